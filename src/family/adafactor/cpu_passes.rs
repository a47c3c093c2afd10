//! Adafactor on the CPU backend: the passes of `src/family/adafactor/adafactor.wgsl` in f32, each tensor
//! cut into blocks of whole rows (vectors: of elements) that run in parallel.
//!
//! Every sum is deterministic: a block's sums are taken in a fixed order (eight lanes, then
//! the lanes in order), and the blocks' partial sums are combined in block order. Blocks are
//! cut by size, not by the number of threads, so the same inputs give the same bits on any
//! pool.
//!
//! Passes over a matrix (batched over the leading dimensions): (1) each row's and each
//! column's sum of `g^2` and the sum of `p^2`; then `row_var`, `col_var`, each batch's
//! mean of `row_var` and (where no floor can bind) the update's sum of squares on one
//! thread (they are small); (2) `p = p decay - scale U`. A vector: (1) `variance`, the sums
//! of `p^2` and of `U^2`; (2) the same apply. The gradient and the parameter are read twice
//! and the parameter written once, the least the update allows: its scale needs the whole
//! tensor's sums before any element changes, and the column factors need every row. The
//! state is sublinear; the passes' partial sums live in scratch made with the state, so a
//! step allocates nothing.

use std::any::Any;

use half::{bf16, f16};
use rayon::prelude::*;

use crate::cpu::host::{HostSlice, HostSliceMut};
use crate::cpu::passes::{CpuPasses, CpuStep};
use crate::cpu::state_memory::StateTensor;

use crate::algo::factored_dims;
use super::contract::AdafactorUniform;
use crate::{Algorithm, DType, OptimizerOptions, Result, StateKind};

/// Elements per block: rayon's per-item cost vanishes next to a block's work.
const BLOCK: usize = 64 * 1024;
/// The most blocks a matrix is cut into (larger blocks beyond): each block keeps two partial
/// sums per column until the whole matrix is read, so the scratch stays within
/// `2 MAX_BLOCKS` rows per matrix and their combination, on one thread, stays short.
const MAX_BLOCKS: usize = 64;
/// Independent partial sums per block: the loops vectorize over them.
const LANES: usize = 8;

/// One tensor's Adafactor state, in f32.
#[derive(Clone, Debug)]
struct AdafactorTensor {
    /// `(batches, rows, cols)` of a tensor of 2 or more dimensions; `None` for a vector.
    dims: Option<(usize, usize, usize)>,
    /// `row_var` (`batches * rows`) or, for a vector, `variance`; F32.
    first: StateTensor,
    /// `col_var` (`batches * cols`); empty for a vector.
    second: StateTensor,
    /// The step's working memory between its passes.
    scratch: Scratch,
}

/// How a matrix's rows are cut into blocks: by its shape alone, never by the thread count.
#[derive(Clone, Copy, Debug)]
struct Layout {
    batches: usize,
    rows: usize,
    cols: usize,
    /// Rows per block (each matrix's last block may hold fewer).
    block_rows: usize,
    /// Blocks per matrix.
    per_matrix: usize,
}

impl Layout {
    fn new((batches, rows, cols): (usize, usize, usize)) -> Self {
        let block_rows = (BLOCK / cols.max(1)).max(rows.div_ceil(MAX_BLOCKS)).clamp(1, rows.max(1));
        Layout { batches, rows, cols, block_rows, per_matrix: rows.div_ceil(block_rows) }
    }
}

/// A tensor's working memory between the passes of a step, made with its state.
#[derive(Clone, Debug)]
struct Scratch {
    /// A matrix: per block, its columns' partial sums of `g^2`, then of `g^2 / R_r` (`2 cols`
    /// values). Each matrix's first block ends up holding the matrix's totals, and its first
    /// `cols` values then the columns' `1 / sqrt(col_var)`.
    columns: Vec<f32>,
    /// A matrix: per block, a partial sum (of `p^2`, then of `U^2` where a floor may bind);
    /// a vector: two per block, of `p^2` and of `U^2`.
    blocks: Vec<f32>,
    /// Per matrix: the clamped mean of `row_var`.
    denoms: Vec<f32>,
    /// Per matrix: whether the `eps1^2` floor may bind (the element-wise path).
    floored: Vec<bool>,
    /// Per matrix: whether its states are NaN or infinite.
    nonfinite: Vec<bool>,
}

