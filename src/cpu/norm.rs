//! Gradient clipping's global norm on the host: every gradient's chunks in one parallel
//! iteration, each chunk's sum of squares in f64 (or its maximum), and the chunks combined
//! in their fixed order, so the same gradients give the same norm on any number of threads.

use rayon::prelude::*;

use super::convert::{bf16_to_f32, f16_to_f32};
use super::host::HostSlice;
use crate::NormType;

/// Elements per chunk (as many as the update's chunks).
const CHUNK: usize = 128 * 1024;

/// The norm of all of `grads` taken as one vector, in f32 as PyTorch returns it for f32
/// gradients. NaN if any element is NaN.
pub(super) fn global_norm(grads: &[HostSlice<'_>], norm: NormType) -> f32 {
    let mut chunks = Vec::new();
    for grad in grads {
        let mut rest = *grad;
        while !rest.is_empty() {
            let (chunk, tail) = rest.split_at(CHUNK);
            chunks.push(chunk);
            rest = tail;
        }
    }
    let partials: Vec<f64> = chunks.into_par_iter().map(|chunk| fold(chunk, norm)).collect();
    match norm {
        NormType::L2 => partials.iter().sum::<f64>().sqrt() as f32,
        NormType::Inf => partials.into_iter().fold(0.0, max_propagating_nan) as f32,
    }
}

/// A chunk's sum of squares, or its largest magnitude. 16-bit values are widened a block
/// at a time with the update's conversions.
fn fold(chunk: HostSlice<'_>, norm: NormType) -> f64 {
    const BLOCK: usize = 512;
    let fold_f32 = |values: &[f32]| match norm {
        NormType::L2 => sum_of_squares(values),
        NormType::Inf => max_magnitude(values),
    };
    let combine = |a: f64, b: f64| match norm {
        NormType::L2 => a + b,
        NormType::Inf => max_propagating_nan(a, b),
    };
    let mut scratch = [0f32; BLOCK];
    match chunk {
        HostSlice::F32(v) => fold_f32(v),
        HostSlice::F16(v) => v.chunks(BLOCK).fold(0.0, |acc, block| {
            f16_to_f32(block, &mut scratch[..block.len()]);
            combine(acc, fold_f32(&scratch[..block.len()]))
        }),
        HostSlice::BF16(v) => v.chunks(BLOCK).fold(0.0, |acc, block| {
            bf16_to_f32(block, &mut scratch[..block.len()]);
            combine(acc, fold_f32(&scratch[..block.len()]))
        }),
    }
}

/// Lanes of the vectorized folds: independent accumulators in a fixed order, so the result
/// does not depend on the vector width chosen at run time.
const LANES: usize = 8;

/// `sum x^2` in f64 (exact products, rounding only in the sums).
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn sum_of_squares(values: &[f32]) -> f64 {
    let mut lanes = [0f64; LANES];
    let mut eights = values.chunks_exact(LANES);
    for eight in &mut eights {
        for (lane, x) in lanes.iter_mut().zip(eight) {
            let x = f64::from(*x);
            *lane += x * x;
        }
    }
    let tail: f64 = eights.remainder().iter().map(|x| f64::from(*x) * f64::from(*x)).sum();
    lanes.iter().sum::<f64>() + tail
}

/// `max |x|`, NaN if any `x` is NaN.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn max_magnitude(values: &[f32]) -> f64 {
    let mut lanes = [0f32; LANES];
    let mut nan = false;
    let mut eights = values.chunks_exact(LANES);
    for eight in &mut eights {
        for (lane, x) in lanes.iter_mut().zip(eight) {
            nan |= x.is_nan();
            *lane = lane.max(x.abs());
        }
    }
    for x in eights.remainder() {
        nan |= x.is_nan();
        lanes[0] = lanes[0].max(x.abs());
    }
    if nan {
        f64::NAN
    } else {
        f64::from(lanes.iter().fold(0f32, |m, x| m.max(*x)))
    }
}

/// `torch.max` keeps NaN; `f64::max` would drop it.
fn max_propagating_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn norms_over_several_tensors_and_dtypes() {
        let a = vec![3.0f32; 5];
        let b = vec![half::bf16::from_f32(-4.0); 2];
        let grads = [HostSlice::F32(&a), HostSlice::BF16(&b)];
        // sqrt(5 * 9 + 2 * 16) = sqrt(77)
        assert_eq!(global_norm(&grads, NormType::L2), 77f64.sqrt() as f32);
        assert_eq!(global_norm(&grads, NormType::Inf), 4.0);
        let nan = [f32::NAN];
        let with_nan = [HostSlice::F32(&a), HostSlice::F32(&nan)];
        assert!(global_norm(&with_nan, NormType::L2).is_nan());
        assert!(global_norm(&with_nan, NormType::Inf).is_nan());
        assert_eq!(global_norm(&[], NormType::L2), 0.0);
    }
}
