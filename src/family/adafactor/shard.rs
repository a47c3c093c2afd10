//! Adafactor's step over ZeRO-1 pieces (`crate::shard`): each rank holds a contiguous
//! piece of some of the tensors, which may cut a matrix in the middle of a row, and the
//! step's whole-tensor reductions are taken over the pieces and added across the ranks.
//!
//! torch's step of a tensor reduces it three times: each row's and each column's sum of
//! `g^2` (the factored second moment), the sum of `p^2` (the relative step's RMS), and the
//! sum of the update's squares (its RMS clipping), which needs the new factors. So a step
//! here is three phases around two all-reduces, which every rank makes, in the same order,
//! whether or not it holds a piece:
//!
//! 1. over its pieces: the rows' and columns' partial sums of `g^2` and the partial sum of
//!    `p^2`; a vector's `variance` (elementwise) and its partial sum of the update's squares;
//! 2. *all-reduce*; every rank holding a piece of a matrix updates the whole matrix's
//!    `row_var` and `col_var` from the same totals (the same bits on each: they are
//!    sublinear, so each such rank keeps them whole), then a matrix's partial sum of the
//!    update's squares over its piece;
//! 3. *all-reduce*; the update of the pieces, `p = p decay - scale U`.
//!
//! The sums are taken in f64 over f32 values (the unsharded passes add in f32 by blocks),
//! so a sharded step matches the unsharded one within the f32 tolerance of the vectors,
//! not bit for bit. The values are the host's: the CPU backend's pieces are host memory,
//! and the GPU sharded step reads its pieces back (it has the reduced gradients on the host
//! already) and writes them after the update.

use std::ops::Range;

use super::config::{factored_dims, Adafactor};
use crate::{Algorithm, DType, OptimizerOptions, Result, StateKind};

/// torch's `lerp` (two forms, below and above a weight of one half), in f32 as the passes
/// take it.
fn lerp(start: f32, end: f32, weight: f32) -> f32 {
    let diff = end - start;
    if weight.abs() < 0.5 {
        start + weight * diff
    } else {
        end - diff * (1.0 - weight)
    }
}

/// `torch.clamp(x, min=lo)`: a NaN stays NaN.
fn clamp_min(x: f32, lo: f32) -> f32 {
    if x.is_nan() {
        x
    } else {
        x.max(lo)
    }
}

/// One Adafactor tensor of a sharded optimizer, as every rank knows it, with the state of
/// this rank's piece of it.
#[derive(Clone, Debug)]
struct ShardTensor {
    /// Its index among the optimizer's parameters.
    index: usize,
    len: u64,
    /// `(batches, rows, cols)` of a matrix (2 or more dimensions); `None` for a vector.
    dims: Option<(usize, usize, usize)>,
    /// Its group's configuration.
    config: Adafactor,
    /// `eps1`, resolved for its group's first parameter's dtype as torch does.
    eps1: f32,
    /// This rank's elements of it (empty: no piece here, and no state).
    elements: Range<u64>,
    /// A matrix: the whole `row_var` (`batches * rows`); a vector: its piece's `variance`.
    first: Vec<f32>,
    /// A matrix: the whole `col_var` (`batches * cols`); a vector: empty.
    second: Vec<f32>,
    /// A matrix's working values between the phases.
    scratch: Scratch,
    /// Where its totals lie in the first all-reduce: `[sum p^2, a vector's sum U^2]`, then
    /// a matrix's row sums and column sums of `g^2`.
    sums_at: usize,
    /// A matrix: where its sum of `U^2` lies in the second all-reduce.
    norm_at: usize,
}

impl ShardTensor {
    fn here(&self) -> bool {
        self.elements.end > self.elements.start
    }
}