impl Scratch {
    fn new(dims: Option<(usize, usize, usize)>, len: usize) -> Self {
        match dims {
            Some(dims) => {
                let l = Layout::new(dims);
                let blocks = l.batches * l.per_matrix;
                Scratch {
                    columns: vec![0.0; blocks * 2 * l.cols],
                    blocks: vec![0.0; blocks],
                    denoms: vec![0.0; l.batches],
                    floored: vec![false; l.batches],
                    nonfinite: vec![false; l.batches],
                }
            }
            None => Scratch {
                columns: Vec::new(),
                blocks: vec![0.0; 2 * len.div_ceil(BLOCK)],
                denoms: Vec::new(),
                floored: Vec::new(),
                nonfinite: Vec::new(),
            },
        }
    }
}

impl AdafactorTensor {
    fn new(shape: &[usize]) -> Result<Self> {
        let zeros = |len: usize| StateTensor::filled(DType::F32, len, 0.0, 0);
        let (dims, len) = (factored_dims(shape), shape.iter().product());
        let scratch = Scratch::new(dims, len);
        Ok(match dims {
            Some((b, r, c)) => AdafactorTensor { dims, first: zeros(b * r)?, second: zeros(b * c)?, scratch },
            None => AdafactorTensor { dims, first: zeros(len)?, second: zeros(0)?, scratch },
        })
    }

    /// Its states in `adafactor_state_kinds` order.
    #[cfg(feature = "checkpoint")]
    fn states(&self) -> Vec<&StateTensor> {
        match self.dims {
            Some(_) => vec![&self.first, &self.second],
            None => vec![&self.first],
        }
    }
}

/// An F32 state's values (every Adafactor state is F32).
fn values(tensor: &mut StateTensor) -> &mut [f32] {
    match tensor.as_mut_slice() {
        HostSliceMut::F32(values) => values,
        _ => &mut [],
    }
}

/// A storage type the passes read and write.
trait Wide: Copy + Send + Sync {
    fn widen(self) -> f32;
    fn narrow(x: f32) -> Self;
}

impl Wide for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
    #[inline(always)]
    fn narrow(x: f32) -> Self {
        x
    }
}

impl Wide for f16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn narrow(x: f32) -> Self {
        f16::from_f32(x)
    }
}

impl Wide for bf16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn narrow(x: f32) -> Self {
        bf16::from_f32(x)
    }
}

/// torch's `lerp` (two forms, below and above a weight of one half), in f32.
#[inline(always)]
pub(crate) fn lerp(start: f32, end: f32, weight: f32) -> f32 {
    let diff = end - start;
    if weight.abs() < 0.5 {
        start + weight * diff
    } else {
        end - diff * (1.0 - weight)
    }
}

/// `(sum g^2, sum p^2)` of a row, each in [`LANES`] lanes added in order: whole chunks of
/// lanes (which the compiler vectorizes), then the tail.
#[inline(always)]
fn squares<P: Wide, G: Wide>(g: &[G], p: &[P]) -> (f32, f32) {
    let (mut g2, mut p2) = ([0f32; LANES], [0f32; LANES]);
    let (gc, pc) = (g.chunks_exact(LANES), p.chunks_exact(LANES));
    let (g_tail, p_tail) = (gc.remainder(), pc.remainder());
    for (g, p) in gc.zip(pc) {
        for k in 0..LANES {
            let (g, p) = (g[k].widen(), p[k].widen());
            g2[k] += g * g;
            p2[k] += p * p;
        }
    }
    for (k, (g, p)) in g_tail.iter().zip(p_tail).enumerate() {
        let (g, p) = (g.widen(), p.widen());
        g2[k] += g * g;
        p2[k] += p * p;
    }
    (fold(g2), fold(p2))
}

