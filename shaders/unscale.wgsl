// AMP: PyTorch's _amp_foreach_non_finite_check_and_unscale_, one element at a time. A
// non-finite gradient (checked before scaling) sets the device's found_inf flag, which the
// optimizer step reads to skip itself. The generated prelude declares `device_state`,
// `load_grad` and `store_grad` (the whole interface: the module doc of src/gpu/kernel/mod.rs).
// The unscale pass runs `update` (shaders/entry_element.wgsl); the pass that also takes the
// gradient norm folds `unscale`'s result into its partial norm (`norm_term`,
// shaders/entry_norm.wgsl).

fn unscale(i: u32) -> R {
    let g = load_grad(i);
    if (bitcast<u32>(f32(g)) & 0x7f800000u) == 0x7f800000u {
        atomicStore(&device_state.found_inf, 1u);
    }
    let inv_scale = R(device_state.inv_scale);
    if inv_scale == R(1) {
        return g;
    }
    let unscaled = g * inv_scale;
    store_grad(i, unscaled);
    return unscaled;
}

fn update(i: u32) {
    _ = unscale(i);
}
