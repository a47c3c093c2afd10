//! Dequantizing and requantizing a block with AVX-512 and no gathers: a code's value is read
//! from the map's four byte planes held in registers (VBMI's `vpermt2b` looks up 128 bytes
//! for 64 codes per instruction), and a value's code is computed sixteen lanes at a time by
//! [`Quantizer`]'s arithmetic, the few lanes near a switch between codes taking the
//! exact rule ([`CodeTable::code`] of the quotient). The results are the portable
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
pub(super) const B: usize = 64;

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
    /// `values[i] = map[codes[i]] * absmax` with the map of `table`, as `super::dequantize`.
    #[inline]
    pub(super) fn dequantize(
        level: Avx512,
        codes: &[u8],
        absmax: f32,
        table: &'static CodeTable,
        values: &mut [f32],
    ) {
        let dequantizer = Dequantizer::new(level, table);
        let (whole, tail) = codes.as_chunks::<B>();
        let (out, out_tail) = values.split_at_mut(whole.len() * B);
        for (chunk, out) in whole.iter().zip(out.as_chunks_mut::<B>().0) {
            dequantize_chunk(level, &dequantizer, chunk, absmax, out);
        }
        let map = table.map();
        for (value, code) in out_tail.iter_mut().zip(tail) {
            *value = map[usize::from(*code)] * absmax;
        }
    }
);

/// One map's dequantizing loop with its registers loaded once, for a caller that
/// dequantizes chunk after chunk.
pub(super) struct Dequantizer {
    /// The map's four byte planes, 64 entries a register.
    planes: [[__m512i; 4]; 4],
    order: __m512i,
}

impl Dequantizer {
    #[inline]
    pub(super) fn new(_level: Avx512, table: &'static CodeTable) -> Self {
        Dequantizer {
            planes: std::array::from_fn(|p| {
                let plane = &table.quantizer().planes[p];
                std::array::from_fn(|r| {
                    bytemuck::cast::<[u8; B], __m512i>(plane[r * B..(r + 1) * B].try_into().unwrap_or([0; B]))
                })
            }),
            order: bytemuck::cast::<[u8; B], __m512i>(INTERLEAVE),
        }
    }

    /// One register of codes' values.
    #[inline]
    pub(super) fn chunk(&self, level: Avx512, codes: &[u8; B], absmax: f32, values: &mut [f32; B]) {
        dequantize_chunk(level, self, codes, absmax, values)
    }
}