/// A row's share of the column sums: `sum += g^2`, `scaled += g^2 inverse`.
#[inline(always)]
fn columns<G: Wide>(g: &[G], inverse: f32, sums: &mut [f32], scaled: &mut [f32]) {
    for ((g, sum), scaled) in g.iter().zip(sums.iter_mut()).zip(scaled.iter_mut()) {
        let g = g.widen();
        let g2 = g * g;
        *sum += g2;
        *scaled += g2 * inverse;
    }
}

/// Two rows' share of the column sums, [`columns`] of each added together: half the reads
/// and writes of the sums, which bound the first pass once the rows are in cache.
#[inline(always)]
fn columns_pair<G: Wide>(a: &[G], b: &[G], (ia, ib): (f32, f32), sums: &mut [f32], scaled: &mut [f32]) {
    for (((a, b), sum), scaled) in a.iter().zip(b).zip(sums.iter_mut()).zip(scaled.iter_mut()) {
        let (a, b) = (a.widen(), b.widen());
        let (a2, b2) = (a * a, b * b);
        *sum += a2 + b2;
        *scaled += a2 * ia + b2 * ib;
    }
}

/// The first pass over one block of rows: its rows' new `row_var`, its columns' partial
/// sums (`sums`, `scaled`: of `g^2` and of `g^2 / R_r`, `cols` each), and its sum of `p^2`
/// (rows in order). A row's column sums need its `R_r`, so they are taken right after its
/// squares, while the row is in L1, two rows at a time (the block's first and second, third
/// and fourth, ...; an odd last row alone). (Interleaving them with the next row's squares,
/// to keep the memory streams busy, measured slower: the compiler then spills the lanes.)
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn block_sums<P: Wide, G: Wide>(
    weight: f32,
    p: &[P],
    g: &[G],
    row_var: &mut [f32],
    sums: &mut [f32],
    scaled: &mut [f32],
) -> f32 {
    let cols = sums.len();
    sums.fill(0.0);
    scaled.fill(0.0);
    let mut sum_p2 = 0f32;
    let mut rows = g.chunks_exact(cols).zip(p.chunks_exact(cols)).zip(row_var.iter_mut());
    while let Some(((g, p), rv)) = rows.next() {
        let inverse = row_sums(weight, g, p, rv, &mut sum_p2);
        match rows.next() {
            Some(((g2, p2), rv2)) => {
                let inverse2 = row_sums(weight, g2, p2, rv2, &mut sum_p2);
                columns_pair(g, g2, (inverse, inverse2), sums, scaled);
            }
            None => columns(g, inverse, sums, scaled),
        }
    }
    sum_p2
}

/// A row's squares: its new `row_var` (in place), `sum_p2 += sum p^2`, and `1 / row_var`.
/// A function rather than a closure: `multiversion` compiles a closure once, without the
/// target features of the version it is written in.
#[inline(always)]
fn row_sums<P: Wide, G: Wide>(weight: f32, g: &[G], p: &[P], row_var: &mut f32, sum_p2: &mut f32) -> f32 {
    let (row_g2, row_p2) = squares(g, p);
    *sum_p2 += row_p2;
    *row_var = lerp(*row_var, row_g2 / g.len() as f32, weight);
    1.0 / *row_var
}

/// The update of a block of rows where no floor binds: `U = g row inv_c` with the row's
/// factor `row = sign sqrt(denom / R_r)` and the columns' `inv` (`cols` values).
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn apply_block<P: Wide, G: Wide>(
    hp: &AdafactorUniform,
    scale: f32,
    denom: f32,
    p: &mut [P],
    g: &[G],
    row_var: &[f32],
    inv: &[f32],
) {
    let cols = inv.len();
    for ((p, g), rv) in p.chunks_exact_mut(cols).zip(g.chunks_exact(cols)).zip(row_var) {
        let row = hp.sign * (denom / rv).sqrt();
        for ((p, g), inv) in p.iter_mut().zip(g).zip(inv) {
            apply(hp, scale, p, g.widen() * row * inv);
        }
    }
}

