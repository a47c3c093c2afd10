// Storage conversions for 16-bit types kept as bits. WGSL leaves the rounding of f32 -> f16
// conversions (and of pack2x16float) to the implementation, so stores round here, in
// integer arithmetic, to nearest even on every adapter. NaN stays NaN, overflow is infinity.

// binary16 bits (in the low half) of the f32 `x`, rounded to nearest even.
fn f16_bits(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let sign = (b >> 16u) & 0x8000u;
    let a = b & 0x7fffffffu;
    if a > 0x7f800000u {
        return sign | 0x7e00u | ((a >> 13u) & 0x3ffu);
    }
    if a >= 0x477ff000u {
        // 65520 and above round to infinity (65504 is the largest finite half).
        return sign | 0x7c00u;
    }
    if a < 0x38800000u {
        // Below 2^-14 the result is subnormal: a multiple of 2^-24, and x * 2^24 is exact.
        // round() rounds halfway cases to even.
        return sign | u32(round(bitcast<f32>(a) * 16777216.0));
    }
    // Normal: drop 13 mantissa bits rounding to nearest even, then rebias 127 -> 15.
    let rounded = a + 0xfffu + ((a >> 13u) & 1u);
    return sign | ((rounded - 0x38000000u) >> 13u);
}

// The f32 value of binary16 bits `h` (low half), exact for every half including subnormals.
fn f16_value(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if e == 0u {
        return bitcast<f32>(sign | bitcast<u32>(f32(m) * 5.9604644775390625e-8));
    }
    if e == 31u {
        return bitcast<f32>(sign | 0x7f800000u | (m << 13u));
    }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}

// bfloat16 bits (low half) of the f32 `x`, rounded to nearest even; NaN stays a quiet NaN.
fn bf16_bits(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    if (b & 0x7fffffffu) > 0x7f800000u {
        return (b >> 16u) | 0x40u;
    }
    return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}

// The f32 value of bfloat16 bits `h` (low half): exact.
fn bf16_value(h: u32) -> f32 {
    return bitcast<f32>(h << 16u);
}

// Replaces the 16-bit half `half` (0: low, 1: high) of `word` with `bits`.
fn with_half(word: u32, half: u32, bits: u32) -> u32 {
    let shift = half * 16u;
    return (word & ~(0xffffu << shift)) | (bits << shift);
}

// Four lanes at once, for kernels that move four elements per access: the same rounding
// as the scalar functions above, lane by lane, with selects instead of branches.
fn f16_bits4(x: vec4<f32>) -> vec4<u32> {
    let b = bitcast<vec4<u32>>(x);
    let a = b & vec4(0x7fffffffu);
    // Normal: drop 13 mantissa bits rounding to nearest even and rebias 127 -> 15 in one
    // add (0xc8000000 is -(112 << 23)); a carry out of the mantissa bumps the exponent.
    let normal = (a + vec4(0xc8000fffu) + ((a >> vec4(13u)) & vec4(1u))) >> vec4(13u);
    // Clamped into range first: lanes that are not subnormal must still convert cleanly.
    let sub = vec4<u32>(round(min(bitcast<vec4<f32>>(a), vec4(6.103515625e-5)) * 16777216.0));
    let finite = select(normal, sub, a < vec4(0x38800000u));
    let special = select(vec4(0x7c00u), vec4(0x7e00u) | ((a >> vec4(13u)) & vec4(0x3ffu)), a > vec4(0x7f800000u));
    return ((b >> vec4(16u)) & vec4(0x8000u)) | select(finite, special, a >= vec4(0x477ff000u));
}

fn f16_value4(h: vec4<u32>) -> vec4<f32> {
    let sign = (h & vec4(0x8000u)) << vec4(16u);
    let em = (h & vec4(0x7fffu)) << vec4(13u);
    // Rebias the exponent 15 -> 127, or 31 -> 255 for infinity and NaN.
    let normal = em + select(vec4(0x38000000u), vec4(0x70000000u), em >= vec4(0x0f800000u));
    // A subnormal half m * 2^-24 is a normal f32: 2^-14 (1 + m / 1024) - 2^-14, exact.
    let sub = bitcast<vec4<u32>>(bitcast<vec4<f32>>(em + vec4(0x38800000u)) - 6.103515625e-5);
    return bitcast<vec4<f32>>(sign | select(normal, sub, em < vec4(0x00800000u)));
}

fn bf16_bits4(x: vec4<f32>) -> vec4<u32> {
    let b = bitcast<vec4<u32>>(x);
    let nan = (b >> vec4(16u)) | vec4(0x40u);
    let rounded = (b + vec4(0x7fffu) + ((b >> vec4(16u)) & vec4(1u))) >> vec4(16u);
    return select(rounded, nan, (b & vec4(0x7fffffffu)) > vec4(0x7f800000u));
}

fn bf16_value4(h: vec4<u32>) -> vec4<f32> {
    return bitcast<vec4<f32>>(h << vec4(16u));
}

// The four halves of two words, low half first.
fn halves(w: vec2<u32>) -> vec4<u32> {
    return vec4(w.x & 0xffffu, w.x >> 16u, w.y & 0xffffu, w.y >> 16u);
}

// Two words from four halves (each in the low 16 bits of its lane).
fn words(h: vec4<u32>) -> vec2<u32> {
    return vec2(h.x | (h.y << 16u), h.z | (h.w << 16u));
}
