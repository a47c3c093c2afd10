//! Dequantizing and requantizing a block with AVX-512 and no gathers: a code's value is read
//! from the map's four byte planes held in registers (VBMI's `vpermt2b` looks up 128 bytes
//! for 64 codes per instruction), and a value's code is computed sixteen lanes at a time by
//! [`Quantizer`]'s arithmetic, the few registers with a lane near a switch between codes
//! taking the exact rule ([`CodeTable::code`] of the quotient). The results are the portable
//! loops' (`super::dequantize`, `super::quantize`) bit for bit.

use std::arch::x86_64::*;

use fearless_simd::Avx512;

use crate::q8::arith::{Quantizer, CLAMP, FLOOR, LINES, NEAR, SPAN_SHIFT};
use crate::q8::lut::{CodeTable, INFINITY};

/// Lanes per register.
const L: usize = 16;

/// The AVX-512 level, where the CPU has it (with VBMI and the rest of Zen 4's and Ice Lake's
/// set, which `fearless_simd`'s level requires).
pub(super) fn level() -> Option<Avx512> {
    fearless_simd::Level::new().as_avx512()
}

/// Codes per iteration of the dequantizing loop: one register of bytes.
const B: usize = 64;

/// The order the dequantizing loop puts a register of codes in first, so that the byte and
/// word interleaves (which work within each 128-bit lane) leave the values in order: byte
/// `16 * lane + 4 * q + i` takes code `16 * q + 4 * lane + i`.
const INTERLEAVE: [u8; B] = {
    let mut order = [0u8; B];
    let mut at = 0;
    while at < B {
        let (lane, q, i) = (at / 16, at % 16 / 4, at % 4);
        order[at] = (16 * q + 4 * lane + i) as u8;
        at += 1;
    }
    order
};

fearless_simd::kernel!(
    /// `values[i] = map[codes[i]] * absmax` with the map of `table`, as `super::dequantize`:
    /// each byte of the 64 values' f32 bits looked up in a 256-byte table (two 128-entry
    /// `vpermt2b` and a select on the code's top bit), the four bytes interleaved into f32
    /// lanes: 22 instructions for 64 values.
    #[inline]
    pub(super) fn dequantize(
        level: Avx512,
        codes: &[u8],
        absmax: f32,
        table: &CodeTable,
        values: &mut [f32],
    ) {
        let map = table.map();
        let planes: [[__m512i; 4]; 4] = std::array::from_fn(|p| {
            let plane = &table.quantizer().planes[p];
            std::array::from_fn(|r| {
                bytemuck::cast::<[u8; B], __m512i>(plane[r * B..(r + 1) * B].try_into().unwrap_or([0; B]))
            })
        });
        let order = bytemuck::cast::<[u8; B], __m512i>(INTERLEAVE);
        let scale = _mm512_set1_ps(absmax);
        let (whole, tail) = codes.as_chunks::<B>();
        let (out, out_tail) = values.split_at_mut(whole.len() * B);
        for (chunk, out) in whole.iter().zip(out.as_chunks_mut::<B>().0) {
            let index = _mm512_permutexvar_epi8(order, bytemuck::cast::<[u8; B], __m512i>(*chunk));
            let high = _mm512_movepi8_mask(index);
            let byte: [__m512i; 4] = std::array::from_fn(|p| {
                let [a, b, c, d] = planes[p];
                let low_half = _mm512_permutex2var_epi8(a, index, b);
                let high_half = _mm512_permutex2var_epi8(c, index, d);
                _mm512_mask_blend_epi8(high, low_half, high_half)
            });
            let (low01, high01) =
                (_mm512_unpacklo_epi8(byte[0], byte[1]), _mm512_unpackhi_epi8(byte[0], byte[1]));
            let (low23, high23) =
                (_mm512_unpacklo_epi8(byte[2], byte[3]), _mm512_unpackhi_epi8(byte[2], byte[3]));
            let words = [
                _mm512_unpacklo_epi16(low01, low23),
                _mm512_unpackhi_epi16(low01, low23),
                _mm512_unpacklo_epi16(high01, high23),
                _mm512_unpackhi_epi16(high01, high23),
            ];
            let out: &mut [[f32; L]; 4] = bytemuck::cast_mut(out);
            for (out, word) in out.iter_mut().zip(words) {
                *out = bytemuck::cast::<__m512, [f32; L]>(_mm512_mul_ps(_mm512_castsi512_ps(word), scale));
            }
        }
        for (value, code) in out_tail.iter_mut().zip(tail) {
            *value = map[usize::from(*code)] * absmax;
        }
    }
);