/// The lanes of a partial sum, added in order.
#[inline(always)]
fn fold(lanes: [f32; LANES]) -> f32 {
    lanes.iter().fold(0.0, |a, b| a + b)
}

/// The step's values every element shares, in f32 as the shader reads them, with `eps1`
/// resolved for the group's first parameter's dtype.
#[derive(Clone, Copy, Debug)]
struct Scalars {
    hp: AdafactorUniform,
    eps1: f32,
}

/// Adafactor's passes on the CPU: each parameter's states, which the passes keep in place
/// of the optimizer's.
#[derive(Clone, Debug)]
pub(crate) struct AdafactorPasses {
    tensors: Vec<AdafactorTensor>,
}

impl AdafactorPasses {
    /// The states of an Adafactor optimizer over parameters of `lens`; refuses missing
    /// shapes before anything is made (the builder refused the options Adafactor does not
    /// run: its `FamilyConfig::check_options`).
    pub(crate) fn new(options: &OptimizerOptions, lens: &[usize]) -> Result<Self> {
        super::config::check_shapes_given(&options.param_shapes)?;
        debug_assert_eq!(options.param_shapes.len(), lens.len());
        let tensors = options.param_shapes.iter().map(|s| AdafactorTensor::new(s)).collect::<Result<_>>()?;
        Ok(AdafactorPasses { tensors })
    }
}

impl CpuPasses for AdafactorPasses {
    fn clone_box(&self) -> Box<dyn CpuPasses> {
        Box::new(self.clone())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    /// Every tensor's passes at step `t`; nothing is elementwise.
    fn step(&mut self, s: CpuStep<'_, '_, '_>) -> bool {
        let Algorithm::Adafactor(config) = s.algorithm else { return false };
        let crate::step::KernelStep::Adafactor(_, uniform) = config.kernel_step(s.t) else { return true };
        let hp = uniform.to_f32();
        let first = s.params.first().map_or(DType::F32, |p| p.dtype());
        let eps1 = config.eps1_for(first) as f32;
        let scalars = Scalars { hp, eps1 };
        for ((param, grad), state) in s.params.iter_mut().zip(s.grads).zip(&mut self.tensors) {
            use HostSlice as G;
            use HostSliceMut as P;
            match (param, grad) {
                (P::F32(p), G::F32(g)) => tensor(&scalars, state, p, g),
                (P::F32(p), G::F16(g)) => tensor(&scalars, state, p, g),
                (P::F32(p), G::BF16(g)) => tensor(&scalars, state, p, g),
                (P::F16(p), G::F32(g)) => tensor(&scalars, state, p, g),
                (P::F16(p), G::F16(g)) => tensor(&scalars, state, p, g),
                (P::F16(p), G::BF16(g)) => tensor(&scalars, state, p, g),
                (P::BF16(p), G::F32(g)) => tensor(&scalars, state, p, g),
                (P::BF16(p), G::F16(g)) => tensor(&scalars, state, p, g),
                (P::BF16(p), G::BF16(g)) => tensor(&scalars, state, p, g),
            }
        }
        true
    }

    fn keeps_states(&self) -> bool {
        true
    }

    /// `None` for a kind the tensor does not keep.
    fn state(&self, index: usize, kind: StateKind) -> Option<HostSlice<'_>> {
        let state = self.tensors.get(index)?;
        match (state.dims.is_some(), kind) {
            (true, StateKind::RowVar) | (false, StateKind::Variance) => Some(state.first.as_slice()),
            (true, StateKind::ColVar) => Some(state.second.as_slice()),
            _ => None,
        }
    }

