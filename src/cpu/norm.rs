//! Gradient clipping's global norm on the host: every gradient's chunks in one parallel
//! iteration, each chunk's sum (or maximum) in f64, and the chunks combined in their fixed
//! order, so the same gradients give the same norm on any number of threads.

use rayon::prelude::*;

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

/// A chunk's sum of squares, or its largest magnitude.
fn fold(chunk: HostSlice<'_>, norm: NormType) -> f64 {
    let values: Box<dyn Iterator<Item = f64> + '_> = match chunk {
        HostSlice::F32(v) => Box::new(v.iter().map(|x| f64::from(*x))),
        HostSlice::F16(v) => Box::new(v.iter().map(|x| f64::from(x.to_f32()))),
        HostSlice::BF16(v) => Box::new(v.iter().map(|x| f64::from(x.to_f32()))),
    };
    match norm {
        NormType::L2 => values.map(|x| x * x).sum(),
        NormType::Inf => values.map(f64::abs).fold(0.0, max_propagating_nan),
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
