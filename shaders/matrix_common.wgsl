// What the product kernel and the kernels compiled over its layout share: bfloat16 rounding
// of a value kept in f32 (torch's bfloat16 tensors), and the bits of a 16-bit store. Needs
// shaders/convert.wgsl and the prelude's `STORAGE_*`.

fn round_bf16(v: f32) -> f32 {
    let bits = bitcast<u32>(v);
    if ((bits & 0x7f800000u) == 0x7f800000u) {
        return v; // infinities and NaN unchanged
    }
    let rounded = bits + 0x7fffu + ((bits >> 16u) & 1u);
    return bitcast<f32>(rounded & 0xffff0000u);
}

// The 16-bit bits of `v` stored as `dtype` (bfloat16 or f16), rounded to nearest even.
fn half_bits(v: f32, dtype: u32) -> u32 {
    if (dtype == STORAGE_BF16) {
        return bf16_bits(v);
    }
    return f16_bits(v);
}