    fn state_mut(&mut self, index: usize, kind: StateKind) -> Option<HostSliceMut<'_>> {
        let state = self.tensors.get_mut(index)?;
        match (state.dims.is_some(), kind) {
            (true, StateKind::RowVar) | (false, StateKind::Variance) => Some(state.first.as_mut_slice()),
            (true, StateKind::ColVar) => Some(state.second.as_mut_slice()),
            _ => None,
        }
    }

    /// In `adafactor_state_kinds` order, all f32.
    #[cfg(feature = "checkpoint")]
    fn checkpoint_states(&self, index: usize, shape: &[usize]) -> Vec<(StateKind, DType)> {
        if self.tensors.get(index).is_none() {
            return Vec::new();
        }
        crate::adafactor_state_kinds(shape).iter().map(|kind| (*kind, DType::F32)).collect()
    }

    #[cfg(feature = "checkpoint")]
    fn checkpoint_tensor(&self, index: usize, k: usize) -> Option<&StateTensor> {
        self.tensors.get(index)?.states().get(k).copied()
    }

    #[cfg(feature = "checkpoint")]
    fn checkpoint_tensor_mut(&mut self, index: usize, k: usize) -> Option<&mut StateTensor> {
        let state = self.tensors.get_mut(index)?;
        match (state.dims.is_some(), k) {
            (_, 0) => Some(&mut state.first),
            (true, 1) => Some(&mut state.second),
            _ => None,
        }
    }
}

/// One tensor's step.
fn tensor<P: Wide, G: Wide>(s: &Scalars, state: &mut AdafactorTensor, p: &mut [P], g: &[G]) {
    if p.is_empty() {
        return;
    }
    match state.dims {
        Some(dims) => matrix(s, state, p, g, Layout::new(dims)),
        None => vector(s, values(&mut state.first), &mut state.scratch.blocks, p, g),
    }
}

/// `torch.clamp(x, min=lo)`: a NaN stays NaN (`f32::max` would return `lo`).
#[inline(always)]
fn clamp_min(x: f32, lo: f32) -> f32 {
    if x.is_nan() {
        x
    } else {
        x.max(lo)
    }
}

/// `scale = alpha / max(1, rms(U) / d)` with `alpha = max(eps2, rms(p)) rho`. torch takes
/// both maxima with Python's `max` on the host, which drops a NaN second operand, as
/// `f32::max` does: a NaN parameter gives `alpha = eps2 rho`, a NaN update a scale of `alpha`.
fn step_scale(hp: &AdafactorUniform, sum_p2: f32, sum_u2: f32, n: usize) -> f32 {
    let root_n = (n as f32).sqrt();
    let alpha = hp.eps2.max(sum_p2.sqrt() / root_n) * hp.rho;
    alpha / 1f32.max(sum_u2.sqrt() / (root_n * hp.d))
}

#[inline(always)]
fn apply<P: Wide>(hp: &AdafactorUniform, scale: f32, p: &mut P, u: f32) {
    *p = P::narrow(p.widen() * hp.decay - scale * u);
}

/// A vector: blocks of elements; `variance` in place; `sums`: two per block.
fn vector<P: Wide, G: Wide>(s: &Scalars, variance: &mut [f32], sums: &mut [f32], p: &mut [P], g: &[G]) {
    let hp = &s.hp;
    let floor = s.eps1 * s.eps1;
    // (1) variance, and per block the sums of p^2 and U^2.
    p.par_chunks(BLOCK)
        .zip(g.par_chunks(BLOCK))
        .zip(variance.par_chunks_mut(BLOCK))
        .zip(sums.par_chunks_mut(2))
        .for_each(|(((p, g), v), sums)| {
            let (mut p2, mut u2) = ([0f32; LANES], [0f32; LANES]);
            for (k, ((p, g), v)) in p.iter().zip(g).zip(v.iter_mut()).enumerate() {
                let (p, g) = (p.widen(), g.widen() * hp.sign);
                p2[k % LANES] += p * p;
                *v = lerp(*v, g * g, hp.weight);
                let u = g / clamp_min(*v, floor).sqrt();
                u2[k % LANES] += u * u;
            }
            sums[0] = fold(p2);
            sums[1] = fold(u2);
        });
    let (sum_p2, sum_u2) = sums.chunks_exact(2).fold((0f32, 0f32), |(a, b), s| (a + s[0], b + s[1]));
    let scale = step_scale(hp, sum_p2, sum_u2, p.len());
    // (2) the update.
    p.par_chunks_mut(BLOCK).zip(g.par_chunks(BLOCK)).zip(variance.par_chunks(BLOCK)).for_each(
        |((p, g), v)| {
            for ((p, g), v) in p.iter_mut().zip(g).zip(v) {
                let u = g.widen() * hp.sign / clamp_min(*v, floor).sqrt();
                apply(hp, scale, p, u);
            }
        },
    );
}

