//! Dequantizing and requantizing 4-bit blocks with AVX-512 and no gathers: a 16-entry map
//! is one register, so one `vpermps` looks up sixteen codes' values, and a value's code (the
//! number of the map's thresholds at or below it, [`crate::q4::thresholds`]) is a binary
//! search of four steps whose thresholds the same permute reads. The results are the
//! portable loops' (`super::dequantize`, `super::quantize`) bit for bit.

use std::arch::x86_64::*;

use fearless_simd::Avx512;

use super::Coding;
use crate::q4::CODES;

/// Lanes per register.
const L: usize = 16;

/// Bytes of codes per register of values: two codes a byte.
const BYTES: usize = L / 2;

/// The AVX-512 level, where the CPU has it.
pub(super) fn level() -> Option<Avx512> {
    fearless_simd::Level::new().as_avx512()
}

/// Per dword lane, the shift that brings its code to the low nibble of the byte the lane
/// holds: element 2j's code is byte j's high nibble, element 2j + 1's its low one.
const NIBBLE_SHIFTS: [u32; L] = {
    let mut shifts = [0u32; L];
    let mut lane = 0;
    while lane < L {
        shifts[lane] = if lane % 2 == 0 { 4 } else { 0 };
        lane += 1;
    }
    shifts
};

/// One coding's registers, built once per work item.
pub(super) struct Registers {
    map: __m512,
    /// The map's 15 thresholds, then infinity (which the search never reads).
    thresholds: __m512,
    zero_code: __m512i,
    shifts: __m512i,
}

fearless_simd::kernel!(
    /// The registers of `coding`.
    #[inline]
    pub(super) fn registers(level: Avx512, coding: &Coding) -> Registers {
        let mut thresholds = [f32::INFINITY; L];
        thresholds[..CODES - 1].copy_from_slice(&coding.thresholds);
        Registers {
            map: bytemuck::cast::<[f32; L], __m512>(coding.map),
            thresholds: bytemuck::cast::<[f32; L], __m512>(thresholds),
            zero_code: _mm512_set1_epi32(i32::from(coding.zero)),
            shifts: bytemuck::cast::<[u32; L], __m512i>(NIBBLE_SHIFTS),
        }
    }
);

fearless_simd::kernel!(
    /// `values[i] = map[code i] * scale` for packed `codes`, as `super::dequantize`: each
    /// byte twice, widened to dword lanes, shifted and masked to its code, then one permute
    /// of the map's register.
    #[inline]
    pub(super) fn dequantize(
        level: Avx512,
        r: &Registers,
        codes: &[u8],
        scale: f32,
        map: &[f32; CODES],
        values: &mut [f32],
    ) {
        let scale_lanes = _mm512_set1_ps(scale);
        let nibble = _mm512_set1_epi32(0xf);
        let (whole, tail) = codes.as_chunks::<BYTES>();
        let (out, out_tail) = values.split_at_mut(whole.len() * L);
        for (bytes, out) in whole.iter().zip(out.as_chunks_mut::<L>().0) {
            let bytes = _mm_cvtsi64_si128(i64::from_le_bytes(*bytes));
            let lanes = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(bytes, bytes));
            let code = _mm512_and_si512(_mm512_srlv_epi32(lanes, r.shifts), nibble);
            let value = _mm512_mul_ps(_mm512_permutexvar_ps(code, r.map), scale_lanes);
            *out = bytemuck::cast::<__m512, [f32; L]>(value);
        }
        // Only blocks of 8 leave a tail: a call per block for nothing would zero the
        // portable loop's scratch and pay its dispatch.
        if !tail.is_empty() {
            super::dequantize(tail, scale, map, out_tail)
        }
    }
);