/// A matrix's working values between the phases of a step, made with its state.
#[derive(Clone, Debug, Default)]
struct Scratch {
    /// Each batch's clamped mean of `row_var`.
    denoms: Vec<f32>,
    /// Each batch: whether no element's `eps1^2` floor can bind and its factors are finite,
    /// so that `U = g sqrt(denom / R_r) / sqrt(C_c)`, a row's factor times a column's.
    exact: Vec<bool>,
    /// `1 / sqrt(col_var)` of each column (`batches * cols`).
    col_inv: Vec<f32>,
    /// The columns' partial sums of `g^2` in f32 over a run of rows (`batches * cols`),
    /// added into the f64 sums every [`FLUSH`] rows.
    col_acc: Vec<f32>,
}

/// Rows whose squares a column adds in f32 before they go into its f64 sum.
const FLUSH: usize = 64;
/// Independent partial sums of a row: the loops vectorize over them.
const LANES: usize = 8;

/// What [`ShardedAdafactor::new`] takes of one tensor.
#[derive(Clone, Debug)]
struct ShardTensorSpec {
    /// Its index among the optimizer's parameters.
    index: usize,
    shape: Vec<usize>,
    config: Adafactor,
    /// The dtype of its group's first parameter (torch's `eps1 = None`).
    first_dtype: DType,
    /// This rank's elements of it (empty: none).
    elements: Range<u64>,
}

/// One tensor's piece for a step: its parameters (f32, widened by the caller for 16-bit
/// ones, rounded back after) and its reduced gradients.
pub(crate) type PieceStep<'a> = Option<(&'a mut [f32], &'a [f32])>;

/// Adafactor's sharded step over every Adafactor tensor of an optimizer (each rank makes
/// one over all of them, keeping the state of its pieces only).
#[derive(Clone, Debug)]
pub(crate) struct ShardedAdafactor {
    tensors: Vec<ShardTensor>,
    /// The first all-reduce's values, reused from step to step.
    sums: Vec<f64>,
    /// The second's: each matrix's sum of the update's squares.
    norms: Vec<f64>,
}

impl ShardedAdafactor {
    /// The step over the Adafactor tensors among parameters of `algorithms` and `shapes`
    /// (one each), with this rank's `elements(i)` of parameter `i` (empty: none here) and
    /// `first_dtypes[i]` the dtype of the first parameter of its group; `None` without
    /// Adafactor. Every rank makes one over every Adafactor tensor.
    pub(crate) fn for_tensors(
        algorithms: &[Algorithm],
        shapes: &[Vec<usize>],
        first_dtypes: &[DType],
        elements: impl Fn(usize) -> Range<u64>,
    ) -> Option<Self> {
        let specs: Vec<ShardTensorSpec> = algorithms
            .iter()
            .enumerate()
            .filter_map(|(index, algorithm)| match algorithm {
                Algorithm::Adafactor(config) => Some(ShardTensorSpec {
                    index,
                    shape: shapes.get(index)?.clone(),
                    config: *config,
                    first_dtype: first_dtypes[index],
                    elements: elements(index),
                }),
                _ => None,
            })
            .collect();
        (!specs.is_empty()).then(|| Self::new(specs))
    }

    /// The values its step's all-reduces carry for parameters of `algorithms` and `shapes`:
    /// per tensor its sum of `p^2` and a vector's sum of `U^2`, and per matrix its rows' and
    /// columns' sums of `g^2` and its sum of `U^2`.
    pub(crate) fn values_per_step(algorithms: &[Algorithm], shapes: &[Vec<usize>]) -> u64 {
        let ours = algorithms.iter().zip(shapes).filter(|(a, _)| matches!(a, Algorithm::Adafactor(_)));
        ours.map(|(_, shape)| 2 + factored_dims(shape).map_or(0, |(b, r, c)| 1 + b * (r + c)) as u64).sum()
    }

