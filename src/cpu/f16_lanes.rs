//! f16 operands updated where they lie, a register of elements at a time: each operand's
//! values widened by one instruction into a register of f32 lanes, the update on the
//! registers, each result narrowed by one instruction and stored. One pass over memory, as
//! bf16's loops, instead of the blocked path's round trip through f32 scratch.
//!
//! Two register widths, picked at run time: sixteen lanes where the CPU has AVX-512
//! (`vcvtph2ps`/`vcvtps2ph` on `zmm`), eight where it has AVX2 and F16C. The conversions
//! are exact widening and one rounding to nearest even per store, so the results are the
//! blocked path's bit for bit, and the update itself is the same f32 element function.
//! Where the CPU has neither (or is not x86-64) every element goes through `half`'s scalar
//! conversions instead: correct, and slower than the blocked path, so [`available`] tells
//! the caller which to take.

use half::f16;

/// Whether the one-pass loops run on vector conversions here (otherwise the blocked path
/// is faster).
pub(super) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    if fearless_simd::Level::new().as_avx2().is_some() {
        return true;
    }
    false
}

/// Runs `update` on every element: the gradient (widened) and the `N` operands of `rows`
/// (widened), which it replaces with its results (narrowed). Every slice has the
/// gradient's length.
#[inline(always)]
pub(crate) fn each<const N: usize>(
    rows: [&mut [f16]; N],
    grad: &[f16],
    update: impl Fn(f32, [f32; N]) -> [f32; N],
) {
    #[cfg(target_arch = "x86_64")]
    {
        let level = fearless_simd::Level::new();
        if let Some(avx512) = level.as_avx512() {
            return registers::each(avx512, rows, grad, update);
        }
        if let Some(avx2) = level.as_avx2() {
            return registers::each(avx2, rows, grad, update);
        }
    }
    scalar(rows, grad, update)
}

/// Element by element through `half`'s conversions.
#[inline(always)]
fn scalar<const N: usize>(
    mut rows: [&mut [f16]; N],
    grad: &[f16],
    update: impl Fn(f32, [f32; N]) -> [f32; N],
) {
    for (i, g) in grad.iter().enumerate() {
        let new = update(g.to_f32(), std::array::from_fn(|k| rows[k][i].to_f32()));
        for (row, value) in rows.iter_mut().zip(new) {
            row[i] = f16::from_f32(value);
        }
    }
}

/// The conversions of one register of `L` lanes, and the loop around the update.
/// `convert` widens and narrows its scratch blocks with the same conversions.
#[cfg(target_arch = "x86_64")]
pub(super) mod registers {
    use std::arch::x86_64::{
        __m128i, __m256, __m256i, __m512, _mm256_cvtph_ps, _mm256_cvtps_ph, _mm512_cvtph_ps, _mm512_cvtps_ph,
        _MM_FROUND_TO_NEAREST_INT,
    };

    use fearless_simd::{Avx2, Avx512, Simd};
    use half::f16;

    /// A level whose registers convert `L` halves at once.
    pub(in crate::cpu) trait Width<const L: usize>: Simd {
        /// Exact.
        fn widen(self, values: [f16; L]) -> [f32; L];
        /// To nearest even: the instruction's own rounding, not MXCSR's.
        fn narrow(self, values: [f32; L]) -> [f16; L];
    }

    /// `Width<$lanes>` for `$level`: `$widen` and `$narrow` between `$half` (the register of
    /// halves) and `$wide` (the register of f32 lanes), each inside a `kernel!` so the
    /// intrinsics are called only with the token that proves their features.
    macro_rules! width {
        ($level:ident, $lanes:literal, $half:ty, $wide:ty, $widen:ident, $narrow:ident) => {
            impl Width<$lanes> for $level {
                #[inline(always)]
                fn widen(self, values: [f16; $lanes]) -> [f32; $lanes] {
                    fearless_simd::kernel!(
                        #[inline(always)]
                        fn widen(level: $level, values: [f16; $lanes]) -> [f32; $lanes] {
                            let halves = bytemuck::cast::<[f16; $lanes], $half>(values);
                            bytemuck::cast::<$wide, [f32; $lanes]>($widen(halves))
                        }
                    );
                    widen(self, values)
                }

                #[inline(always)]
                fn narrow(self, values: [f32; $lanes]) -> [f16; $lanes] {
                    fearless_simd::kernel!(
                        #[inline(always)]
                        fn narrow(level: $level, values: [f32; $lanes]) -> [f16; $lanes] {
                            let wide = bytemuck::cast::<[f32; $lanes], $wide>(values);
                            bytemuck::cast::<$half, [f16; $lanes]>($narrow::<_MM_FROUND_TO_NEAREST_INT>(wide))
                        }
                    );
                    narrow(self, values)
                }
            }
        };
    }

    width!(Avx2, 8, __m128i, __m256, _mm256_cvtph_ps, _mm256_cvtps_ph);
    width!(Avx512, 16, __m256i, __m512, _mm512_cvtph_ps, _mm512_cvtps_ph);

