//! Muon on the CPU backend: each matrix's momentum EMA and Newton-Schulz orthogonalization,
//! producing the update `ratio O` in the parameter's layout that the Muon family's
//! elementwise loop (`crate::family::muon::cpu::muon`) applies with the decay.
//!
//! The matrix products are faer's (`gemm`'s blocked SIMD kernels, on rayon's pool), f32
//! in and out with f32 accumulation. In [`NsPrecision::BF16`] every Newton-Schulz result
//! is rounded to bfloat16, as torch's bfloat16 tensors are after each op.

use std::any::Any;

use faer::linalg::matmul::matmul;
use faer::linalg::matmul::triangular::{self, BlockStructure};
use faer::{Accum, MatMut, MatRef, Par};
use half::{bf16, f16};

use crate::cpu::convert::{bf16_to_f32, f16_to_f32};
use crate::cpu::host::{HostSlice, HostSliceMut};
use crate::cpu::kernels::Kernel;
use crate::cpu::passes::{CpuPasses, CpuStep};
use crate::cpu::state_memory::StateTensor;
use crate::cpu::storage::Stores;
use crate::cpu::work;
use crate::{Algorithm, Error, Muon, NsPrecision, OptimizerOptions, Result};

/// Rounds every element to bfloat16 (nearest even), kept in f32.
fn round_bf16(values: &mut [f32]) {
    for v in values {
        *v = bf16::from_f32(*v).to_f32();
    }
}

/// The memory of a Muon step, made at build and reused by every step: each matrix's
/// update, and the Newton-Schulz operands sized for the largest matrix.
#[derive(Clone, Default)]
pub(crate) struct Scratch {
    /// Each parameter's update `ratio O`, in its layout: the elementwise pass's gradient.
    updates: Vec<Vec<f32>>,
    /// X and the next X (min x max).
    x: Vec<f32>,
    next: Vec<f32>,
    /// M and N (min x min).
    m: Vec<f32>,
    n: Vec<f32>,
}

impl std::fmt::Debug for Scratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scratch").field("matrices", &self.updates.len()).finish()
    }
}

impl Scratch {
    /// The scratch of matrices of `shapes` (none for another algorithm).
    fn new(shapes: &[(usize, usize)]) -> Self {
        let (mut len, mut square) = (0, 0);
        for &(rows, cols) in shapes {
            len = len.max(rows * cols);
            square = square.max(rows.min(cols).pow(2));
        }
        Scratch {
            updates: shapes.iter().map(|(rows, cols)| vec![0f32; rows * cols]).collect(),
            x: vec![0f32; len],
            next: vec![0f32; len],
            m: vec![0f32; square],
            n: vec![0f32; square],
        }
    }
}

/// `buffer = lerp(buffer, g, 1 - momentum)` in place (stored in the buffer's dtype), and
/// into `u` (of the gradient's length) the matrix to orthogonalize: `lerp(g, buffer,
/// momentum)` with Nesterov, else the buffer. torch's `lerp` takes `end - (end - start)
/// (1 - w)` for `w >= 0.5`, else `start + w (end - start)`; the formulas here are those.
fn momentum(config: &Muon, grad: HostSlice<'_>, buffer: HostSliceMut<'_>, u: &mut [f32]) {
    // The gradient widened to f32 (exactly), in `u` until each element is replaced.
    match grad {
        HostSlice::F32(v) => u.copy_from_slice(v),
        HostSlice::F16(v) => f16_to_f32(v, u),
        HostSlice::BF16(v) => bf16_to_f32(v, u),
    }
    let mu = config.momentum as f32;
    let w = 1.0 - mu;
    let lerp = |start: f32, end: f32, w: f32| {
        if w < 0.5 {
            start + w * (end - start)
        } else {
            end - (end - start) * (1.0 - w)
        }
    };
    // `g` and the buffer as stored after the EMA (rounded to its dtype), as torch's next
    // line reads it.
    let out = |g: f32, stored: f32| if config.nesterov { lerp(g, stored, mu) } else { stored };
    match buffer {
        HostSliceMut::F32(b) => {
            for (b, u) in b.iter_mut().zip(u) {
                *b = lerp(*b, *u, w);
                *u = out(*u, *b);
            }
        }
        HostSliceMut::F16(b) => {
            for (b, u) in b.iter_mut().zip(u) {
                *b = f16::from_f32(lerp(b.to_f32(), *u, w));
                *u = out(*u, b.to_f32());
            }
        }
        HostSliceMut::BF16(b) => {
            for (b, u) in b.iter_mut().zip(u) {
                *b = bf16::from_f32(lerp(b.to_f32(), *u, w));
                *u = out(*u, b.to_f32());
            }
        }
    }
}

