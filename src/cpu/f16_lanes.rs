//! f16 operands updated where they lie, eight elements at a time: each operand's eight
//! values widened by one F16C instruction into a register, the update on the registers,
//! each result narrowed by one instruction and stored. One pass over memory, as bf16's
//! loops, instead of the blocked path's round trip through f32 scratch.
//!
//! The conversions are F16C's, so the results are the blocked path's bit for bit: exact
//! widening, one rounding to nearest even per store, and the update itself is the same f32
//! element function. Where the CPU has no F16C (or is not x86-64) every element goes
//! through `half`'s scalar conversions instead: correct, and slower than the blocked path,
//! so [`available`] tells the caller which to take.

use half::f16;

/// Elements per register: one F16C conversion's width.
const LANES: usize = 8;

/// Whether the one-pass loops run on F16C here (otherwise the blocked path is faster).
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
pub(super) fn each<const N: usize>(
    mut rows: [&mut [f16]; N],
    grad: &[f16],
    update: impl Fn(f32, [f32; N]) -> [f32; N],
) {
    #[cfg(target_arch = "x86_64")]
    if let Some(avx2) = fearless_simd::Level::new().as_avx2() {
        return f16c::each(avx2, rows, grad, update);
    }
    for (i, g) in grad.iter().enumerate() {
        let new = update(g.to_f32(), std::array::from_fn(|k| rows[k][i].to_f32()));
        for (row, value) in rows.iter_mut().zip(new) {
            row[i] = f16::from_f32(value);
        }
    }
}

/// The conversions of one register, and the loop around the update. `convert` widens and
/// narrows its scratch blocks with the same two conversions.
#[cfg(target_arch = "x86_64")]
pub(super) mod f16c {
    use std::arch::x86_64::{__m128i, __m256, _mm256_cvtph_ps, _mm256_cvtps_ph, _MM_FROUND_TO_NEAREST_INT};

    use fearless_simd::{Avx2, Simd};
    use half::f16;

    use super::LANES;

    fearless_simd::kernel!(
        /// Exact.
        #[inline(always)]
        pub(in crate::cpu) fn widen(avx2: Avx2, values: [f16; 8]) -> [f32; 8] {
            bytemuck::cast::<__m256, [f32; 8]>(_mm256_cvtph_ps(bytemuck::cast::<[f16; 8], __m128i>(values)))
        }
    );

    fearless_simd::kernel!(
        /// To nearest even: the instruction's own rounding, not MXCSR's.
        #[inline(always)]
        pub(in crate::cpu) fn narrow(avx2: Avx2, values: [f32; 8]) -> [f16; 8] {
            let narrowed =
                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(bytemuck::cast::<[f32; 8], __m256>(values));
            bytemuck::cast::<__m128i, [f16; 8]>(narrowed)
        }
    );

    /// [`super::each`] on F16C. The loop runs inside `vectorize`, so the update is compiled
    /// for AVX2 with the conversions inlined, and works on all eight lanes at once. Every
    /// closure and helper on the way is `inline(always)`: code left out of `vectorize`'s
    /// function is compiled for baseline x86-64, where the conversions stay calls and the
    /// lanes stay scalar (a step took 5x as long).
    #[inline(always)]
    pub(super) fn each<const N: usize>(
        avx2: Avx2,
        rows: [&mut [f16]; N],
        grad: &[f16],
        update: impl Fn(f32, [f32; N]) -> [f32; N],
    ) {
        avx2.vectorize(
            #[inline(always)]
            || {
                let whole = grad.len() / LANES * LANES;
                let (grad_whole, grad_tail) = grad.split_at(whole);
                let grad_whole: &[[f16; LANES]] = bytemuck::cast_slice(grad_whole);
                // Each operand's whole registers, and the rest.
                let mut rows = rows.map(|row| {
                    let (head, tail) = row.split_at_mut(whole);
                    let head: &mut [[f16; LANES]] = bytemuck::cast_slice_mut(head);
                    (&mut head[..grad_whole.len()], tail)
                });
                // Four registers of each operand per iteration, written out: four independent
                // chains keep more loads in flight (a 16 Mi-element f16 Adam step took 13 ms
                // one register at a time, 9 ms two at a time, 7.3 ms four, and eight gained
                // nothing); an array built by a closure was not inlined and ran 10x slower.
                let unrolled = grad_whole.len() / 4 * 4;
                let mut i = 0;
                while i < unrolled {
                    let a = lanes(avx2, &update, grad_whole[i], std::array::from_fn(|k| rows[k].0[i]));
                    let b =
                        lanes(avx2, &update, grad_whole[i + 1], std::array::from_fn(|k| rows[k].0[i + 1]));
                    let c =
                        lanes(avx2, &update, grad_whole[i + 2], std::array::from_fn(|k| rows[k].0[i + 2]));
                    let d =
                        lanes(avx2, &update, grad_whole[i + 3], std::array::from_fn(|k| rows[k].0[i + 3]));
                    for (k, (head, _)) in rows.iter_mut().enumerate() {
                        head[i] = a[k];
                        head[i + 1] = b[k];
                        head[i + 2] = c[k];
                        head[i + 3] = d[k];
                    }
                    i += 4;
                }
                for i in unrolled..grad_whole.len() {
                    let new = lanes(avx2, &update, grad_whole[i], std::array::from_fn(|k| rows[k].0[i]));
                    for ((head, _), value) in rows.iter_mut().zip(new) {
                        head[i] = value;
                    }
                }
                // The last few elements padded to a register with zeros, which update
                // nothing that is kept.
                if !grad_tail.is_empty() {
                    let n = grad_tail.len();
                    let pad = |values: &[f16]| {
                        let mut padded = [f16::ZERO; LANES];
                        padded[..n].copy_from_slice(values);
                        padded
                    };
                    let new = lanes(avx2, &update, pad(grad_tail), std::array::from_fn(|k| pad(rows[k].1)));
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
    fn lanes<const N: usize>(
        avx2: Avx2,
        update: &impl Fn(f32, [f32; N]) -> [f32; N],
        grad: [f16; LANES],
        values: [[f16; LANES]; N],
    ) -> [[f16; LANES]; N] {
        let grad = widen(avx2, grad);
        let mut wide: [[f32; LANES]; N] = values.map(|v| widen(avx2, v));
        for lane in 0..LANES {
            let new = update(grad[lane], std::array::from_fn(|k| wide[k][lane]));
            for (row, value) in wide.iter_mut().zip(new) {
                row[lane] = value;
            }
        }
        wide.map(|v| narrow(avx2, v))
    }
}