fearless_simd::kernel!(
    /// `codes[i]` = the nearest code of `values[i] / absmax`, as `super::quantize`.
    #[inline]
    pub(super) fn quantize(level: Avx512, values: &[f32], absmax: f32, table: &CodeTable, codes: &mut [u8]) {
        let q: &Quantizer = table.quantizer();
        let inverse = 1.0 / absmax;
        if !inverse.is_normal() {
            // A subnormal absmax (a block of subnormal values): its reciprocal overflows.
            for (code, value) in codes.iter_mut().zip(values) {
                *code = table.code(value / absmax);
            }
            return;
        }
        let lines: [[__m512; 2]; LINES] = std::array::from_fn(|l| {
            [
                bytemuck::cast::<[f32; L], __m512>(q.line_scale[l]),
                bytemuck::cast::<[f32; L], __m512>(q.line_offset[l]),
            ]
        });
        // A positive value's code is its code position's floor; a negative value's is 254
        // less that in the signed map (127 less its magnitude index), the code of 0 in the
        // unsigned one.
        let middle = q.middle;
        let reciprocal = _mm512_set1_ps(inverse);
        let (abs_mask, clamp) = (_mm512_set1_epi32(0x7fff_ffff), _mm512_set1_epi32(CLAMP.to_bits() as i32));
        let smallest = _mm512_set1_epi32(FLOOR as i32);
        let near = _mm512_set1_ps(NEAR);
        let top_value = _mm512_set1_ps(q.top_value(absmax));
        let top_code = _mm512_set1_epi32(q.top_index + middle);
        let (mirror, zero_i) = (_mm512_set1_epi32(2 * middle), _mm512_setzero_si512());
        let infinity = _mm512_set1_epi32(INFINITY as i32);
        let zero_code = _mm512_set1_epi32(i32::from(q.zero));

        let (whole, tail) = values.as_chunks::<L>();
        let (out, out_tail) = codes.split_at_mut(whole.len() * L);
        for (chunk, out) in whole.iter().zip(out.as_chunks_mut::<L>().0) {
            let v = bytemuck::cast::<[f32; L], __m512>(*chunk);
            let x = _mm512_mul_ps(v, reciprocal);
            let bits = _mm512_castps_si512(x);
            let magnitude = _mm512_and_si512(bits, abs_mask);
            let negative = _mm512_movepi32_mask(bits);
            let clamped = _mm512_max_epu32(_mm512_min_epu32(magnitude, clamp), smallest);
            let m = _mm512_castsi512_ps(clamped);
            // The code position (`Quantizer::code_position`): the least of the span's
            // lines (the permutes read the low four bits of the span).
            let span = _mm512_srli_epi32::<SPAN_SHIFT>(clamped);
            let [first, second, third] = lines.map(|[scale, offset]| {
                _mm512_fmadd_ps(m, _mm512_permutexvar_ps(span, scale), _mm512_permutexvar_ps(span, offset))
            });
            let position = _mm512_min_ps(first, _mm512_min_ps(second, third));
            // Its distance to the nearest integer, exact (`position - round(position)`).
            let off = _mm512_reduce_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(position);
            if _mm512_cmp_ps_mask::<_CMP_LT_OQ>(_mm512_abs_ps(off), near) != 0 {
                let quotients = bytemuck::cast::<__m512, [f32; L]>(_mm512_div_ps(v, _mm512_set1_ps(absmax)));
                for (code, x) in out.iter_mut().zip(quotients) {
                    *code = table.code(x);
                }
                continue;
            }
            let code = _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(position);
            // The code of 1, decided exactly on the value (not the product).
            let code = _mm512_mask_mov_epi32(code, _mm512_cmp_ps_mask::<_CMP_GE_OQ>(v, top_value), top_code);
            let code = if q.signed {
                _mm512_mask_sub_epi32(code, negative, mirror, code)
            } else {
                _mm512_mask_mov_epi32(code, negative, zero_i)
            };
            let finite = _mm512_cmplt_epu32_mask(magnitude, infinity);
            let code = _mm512_mask_mov_epi32(zero_code, finite, code);
            *out = bytemuck::cast::<__m128i, [u8; L]>(_mm512_cvtepi32_epi8(code));
        }
        for (code, value) in out_tail.iter_mut().zip(tail) {
            *code = table.code(value / absmax);
        }
    }
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::q8::{nearest_code, signed_map, unsigned_map};

    /// Values of every kind: both signs, zeros, subnormals, NaN, the infinities, values at
    /// and around every code and switch, and pseudo-random ones, under a few absmax values.
    fn values(map: &[f32; 256], table: &CodeTable) -> Vec<f32> {
        let mut values =
            vec![0.0, -0.0, 1e-45, -1e-45, 1e-39, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.0, -1.0];
        for c in map {
            for delta in -2i32..=2 {
                let x = f32::from_bits(c.to_bits().wrapping_add_signed(delta));
                values.extend([x, -x]);
            }
        }
        for (bucket, entry) in table.entries().iter().enumerate() {
            use crate::q8::lut::{BUCKETS_PER_SIGN, BUCKET_SHIFT, SMALLEST};
            let sign = if bucket >= BUCKETS_PER_SIGN { 0x8000_0000u32 } else { 0 };
            let first = sign | (SMALLEST + (((bucket % BUCKETS_PER_SIGN) as u32) << BUCKET_SHIFT));
            let switch = entry >> BUCKET_SHIFT;
            for low in [0, switch.saturating_sub(1), switch, switch + 1, 0xffff] {
                values.push(f32::from_bits(first | low.min(0xffff)));
            }
        }
        let mut state = 0x9e37_79b9u32;
        for _ in 0..100_000 {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            values.push(f32::from_bits(state & 0xbfff_ffff));
        }
        values
    }

    #[test]
    fn the_lanes_give_the_portable_codes_and_values() {
        let Some(level) = level() else {
            eprintln!("no AVX-512 here: nothing to compare");
            return;
        };
        for (map, table) in [(signed_map(), CodeTable::signed()), (unsigned_map(), CodeTable::unsigned())] {
            let values = values(&map, table);
            for absmax in [1.0f32, 0.75, 3.0e-5, 1.0e20, 7.0e-38, 1.0e-39, f32::MAX] {
                let scaled: Vec<f32> = values.iter().map(|v| v * absmax).collect();
                let mut codes = vec![0u8; scaled.len()];
                // Block-sized calls, with a tail shorter than a register.
                for (values, codes) in scaled.chunks(253).zip(codes.chunks_mut(253)) {
                    quantize(level, values, absmax, table, codes);
                }
                for (i, (v, code)) in scaled.iter().zip(&codes).enumerate() {
                    assert_eq!(*code, nearest_code(&map, v / absmax), "{i}: {v:e} / {absmax:e}");
                }
            }
            // Every code in every byte position of a register, and a tail.
            let mut every: Vec<u8> = (0..=255).collect();
            every.extend((0..=255u8).map(|c| c.wrapping_mul(167).wrapping_add(13)));
            every.extend((0..=255u8).rev().take(71));
            for absmax in [0.0f32, 1.0, 0.3, 1e-30, 3.0e38] {
                let mut got = vec![0f32; every.len()];
                dequantize(level, &every, absmax, table, &mut got);
                for (code, value) in every.iter().zip(&got) {
                    assert_eq!(
                        value.to_bits(),
                        (map[usize::from(*code)] * absmax).to_bits(),
                        "{code} x {absmax}"
                    );
                }
            }
        }
    }
}