    /// Refuses what Adafactor's builders would refuse among `distinct` algorithms over
    /// parameters of `lens` and `dtypes` (its pieces take this step, not an inner
    /// optimizer's): its hyperparameters, the options its passes do not run, and missing or
    /// wrong shapes.
    pub(crate) fn check(
        distinct: &[Algorithm],
        lens: &[u64],
        dtypes: &[DType],
        options: &OptimizerOptions,
    ) -> Result<()> {
        let ours: Vec<Algorithm> =
            distinct.iter().copied().filter(|a| matches!(a, Algorithm::Adafactor(_))).collect();
        if ours.is_empty() {
            return Ok(());
        }
        super::config::check_shapes_given(&options.param_shapes)?;
        crate::validate::check_shapes(&options.param_shapes, lens)?;
        for algorithm in &ours {
            algorithm.validate()?;
            algorithm.check_options(options)?;
        }
        if options.state_storage.q8().is_some() {
            crate::q8::check_options(&ours, options, dtypes.iter().copied())?;
        }
        if let Some(config) = options.state_storage.q4() {
            crate::q4::check_options(&config, &ours, options, dtypes.iter().copied())?;
        }
        Ok(())
    }

    /// The step over `tensors` (every rank passes every Adafactor tensor, in order, with its
    /// own elements of each): zero state for the pieces it holds.
    fn new(tensors: Vec<ShardTensorSpec>) -> Self {
        let (mut sums, mut norms) = (0, 0);
        let tensors = tensors
            .into_iter()
            .map(|spec| {
                let dims = factored_dims(&spec.shape);
                let len = spec.shape.iter().product::<usize>() as u64;
                let here = spec.elements.end > spec.elements.start;
                let piece = (spec.elements.end - spec.elements.start) as usize;
                let (first, second, scratch) = match (dims, here) {
                    (_, false) => (Vec::new(), Vec::new(), Scratch::default()),
                    (Some((b, r, c)), true) => {
                        let scratch = Scratch {
                            denoms: vec![0.0; b],
                            exact: vec![false; b],
                            col_inv: vec![0.0; b * c],
                            col_acc: vec![0.0; b * c],
                        };
                        (vec![0.0; b * r], vec![0.0; b * c], scratch)
                    }
                    (None, true) => (vec![0.0; piece], Vec::new(), Scratch::default()),
                };
                let tensor = ShardTensor {
                    index: spec.index,
                    len,
                    dims,
                    config: spec.config,
                    eps1: spec.config.eps1_for(spec.first_dtype) as f32,
                    elements: spec.elements,
                    first,
                    second,
                    scratch,
                    sums_at: sums,
                    norm_at: norms,
                };
                sums += 2 + dims.map_or(0, |(b, r, c)| b * (r + c));
                norms += usize::from(dims.is_some());
                tensor
            })
            .collect();
        ShardedAdafactor { tensors, sums: vec![0.0; sums], norms: vec![0.0; norms] }
    }