fearless_simd::kernel!(
    /// Each byte of the 64 values' f32 bits looked up in a 256-byte table (two 128-entry
    /// `vpermt2b` and a select on the code's top bit), the four bytes interleaved into f32
    /// lanes: 22 instructions for 64 values.
    #[inline]
    fn dequantize_chunk(level: Avx512, d: &Dequantizer, codes: &[u8; B], absmax: f32, values: &mut [f32; B]) {
        let scale = _mm512_set1_ps(absmax);
        let index = _mm512_permutexvar_epi8(d.order, bytemuck::cast::<[u8; B], __m512i>(*codes));
        let high = _mm512_movepi8_mask(index);
        let byte: [__m512i; 4] = std::array::from_fn(|p| {
            let [a, b, c, e] = d.planes[p];
            let low_half = _mm512_permutex2var_epi8(a, index, b);
            let high_half = _mm512_permutex2var_epi8(c, index, e);
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
        let out: &mut [[f32; L]; 4] = bytemuck::cast_mut(values);
        for (out, word) in out.iter_mut().zip(words) {
            *out = bytemuck::cast::<__m512, [f32; L]>(_mm512_mul_ps(_mm512_castsi512_ps(word), scale));
        }
    }
);

/// Values the requantizing loop takes per iteration: four registers, whose codes one byte
/// pack and one permute put in order (a register's own narrowing store is two shuffles).
pub(super) const Q: usize = 4 * L;

/// The dword order that puts the packed codes of four registers back in place: the packs
/// work within each 128-bit lane, leaving in dword `4 * lane + r` the codes of register `r`'s
/// lanes `4 * lane` to `4 * lane + 3`.
const PACKED_ORDER: [u32; L] = {
    let mut order = [0u32; L];
    let mut at = 0;
    while at < L {
        let (r, lane) = (at / 4, at % 4);
        order[at] = (4 * lane + r) as u32;
        at += 1;
    }
    order
};

/// `codes[i]` = the nearest code of `values[i] / absmax`, as `super::quantize`.
#[inline]
pub(super) fn quantize(
    level: Avx512,
    values: &[f32],
    absmax: f32,
    table: &'static CodeTable,
    codes: &mut [u8],
) {
    Requantizer::new(level, table).quantize(level, values, absmax, codes)
}

/// One map's requantizing loop with its constants built once, for a caller that requantizes
/// block after block: only the absmax's two constants change from one block to the next.
pub(super) struct Requantizer {
    table: &'static CodeTable,
    constants: Constants,
}

impl Requantizer {
    #[inline]
    pub(super) fn new(level: Avx512, table: &'static CodeTable) -> Self {
        Requantizer { table, constants: constants(level, table) }
    }

    /// `codes[i]` = the nearest code of `values[i] / absmax`, as `super::quantize`.
    #[inline]
    pub(super) fn quantize(&mut self, level: Avx512, values: &[f32], absmax: f32, codes: &mut [u8]) {
        let table = self.table;
        if !self.set_absmax(level, absmax) {
            return exact(values, absmax, table, codes);
        }
        if table.quantizer().signed {
            quantize_signed(level, &self.constants, values, absmax, table, codes)
        } else {
            quantize_unsigned(level, &self.constants, values, absmax, table, codes)
        }
    }

    /// The code of 0 of the map.
    #[inline]
    pub(super) fn zero(&self) -> u8 {
        self.table.zero()
    }

    /// Takes `absmax` as the scale of the chunks that follow; false where the arithmetic
    /// cannot (a subnormal absmax, whose reciprocal overflows): then only the exact rule can.
    #[inline]
    pub(super) fn set_absmax(&mut self, level: Avx512, absmax: f32) -> bool {
        let inverse = 1.0 / absmax;
        if inverse.is_normal() {
            set_scale(level, &mut self.constants, inverse, self.table.quantizer().top_value(absmax));
        }
        inverse.is_normal()
    }

    /// Four registers' codes under the absmax last set, which the arithmetic takes.
    #[inline]
    pub(super) fn quantize_chunk(&self, level: Avx512, values: &[f32; Q], absmax: f32, codes: &mut [u8; Q]) {
        if self.table.quantizer().signed {
            quantize_chunk_signed(level, &self.constants, values, absmax, self.table, codes)
        } else {
            quantize_chunk_unsigned(level, &self.constants, values, absmax, self.table, codes)
        }
    }
}

fearless_simd::kernel!(
    /// Four registers' codes (0 to 255, which the saturating packs keep) as bytes in order:
    /// one byte pack and one permute (a register's own narrowing store is two shuffles).
    #[inline]
    fn pack(level: Avx512, codes: [__m512i; 4]) -> [u8; Q] {
        let [codes0, codes1, codes2, codes3] = codes;
        let order = bytemuck::cast::<[u32; L], __m512i>(PACKED_ORDER);
        let low = _mm512_packus_epi32(codes0, codes1);
        let packed = _mm512_packus_epi16(low, _mm512_packus_epi32(codes2, codes3));
        bytemuck::cast::<__m512i, [u8; Q]>(_mm512_permutexvar_epi32(order, packed))
    }
);

/// The constants of one map's requantizing loop; `reciprocal` and `top_value` are the
/// block's (`set_scale`).
struct Constants {
    lines: [[__m512; 2]; LINES],
    reciprocal: __m512,
    abs_mask: __m512i,
    clamp: __m512i,
    smallest: __m512i,
    near: __m512,
    top_value: __m512,
    top_code: __m512i,
    mirror: __m512i,
    /// The code above the code of 0 (128, signed): a negative value's code mirrors at least
    /// it, so no negative value takes the code of 0.
    first_positive: __m512i,
    infinity: __m512i,
    zero_code: __m512i,
}

fearless_simd::kernel!(
    /// The constants of `table`'s map, for an absmax of 1 until `set_scale`.
    #[inline]
    fn constants(level: Avx512, table: &CodeTable) -> Constants {
        let q: &Quantizer = table.quantizer();
        Constants {
            lines: std::array::from_fn(|l| {
                [
                    bytemuck::cast::<[f32; L], __m512>(q.line_scale[l]),
                    bytemuck::cast::<[f32; L], __m512>(q.line_offset[l]),
                ]
            }),
            reciprocal: _mm512_set1_ps(1.0),
            abs_mask: _mm512_set1_epi32(0x7fff_ffff),
            clamp: _mm512_set1_epi32(CLAMP.to_bits() as i32),
            smallest: _mm512_set1_epi32(FLOOR as i32),
            near: _mm512_set1_ps(NEAR),
            top_value: _mm512_set1_ps(q.top_value(1.0)),
            top_code: _mm512_set1_epi32(q.top_index + q.middle),
            mirror: _mm512_set1_epi32(2 * q.middle),
            first_positive: _mm512_set1_epi32(q.middle + 1),
            infinity: _mm512_set1_epi32(INFINITY as i32),
            zero_code: _mm512_set1_epi32(i32::from(q.zero)),
        }
    }
);

fearless_simd::kernel!(
    /// A block's constants: `1 / absmax`, and the least value that takes the top code.
    #[inline]
    fn set_scale(level: Avx512, c: &mut Constants, reciprocal: f32, top_value: f32) {
        c.reciprocal = _mm512_set1_ps(reciprocal);
        c.top_value = _mm512_set1_ps(top_value);
    }
);

fearless_simd::kernel!(
    /// One register's codes as i32 lanes, and the lanes whose position lies near a switch
    /// (their codes are left to the exact rule).
    #[inline]
    fn register_codes(level: Avx512, c: &Constants, v: __m512, signed: bool) -> (__m512i, __mmask16) {
        let x = _mm512_mul_ps(v, c.reciprocal);
        let bits = _mm512_castps_si512(x);
        let magnitude = _mm512_and_si512(bits, c.abs_mask);
        let negative = _mm512_movepi32_mask(bits);
        let clamped = _mm512_max_epu32(_mm512_min_epu32(magnitude, c.clamp), c.smallest);
        let m = _mm512_castsi512_ps(clamped);
        // The code position (`Quantizer::code_position`): the least of the span's lines
        // (the permutes read the low four bits of the span).
        let span = _mm512_srli_epi32::<SPAN_SHIFT>(clamped);
        let [[scale0, offset0], [scale1, offset1], [scale2, offset2]] = c.lines;
        let first =
            _mm512_fmadd_ps(m, _mm512_permutexvar_ps(span, scale0), _mm512_permutexvar_ps(span, offset0));
        let second =
            _mm512_fmadd_ps(m, _mm512_permutexvar_ps(span, scale1), _mm512_permutexvar_ps(span, offset1));
        let third =
            _mm512_fmadd_ps(m, _mm512_permutexvar_ps(span, scale2), _mm512_permutexvar_ps(span, offset2));
        let position = _mm512_min_ps(first, _mm512_min_ps(second, third));
        // Its distance to the nearest integer, exact (`position - round(position)`).
        let off = _mm512_reduce_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(position);
        let near = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(_mm512_abs_ps(off), c.near);
        let code = _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(position);
        // The code of 1, decided exactly on the value (not the product).
        let code = _mm512_mask_mov_epi32(code, _mm512_cmp_ps_mask::<_CMP_GE_OQ>(v, c.top_value), c.top_code);
        // A positive value's code is its code position's floor; a negative value's is 254
        // less that in the signed map (127 less its magnitude index, and at least 1 below the
        // code of 0: the sign rule of `nearest_code`, -0.0 included), the code of 0 in the
        // unsigned one.
        let code = if signed {
            let code = _mm512_mask_max_epi32(code, negative, code, c.first_positive);
            _mm512_mask_sub_epi32(code, negative, c.mirror, code)
        } else {
            _mm512_maskz_mov_epi32(!negative, code)
        };
        let finite = _mm512_cmplt_epu32_mask(magnitude, c.infinity);
        (_mm512_mask_mov_epi32(c.zero_code, finite, code), near)
    }
);

/// The requantizing loops of one map's sign (`$signed`, a constant in each): `$chunk`, four
/// registers' codes, and `$name`, a slice's.
macro_rules! quantize_map {
    ($(#[$doc:meta])* $name:ident, $chunk:ident, $signed:literal) => {
        fearless_simd::kernel!(
            /// Four registers' codes.
            #[inline]
            fn $chunk(
                level: Avx512,
                c: &Constants,
                chunk: &[f32; Q],
                absmax: f32,
                table: &CodeTable,
                out: &mut [u8; Q],
            ) {
                let signed = $signed;
                let [r0, r1, r2, r3] = bytemuck::cast::<[f32; Q], [__m512; 4]>(*chunk);
                let (codes0, near0) = register_codes(level, c, r0, signed);
                let (codes1, near1) = register_codes(level, c, r1, signed);
                let (codes2, near2) = register_codes(level, c, r2, signed);
                let (codes3, near3) = register_codes(level, c, r3, signed);
                *out = pack(level, [codes0, codes1, codes2, codes3]);
                let near = u64::from(near0)
                    | u64::from(near1) << L
                    | u64::from(near2) << (2 * L)
                    | u64::from(near3) << (3 * L);
                if near != 0 {
                    // Rare (one value in some two thousand): the exact rule for those lanes.
                    exact_lanes(chunk, near, absmax, table, out);
                }
            }
        );

        fearless_simd::kernel!(
            $(#[$doc])*
            fn $name(
                level: Avx512,
                c: &Constants,
                values: &[f32],
                absmax: f32,
                table: &CodeTable,
                codes: &mut [u8],
            ) {
                let signed = $signed;
                let (whole, tail) = values.as_chunks::<Q>();
                let (out, out_tail) = codes.split_at_mut(whole.len() * Q);
                for (chunk, out) in whole.iter().zip(out.as_chunks_mut::<Q>().0) {
                    $chunk(level, c, chunk, absmax, table, out);
                }
                let (registers, rest) = tail.as_chunks::<L>();
                let (out, out_rest) = out_tail.split_at_mut(registers.len() * L);
                for (register, out) in registers.iter().zip(out.as_chunks_mut::<L>().0) {
                    let (code, near) = register_codes(level, c, bytemuck::cast::<[f32; L], __m512>(*register), signed);
                    *out = bytemuck::cast::<__m128i, [u8; L]>(_mm512_cvtepi32_epi8(code));
                    if near != 0 {
                        exact_lanes(register, u64::from(near), absmax, table, out);
                    }
                }
                exact(rest, absmax, table, out_rest);
            }
        );
    };
}

/// The exact rule (`CodeTable::code` of the quotient), for lanes the arithmetic leaves to it.
fn exact(values: &[f32], absmax: f32, table: &CodeTable, codes: &mut [u8]) {
    for (code, value) in codes.iter_mut().zip(values) {
        *code = table.code(value / absmax);
    }
}

/// The exact rule for the lanes set in `lanes` only, the others' codes left as they are.
#[cold]
fn exact_lanes(values: &[f32], mut lanes: u64, absmax: f32, table: &CodeTable, codes: &mut [u8]) {
    while lanes != 0 {
        let i = lanes.trailing_zeros() as usize;
        lanes &= lanes - 1;
        if let (Some(code), Some(value)) = (codes.get_mut(i), values.get(i)) {
            *code = table.code(value / absmax);
        }
    }
}

quantize_map!(
    /// [`quantize`] for the signed map.
    quantize_signed,
    quantize_chunk_signed,
    true
);
quantize_map!(
    /// [`quantize`] for the unsigned map.
    quantize_unsigned,
    quantize_chunk_unsigned,
    false
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::q8::{nearest_code, signed_map, unsigned_map};

    /// Values of every kind: both signs, zeros (-0.0 too), subnormals, NaN, the infinities,
    /// values at and around every code, midpoint and switch, and pseudo-random ones, under a
    /// few absmax values.
    fn values(map: &[f32; 256], table: &CodeTable) -> Vec<f32> {
        let mut values =
            vec![0.0, -0.0, 1e-45, -1e-45, 1e-39, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.0, -1.0];
        for c in map {
            for delta in -2i32..=2 {
                let x = f32::from_bits(c.to_bits().wrapping_add_signed(delta));
                values.extend([x, -x]);
            }
        }
        // Every midpoint of neighbouring codes (an exact tie takes the even code, and below
        // the code of 0 the sign rule's threshold lies there) with its neighbours.
        for pair in map.windows(2) {
            let midpoint = (pair[0] + pair[1]) * 0.5;
            for delta in -2i32..=2 {
                let x = f32::from_bits(midpoint.to_bits().wrapping_add_signed(delta));
                values.extend([x, -x]);
            }
        }
        values.extend([-1e-30, -1e-10, -2.7e-7, -f32::MIN_POSITIVE]);
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