/// Multiply-adds of `X Xᵀ` from which a matrix's products run on rayon's threads.
#[cfg(not(target_arch = "wasm32"))]
const PARALLEL_WORK: usize = 1 << 18;

/// Newton-Schulz on `x` (`rows` x `cols`, row-major, `rows <= cols`), with `next` of its
/// length and `m`, `n` of `rows * rows` as scratch: the slice (`x` or `next`) that holds
/// the result.
fn newton_schulz<'a>(
    config: &Muon,
    mut x: &'a mut [f32],
    mut next: &'a mut [f32],
    m: &mut [f32],
    n: &mut [f32],
    rows: usize,
    cols: usize,
) -> &'a mut [f32] {
    let bf16 = config.ns_precision == NsPrecision::BF16;
    let round = |v: &mut [f32]| {
        if bf16 {
            round_bf16(v)
        }
    };
    let round_one = |v: f32| if bf16 { bf16::from_f32(v).to_f32() } else { v };
    round(x);
    // The norm in f64 (torch accumulates bfloat16 norms in f32; either is exact enough),
    // then rounded to the iteration's precision, as torch's 0-d result is.
    let norm = round_one(x.iter().map(|v| f64::from(*v) * f64::from(*v)).sum::<f64>().sqrt() as f32);
    let norm = norm.max(round_one(config.eps as f32));
    for v in x.iter_mut() {
        *v /= norm;
    }
    round(x);
    let (a, b, c) = config.ns_coefficients;
    let (a, b, c) = (a as f32, b as f32, c as f32);
    // rayon's pool natively, for products large enough to share (a few hundred thousand
    // multiply-adds: below that, handing out the work costs more than it saves; a step of
    // 200 matrices of 4 x 1024 took 2.1 times as long on two threads as on one); in a
    // browser (faer built without it, no threads) one thread.
    #[cfg(not(target_arch = "wasm32"))]
    let par = if rows * rows * cols >= PARALLEL_WORK { Par::rayon(0) } else { Par::Seq };
    #[cfg(target_arch = "wasm32")]
    let par = Par::Seq;
    // Every element of `m`, `n` and `next` is written before it is read.
    for _ in 0..config.ns_steps {
        // M = X Xᵀ (the transpose is a view, never a copy) and N = b M + c M M are
        // symmetric: only their lower halves are computed (half the products' work), then
        // mirrored.
        {
            let xr = MatRef::from_row_major_slice(&*x, rows, cols);
            let dst = MatMut::from_row_major_slice_mut(&mut *m, rows, rows);
            lower(dst, Accum::Replace, xr, xr.transpose(), 1.0, par);
        }
        mirror(m, rows);
        round(m);
        for (n, m) in n.iter_mut().zip(m.iter()) {
            *n = b * m;
        }
        {
            let mr = MatRef::from_row_major_slice(&*m, rows, rows);
            lower(MatMut::from_row_major_slice_mut(&mut *n, rows, rows), Accum::Add, mr, mr, c, par);
        }
        mirror(n, rows);
        round(n);
        // X = a X + N X.
        for (o, v) in next.iter_mut().zip(x.iter()) {
            *o = a * v;
        }
        {
            let nr = MatRef::from_row_major_slice(&*n, rows, rows);
            let xr = MatRef::from_row_major_slice(&*x, rows, cols);
            matmul(MatMut::from_row_major_slice_mut(&mut *next, rows, cols), Accum::Add, nr, xr, 1.0, par);
        }
        round(next);
        std::mem::swap(&mut x, &mut next);
    }
    x
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

