//! Adafactor on the CPU backend: the passes of `shaders/adafactor.wgsl` in f32, each tensor
//! cut into blocks of whole rows (vectors: of elements) that run in parallel.
//!
//! Every sum is deterministic: a block's sums are taken in a fixed order (eight lanes, then
//! the lanes in order), and the blocks' partial sums are combined in block order. Blocks are
//! cut by size, not by the number of threads, so the same inputs give the same bits on any
//! pool.
//!
//! Passes over a matrix (batched over the leading dimensions): (1) each row's and each
//! column's sum of `g^2` and the sum of `p^2`; then `row_var`, `col_var` and each batch's
//! mean of `row_var` on one thread (they are small); (2) the update's sum of squares;
//! (3) `p = p decay - scale U`. A vector: (1) `variance`, the sums of `p^2` and of `U^2`;
//! (2) the same apply. The gradient is read three times (twice for a vector), the parameter
//! twice and written once; the state is sublinear.

use half::{bf16, f16};
use rayon::prelude::*;

use super::host::{HostSlice, HostSliceMut};
use super::state_memory::StateTensor;
use super::CpuOptimizer;
use crate::algo::factored_dims;
use crate::step::AdafactorUniform;
use crate::{Adafactor, Algorithm, DType, OptimizerOptions, Result, StateKind};

/// Elements per block: rayon's per-item cost vanishes next to a block's work.
const BLOCK: usize = 64 * 1024;
/// Independent partial sums per block: the loops vectorize over them.
const LANES: usize = 8;

/// One tensor's Adafactor state, in f32.
#[derive(Clone, Debug)]
pub(super) struct AdafactorTensor {
    /// `(batches, rows, cols)` of a tensor of 2 or more dimensions; `None` for a vector.
    dims: Option<(usize, usize, usize)>,
    /// `row_var` (`batches * rows`) or, for a vector, `variance`; F32.
    first: StateTensor,
    /// `col_var` (`batches * cols`); empty for a vector.
    second: StateTensor,
}

impl AdafactorTensor {
    fn new(shape: &[usize]) -> Result<Self> {
        let zeros = |len: usize| StateTensor::filled(DType::F32, len, 0.0, 0);
        Ok(match factored_dims(shape) {
            Some((b, r, c)) => {
                AdafactorTensor { dims: Some((b, r, c)), first: zeros(b * r)?, second: zeros(b * c)? }
            }
            None => AdafactorTensor { dims: None, first: zeros(shape.iter().product())?, second: zeros(0)? },
        })
    }