fearless_simd::kernel!(
    /// Each value's code under `scale`, packed two per byte, as `super::quantize`: the
    /// quotient's count of thresholds at or below it found in four steps (8, 4, 2, 1: the
    /// thresholds rise strictly, so the count is where the search lands), the code of 0 for
    /// a NaN or infinite quotient, and each pair of lanes narrowed into one byte.
    #[inline]
    pub(super) fn quantize(
        level: Avx512,
        r: &Registers,
        values: &[f32],
        scale: f32,
        coding: &Coding,
        codes: &mut [u8],
    ) {
        let scale_lanes = _mm512_set1_ps(scale);
        let magnitude = _mm512_set1_epi32(0x7fff_ffff);
        let infinity = _mm512_set1_epi32(f32::INFINITY.to_bits() as i32);
        let (whole, tail) = values.as_chunks::<L>();
        let (out, out_tail) = codes.split_at_mut(whole.len() * BYTES);
        for (chunk, out) in whole.iter().zip(out.as_chunks_mut::<BYTES>().0) {
            let x = _mm512_div_ps(bytemuck::cast::<[f32; L], __m512>(*chunk), scale_lanes);
            let mut code = _mm512_setzero_si512();
            for step in [8, 4, 2, 1] {
                let index = _mm512_add_epi32(code, _mm512_set1_epi32(step - 1));
                let threshold = _mm512_permutexvar_ps(index, r.thresholds);
                let at_or_above = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, threshold);
                code = _mm512_mask_add_epi32(code, at_or_above, code, _mm512_set1_epi32(step));
            }
            let bits = _mm512_and_si512(_mm512_castps_si512(x), magnitude);
            let code = _mm512_mask_mov_epi32(r.zero_code, _mm512_cmplt_epu32_mask(bits, infinity), code);
            // Element 2j's code into the high nibble; each 64-bit lane's low byte then takes
            // both codes of its pair.
            let shifted = _mm512_sllv_epi32(code, r.shifts);
            let pairs = _mm512_or_si512(shifted, _mm512_srli_epi64::<32>(shifted));
            let bytes = bytemuck::cast::<__m128i, [u8; 16]>(_mm512_cvtepi64_epi8(pairs));
            out.copy_from_slice(&bytes[..BYTES]);
        }
        if !tail.is_empty() {
            super::quantize(tail, scale, coding, out_tail)
        }
    }
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::q4::{nearest_code, signed_map, unsigned_map};

    /// Values of every kind: both signs, zeros, subnormals, NaN, the infinities, every map
    /// entry and threshold and the f32s around them, and pseudo-random ones.
    fn values(coding: &Coding) -> Vec<f32> {
        let mut values = vec![
            0.0,
            -0.0,
            1e-45,
            -1e-45,
            1e-39,
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1.0,
            -1.0,
        ];
        for x in coding.map.iter().chain(&coding.thresholds) {
            for delta in -3i32..=3 {
                let y = f32::from_bits(x.to_bits().wrapping_add_signed(delta));
                values.extend([y, -y]);
            }
        }
        let mut state = 0x9e37_79b9u32;
        for _ in 0..20_000 {
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
        for map in [signed_map(), unsigned_map()] {
            let coding = Coding::from_map(map);
            let r = registers(level, &coding);
            let values = values(&coding);
            for scale in [1.0f32, 0.75, 3.0e-5, 1.0e20, 1e-12, 1.0e-39] {
                let scaled: Vec<f32> = values.iter().map(|v| v * scale).collect();
                // Blocks of 72 values: four registers and a tail of 8 for the portable loop.
                let whole = scaled.len() / 72 * 72;
                let mut codes = vec![0u8; whole / 2];
                for (block, out) in scaled[..whole].chunks(72).zip(codes.chunks_mut(36)) {
                    quantize(level, &r, block, scale, &coding, out);
                }
                for (i, v) in scaled[..whole].iter().enumerate() {
                    let code = crate::q4::code_at(&codes, i);
                    assert_eq!(code, nearest_code(&map, v / scale), "{i}: {v:e} / {scale:e}");
                }
                let mut got = vec![0f32; whole];
                for (out, block) in got.chunks_mut(72).zip(codes.chunks(36)) {
                    dequantize(level, &r, block, scale, &map, out);
                }
                for (i, value) in got.iter().enumerate() {
                    let code = usize::from(crate::q4::code_at(&codes, i));
                    assert_eq!(
                        value.to_bits(),
                        (map[code] * scale).to_bits(),
                        "{i}: code {code} x {scale:e}"
                    );
                }
            }
        }
    }
}
