//! Conversions between the 16-bit storage types and f32, a slice at a time (the scratch
//! blocks of `storage`). f16 and bf16 widen exactly; f32 narrows rounding once to nearest
//! even; a NaN keeps its sign and the leading bits of its payload and becomes quiet. f16
//! results are bit for bit `half`'s, bf16 results `shaders/convert.wgsl`'s.
//!
//! f16: where the CPU has AVX-512 one instruction converts sixteen elements, where it has
//! x86-64-v3 (AVX2 and F16C) one F16C instruction converts eight (both detected at run
//! time), in a loop compiled for those features. Elsewhere
//! `half`'s slice conversions, which reach F16C (or Arm's fp16 unit) too, but through a
//! call per 8 elements that cannot be inlined, and measured several times slower; a
//! branch-free integer conversion that the compiler vectorizes was slower too, and was
//! dropped (PERF.md).
//!
//! bf16: the upper half of an f32, so plain integer loops the compiler vectorizes, compiled
//! for AVX-512, AVX2 and NEON as well and chosen at run time as the update loops are.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::step::rounding;

/// Widens `values` into `out` (of the same length).
pub(crate) fn f16_to_f32(values: &[f16], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        let level = fearless_simd::Level::new();
        if let Some(avx512) = level.as_avx512() {
            return registers::f16_to_f32(avx512, values, out);
        }
        if let Some(avx2) = level.as_avx2() {
            return registers::f16_to_f32(avx2, values, out);
        }
    }
    values.convert_to_f32_slice(out);
}

/// Rounds `values` into `out` (of the same length).
pub(crate) fn f32_to_f16(values: &[f32], out: &mut [f16]) {
    #[cfg(target_arch = "x86_64")]
    {
        let level = fearless_simd::Level::new();
        if let Some(avx512) = level.as_avx512() {
            return registers::f32_to_f16(avx512, values, out);
        }
        if let Some(avx2) = level.as_avx2() {
            return registers::f32_to_f16(avx2, values, out);
        }
    }
    out.convert_from_f32_slice(values);
}

/// The vector loops: `f16_lanes`' register conversions (sixteen lanes on AVX-512, eight on
/// F16C), inlined into a loop that `vectorize` compiles with the features its token proves
/// the CPU has.
#[cfg(target_arch = "x86_64")]
mod registers {
    use half::f16;
    use half::slice::HalfFloatSliceExt;

    use crate::cpu::f16_lanes::registers::Width;

    /// Widens `values` into `out` (of the same length).
    #[inline(always)]
    pub(crate) fn f16_to_f32<W: Width<L>, const L: usize>(level: W, values: &[f16], out: &mut [f32]) {
        level.vectorize(
            #[inline(always)]
            || {
                let (whole, tail) = values.as_chunks::<L>();
                let (out_whole, out_tail) = out.split_at_mut(whole.len() * L);
                for (v, o) in whole.iter().zip(out_whole.as_chunks_mut::<L>().0) {
                    *o = level.widen(*v);
                }
                tail.convert_to_f32_slice(out_tail);
            },
        )
    }

    /// Rounds `values` into `out` (of the same length), to nearest even.
    #[inline(always)]
    pub(crate) fn f32_to_f16<W: Width<L>, const L: usize>(level: W, values: &[f32], out: &mut [f16]) {
        level.vectorize(
            #[inline(always)]
            || {
                let (whole, tail) = values.as_chunks::<L>();
                let (out_whole, out_tail) = out.split_at_mut(whole.len() * L);
                for (v, o) in whole.iter().zip(out_whole.as_chunks_mut::<L>().0) {
                    *o = level.narrow(*v);
                }
                out_tail.convert_from_f32_slice(tail);
            },
        )
    }
}

/// Widens `values` into `out` (of the same length).
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
pub(crate) fn bf16_to_f32(values: &[bf16], out: &mut [f32]) {
    for (o, v) in out.iter_mut().zip(values) {
        *o = f32::from_bits(u32::from(v.to_bits()) << 16);
    }
}

/// Rounds `values` into `out` (of the same length) as `shaders/convert.wgsl`'s `bf16_bits`
/// does.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
pub(crate) fn f32_to_bf16(values: &[f32], out: &mut [bf16]) {
    for (o, v) in out.iter_mut().zip(values) {
        *o = bf16::from_bits(bf16_bits(*v));
    }
}

/// The bits of `v` rounded to bfloat16 (nearest even; NaN stays a quiet NaN), in integer
/// operations the compiler vectorizes.
#[inline(always)]
pub(crate) fn bf16_bits(v: f32) -> u16 {
    let b = v.to_bits();
    // Chosen before the shift, so that the vectorized loop packs to 16 bits once.
    let wide = if v.is_nan() { b | 0x0040_0000 } else { b.wrapping_add(0x7fff + ((b >> 16) & 1)) };
    (wide >> 16) as u16
}

/// Rounds `values` into `out` stochastically as `shaders/stochastic.wgsl`'s `f16_bits_sr`,
/// with the hash bits of `stream` for elements `first..` under `key`.
pub(crate) fn f32_to_f16_stochastic(values: &[f32], out: &mut [f16], key: u32, stream: u32, first: u64) {
    for ((o, v), e) in out.iter_mut().zip(values).zip(first..) {
        *o = f16::from_bits(rounding::f16_bits(*v, rounding::bits(key, stream, e)));
    }
}

