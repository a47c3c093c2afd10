// Capturable mode: the first dispatch of a step counts it, unless AMP found an infinity in
// the gradients, in which case the whole step (this count included) is skipped. The prelude
// (src/gpu/kernel/passes.rs's advance_wgsl) declares the BINDING_* constants and struct DeviceHeader.
@group(GROUP_SCALARS) @binding(BINDING_DEVICE_STATE_RW) var<storage, read_write> state: DeviceHeader;

@compute @workgroup_size(1)
fn main() {
    if state.found_inf == 0u {
        state.step += 1u;
    }
}