    /// Its states in `adafactor_state_kinds` order.
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

/// The states of an Adafactor optimizer over parameters of `lens` (empty for another
/// algorithm); refuses what Adafactor does not run, before anything is made.
pub(super) fn new_states(
    algorithm: &Algorithm,
    options: &OptimizerOptions,
    lens: &[usize],
) -> Result<Vec<AdafactorTensor>> {
    if !matches!(algorithm, Algorithm::Adafactor(_)) {
        return Ok(Vec::new());
    }
    crate::algo::check_adafactor_options(true, options)?;
    crate::algo::check_adafactor_shapes(&options.param_shapes)?;
    debug_assert_eq!(options.param_shapes.len(), lens.len());
    options.param_shapes.iter().map(|s| AdafactorTensor::new(s)).collect()
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
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
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
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn columns<G: Wide>(g: &[G], inverse: f32, sums: &mut [f32], scaled: &mut [f32]) {
    for ((g, sum), scaled) in g.iter().zip(sums.iter_mut()).zip(scaled.iter_mut()) {
        let g = g.widen();
        let g2 = g * g;
        *sum += g2;
        *scaled += g2 * inverse;
    }
}

/// A row's update where no floor binds: `U = g row inv_c`.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn apply_row<P: Wide, G: Wide>(
    hp: &AdafactorUniform,
    scale: f32,
    row: f32,
    p: &mut [P],
    g: &[G],
    inv: &[f32],
) {
    for ((p, g), inv) in p.iter_mut().zip(g).zip(inv) {
        apply(hp, scale, p, g.widen() * row * inv);
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

impl CpuOptimizer {
    /// One Adafactor step at step `t` over every tensor (already checked).
    pub(super) fn adafactor_step(
        &mut self,
        config: &Adafactor,
        params: &mut [HostSliceMut<'_>],
        grads: &[HostSlice<'_>],
    ) -> Result<()> {
        let t = self.step + 1;
        let crate::step::KernelStep::Adafactor(_, uniform) = config.kernel_step(t) else { return Ok(()) };
        let hp = uniform.to_f32();
        let first = self.params.first().map_or(DType::F32, |p| p.0);
        let eps1 = config.eps1_for(first) as f32;
        let scalars = Scalars { hp, eps1 };
        for ((param, grad), state) in params.iter_mut().zip(grads).zip(&mut self.adafactor) {
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
        self.step = t;
        Ok(())
    }

    /// Parameter `index`'s Adafactor state of `kind` (`None` for another algorithm, or a
    /// kind the tensor does not keep).
    pub(super) fn adafactor_state(&self, index: usize, kind: StateKind) -> Option<HostSlice<'_>> {
        let state = self.adafactor.get(index)?;
        match (state.dims.is_some(), kind) {
            (true, StateKind::RowVar) | (false, StateKind::Variance) => Some(state.first.as_slice()),
            (true, StateKind::ColVar) => Some(state.second.as_slice()),
            _ => None,
        }
    }

    /// [`Self::adafactor_state`], writable.
    pub(super) fn adafactor_state_mut(&mut self, index: usize, kind: StateKind) -> Option<HostSliceMut<'_>> {
        let state = self.adafactor.get_mut(index)?;
        match (state.dims.is_some(), kind) {
            (true, StateKind::RowVar) | (false, StateKind::Variance) => Some(state.first.as_mut_slice()),
            (true, StateKind::ColVar) => Some(state.second.as_mut_slice()),
            _ => None,
        }
    }

    /// Checkpoints: parameter `index`'s Adafactor states' kinds and dtypes (empty for
    /// another algorithm).
    pub(super) fn adafactor_layout_state(&self, index: usize) -> Vec<(StateKind, DType)> {
        if self.adafactor.get(index).is_none() {
            return Vec::new();
        }
        let shape = self.shapes.get(index).map_or(&[][..], Vec::as_slice);
        crate::adafactor_state_kinds(shape).iter().map(|kind| (*kind, DType::F32)).collect()
    }

    /// Checkpoints: parameter `index`'s Adafactor state `k` (in `adafactor_state_kinds` order).
    pub(super) fn adafactor_tensor(&self, index: usize, k: usize) -> Option<&StateTensor> {
        self.adafactor.get(index)?.states().get(k).copied()
    }

    /// [`Self::adafactor_tensor`], writable.
    pub(super) fn adafactor_tensor_mut(&mut self, index: usize, k: usize) -> Option<&mut StateTensor> {
        let state = self.adafactor.get_mut(index)?;
        match (state.dims.is_some(), k) {
            (_, 0) => Some(&mut state.first),
            (true, 1) => Some(&mut state.second),
            _ => None,
        }
    }
}

/// One tensor's step.
fn tensor<P: Wide, G: Wide>(s: &Scalars, state: &mut AdafactorTensor, p: &mut [P], g: &[G]) {
    let n = p.len();
    if n == 0 {
        return;
    }
    match state.dims {
        Some((batches, rows, cols)) => matrix(s, state, p, g, (batches, rows, cols)),
        None => vector(s, values(&mut state.first), p, g),
    }
}

/// `scale = alpha / max(1, rms(U) / d)` with `alpha = max(eps2, rms(p)) rho`.
fn step_scale(hp: &AdafactorUniform, sum_p2: f32, sum_u2: f32, n: usize) -> f32 {
    let root_n = (n as f32).sqrt();
    let alpha = hp.eps2.max(sum_p2.sqrt() / root_n) * hp.rho;
    alpha / 1f32.max(sum_u2.sqrt() / (root_n * hp.d))
}

#[inline(always)]
fn apply<P: Wide>(hp: &AdafactorUniform, scale: f32, p: &mut P, u: f32) {
    *p = P::narrow(p.widen() * hp.decay - scale * u);
}

/// A vector: blocks of elements; `variance` in place.
fn vector<P: Wide, G: Wide>(s: &Scalars, variance: &mut [f32], p: &mut [P], g: &[G]) {
    let hp = &s.hp;
    let floor = s.eps1 * s.eps1;
    // (1) variance, and per block the sums of p^2 and U^2.
    let partials: Vec<(f32, f32)> = p
        .par_chunks(BLOCK)
        .zip(g.par_chunks(BLOCK))
        .zip(variance.par_chunks_mut(BLOCK))
        .map(|((p, g), v)| {
            let (mut p2, mut u2) = ([0f32; LANES], [0f32; LANES]);
            for (k, ((p, g), v)) in p.iter().zip(g).zip(v.iter_mut()).enumerate() {
                let (p, g) = (p.widen(), g.widen() * hp.sign);
                p2[k % LANES] += p * p;
                *v = lerp(*v, g * g, hp.weight);
                let u = g / v.max(floor).sqrt();
                u2[k % LANES] += u * u;
            }
            (fold(p2), fold(u2))
        })
        .collect();
    let (sum_p2, sum_u2) = partials.iter().fold((0f32, 0f32), |(a, b), (c, d)| (a + c, b + d));
    let scale = step_scale(hp, sum_p2, sum_u2, p.len());
    // (2) the update.
    p.par_chunks_mut(BLOCK).zip(g.par_chunks(BLOCK)).zip(variance.par_chunks(BLOCK)).for_each(
        |((p, g), v)| {
            for ((p, g), v) in p.iter_mut().zip(g).zip(v) {
                let u = g.widen() * hp.sign / v.max(floor).sqrt();
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
fn matrix<P: Wide, G: Wide>(
    s: &Scalars,
    state: &mut AdafactorTensor,
    p: &mut [P],
    g: &[G],
    (batches, rows, cols): (usize, usize, usize),
) {
    let hp = &s.hp;
    let floor = s.eps1 * s.eps1;
    if rows == 0 || cols == 0 {
        return;
    }
    let block_rows = (BLOCK / cols).clamp(1, rows);
    let per_matrix = rows.div_ceil(block_rows);
    // Blocks never straddle two matrices: each matrix's rows are cut alike.
    let order: Vec<(usize, usize)> =
        (0..batches).flat_map(|b| (0..per_matrix).map(move |k| (b, k))).collect();
    let span = |b: usize, k: usize| {
        let first = b * rows + k * block_rows;
        (first, block_rows.min(b * rows + rows - first))
    };
    let row_var = values(&mut state.first);
    // (1) per block: its rows' new row_var, its columns' partial sums of g^2 and of
    // g^2 / R_r, its sum of p^2.
    let mut row_chunks: Vec<&mut [f32]> = Vec::with_capacity(order.len());
    let mut rest = &mut row_var[..];
    for &(b, k) in &order {
        let (_, count) = span(b, k);
        let (head, tail) = rest.split_at_mut(count);
        row_chunks.push(head);
        rest = tail;
    }
    let pass1: Vec<(Vec<f32>, Vec<f32>, f32)> = order
        .par_iter()
        .zip(row_chunks.into_par_iter())
        .map(|(&(b, k), row_var)| {
            let (first, _) = span(b, k);
            let mut col_sums = vec![0f32; cols];
            let mut col_scaled = vec![0f32; cols];
            let mut sum_p2 = 0f32;
            for (r, rv) in (first..).zip(row_var.iter_mut()) {
                let (g, p) = (&g[r * cols..(r + 1) * cols], &p[r * cols..(r + 1) * cols]);
                let (row_g2, row_p2) = squares(g, p);
                sum_p2 += row_p2;
                *rv = lerp(*rv, row_g2 / cols as f32, hp.weight);
                columns(g, 1.0 / *rv, &mut col_sums, &mut col_scaled);
            }
            (col_sums, col_scaled, sum_p2)
        })
        .collect();
    // The column factors, on one thread: they hold cols values per matrix.
    let col_var = values(&mut state.second);
    let mut sum_p2 = 0f32;
    let mut col_sums = vec![0f32; batches * cols];
    let mut col_scaled = vec![0f32; batches * cols];
    for (&(b, _), (sums, scaled, p2)) in order.iter().zip(&pass1) {
        let at = b * cols..(b + 1) * cols;
        for (total, part) in col_sums[at.clone()].iter_mut().zip(sums) {
            *total += part;
        }
        for (total, part) in col_scaled[at].iter_mut().zip(scaled) {
            *total += part;
        }
        sum_p2 += p2;
    }
    for (v, sum) in col_var.iter_mut().zip(&col_sums) {
        *v = lerp(*v, sum / rows as f32, hp.weight);
    }
    let row_var = values(&mut state.first);
    // Each matrix's clamped mean of row_var, and the update's sum of squares where no floor
    // binds.
    let mut denoms = vec![0f32; batches];
    let mut floored = Vec::new();
    let mut sum_u2 = 0f32;
    for b in 0..batches {
        let rv = &row_var[b * rows..(b + 1) * rows];
        let cv = &col_var[b * cols..(b + 1) * cols];
        let mean = rv.iter().fold(0f32, |a, v| a + v) / rows as f32;
        denoms[b] = mean.max(s.eps1);
        let min_r = rv.iter().fold(f32::INFINITY, |a, v| a.min(*v));
        let min_c = cv.iter().fold(f32::INFINITY, |a, v| a.min(*v));
        // Also false for NaN, which the element-wise pass then carries.
        if min_r * min_c / denoms[b] >= floor && min_r > 0.0 && min_c > 0.0 {
            let scaled = &col_scaled[b * cols..(b + 1) * cols];
            let sum = scaled.iter().zip(cv).fold(0f32, |a, (t, c)| a + t / c);
            sum_u2 += denoms[b] * sum;
        } else {
            floored.push(b);
        }
    }
    let (row_var, col_var, denoms) = (&*row_var, &*col_var, &denoms);
    let u = move |r: usize, c: usize, g: f32, b: usize| {
        let v = row_var[r] * col_var[b * cols + c] / denoms[b];
        g * hp.sign / v.max(floor).sqrt()
    };
    // (2) where a floor may bind, the update's sum of squares element by element.
    if !floored.is_empty() {
        let sums: Vec<f32> = order
            .par_iter()
            .filter(|(b, _)| floored.contains(b))
            .map(|&(b, k)| {
                let (first, count) = span(b, k);
                let mut lanes = [0f32; LANES];
                for r in first..first + count {
                    for (c, g) in g[r * cols..(r + 1) * cols].iter().enumerate() {
                        let u = u(r, c, g.widen(), b);
                        lanes[c % LANES] += u * u;
                    }
                }
                fold(lanes)
            })
            .collect();
        sum_u2 += sums.iter().fold(0f32, |a, b| a + b);
    }
    let scale = step_scale(hp, sum_p2, sum_u2, p.len());
    // (3) the update, in blocks of rows. Where no floor binds, `1 / sqrt(R C / m)` is
    // `sqrt(m / R) / sqrt(C)`: a row's factor times a column's, so the loop only multiplies.
    let inv_cols: Vec<f32> = col_var.iter().map(|c| 1.0 / c.sqrt()).collect();
    let (inv_cols, floored) = (&inv_cols, &floored);
    let block = block_rows * cols;
    p.par_chunks_mut(block).zip(g.par_chunks(block)).enumerate().for_each(|(k, (p, g))| {
        let first = k * block_rows;
        for (j, (p, g)) in p.chunks_mut(cols).zip(g.chunks(cols)).enumerate() {
            let r = first + j;
            let b = r / rows;
            if floored.contains(&b) {
                for (c, (p, g)) in p.iter_mut().zip(g).enumerate() {
                    apply(hp, scale, p, u(r, c, g.widen(), b));
                }
                continue;
            }
            let row = hp.sign * (denoms[b] / row_var[r]).sqrt();
            apply_row(hp, scale, row, p, g, &inv_cols[b * cols..(b + 1) * cols]);
        }
    });
}
