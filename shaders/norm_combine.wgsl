// How gradient norms combine, shared by the partial pass (grad_norm.wgsl) and the finalize
// pass (clip_finalize.wgsl). NORM_INF (an override): false sums squares, true takes the
// largest magnitude, NaN if either side is NaN (as torch.max).

fn nan_f32(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

fn combine(a: f32, b: f32) -> f32 {
    if NORM_INF {
        return select(max(a, b), a + b, nan_f32(a) || nan_f32(b));
    }
    return a + b;
}
