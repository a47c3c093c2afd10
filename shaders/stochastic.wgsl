// Stochastic rounding of 16-bit stores, in integer arithmetic only, so that every adapter
// and the CPU backend (src/step/rounding.rs, the same lines in Rust) store the same bits.
//
// The random bits of a store are a counter-based hash: h = mix(h ^ word) from h = 0 over
// (seed low, seed high, step, tensor ordinal, stream, element low, element high), where the
// stream names the tensor of the parameter (0 the parameter, 1 + n a state tensor) and the
// element index counts from the tensor's first element. `rng_begin` (generated with the
// table) hashes the first four words once per invocation; no dispatch shape enters the hash.

// Chris Wellons' lowbias32: a bijection of u32 with good avalanche.
fn rng_mix(v: u32) -> u32 {
    var x = v;
    x ^= x >> 16u;
    x *= 0x7feb352du;
    x ^= x >> 15u;
    x *= 0x846ca68bu;
    x ^= x >> 16u;
    return x;
}

// The bits of element `index` of the current segment (elements, not accesses) in `stream`.
fn rng_bits(stream: u32, index: u32) -> u32 {
    let lo = rng_first_lo + index;
    let hi = rng_first_hi + select(0u, 1u, lo < index);
    return rng_mix(rng_mix(rng_mix(rng_key ^ stream) ^ lo) ^ hi);
}

// The bits of the four elements of access `i` of a vec4 segment.
fn rng_bits4(stream: u32, i: u32) -> vec4<u32> {
    let k = 4u * i;
    return vec4(rng_bits(stream, k), rng_bits(stream, k + 1u), rng_bits(stream, k + 2u), rng_bits(stream, k + 3u));
}

// bfloat16 bits of `x` rounded stochastically with the random bits `r`: the top 16 bits of
// `r` added below the kept bits carry into them with probability equal to the discarded
// fraction. NaN stays a quiet NaN; infinity stays infinity.
fn bf16_bits_sr(x: f32, r: u32) -> u32 {
    let b = bitcast<u32>(x);
    if (b & 0x7fffffffu) > 0x7f800000u {
        return (b >> 16u) | 0x40u;
    }
    return (b + (r >> 16u)) >> 16u;
}

// binary16 bits of `x` rounded stochastically with the random bits `r`. Normal results add
// the top 13 bits of `r` below the kept bits; subnormal results round up where
// r >= 2^32 - f, f the discarded fraction in units of 2^-32. NaN as with nearest rounding;
// 65536 and above are infinity.
fn f16_bits_sr(x: f32, r: u32) -> u32 {
    let b = bitcast<u32>(x);
    let sign = (b >> 16u) & 0x8000u;
    let a = b & 0x7fffffffu;
    if a > 0x7f800000u {
        return sign | 0x7e00u | ((a >> 13u) & 0x3ffu);
    }
    if a >= 0x47800000u {
        return sign | 0x7c00u;
    }
    if a < 0x38800000u {
        // |x| = m 2^(e - 150); in units of 2^-24 (the subnormal spacing), m 2^-s.
        let e = max(a >> 23u, 1u);
        let m = select(a & 0x7fffffu, (a & 0x7fffffu) | 0x800000u, a >= 0x800000u);
        let s = 126u - e;
        var q = 0u;
        var fraction = 0u;
        if s < 32u {
            q = m >> s;
            fraction = m << (32u - s);
        } else if s < 64u {
            fraction = m >> (s - 32u);
        }
        // Up when r >= 2^32 - fraction, so that large r rounds up as on the normal path.
        return sign | (q + select(0u, 1u, ~r < fraction));
    }
    return sign | ((a - 0x38000000u + (r >> 19u)) >> 13u);
}

fn bf16_bits_sr4(x: vec4<f32>, r: vec4<u32>) -> vec4<u32> {
    return vec4(bf16_bits_sr(x.x, r.x), bf16_bits_sr(x.y, r.y), bf16_bits_sr(x.z, r.z), bf16_bits_sr(x.w, r.w));
}

fn f16_bits_sr4(x: vec4<f32>, r: vec4<u32>) -> vec4<u32> {
    return vec4(f16_bits_sr(x.x, r.x), f16_bits_sr(x.y, r.y), f16_bits_sr(x.z, r.z), f16_bits_sr(x.w, r.w));
}