    /// The parameters' indices of its tensors, in the order [`Self::step`] takes their pieces.
    pub(crate) fn indices(&self) -> impl Iterator<Item = usize> + '_ {
        self.tensors.iter().map(|t| t.index)
    }

    /// Step `t` (from 1) of every tensor: `pieces[k]` is this rank's piece of its `k`-th
    /// tensor (`None` where it holds none); `all_reduce` adds every rank's values in place,
    /// in rank order, and is called twice (once when no tensor is a matrix) on every rank.
    pub(crate) fn step(
        &mut self,
        t: u64,
        pieces: &mut [PieceStep<'_>],
        all_reduce: &mut dyn FnMut(&mut [f64]) -> Result<()>,
    ) -> Result<()> {
        self.sums.fill(0.0);
        self.norms.fill(0.0);
        for (tensor, piece) in self.tensors.iter_mut().zip(pieces.iter_mut()) {
            if let (true, Some((p, g))) = (tensor.here(), piece) {
                first_sums(tensor, t, p, g, &mut self.sums);
            }
        }
        all_reduce(&mut self.sums)?;
        for (tensor, piece) in self.tensors.iter_mut().zip(pieces.iter_mut()) {
            if let (true, Some(_), Some((_, g))) = (tensor.here(), tensor.dims, piece) {
                self.norms[tensor.norm_at] = factors(tensor, t, g, &self.sums);
            }
        }
        if !self.norms.is_empty() {
            all_reduce(&mut self.norms)?;
        }
        for (tensor, piece) in self.tensors.iter().zip(pieces.iter_mut()) {
            if let (true, Some((p, g))) = (tensor.here(), piece) {
                update(tensor, t, p, g, &self.sums, &self.norms);
            }
        }
        Ok(())
    }

    /// The bytes of state this rank keeps.
    pub(crate) fn state_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| 4 * (t.first.len() + t.second.len()) as u64).sum()
    }

    /// The state of kind `kind` this rank keeps of parameter `index`: a matrix's whole
    /// `row_var` or `col_var`, or a vector piece's `variance`.
    pub(crate) fn state(&self, index: usize, kind: StateKind) -> Option<&[f32]> {
        let tensor = self.tensors.iter().find(|t| t.index == index && t.here())?;
        match (tensor.dims.is_some(), kind) {
            (true, StateKind::RowVar) | (false, StateKind::Variance) => Some(&tensor.first),
            (true, StateKind::ColVar) => Some(&tensor.second),
            _ => None,
        }
    }

    /// [`Self::state`], to write.
    pub(crate) fn state_mut(&mut self, index: usize, kind: StateKind) -> Option<&mut [f32]> {
        let tensor = self.tensors.iter_mut().find(|t| t.index == index && t.here())?;
        match (tensor.dims.is_some(), kind) {
            (true, StateKind::RowVar) | (false, StateKind::Variance) => Some(&mut tensor.first),
            (true, StateKind::ColVar) => Some(&mut tensor.second),
            _ => None,
        }
    }

    /// The whole factors (`row_var`, `col_var`) of each matrix this rank holds a piece of,
    /// by parameter index, as a checkpoint keeps them.
    #[cfg(feature = "checkpoint")]
    pub(crate) fn factored(&self) -> Vec<(usize, StateKind, Vec<f32>)> {
        let matrices = self.tensors.iter().filter(|t| t.here() && t.dims.is_some());
        matrices
            .flat_map(|t| {
                let (rows, cols) = (t.first.clone(), t.second.clone());
                [(t.index, StateKind::RowVar, rows), (t.index, StateKind::ColVar, cols)]
            })
            .collect()
    }

    /// The factors of each matrix this rank holds a piece of, taken from `saved` (a
    /// checkpoint's, by parameter index); what is missing or of another length, otherwise.
    #[cfg(feature = "checkpoint")]
    pub(crate) fn factored_from(
        &self,
        saved: &[(usize, StateKind, Vec<f32>)],
    ) -> std::result::Result<Vec<(usize, StateKind, Vec<f32>)>, String> {
        let mut found = Vec::new();
        for tensor in self.tensors.iter().filter(|t| t.here() && t.dims.is_some()) {
            let kinds = [(StateKind::RowVar, tensor.first.len()), (StateKind::ColVar, tensor.second.len())];
            for (kind, len) in kinds {
                match saved.iter().find(|(i, k, _)| (*i, *k) == (tensor.index, kind)) {
                    Some((_, _, values)) if values.len() == len => {
                        found.push((tensor.index, kind, values.clone()))
                    }
                    Some((_, _, values)) => {
                        return Err(format!(
                            "`factored.{}.{}` holds {} values; the matrix's factor has {len}",
                            tensor.index,
                            kind.torch_name(),
                            values.len()
                        ))
                    }
                    None => {
                        return Err(format!(
                            "the checkpoint holds no `{}` of parameter {}, an Adafactor matrix",
                            kind.torch_name(),
                            tensor.index
                        ))
                    }
                }
            }
        }
        Ok(found)
    }

    /// Writes `values` into its state of kind `kind` of parameter `index` (the lengths were
    /// checked: [`Self::factored_from`], or a piece's elements).
    #[cfg(feature = "checkpoint")]
    pub(crate) fn set_state(&mut self, index: usize, kind: StateKind, values: impl AsRef<[f32]>) {
        if let Some(state) = self.state_mut(index, kind) {
            let values = values.as_ref();
            if state.len() == values.len() {
                state.copy_from_slice(values);
            }
        }
    }

    /// Whether parameter `index` is one of its vectors, whose `variance` is elementwise.
    pub(crate) fn is_vector(&self, index: usize) -> bool {
        self.tensors.iter().any(|t| t.index == index && t.dims.is_none())
    }

    /// Sets the learning rate of the tensors of parameters `indices` (a group's); refused,
    /// with nothing changed, where the configuration would be refused with it.
    pub(crate) fn set_lr(&mut self, indices: Range<usize>, lr: f64) -> Result<()> {
        let ours = |t: &&mut ShardTensor| indices.contains(&t.index);
        for tensor in self.tensors.iter_mut().filter(ours) {
            Adafactor { lr, ..tensor.config }.validate()?;
        }
        for tensor in self.tensors.iter_mut().filter(ours) {
            tensor.config.lr = lr;
        }
        Ok(())
    }
}