/// One Muon matrix: updates its momentum `buffer` from `grad` and writes `ratio NS(u)`
/// into `out`, in the parameter's layout (`shape` = (A, B), row-major).
fn update(
    config: &Muon,
    shape: (usize, usize),
    grad: HostSlice<'_>,
    buffer: &mut StateTensor,
    out: &mut [f32],
    scratch: (&mut [f32], &mut [f32], &mut [f32], &mut [f32]),
) {
    let (rows, cols) = shape;
    let ratio = config.adjust_lr.ratio(rows, cols) as f32;
    let tall = rows > cols;
    // X is (min, max): the transpose of a tall matrix.
    let (r, k) = if tall { (cols, rows) } else { (rows, cols) };
    let (x, next, m, n) = scratch;
    let (x, next, m, n) = (&mut x[..r * k], &mut next[..r * k], &mut m[..r * r], &mut n[..r * r]);
    // `u` goes straight into X, or into `out` (overwritten below) to be transposed.
    if tall {
        momentum(config, grad, buffer.as_mut_slice(), out);
        transpose(out, rows, cols, x);
    } else {
        momentum(config, grad, buffer.as_mut_slice(), x);
    }
    let o = newton_schulz(config, x, next, m, n, r, k);
    if tall {
        transpose(o, r, k, out);
    } else {
        out.copy_from_slice(o);
    }
    for v in out.iter_mut() {
        *v *= ratio;
    }
}

/// `values` (`rows` x `cols`, row-major) transposed into `out` (of the same length).
fn transpose(values: &[f32], rows: usize, cols: usize, out: &mut [f32]) {
    for (i, row) in values.chunks_exact(cols.max(1)).enumerate().take(rows) {
        for (j, v) in row.iter().enumerate() {
            out[j * rows + i] = *v;
        }
    }
}

/// The matrix shapes of a Muon optimizer's `count` parameters, checked at build: shapes
/// given and 2-D ([`crate::algo::matrix_shapes`]), and no gradient clipping (its
/// coefficient would scale the orthogonalized update, not the gradient). Empty for the
/// other algorithms.
fn check(algorithm: &Algorithm, options: &OptimizerOptions, count: usize) -> Result<Vec<(usize, usize)>> {
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

/// Every matrix's update `ratio O` into `scratch.updates` (and its momentum buffer,
/// `state[i][0]`, updated).
fn updates(
    config: &Muon,
    shapes: &[(usize, usize)],
    grads: &[HostSlice<'_>],
    state: &mut [Vec<StateTensor>],
    scratch: &mut Scratch,
) {
    let Scratch { updates, x, next, m, n } = scratch;
    for (((shape, grad), state), out) in shapes.iter().zip(grads).zip(state).zip(updates) {
        update(config, *shape, *grad, &mut state[0], out, (x, next, m, n));
    }
}

/// Muon's passes on the CPU: each parameter's (rows, cols), and the updates and
/// Newton-Schulz operands every step reuses.
#[derive(Clone, Debug)]
pub(crate) struct MuonPasses {
    shapes: Vec<(usize, usize)>,
    scratch: Scratch,
}

impl MuonPasses {
    /// The passes over `count` parameters of a Muon optimizer built with `options`; refuses
    /// what Muon does not run.
    pub(crate) fn new(algorithm: &Algorithm, options: &OptimizerOptions, count: usize) -> Result<Self> {
        let shapes = check(algorithm, options, count)?;
        Ok(MuonPasses { scratch: Scratch::new(&shapes), shapes })
    }
}

impl CpuPasses for MuonPasses {
    fn clone_box(&self) -> Box<dyn CpuPasses> {
        Box::new(self.clone())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    /// The orthogonalized updates take the gradients' place; the elementwise loop keeps no
    /// state of its own (the momentum buffers were updated here).
    fn step(&mut self, s: CpuStep<'_, '_, '_>) -> bool {
        let Algorithm::Muon(config) = s.algorithm else { return false };
        updates(config, &self.shapes, s.grads, s.state, &mut self.scratch);
        run_apply(s.kernel, s.stores, s.params, &self.scratch.updates, s.compensation);
        true
    }
}

/// The elementwise apply pass, with each update as its parameter's gradient.
fn run_apply(
    kernel: &Kernel,
    stores: &Stores,
    params: &mut [HostSliceMut<'_>],
    updates: &[Vec<f32>],
    compensation: &mut [StateTensor],
) {
    let grads = updates.iter().map(|u| HostSlice::F32(u));
    let no_state = std::iter::repeat_with(|| &mut [][..]);
    work::run_jobs(kernel, stores, work::jobs(params, grads, no_state, compensation));
}
