//! Muon on the CPU backend: each matrix's momentum EMA and Newton-Schulz orthogonalization,
//! producing the update `ratio O` in the parameter's layout that the Muon family's
//! elementwise loop (`kernels::muon`) applies with the decay.
//!
//! The matrix products are faer's (`gemm`'s blocked SIMD kernels, on rayon's pool), f32
//! in and out with f32 accumulation. In [`NsPrecision::BF16`] every Newton-Schulz result
//! is rounded to bfloat16, as torch's bfloat16 tensors are after each op.

use faer::linalg::matmul::matmul;
use faer::linalg::matmul::triangular::{self, BlockStructure};
use faer::{Accum, MatMut, MatRef, Par};
use half::{bf16, f16};

use super::host::{HostSlice, HostSliceMut};
use super::state_memory::StateTensor;
use crate::{Algorithm, Error, Muon, NsPrecision, OptimizerOptions, Result};

/// Rounds every element to bfloat16 (nearest even), kept in f32.
fn round_bf16(values: &mut [f32]) {
    for v in values {
        *v = bf16::from_f32(*v).to_f32();
    }
}

/// The gradient widened to f32.
fn widen(grad: HostSlice<'_>) -> Vec<f32> {
    match grad {
        HostSlice::F32(v) => v.to_vec(),
        HostSlice::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
        HostSlice::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
    }
}

/// `buffer = lerp(buffer, g, 1 - momentum)` in place (stored in the buffer's dtype), and
/// the matrix to orthogonalize: `lerp(g, buffer, momentum)` with Nesterov, else the buffer.
/// torch's `lerp` takes `end - (end - start) (1 - w)` for `w >= 0.5`, else
/// `start + w (end - start)`; the formulas here are those.
fn momentum(config: &Muon, grad: &[f32], buffer: HostSliceMut<'_>) -> Vec<f32> {
    let mu = config.momentum as f32;
    let w = 1.0 - mu;
    let lerp = |start: f32, end: f32, w: f32| {
        if w < 0.5 {
            start + w * (end - start)
        } else {
            end - (end - start) * (1.0 - w)
        }
    };
    let step = |b: f32, g: f32| lerp(b, g, w);
    // The buffer as stored after the EMA (rounded to its dtype), as torch's next line reads it.
    let stored: Vec<f32> = match buffer {
        HostSliceMut::F32(b) => b
            .iter_mut()
            .zip(grad)
            .map(|(b, &g)| {
                *b = step(*b, g);
                *b
            })
            .collect(),
        HostSliceMut::F16(b) => b
            .iter_mut()
            .zip(grad)
            .map(|(b, &g)| {
                *b = f16::from_f32(step(b.to_f32(), g));
                b.to_f32()
            })
            .collect(),
        HostSliceMut::BF16(b) => b
            .iter_mut()
            .zip(grad)
            .map(|(b, &g)| {
                *b = bf16::from_f32(step(b.to_f32(), g));
                b.to_f32()
            })
            .collect(),
    };
    if config.nesterov {
        grad.iter().zip(&stored).map(|(&g, &b)| lerp(g, b, mu)).collect()
    } else {
        stored
    }
}

/// Newton-Schulz on `x` (`rows` x `cols`, row-major, `rows <= cols`), in place.
fn newton_schulz(config: &Muon, x: &mut Vec<f32>, rows: usize, cols: usize) {
    let bf16 = config.ns_precision == NsPrecision::BF16;
    let round = |v: &mut [f32]| {
        if bf16 {
            round_bf16(v)
        }
    };
    round(x);
    // The norm in f64 (torch accumulates bfloat16 norms in f32; either is exact enough),
    // then rounded to the iteration's precision, as torch's 0-d result is.
    let mut norm = vec![x.iter().map(|v| f64::from(*v) * f64::from(*v)).sum::<f64>().sqrt() as f32];
    round(&mut norm);
    let mut eps = vec![config.eps as f32];
    round(&mut eps);
    let norm = norm[0].max(eps[0]);
    for v in x.iter_mut() {
        *v /= norm;
    }
    round(x);
    let (a, b, c) = config.ns_coefficients;
    let (a, b, c) = (a as f32, b as f32, c as f32);
    // rayon's pool natively; in a browser (faer built without it, no threads) one thread.
    #[cfg(not(target_arch = "wasm32"))]
    let par = Par::rayon(0);
    #[cfg(target_arch = "wasm32")]
    let par = Par::Seq;
    let mut m = vec![0f32; rows * rows];
    let mut n = vec![0f32; rows * rows];
    let mut next = vec![0f32; rows * cols];
    for _ in 0..config.ns_steps {
        // M = X Xᵀ (the transpose is a view, never a copy) and N = b M + c M M are
        // symmetric: only their lower halves are computed (half the products' work), then
        // mirrored.
        {
            let xr = MatRef::from_row_major_slice(x.as_slice(), rows, cols);
            let dst = MatMut::from_row_major_slice_mut(&mut m, rows, rows);
            lower(dst, Accum::Replace, xr, xr.transpose(), 1.0, par);
        }
        mirror(&mut m, rows);
        round(&mut m);
        for (n, m) in n.iter_mut().zip(&m) {
            *n = b * m;
        }
        {
            let mr = MatRef::from_row_major_slice(m.as_slice(), rows, rows);
            lower(MatMut::from_row_major_slice_mut(&mut n, rows, rows), Accum::Add, mr, mr, c, par);
        }
        mirror(&mut n, rows);
        round(&mut n);
        // X = a X + N X.
        for (o, v) in next.iter_mut().zip(x.iter()) {
            *o = a * v;
        }
        {
            let nr = MatRef::from_row_major_slice(n.as_slice(), rows, rows);
            let xr = MatRef::from_row_major_slice(x.as_slice(), rows, cols);
            matmul(MatMut::from_row_major_slice_mut(&mut next, rows, cols), Accum::Add, nr, xr, 1.0, par);
        }
        round(&mut next);
        std::mem::swap(x, &mut next);
    }
}

