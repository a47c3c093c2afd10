// AMP: PyTorch's _amp_foreach_non_finite_check_and_unscale_, one element at a time. A
// non-finite gradient (checked before scaling) sets the device's found_inf flag, which the
// optimizer step reads to skip itself. The generated code declares `device_state`.

fn update(i: u32) {
    let g = load_grad(i);
    if (bitcast<u32>(f32(g)) & 0x7f800000u) == 0x7f800000u {
        atomicStore(&device_state.found_inf, 1u);
    }
    let inv_scale = R(device_state.inv_scale);
    if inv_scale != R(1) {
        store_grad(i, g * inv_scale);
    }
}