    /// [`super::each`] on registers of `L` lanes. The loop runs inside `vectorize`, so the
    /// update is compiled for the level's features with the conversions inlined, and works
    /// on all lanes at once. Every closure and helper on the way is `inline(always)`: code
    /// left out of `vectorize`'s function is compiled for baseline x86-64, where the
    /// conversions stay calls and the lanes stay scalar (a step took 5x as long).
    #[inline(always)]
    pub(crate) fn each<W: Width<L>, const L: usize, const N: usize>(
        level: W,
        rows: [&mut [f16]; N],
        grad: &[f16],
        update: impl Fn(f32, [f32; N]) -> [f32; N],
    ) {
        level.vectorize(
            #[inline(always)]
            || {
                let (grad_whole, grad_tail) = grad.as_chunks::<L>();
                // Each operand's whole registers, and the rest.
                let mut rows = rows.map(|row| {
                    let (head, tail) = row.split_at_mut(grad_whole.len() * L);
                    (head.as_chunks_mut::<L>().0, tail)
                });
                // Four registers of each operand per iteration, written out: four independent
                // chains keep more loads in flight (fewer were slower, eight gained nothing);
                // an array built by a closure was not inlined. Timings in PERF.md.
                let unrolled = grad_whole.len() / 4 * 4;
                let mut i = 0;
                while i < unrolled {
                    let a = lanes(level, &update, grad_whole[i], std::array::from_fn(|k| rows[k].0[i]));
                    let b =
                        lanes(level, &update, grad_whole[i + 1], std::array::from_fn(|k| rows[k].0[i + 1]));
                    let c =
                        lanes(level, &update, grad_whole[i + 2], std::array::from_fn(|k| rows[k].0[i + 2]));
                    let d =
                        lanes(level, &update, grad_whole[i + 3], std::array::from_fn(|k| rows[k].0[i + 3]));
                    for (k, (head, _)) in rows.iter_mut().enumerate() {
                        head[i] = a[k];
                        head[i + 1] = b[k];
                        head[i + 2] = c[k];
                        head[i + 3] = d[k];
                    }
                    i += 4;
                }
                for i in unrolled..grad_whole.len() {
                    let new = lanes(level, &update, grad_whole[i], std::array::from_fn(|k| rows[k].0[i]));
                    for ((head, _), value) in rows.iter_mut().zip(new) {
                        head[i] = value;
                    }
                }
                // The last few elements padded to a register with zeros, which update
                // nothing that is kept.
                if !grad_tail.is_empty() {
                    let n = grad_tail.len();
                    let pad = |values: &[f16]| {
                        let mut padded = [f16::ZERO; L];
                        padded[..n].copy_from_slice(values);
                        padded
                    };
                    let new = lanes(level, &update, pad(grad_tail), std::array::from_fn(|k| pad(rows[k].1)));
                    for ((_, tail), value) in rows.iter_mut().zip(new) {
                        tail.copy_from_slice(&value[..n]);
                    }
                }
            },
        )
    }

    /// One register of each operand through `update`, lane by lane: once inlined, LLVM
    /// turns the lane loop into one vector operation per step of the update (two registers
    /// of each operand at a time were left scalar).
    #[inline(always)]
    fn lanes<W: Width<L>, const L: usize, const N: usize>(
        level: W,
        update: &impl Fn(f32, [f32; N]) -> [f32; N],
        grad: [f16; L],
        values: [[f16; L]; N],
    ) -> [[f16; L]; N] {
        let grad = level.widen(grad);
        let mut wide: [[f32; L]; N] = values.map(|v| level.widen(v));
        for lane in 0..L {
            let new = update(grad[lane], std::array::from_fn(|k| wide[k][lane]));
            for (row, value) in wide.iter_mut().zip(new) {
                row[lane] = value;
            }
        }
        wide.map(|v| level.narrow(v))
    }
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::scalar;

    /// Halves of every kind: normal, subnormal, zero of both signs, infinities, NaN, and
    /// values whose update rounds halfway.
    fn halves(n: usize, seed: u16) -> Vec<f16> {
        (0..n as u16)
            .map(|i| match i % 11 {
                0 => f16::from_bits(0x0001 + (i % 7)),
                1 => f16::NEG_ZERO,
                2 => f16::INFINITY,
                3 => f16::NAN,
                _ => f16::from_bits(i.wrapping_mul(40503).wrapping_add(seed) & 0x7bff),
            })
            .collect()
    }

    /// Every register width this CPU has gives the scalar path's bits, over lengths that
    /// leave every kind of remainder after the four-register loop.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn every_register_width_matches_the_scalar_conversions_bit_for_bit() {
        let update = |g: f32, [p, m]: [f32; 2]| [p - 0.01 * g, 0.9 * m + 0.1 * g];
        let level = fearless_simd::Level::new();
        for n in [0, 1, 7, 8, 15, 16, 17, 63, 64, 65, 127, 1077] {
            let grad = halves(n, 3);
            let run = |each: &dyn Fn(&mut [f16], &mut [f16])| {
                let (mut p, mut m) = (halves(n, 5), halves(n, 9));
                each(&mut p, &mut m);
                (
                    p.iter().map(|h| h.to_bits()).collect::<Vec<_>>(),
                    m.iter().map(|h| h.to_bits()).collect::<Vec<_>>(),
                )
            };
            let expected = run(&|p, m| scalar([p, m], &grad, update));
            if let Some(avx2) = level.as_avx2() {
                assert_eq!(
                    run(&|p, m| super::registers::each(avx2, [p, m], &grad, update)),
                    expected,
                    "F16C, n = {n}"
                );
            }
            if let Some(avx512) = level.as_avx512() {
                let got = run(&|p, m| super::registers::each(avx512, [p, m], &grad, update));
                assert_eq!(got, expected, "AVX-512, n = {n}");
            }
        }
    }
}