/// The lower half (with the diagonal) of `dst = alpha lhs rhs` (or `+=`), for a product
/// known to be symmetric.
fn lower(
    dst: MatMut<'_, f32>,
    accum: Accum,
    lhs: MatRef<'_, f32>,
    rhs: MatRef<'_, f32>,
    alpha: f32,
    par: Par,
) {
    let full = BlockStructure::Rectangular;
    triangular::matmul(dst, BlockStructure::TriangularLower, accum, lhs, full, rhs, full, alpha, par);
}

/// Copies the lower half of the `n` x `n` row-major `m` onto its upper half.
fn mirror(m: &mut [f32], n: usize) {
    for i in 0..n {
        for j in i + 1..n {
            m[i * n + j] = m[j * n + i];
        }
    }
}

/// One Muon matrix: updates its momentum `buffer` from `grad` and returns
/// `ratio NS(u)` in the parameter's layout (`shape` = (A, B), row-major).
pub(super) fn update(
    config: &Muon,
    shape: (usize, usize),
    grad: HostSlice<'_>,
    buffer: &mut StateTensor,
) -> Vec<f32> {
    let (rows, cols) = shape;
    let u = momentum(config, &widen(grad), buffer.as_mut_slice());
    let ratio = config.adjust_lr.ratio(rows, cols) as f32;
    let tall = rows > cols;
    // X is (min, max): the transpose of a tall matrix.
    let (r, k) = if tall { (cols, rows) } else { (rows, cols) };
    let mut x = if tall { transpose(&u, rows, cols) } else { u };
    newton_schulz(config, &mut x, r, k);
    let mut out = if tall { transpose(&x, r, k) } else { x };
    for v in &mut out {
        *v *= ratio;
    }
    out
}

/// `values` (`rows` x `cols`, row-major) transposed.
fn transpose(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; values.len()];
    for (i, row) in values.chunks_exact(cols.max(1)).enumerate().take(rows) {
        for (j, v) in row.iter().enumerate() {
            out[j * rows + i] = *v;
        }
    }
    out
}

/// The matrix shapes of a Muon optimizer's `count` parameters, checked at build: shapes
/// given and 2-D ([`crate::algo::matrix_shapes`]), and no gradient clipping (its
/// coefficient would scale the orthogonalized update, not the gradient). Empty for the
/// other algorithms.
pub(super) fn check(
    algorithm: &Algorithm,
    options: &OptimizerOptions,
    count: usize,
) -> Result<Vec<(usize, usize)>> {
    if !matches!(algorithm, Algorithm::Muon(_)) {
        return Ok(Vec::new());
    }
    if options.grad_clip.is_some() {
        return Err(Error::ConflictingOptions {
            first: "grad_clip",
            second: "algorithm",
            reason: "Muon normalizes each momentum matrix before Newton-Schulz, so a global clipping \
                     coefficient would change nothing but the momentum's mix of steps; it is not \
                     implemented for Muon",
        });
    }
    crate::algo::matrix_shapes(&options.param_shapes, 0..count)
}

/// Every matrix's update `ratio O` (and its momentum buffer, `state[i][0]`, updated).
pub(super) fn updates(
    config: &Muon,
    shapes: &[(usize, usize)],
    grads: &[HostSlice<'_>],
    state: &mut [Vec<StateTensor>],
) -> Vec<Vec<f32>> {
    shapes
        .iter()
        .zip(grads)
        .zip(state)
        .map(|((shape, grad), state)| update(config, *shape, *grad, &mut state[0]))
        .collect()
}
