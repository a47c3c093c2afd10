//! The WGSL of the passes that run without the update kernels' prelude: the clip finalize
//! pass and the step-advancing kernel.

use super::{binding_wgsl, WORKGROUP_SIZE};
use crate::step::clip::ClipHeader;
use crate::step::device::DeviceHeader;

/// The clip finalize pass's WGSL (`shaders/clip_finalize.wgsl`, one workgroup of `WG`
/// invocations), after its prelude: `WG`, the binding constants, `struct ClipHeader`,
/// `NORM_INF`, `shaders/norm_combine.wgsl` and `publish(coefficient)`, which in capturable
/// mode also writes the coefficient into the device state, where capturable update kernels
/// read it.
pub(crate) fn clip_finalize_wgsl(capturable: bool) -> String {
    let mut s = format!("const WG: u32 = {WORKGROUP_SIZE}u;\n") + &binding_wgsl() + &ClipHeader::wgsl();
    if capturable {
        s.push_str(&DeviceHeader::wgsl_for(false));
        s.push_str(
            "@group(GROUP_SCALARS) @binding(BINDING_FINALIZE_DEVICE_STATE)\n\
             var<storage, read_write> device_state: DeviceHeader;\n\
             fn publish(coefficient: f32) { device_state.clip_coefficient = coefficient; }\n",
        );
    } else {
        s.push_str("fn publish(coefficient: f32) {}\n");
    }
    s.push_str("override NORM_INF: bool;\n");
    s.push_str(include_str!("../../../shaders/norm_combine.wgsl"));
    s.push_str(include_str!("../../../shaders/clip_finalize.wgsl"));
    s
}

/// The step-advancing kernel's WGSL (`shaders/advance.wgsl`), after its prelude: the binding
/// constants and `struct DeviceHeader`.
pub(crate) fn advance_wgsl() -> String {
    binding_wgsl() + &DeviceHeader::wgsl_for(false) + include_str!("../../../shaders/advance.wgsl")
}