/// The step's values of `tensor` at step `t`, as the passes take them.
fn hyper(tensor: &ShardTensor, t: u64) -> super::contract::AdafactorUniform64 {
    tensor.config.uniform(t)
}

/// `(sum a^2, sum b^2)` of two slices of one length, each in [`LANES`] f32 lanes added in
/// order.
fn squares(a: &[f32], b: &[f32]) -> (f32, f32) {
    let (mut a2, mut b2) = ([0f32; LANES], [0f32; LANES]);
    let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (a_tail, b_tail) = (ac.remainder(), bc.remainder());
    for (a, b) in ac.zip(bc) {
        for k in 0..LANES {
            a2[k] += a[k] * a[k];
            b2[k] += b[k] * b[k];
        }
    }
    for (k, (a, b)) in a_tail.iter().zip(b_tail).enumerate() {
        a2[k] += a * a;
        b2[k] += b * b;
    }
    (a2.iter().sum(), b2.iter().sum())
}

/// `sum (g inv)^2` of a row's gradients and its columns' `1 / sqrt(col_var)`, in [`LANES`]
/// f32 lanes added in order.
fn scaled_squares(g: &[f32], inv: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    let (gc, ic) = (g.chunks_exact(LANES), inv[..g.len()].chunks_exact(LANES));
    let (g_tail, i_tail) = (gc.remainder(), ic.remainder());
    for (g, inv) in gc.zip(ic) {
        for k in 0..LANES {
            let u = g[k] * inv[k];
            lanes[k] += u * u;
        }
    }
    for (k, (g, inv)) in g_tail.iter().zip(i_tail).enumerate() {
        let u = g * inv;
        lanes[k] += u * u;
    }
    lanes.iter().sum()
}

