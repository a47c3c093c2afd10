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
//! A row's sums are taken in f32 lanes and the sums over rows, chunks and ranks in f64
//! (the unsharded passes add in f32 by blocks), so a sharded step matches the unsharded one
//! within the f32 tolerance of the vectors, not bit for bit; `passes` has the arithmetic,
//! a piece's chunks on the CPU backend's threads. The values are the host's: the CPU
//! backend's pieces are host memory, and the GPU sharded step reads its pieces back (it has
//! the reduced gradients on the host already) and writes them after the update, so both
//! backends' sharded steps give the same bits.

use std::ops::Range;

mod passes;

use super::config::{factored_dims, Adafactor};
use super::contract::AdafactorUniform64;
use crate::{Algorithm, DType, OptimizerOptions, Result, StateKind};

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
    /// The piece's working values between the phases.
    scratch: passes::Scratch,
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
                let (first, second) = match (dims, here) {
                    (_, false) => (Vec::new(), Vec::new()),
                    (Some((b, r, c)), true) => (vec![0.0; b * r], vec![0.0; b * c]),
                    (None, true) => (vec![0.0; piece], Vec::new()),
                };
                let scratch = match here {
                    true => passes::Scratch::new(dims, &spec.elements),
                    false => passes::Scratch::default(),
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
                let hp = tensor.config.uniform(t);
                passes::first_sums(tensor, &hp, p, g, &mut self.sums[tensor.sums_at..]);
            }
        }
        all_reduce(&mut self.sums)?;
        for (tensor, piece) in self.tensors.iter_mut().zip(pieces.iter_mut()) {
            if let (true, Some(_), Some((_, g))) = (tensor.here(), tensor.dims, piece) {
                let hp = tensor.config.uniform(t);
                self.norms[tensor.norm_at] = passes::factors(tensor, &hp, g, &self.sums[tensor.sums_at..]);
            }
        }
        if !self.norms.is_empty() {
            all_reduce(&mut self.norms)?;
        }
        for (tensor, piece) in self.tensors.iter_mut().zip(pieces.iter_mut()) {
            if let (true, Some((p, g))) = (tensor.here(), piece) {
                let hp = tensor.config.uniform(t);
                let sum_u2 = match tensor.dims {
                    Some(_) => self.norms[tensor.norm_at],
                    None => self.sums[tensor.sums_at + 1],
                };
                let scale = step_scale(&hp, self.sums[tensor.sums_at], sum_u2, tensor.len);
                passes::update(tensor, &hp, scale, p, g);
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

/// `scale = alpha / max(1, rms(U) / d)` with `alpha = max(eps2, rms(p)) rho`, from a
/// tensor's totals over its `len` elements. torch takes both maxima with Python's `max` on
/// the host, which drops a NaN second operand, as `f64::max` does.
fn step_scale(hp: &AdafactorUniform64, sum_p2: f64, sum_u2: f64, len: u64) -> f32 {
    let root_n = (len as f64).sqrt();
    let alpha = hp.eps2.max(sum_p2.sqrt() / root_n) * hp.rho;
    (alpha / 1f64.max(sum_u2.sqrt() / (root_n * hp.d))) as f32
}