/// Rounds `values` into `out` stochastically as `shaders/stochastic.wgsl`'s `bf16_bits_sr`.
pub(crate) fn f32_to_bf16_stochastic(values: &[f32], out: &mut [bf16], key: u32, stream: u32, first: u64) {
    for ((o, v), e) in out.iter_mut().zip(values).zip(first..) {
        *o = bf16::from_bits(rounding::bf16_bits(*v, rounding::bits(key, stream, e)));
    }
}

#[cfg(test)]
mod tests {
    use half::slice::HalfFloatSliceExt;
    use half::{bf16, f16};

    /// The first few indices where `got` and `want` differ in their bits (so that NaNs
    /// compare by payload).
    fn mismatches<T: Copy, U: std::fmt::Display>(
        inputs: &[U],
        got: &[T],
        want: &[T],
        bits: impl Fn(T) -> u32,
    ) -> Vec<String> {
        let mut out = Vec::new();
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            if bits(*g) != bits(*w) && out.len() < 5 {
                out.push(format!("[{i}] {} -> got {:#x} want {:#x}", inputs[i], bits(*g), bits(*w)));
            }
        }
        out
    }

    #[test]
    fn every_f16_widens_as_half_does() {
        let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        let mut want = vec![0f32; all.len()];
        all.convert_to_f32_slice(&mut want);
        let mut got = vec![0f32; all.len()];
        // In two calls, so that both end in a run shorter than the 8-element loop's.
        let (head, tail) = all.split_at(all.len() - 3);
        let (got_head, got_tail) = got.split_at_mut(head.len());
        super::f16_to_f32(head, got_head);
        super::f16_to_f32(tail, got_tail);
        let bad = mismatches(&all, &got, &want, f32::to_bits);
        assert!(bad.is_empty(), "{bad:?}");
    }

    #[test]
    fn every_bf16_widens_exactly() {
        let all: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).collect();
        let mut got = vec![0f32; all.len()];
        super::bf16_to_f32(&all, &mut got);
        let want: Vec<f32> = all.iter().map(|b| f32::from_bits(u32::from(b.to_bits()) << 16)).collect();
        let bad = mismatches(&all, &got, &want, f32::to_bits);
        assert!(bad.is_empty(), "{bad:?}");
    }

    /// f32 bit patterns that exercise every rounding case of both narrowings: every exponent
    /// (so every f16 range: zero, subnormal, normal, overflow, infinity, NaN) with the low
    /// mantissa bits at and around each halfway point, both last-bit parities, both signs,
    /// plus a spread of other patterns.
    fn narrowing_cases() -> Vec<f32> {
        let mut bits = Vec::new();
        for sign in [0u32, 0x8000_0000] {
            for exponent in 0..=255u32 {
                for high in [0u32, 1, 2, 3, 0x1ff, 0x200, 0x3fe, 0x3ff] {
                    // The ten bits an f16 normal keeps (or their prefix), then the rest.
                    for low in [0u32, 1, 0xfff, 0x1000, 0x1001, 0x1fff, 0xffff, 0x8000, 0x7fff, 0x1_0000] {
                        let mantissa = ((high << 13) | (low & 0x1fff)) & 0x7f_ffff;
                        bits.push(sign | (exponent << 23) | mantissa);
                        let mantissa = ((high << 14) | low) & 0x7f_ffff;
                        bits.push(sign | (exponent << 23) | mantissa);
                    }
                }
            }
        }
        bits.extend((0..200_000u32).map(|i| i.wrapping_mul(0x9e37_79b9)));
        bits.into_iter().map(f32::from_bits).collect()
    }

    #[test]
    fn f32_narrows_to_f16_as_half_does() {
        let cases = narrowing_cases();
        let mut want = vec![f16::ZERO; cases.len()];
        want.convert_from_f32_slice(&cases);
        let mut got = vec![f16::ZERO; cases.len()];
        let (head, tail) = cases.split_at(cases.len() - 3);
        let (got_head, got_tail) = got.split_at_mut(head.len());
        super::f32_to_f16(head, got_head);
        super::f32_to_f16(tail, got_tail);
        let bad = mismatches(&cases, &got, &want, |h| u32::from(h.to_bits()));
        assert!(bad.is_empty(), "{bad:?}");
    }

    #[test]
    fn f32_narrows_to_bf16_to_nearest_even_with_nan_kept_quiet() {
        let cases = narrowing_cases();
        let mut got = vec![bf16::ZERO; cases.len()];
        super::f32_to_bf16(&cases, &mut got);
        // The f64 oracle's rounding; a NaN keeps its sign and top payload bits, made quiet.
        let want: Vec<bf16> = cases
            .iter()
            .map(|x| {
                if x.is_nan() {
                    bf16::from_bits(((x.to_bits() >> 16) | 0x40) as u16)
                } else {
                    bf16::from_f64(crate::DType::BF16.round(f64::from(*x)))
                }
            })
            .collect();
        let bad = mismatches(&cases, &got, &want, |h| u32::from(h.to_bits()));
        assert!(bad.is_empty(), "{bad:?}");
    }
}