/// Phase 1 over a piece `p`, `g`: `sum p^2` and, for a matrix, the rows' and columns'
/// partial sums of `g^2`; for a vector, its `variance` and partial `sum U^2`.
fn first_sums(tensor: &mut ShardTensor, t: u64, p: &[f32], g: &[f32], sums: &mut [f64]) {
    let hp = hyper(tensor, t);
    let at = tensor.sums_at;
    let Some((batches, rows, cols)) = tensor.dims else {
        let (weight, sign, floor) = (hp.weight as f32, hp.sign as f32, tensor.eps1 * tensor.eps1);
        let (mut sum_p2, mut sum_u2) = (0f64, 0f64);
        for ((v, &g), &p) in tensor.first.iter_mut().zip(g).zip(p) {
            let g = g * sign;
            *v = lerp(*v, g * g, weight);
            let u = g / clamp_min(*v, floor).sqrt();
            sum_u2 += f64::from(u) * f64::from(u);
            sum_p2 += f64::from(p) * f64::from(p);
        }
        (sums[at], sums[at + 1]) = (sum_p2, sum_u2);
        return;
    };
    let (row_sums, col_sums) = sums[at + 2..at + 2 + batches * (rows + cols)].split_at_mut(batches * rows);
    let acc = &mut tensor.scratch.col_acc;
    let flush = |acc: &mut [f32], col_sums: &mut [f64]| {
        for (sum, a) in col_sums.iter_mut().zip(acc.iter_mut()) {
            *sum += f64::from(*a);
            *a = 0.0;
        }
    };
    let start = tensor.elements.start as usize;
    let mut sum_p2 = 0f64;
    for (n, (row, segment)) in segments(start, g.len(), cols).enumerate() {
        let (first_col, batch) = ((start + segment.start) % cols, row / rows);
        let (g, p) = (&g[segment.clone()], &p[segment]);
        let (row_g2, row_p2) = squares(g, p);
        row_sums[row] += f64::from(row_g2);
        sum_p2 += f64::from(row_p2);
        for (a, &g) in acc[batch * cols + first_col..].iter_mut().zip(g) {
            *a += g * g;
        }
        if (n + 1) % FLUSH == 0 {
            flush(acc, col_sums);
        }
    }
    flush(acc, col_sums);
    sums[at] = sum_p2;
}

/// The rows a piece of `len` elements starting at element `start` of a matrix of `cols`
/// columns (batches' rows counted on) touches: each row's index and the piece's elements
/// in it.
fn segments(start: usize, len: usize, cols: usize) -> impl Iterator<Item = (usize, Range<usize>)> {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at >= len {
            return None;
        }
        let row = (start + at) / cols;
        let end = ((row + 1) * cols - start).min(len);
        let segment = at..end;
        at = end;
        Some((row, segment))
    })
}

/// Phase 2 of a matrix: its `row_var` and `col_var` from the totals, each batch's clamped
/// mean of `row_var` and whether its floor can bind, and the partial sum of `U^2` over the
/// piece.
fn factors(tensor: &mut ShardTensor, t: u64, g: &[f32], sums: &[f64]) -> f64 {
    let Some((batches, rows, cols)) = tensor.dims else { return 0.0 };
    let hp = hyper(tensor, t);
    let weight = hp.weight as f32;
    let at = tensor.sums_at + 2;
    let (row_sums, col_sums) = sums[at..at + batches * (rows + cols)].split_at(batches * rows);
    for (v, sum) in tensor.first.iter_mut().zip(row_sums) {
        *v = lerp(*v, (sum / cols as f64) as f32, weight);
    }
    for (v, sum) in tensor.second.iter_mut().zip(col_sums) {
        *v = lerp(*v, (sum / rows as f64) as f32, weight);
    }
    let floor = tensor.eps1 * tensor.eps1;
    let scratch = &mut tensor.scratch;
    for b in 0..batches {
        let (rv, cv) = (&tensor.first[b * rows..(b + 1) * rows], &tensor.second[b * cols..(b + 1) * cols]);
        let mean = rv.iter().map(|&v| f64::from(v)).sum::<f64>() / rows as f64;
        let denom = clamp_min(mean as f32, tensor.eps1);
        scratch.denoms[b] = denom;
        // A finite mean means every `row_var` is finite; the smallest `V` is the smallest
        // row's over the denominator times the smallest column's.
        let smallest = |values: &[f32]| values.iter().fold(f32::INFINITY, |a, v| a.min(*v));
        let (min_r, min_c) = (smallest(rv), smallest(cv));
        let finite = denom.is_finite() && cv.iter().all(|c| c.is_finite());
        scratch.exact[b] = finite && min_r > 0.0 && min_c > 0.0 && min_r / denom * min_c >= floor;
        for (inv, c) in scratch.col_inv[b * cols..(b + 1) * cols].iter_mut().zip(cv) {
            *inv = 1.0 / c.sqrt();
        }
    }
    let start = tensor.elements.start as usize;
    let mut sum_u2 = 0f64;
    for (row, segment) in segments(start, g.len(), cols) {
        let (first_col, batch) = ((start + segment.start) % cols, row / rows);
        let g = &g[segment];
        if scratch.exact[batch] {
            let inv = &scratch.col_inv[batch * cols + first_col..];
            let row_factor2 = scratch.denoms[batch] / tensor.first[row];
            sum_u2 += f64::from(scaled_squares(g, inv)) * f64::from(row_factor2);
        } else {
            for (&g, &c) in g.iter().zip(&tensor.second[batch * cols + first_col..]) {
                let u = g / clamp_min(tensor.first[row] / scratch.denoms[batch] * c, floor).sqrt();
                sum_u2 += f64::from(u) * f64::from(u);
            }
        }
    }
    sum_u2
}

