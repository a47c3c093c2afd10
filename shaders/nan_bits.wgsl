// `is_nan(x)` for f32 and f16 math, from the bits, which no compiler may assume away.
//
// The generated prelude supplies `R` (the value type) and the aliases `NanBits` (u32, or
// vec4<u32> for vec4 values) and `NanMask` (bool, or vec4<bool>).

fn is_nan(x: R) -> NanMask {
    return (bitcast<NanBits>(x) & NanBits(0x7fffffffu)) > NanBits(0x7f800000u);
}