/// A batch of matrices `[batches, rows, cols]`: blocks of whole rows within one matrix.
///
/// The update's sum of squares needs the new `col_var`, known only after every row is read;
/// without the `eps1^2` floor it is `sum_rc g^2 m / (R_r C_c) = m sum_c (1/C_c) T_c` with
/// `T_c = sum_r g_rc^2 / R_r`, and `R_r` is known as soon as row r is read. So the first
/// pass reads each row twice while it is in cache (its sum gives `R_r`, then `T` and the
/// column sums take it), and the step reads the gradient and the parameter twice in all.
/// Where the floor could bind (`min R min C < m eps1^2`, a zero row or column among them), a
/// pass of its own takes the sum element by element, as torch does.
fn matrix<P: Wide, G: Wide>(s: &Scalars, state: &mut AdafactorTensor, p: &mut [P], g: &[G], l: Layout) {
    let hp = &s.hp;
    let floor = s.eps1 * s.eps1;
    let Layout { batches, rows, cols, block_rows, per_matrix } = l;
    if rows == 0 || cols == 0 {
        return;
    }
    let (matrix_len, block_len, columns_len) = (rows * cols, block_rows * cols, per_matrix * 2 * cols);
    let scratch = &mut state.scratch;
    let (row_var, col_var) = (values(&mut state.first), values(&mut state.second));
    // (1) per block: its rows' new row_var, its columns' partial sums, its sum of p^2.
    // Blocks never straddle two matrices: each matrix's rows are cut alike.
    p.par_chunks(matrix_len)
        .zip(g.par_chunks(matrix_len))
        .zip(row_var.par_chunks_mut(rows))
        .zip(scratch.columns.par_chunks_mut(columns_len))
        .zip(scratch.blocks.par_chunks_mut(per_matrix))
        .for_each(|((((p, g), row_var), columns), sums)| {
            p.par_chunks(block_len)
                .zip(g.par_chunks(block_len))
                .zip(row_var.par_chunks_mut(block_rows))
                .zip(columns.par_chunks_mut(2 * cols))
                .zip(sums.par_iter_mut())
                .for_each(|((((p, g), row_var), columns), sum)| {
                    let (sums, scaled) = columns.split_at_mut(cols);
                    *sum = block_sums(hp.weight, p, g, row_var, sums, scaled);
                });
        });
    let sum_p2 = scratch.blocks.iter().fold(0f32, |a, b| a + b);
    // Each matrix's column factors, clamped mean of row_var and, where no floor binds, the
    // update's sum of squares, on one thread: they hold a few rows' worth of values.
    for b in 0..batches {
        let (total, parts) = scratch.columns[b * columns_len..(b + 1) * columns_len].split_at_mut(2 * cols);
        for part in parts.chunks_exact(2 * cols) {
            for (total, part) in total.iter_mut().zip(part) {
                *total += part;
            }
        }
        let (sums, _) = total.split_at_mut(cols);
        let cv = &mut col_var[b * cols..(b + 1) * cols];
        for (v, sum) in cv.iter_mut().zip(sums.iter()) {
            *v = lerp(*v, sum / rows as f32, hp.weight);
        }
        let rv = &row_var[b * rows..(b + 1) * rows];
        let mean = rv.iter().fold(0f32, |a, v| a + v) / rows as f32;
        let denom = clamp_min(mean, s.eps1);
        scratch.denoms[b] = denom;
        // A finite mean means every `row_var` is finite.
        let finite = denom.is_finite() && cv.iter().all(|c| c.is_finite());
        let min_r = rv.iter().fold(f32::INFINITY, |a, v| a.min(*v));
        let min_c = cv.iter().fold(f32::INFINITY, |a, v| a.min(*v));
        let exact = finite && min_r * min_c / denom >= floor && min_r > 0.0 && min_c > 0.0;
        // Non-finite states (from a NaN or infinite gradient) take the element-wise pass,
        // which carries them as torch does.
        scratch.floored[b] = !exact;
        scratch.nonfinite[b] = !finite;
        // Where no floor binds, `1 / sqrt(R C / m)` is `sqrt(m / R) / sqrt(C)`: a row's
        // factor times a column's, so the update's loop only multiplies.
        for (inv, c) in sums.iter_mut().zip(cv.iter()) {
            *inv = 1.0 / c.sqrt();
        }
    }
    // A matrix that saw a NaN or infinite gradient makes the update's norm NaN, so the
    // step's scale is torch's `alpha / max(1, NaN) = alpha` for every matrix of the tensor:
    // then each takes the element-wise pass, the device's formula, and both backends give
    // the same bits.
    if scratch.nonfinite.contains(&true) {
        scratch.floored.fill(true);
    }
    let mut sum_u2 = 0f32;
    for b in (0..batches).filter(|&b| !scratch.floored[b]) {
        let total = &scratch.columns[b * columns_len..b * columns_len + 2 * cols];
        let (cv, scaled) = (&col_var[b * cols..(b + 1) * cols], &total[cols..]);
        sum_u2 += scratch.denoms[b] * scaled.iter().zip(cv.iter()).fold(0f32, |a, (t, c)| a + t / c);
    }
    let (row_var, col_var) = (&*row_var, &*col_var);
    let (denoms, floored) = (&scratch.denoms[..], &scratch.floored[..]);
    // The update at `(r, c)` of matrix `b`, element by element as torch takes it.
    // `R / m` first, as the device's passes take it, so both give the same bits here.
    let u = move |r: usize, c: usize, g: f32, b: usize| {
        let v = row_var[r] / denoms[b] * col_var[b * cols + c];
        g * hp.sign / clamp_min(v, floor).sqrt()
    };
    // (2) where a floor may bind, the update's sum of squares element by element.
    if floored.contains(&true) {
        g.par_chunks(matrix_len).zip(scratch.blocks.par_chunks_mut(per_matrix)).enumerate().for_each(
            |(b, (g, sums))| {
                g.par_chunks(block_len).zip(sums.par_iter_mut()).enumerate().for_each(|(k, (g, sum))| {
                    *sum = 0.0;
                    if !floored[b] {
                        return;
                    }
                    let first = b * rows + k * block_rows;
                    let mut lanes = [0f32; LANES];
                    for (j, g) in g.chunks_exact(cols).enumerate() {
                        for (c, g) in g.iter().enumerate() {
                            let u = u(first + j, c, g.widen(), b);
                            lanes[c % LANES] += u * u;
                        }
                    }
                    *sum = fold(lanes);
                });
            },
        );
        sum_u2 += scratch.blocks.iter().fold(0f32, |a, b| a + b);
    }
    let scale = step_scale(hp, sum_p2, sum_u2, p.len());
    // (3) the update, in blocks of rows.
    let columns = &scratch.columns[..];
    p.par_chunks_mut(matrix_len)
        .zip(g.par_chunks(matrix_len))
        .zip(row_var.par_chunks(rows))
        .enumerate()
        .for_each(|(b, ((p, g), row_var))| {
            let inv = &columns[b * columns_len..b * columns_len + cols];
            let blocks =
                p.par_chunks_mut(block_len).zip(g.par_chunks(block_len)).zip(row_var.par_chunks(block_rows));
            blocks.enumerate().for_each(|(k, ((p, g), row_var))| {
                if !floored[b] {
                    return apply_block(hp, scale, denoms[b], p, g, row_var, inv);
                }
                let first = b * rows + k * block_rows;
                for (j, (p, g)) in p.chunks_exact_mut(cols).zip(g.chunks_exact(cols)).enumerate() {
                    for (c, (p, g)) in p.iter_mut().zip(g).enumerate() {
                        apply(hp, scale, p, u(first + j, c, g.widen(), b));
                    }
                }
            });
        });
}