/// Phase 3: `p = p decay - scale U` over a piece, with `scale = alpha / max(1, rms(U) / d)`
/// and `alpha = max(eps2, rms(p)) rho` from the totals. torch takes both maxima with Python's
/// `max` on the host, which drops a NaN second operand, as `f64::max` does. A matrix's `U`
/// is `g / sqrt(max(row_var / denom col_var, eps1^2))` (the factors' product in the passes'
/// order), or where no floor binds its row's factor times its column's.
fn update(tensor: &ShardTensor, t: u64, p: &mut [f32], g: &[f32], sums: &[f64], norms: &[f64]) {
    let hp = hyper(tensor, t);
    let root_n = (tensor.len as f64).sqrt();
    let sum_p2 = sums[tensor.sums_at];
    let sum_u2 = match tensor.dims {
        Some(_) => norms[tensor.norm_at],
        None => sums[tensor.sums_at + 1],
    };
    let alpha = hp.eps2.max(sum_p2.sqrt() / root_n) * hp.rho;
    let scale = (alpha / 1f64.max(sum_u2.sqrt() / (root_n * hp.d))) as f32;
    let (decay, sign, floor) = (hp.decay as f32, hp.sign as f32, tensor.eps1 * tensor.eps1);
    let Some((_, rows, cols)) = tensor.dims else {
        for ((p, &g), &v) in p.iter_mut().zip(g).zip(&tensor.first) {
            let u = g * sign / clamp_min(v, floor).sqrt();
            *p = *p * decay - scale * u;
        }
        return;
    };
    let (scratch, start) = (&tensor.scratch, tensor.elements.start as usize);
    for (row, segment) in segments(start, g.len(), cols) {
        let (first_col, batch) = ((start + segment.start) % cols, row / rows);
        let (p, g) = (&mut p[segment.clone()], &g[segment]);
        let (row_var, denom) = (tensor.first[row], scratch.denoms[batch]);
        if scratch.exact[batch] {
            let factor = sign * (denom / row_var).sqrt();
            for ((p, &g), &inv) in p.iter_mut().zip(g).zip(&scratch.col_inv[batch * cols + first_col..]) {
                *p = *p * decay - scale * (g * factor * inv);
            }
        } else {
            for ((p, &g), &c) in p.iter_mut().zip(g).zip(&tensor.second[batch * cols + first_col..]) {
                let u = g * sign / clamp_min(row_var / denom * c, floor).sqrt();
                *p = *p * decay - scale * u;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A piece's rows: whole rows, a row cut at both ends, and a piece inside one row.
    #[test]
    fn a_piece_is_cut_into_the_rows_it_touches() {
        let got: Vec<_> = segments(5, 12, 4).collect();
        assert_eq!(got, vec![(1, 0..3), (2, 3..7), (3, 7..11), (4, 11..12)]);
        let inside: Vec<_> = segments(9, 2, 4).collect();
        assert_eq!(inside, vec![(2, 0..2)]);
        assert_eq!(segments(0, 0, 4).count(), 0);
    }
}
