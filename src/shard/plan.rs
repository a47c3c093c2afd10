//! What both sharded optimizers share: the checks made when one is built, the flat layout
//! of its parameters, and the host side of a step's collectives (the gradients flattened
//! and reduce-scattered, the updated pieces packed and all-gathered).

use std::ops::Range;
use std::time::Duration;

use super::{Communicator, FlatLayout, Piece, ReduceOp};
use crate::family::adafactor::shard::ShardedAdafactor;
use crate::q4::Q4States;
use crate::q8::Q8States;
use crate::step::clip::fused_clip;
use crate::{Algorithm, DType, Error, NormType, OptimizerOptions, Result, StateStorage};

/// How the ranks' gradients combine before the step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GradReduction {
    /// Their sum, added in rank order.
    Sum,
    /// Their sum, added in rank order, divided by the number of ranks (in f32): the mean of
    /// data-parallel training, where each rank's gradient is the mean over its part of the
    /// batch (PyTorch's `DistributedDataParallel`).
    #[default]
    Mean,
}

/// The last step's time and traffic on this rank ([`super::ShardedOptimizer::last_step`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepSplit {
    /// Time in collectives: the gradient reduce-scatter, the norm (its partial taken over
    /// the shard) and its all-reduce, and the parameter all-gather, with the host copies in
    /// and out of their buffers (on the GPU, the readbacks and writes of the device's).
    pub communication: Duration,
    /// Time in the update of this rank's shard (on the GPU, its update passes).
    pub update: Duration,
    /// Bytes this rank sent to the others: `(N - 1)` gradient chunks of the reduce-scatter
    /// (f32, one shard each), `(N - 1)` copies of its parameter shard in the all-gather, the
    /// norm's 8 bytes to each when clipping, and with LAMB two f64 sums per tensor to each.
    /// ZeRO-1's `2 (N - 1) / N` of the parameters' bytes, plus padding, with f32 gradients.
    pub sent_bytes: u64,
}

/// The host buffers a sharded step reuses from step to step: the flat gradients every rank
/// contributes to the reduce-scatter, and this rank's reduced shard of them.
#[derive(Debug, Default)]
pub(crate) struct StepBuffers {
    flat: Vec<f32>,
    pub shard: Vec<f32>,
}

/// One rank's part of a sharded optimizer, fixed when it is built.
///
/// Tensors of the elementwise families lie in ZeRO-1's flat layout ([`FlatLayout`]), cut
/// into equal shards, LAMB's too (each tensor's sums combined across ranks,
/// [`Self::combine_sums`]), and Adafactor's (stepped by [`ShardedAdafactor`], which adds
/// their row and column sums across the ranks); tensors that a family steps whole (Muon's,
/// and LAMB's with low-bit state: `Algorithm::shard_whole`) are each given to one rank,
/// longest first to the least loaded (Megatron's layer-wise distributed optimizer). Rank `r`'s shard is
/// its slice of the flat layout followed by the tensors it owns, `shard_len` elements in all
/// (every rank's alike, padded): the gradients' reduce-scatter hands each rank its shard,
/// whole tensors included.
#[derive(Clone, Debug)]
pub(crate) struct ShardPlan {
    pub rank: usize,
    pub size: usize,
    /// Elements of every rank's shard, padding included.
    pub shard_len: u64,
    /// Every rank's pieces, `pieces[rank]`, in tensor order; a piece's `at` is where it
    /// lies in its rank's shard.
    pub pieces: Vec<Vec<Piece>>,
    pub lens: Vec<u64>,
    pub dtypes: Vec<DType>,
    /// The shapes the optimizer was given (empty, or one per tensor).
    shapes: Vec<Vec<usize>>,
    /// Whether tensor `i` is stepped whole by its owner rank.
    pub whole: Vec<bool>,
    pub reduction: GradReduction,
    /// The norm clipped across every rank's gradients, if any.
    pub clip: Option<NormType>,
    /// Bytes of the largest rank's parameter shard: every rank's part of the all-gather.
    pub gather_chunk: usize,
    /// The state storage the optimizer was built with.
    pub storage: StateStorage,
    /// Master-weight mode: the inner optimizers keep f32 masters of the pieces.
    pub masters: bool,
    /// Stochastic rounding, whose hash must see a piece's elements as its tensor's.
    stochastic: bool,
    /// Some tensor's family takes per-tensor sums in its step (LAMB's norms) from pieces in
    /// the flat layout: every rank combines them once per step ([`Self::combine_sums`]).
    pub sums: bool,
    /// Each tensor's algorithm.
    algorithms: Vec<Algorithm>,
}

impl ShardPlan {
    /// The plan of tensors of `lens` and `dtypes` under `algorithms` (one per tensor) and
    /// `options`, after refusing what a sharded step cannot run and checking that every rank
    /// was built alike (Error::Collective on every rank otherwise).
    pub(crate) fn new<C: Communicator + ?Sized>(
        comm: &C,
        lens: &[u64],
        dtypes: &[DType],
        algorithms: &[Algorithm],
        options: &OptimizerOptions,
        reduction: GradReduction,
    ) -> Result<Self> {
        refuse_options(options)?;
        if options.rounding.seed().is_some() && algorithms.iter().any(Algorithm::shard_whole) {
            return Err(Error::ConflictingOptions {
                first: "sharding",
                second: "rounding",
                reason: "stochastic rounding of a tensor stepped whole by its owner rank (Muon) would \
                         hash under another ordinal than unsharded",
            });
        }
        let mut distinct: Vec<Algorithm> = Vec::new();
        for algorithm in algorithms {
            if !distinct.contains(algorithm) {
                distinct.push(*algorithm);
            }
        }
        let clip = fused_clip(options.grad_clip, &distinct)?.map(|c| c.clip.norm_type);
        let configuration = format!(
            "ranks {} lens {lens:?} dtypes {dtypes:?} shapes {:?} algorithms {algorithms:?} storage {:?} \
             masters {} clip {:?} rounding {:?} reduction {reduction:?}",
            comm.size(),
            options.param_shapes,
            options.state_storage,
            options.master_weights,
            options.grad_clip,
            options.rounding,
        );
        comm.check_same(
            "configuration (world size, tensors, algorithms, options)",
            configuration.as_bytes(),
        )?;
        ShardedAdafactor::check(&distinct, lens, dtypes, options)?;
        let size = comm.size();
        // Low-bit blocks start at shard boundaries: every tensor and every shard a whole
        // number of blocks, so that a piece's blocks are the whole tensor's.
        let align = match options.state_storage {
            StateStorage::Q8(_) => crate::q8::BLOCK_SIZE as u64,
            StateStorage::Q4(q4) => q4.block_size as u64,
            _ => 1,
        };
        // A family that sums over each tensor (LAMB) has them combined across ranks by its
        // dense passes; with low-bit state its tensors step whole on owner ranks instead.
        let low_bit = matches!(options.state_storage, StateStorage::Q8(_) | StateStorage::Q4(_));
        let whole: Vec<bool> =
            algorithms.iter().map(|a| a.shard_whole() || (a.shard_sums() && low_bit)).collect();
        let sums = algorithms.iter().zip(&whole).any(|(a, &whole)| a.shard_sums() && !whole);
        let flat_tensors: Vec<usize> = (0..lens.len()).filter(|&i| !whole[i]).collect();
        let flat_lens: Vec<u64> = flat_tensors.iter().map(|&i| lens[i]).collect();
        let flat = FlatLayout::new(&flat_lens, size, align)?;
        let mut pieces: Vec<Vec<Piece>> = (0..size)
            .map(|r| {
                flat.pieces(r).into_iter().map(|p| Piece { tensor: flat_tensors[p.tensor], ..p }).collect()
            })
            .collect();
        let mut owned = vec![0u64; size];
        for (tensor, rank) in owners(lens, &whole, size) {
            let at = flat.shard_len() + owned[rank].next_multiple_of(align);
            pieces[rank].push(Piece { tensor, elements: 0..lens[tensor], at });
            owned[rank] = at - flat.shard_len() + lens[tensor];
        }
        let most_owned = owned.iter().max().copied().unwrap_or(0).next_multiple_of(align);
        for mine in &mut pieces {
            mine.sort_by_key(|p| p.tensor);
        }
        let bytes = |pieces: &[Piece]| {
            pieces.iter().map(|p| (p.elements.end - p.elements.start) * dtypes[p.tensor].size()).sum::<u64>()
        };
        let gather_chunk = pieces.iter().map(|p| bytes(p)).max().unwrap_or(0) as usize;
        Ok(ShardPlan {
            rank: comm.rank(),
            size,
            shard_len: flat.shard_len() + most_owned,
            pieces,
            lens: lens.to_vec(),
            dtypes: dtypes.to_vec(),
            shapes: options.param_shapes.clone(),
            whole,
            reduction,
            clip,
            gather_chunk,
            storage: options.state_storage,
            masters: options.master_weights,
            stochastic: options.rounding.seed().is_some(),
            sums,
            algorithms: algorithms.to_vec(),
        })
    }

    /// Whether tensor `i`'s pieces take its family's own sharded step (Adafactor's,
    /// [`ShardedAdafactor`], its rows' and columns' sums added across the ranks) rather
    /// than an inner optimizer's.
    pub(crate) fn own_step(&self, i: usize) -> bool {
        self.algorithms[i].shard_own_step()
    }

    /// Adafactor's sharded step over every Adafactor tensor, with this rank's pieces of them;
    /// `None` without Adafactor. `first_dtypes[i]`: the dtype of the first parameter of
    /// tensor `i`'s group (torch's `eps1 = None`).
    pub(crate) fn sharded_adafactor(&self, first_dtypes: &[DType]) -> Option<ShardedAdafactor> {
        let mine = self.mine();
        let elements = |i: usize| mine.iter().find(|p| p.tensor == i).map_or(0..0, |p| p.elements.clone());
        ShardedAdafactor::for_tensors(&self.algorithms, &self.shapes, first_dtypes, elements)
    }

    /// The shapes an inner optimizer over this rank's pieces `indices` is given: none where
    /// the optimizer was given none; else a whole tensor's shape where its owner steps it
    /// whole, and a piece's length where the piece lies in the flat layout.
    pub(crate) fn piece_shapes(&self, indices: &[usize]) -> Vec<Vec<usize>> {
        if self.shapes.is_empty() {
            return Vec::new();
        }
        let mine = self.mine();
        indices
            .iter()
            .map(|&j| match self.shapes.get(mine[j].tensor) {
                Some(shape) if self.whole[mine[j].tensor] => shape.clone(),
                _ => vec![(mine[j].elements.end - mine[j].elements.start) as usize],
            })
            .collect()
    }

    /// Where the elements of this rank's pieces `indices` come from: each piece's tensor and
    /// first element, so that stochastic rounding hashes a piece's elements as its whole
    /// tensor's (`OptimizerOptions::origins`).
    /// Empty without stochastic rounding, its only reader: a row's ordinal also places
    /// LAMB's workgroups by parameter, and LAMB refuses stochastic rounding.
    pub(crate) fn origins(&self, indices: &[usize]) -> Vec<(u32, u64)> {
        if !self.stochastic {
            return Vec::new();
        }
        let mine = self.mine();
        indices.iter().map(|&j| (mine[j].tensor as u32, mine[j].elements.start)).collect()
    }

    /// Whether tensor `i`'s state is low-bit: its whole length decides, as unsharded.
    pub(crate) fn low_bit(&self, i: usize) -> bool {
        match self.storage {
            StateStorage::Q8(c) => c.quantizes(self.lens[i]),
            StateStorage::Q4(c) => c.quantizes(self.lens[i]),
            _ => false,
        }
    }

    /// This rank's pieces grouped by the storage of their state, each with the storage the
    /// optimizer of that part is built with: with low-bit storage, whether a piece's state
    /// is low-bit follows its whole tensor's size, never the piece's (a shard must not flip
    /// it: bitsandbytes#2080, torchao#4912), so the pieces of quantized tensors go to an
    /// optimizer that quantizes every tensor and the others to one that quantizes none.
    /// Indices are into [`Self::mine`]; parts without pieces are left out.
    pub(crate) fn parts(&self) -> Vec<(StateStorage, Vec<usize>)> {
        let mine = self.mine();
        let all = (0..mine.len()).filter(|&j| !self.own_step(mine[j].tensor)).collect::<Vec<_>>();
        let (quantized, full): (StateStorage, StateStorage) = match self.storage {
            StateStorage::Q8(_) => (
                StateStorage::Q8(Q8States { min_8bit_size: 0 }),
                StateStorage::Q8(Q8States { min_8bit_size: u64::MAX }),
            ),
            StateStorage::Q4(c) => (
                StateStorage::Q4(Q4States { min_size: 0, ..c }),
                StateStorage::Q4(Q4States { min_size: u64::MAX, ..c }),
            ),
            other => return if all.is_empty() { Vec::new() } else { vec![(other, all)] },
        };
        let whole = |j: &usize| self.low_bit(mine[*j].tensor);
        let (low_bit, rest): (Vec<usize>, Vec<usize>) = all.into_iter().partition(whole);
        [(quantized, low_bit), (full, rest)].into_iter().filter(|(_, pieces)| !pieces.is_empty()).collect()
    }

    /// The tensors' lengths and dtypes and the state's storage, which a checkpoint of this
    /// plan's state records and a loader must have.
    #[cfg_attr(not(feature = "checkpoint"), allow(dead_code))]
    pub(crate) fn structure(&self) -> String {
        let (lens, dtypes, storage, masters) = (&self.lens, &self.dtypes, self.storage, self.masters);
        format!("lens {lens:?} dtypes {dtypes:?} storage {storage:?} masters {masters}")
    }

    /// This rank's pieces.
    pub(crate) fn mine(&self) -> &[Piece] {
        &self.pieces[self.rank]
    }

    /// This rank's shard of the reduced gradients, into `buffers.shard`: `grad(i, elements,
    /// out)` writes `elements` of tensor `i`'s gradient into `out` as f32, each piece straight
    /// into its place in the flat buffer; every rank's flat gradients are reduce-scattered
    /// in rank order, then divided by the number of ranks for the mean. The buffers are
    /// reused from step to step (padding, never written, stays 0).
    pub(crate) fn reduce_gradients<C: Communicator + ?Sized>(
        &self,
        comm: &C,
        buffers: &mut StepBuffers,
        mut grad: impl FnMut(usize, Range<usize>, &mut [f32]) -> Result<()>,
    ) -> Result<()> {
        let shard_len = self.shard_len as usize;
        buffers.flat.resize(shard_len * self.size, 0.0);
        for (rank, pieces) in self.pieces.iter().enumerate() {
            for piece in pieces {
                let (from, to) = (piece.elements.start as usize, piece.elements.end as usize);
                let at = rank * shard_len + piece.at as usize;
                grad(piece.tensor, from..to, &mut buffers.flat[at..at + to - from])?;
            }
        }
        match self.size {
            // One rank's flat gradients are its shard.
            1 => std::mem::swap(&mut buffers.flat, &mut buffers.shard),
            _ => comm.reduce_scatter_f32_into(&buffers.flat, &mut buffers.shard)?,
        }
        if self.reduction == GradReduction::Mean && self.size > 1 {
            let ranks = self.size as f32;
            buffers.shard.iter_mut().for_each(|g| *g /= ranks);
        }
        Ok(())
    }

    /// [`Self::reduce_gradients`], then [`Self::unscale`] with AMP's `inv_scale`: whether any
    /// rank's shard held a NaN or an infinity, when every rank skips the step.
    pub(crate) fn reduce_and_unscale<C: Communicator + ?Sized>(
        &self,
        comm: &C,
        buffers: &mut StepBuffers,
        inv_scale: Option<f32>,
        grad: impl FnMut(usize, Range<usize>, &mut [f32]) -> Result<()>,
    ) -> Result<bool> {
        self.reduce_gradients(comm, buffers, grad)?;
        self.unscale(comm, &mut buffers.shard, inv_scale)
    }

    /// The sums of each tensor over every rank's pieces of it (LAMB's `p^2` and `s^2`): `sums[k]`
    /// are this rank's piece `indices[k]`'s (indices into [`Self::mine`]), replaced by its
    /// tensor's totals, added in rank order. Every rank calls it once per step when
    /// [`Self::sums`], with nothing of its own where it has no such piece.
    pub(crate) fn combine_sums<C: Communicator + ?Sized>(
        &self,
        comm: &C,
        indices: &[usize],
        sums: &mut [[f64; 2]],
    ) -> Result<()> {
        let mine = self.mine();
        let mut all = vec![0f64; 2 * self.lens.len()];
        for (&j, pair) in indices.iter().zip(sums.iter()) {
            let t = mine[j].tensor;
            all[2 * t] += pair[0];
            all[2 * t + 1] += pair[1];
        }
        comm.all_reduce_f64(&mut all, ReduceOp::Sum)?;
        for (&j, pair) in indices.iter().zip(sums.iter_mut()) {
            let t = mine[j].tensor;
            *pair = [all[2 * t], all[2 * t + 1]];
        }
        Ok(())
    }

    /// AMP's unscale of this rank's gradient shard, as PyTorch's
    /// `_amp_foreach_non_finite_check_and_unscale_` does it (a gradient that is NaN or
    /// infinite is flagged, every one is multiplied by `inv_scale` unless it is 1), then the
    /// flags of every rank combined: whether any rank's shard held a non-finite gradient,
    /// the same answer on every rank. `None`: no loss scale, nothing to do.
    pub(crate) fn unscale<C: Communicator + ?Sized>(
        &self,
        comm: &C,
        shard: &mut [f32],
        inv_scale: Option<f32>,
    ) -> Result<bool> {
        let Some(inv_scale) = inv_scale else { return Ok(false) };
        let found = shard.iter().any(|g| !g.is_finite());
        if inv_scale != 1.0 {
            shard.iter_mut().for_each(|g| *g *= inv_scale);
        }
        let mut any = [f64::from(u8::from(found))];
        comm.all_reduce_f64(&mut any, ReduceOp::Max)?;
        Ok(any[0] > 0.0)
    }

    /// Refuses a loss scale whose inverse is not a positive finite f32.
    pub(crate) fn check_inv_scale(inv_scale: f32) -> Result<()> {
        if !(inv_scale.is_finite() && inv_scale > 0.0) {
            return Err(Error::BadValue {
                argument: "inv_scale".into(),
                problem: format!("is {inv_scale}; expected the inverse of a loss scale, positive and finite"),
            });
        }
        Ok(())
    }

    /// With clipping, the norm of every rank's gradients: this rank's partial over its
    /// reduced `shard` (padding adds 0), taken on the host where the shard already is,
    /// combined in rank order: the same bits on every rank.
    pub(crate) fn global_norm<C: Communicator + ?Sized>(
        &self,
        comm: &C,
        shard: &[f32],
    ) -> Result<Option<f32>> {
        let Some(norm_type) = self.clip else { return Ok(None) };
        let (partial, op) = match norm_type {
            NormType::L2 => {
                // Eight lanes added in order: vectorized, and the same sum on any machine.
                let mut lanes = [0f64; 8];
                let mut eights = shard.chunks_exact(8);
                for eight in &mut eights {
                    for (lane, &g) in lanes.iter_mut().zip(eight) {
                        *lane += f64::from(g) * f64::from(g);
                    }
                }
                let tail: f64 = eights.remainder().iter().map(|&g| f64::from(g) * f64::from(g)).sum();
                (lanes.iter().sum::<f64>() + tail, ReduceOp::Sum)
            }
            NormType::Inf => {
                let largest = shard.iter().fold(0f64, |m, &g| match m.is_nan() || g.is_nan() {
                    true => f64::NAN,
                    false => m.max(f64::from(g.abs())),
                });
                (largest, ReduceOp::Max)
            }
        };
        let mut value = [partial];
        comm.all_reduce_f64(&mut value, op)?;
        // In f32, as PyTorch returns the norm of f32 gradients.
        Ok(Some(match norm_type {
            NormType::L2 => value[0].sqrt() as f32,
            NormType::Inf => value[0] as f32,
        }))
    }

    /// Gathers every rank's updated pieces: `mine` is this rank's pieces' bytes in order;
    /// `write(piece, bytes)` is called for every other rank's piece with its bytes. The
    /// callers skip it for one rank, which has nothing to gather.
    pub(crate) fn gather_params<C: Communicator + ?Sized>(
        &self,
        comm: &C,
        mut mine: Vec<u8>,
        mut write: impl FnMut(&Piece, &[u8]) -> Result<()>,
    ) -> Result<()> {
        mine.resize(self.gather_chunk, 0);
        let all = comm.all_gather_bytes(&mine)?;
        for (rank, pieces) in self.pieces.iter().enumerate().filter(|(r, _)| *r != self.rank) {
            let mut at = rank * self.gather_chunk;
            for piece in pieces {
                let len =
                    ((piece.elements.end - piece.elements.start) * self.dtypes[piece.tensor].size()) as usize;
                write(piece, &all[at..at + len])?;
                at += len;
            }
        }
        Ok(())
    }

    /// The bytes a step sends to the other ranks (see [`StepSplit::sent_bytes`]).
    pub(crate) fn sent_bytes(&self) -> u64 {
        let others = self.size as u64 - 1;
        let norm = if self.clip.is_some() { 8 } else { 0 };
        let sums = if self.sums { 16 * self.lens.len() as u64 } else { 0 };
        let adafactor = 8 * ShardedAdafactor::values_per_step(&self.algorithms, &self.shapes);
        others * (self.shard_len * 4 + self.gather_chunk as u64 + norm + sums + adafactor)
    }

    /// Checks that `argument` has one entry per parameter.
    pub(crate) fn check_counts(&self, argument: &str, count: usize) -> Result<()> {
        if count != self.lens.len() {
            return Err(Error::CountMismatch {
                argument: argument.into(),
                got: count,
                expected: self.lens.len(),
            });
        }
        Ok(())
    }

    /// Checks tensor `i` of `argument` has its parameter's length.
    pub(crate) fn check_len(&self, argument: &str, i: usize, len: u64) -> Result<()> {
        if len != self.lens[i] {
            return Err(Error::LengthMismatch {
                argument: format!("{argument}[{i}]"),
                got: len,
                expected: self.lens[i],
                reference: format!("params[{i}]"),
            });
        }
        Ok(())
    }
}

/// Refuses the options a sharded step does not run yet.
fn refuse_options(options: &OptimizerOptions) -> Result<()> {
    let refuse = |second, reason| Err(Error::ConflictingOptions { first: "sharding", second, reason });
    if options.state_storage == StateStorage::Dtype(crate::DType::F64) {
        return refuse(
            "state_storage",
            "a sharded step keeps no f64 state: its gradients are reduced in f32",
        );
    }
    if options.capturable {
        return refuse(
            "capturable",
            "a sharded step reads its gradients on the host, so capturable mode gains nothing: AMP's \
             sharded step is `step_scaled`",
        );
    }
    if !options.model_copies.is_empty() {
        return refuse("model_copies", "model copies are not gathered across ranks yet");
    }
    Ok(())
}

/// `outcome` on this rank, once every rank has said whether its part succeeded: this rank's
/// error if it failed, [`Error::Collective`] naming `what` if another rank's failed, so
/// that every rank returns an error when one does.
#[cfg_attr(not(feature = "checkpoint"), allow(dead_code))]
pub(crate) fn agree<C: Communicator + ?Sized, T>(comm: &C, what: &str, outcome: Result<T>) -> Result<T> {
    let mut failed = [f64::from(u8::from(outcome.is_err()))];
    comm.all_reduce_f64(&mut failed, ReduceOp::Max)?;
    match outcome {
        Err(e) => Err(e),
        Ok(_) if failed[0] > 0.0 => Err(Error::Collective {
            operation: what.into(),
            rank: comm.rank(),
            size: comm.size(),
            problem: format!("another rank's {what} failed (its own error says why)"),
        }),
        Ok(value) => Ok(value),
    }
}

/// The owner rank of each tensor stepped whole (`whole[i]`): longest first, each to the
/// rank with the fewest elements so far (the lowest rank on a tie), as Megatron's layer-wise
/// optimizer packs them; returned in tensor order.
fn owners(lens: &[u64], whole: &[bool], ranks: usize) -> Vec<(usize, usize)> {
    let mut order: Vec<usize> = (0..lens.len()).filter(|&i| whole[i] && lens[i] > 0).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(lens[i]));
    let mut load = vec![0u64; ranks];
    let mut owners: Vec<(usize, usize)> = order
        .into_iter()
        .map(|i| {
            let rank = (0..ranks).min_by_key(|&r| load[r]).unwrap_or(0);
            load[rank] += lens[i];
            (i, rank)
        })
        .collect();
    owners.sort_unstable();
    owners
}

/// The bytes an 8-bit state holds: its codes and block scales, or its f32 values.
pub(crate) fn q8_bytes(state: &crate::q8::StoredState) -> u64 {
    match state {
        crate::q8::StoredState::Q8 { codes, absmax } => (codes.len() + 4 * absmax.len()) as u64,
        crate::q8::StoredState::F32(values) => 4 * values.len() as u64,
    }
}

/// The bytes a 4-bit state holds: its packed codes and block scales, or its f32 values.
pub(crate) fn q4_bytes(state: &crate::q4::Q4State) -> u64 {
    match state {
        crate::q4::Q4State::Q4 { codes, scale } => (codes.len() + 4 * scale.len()) as u64,
        crate::q4::Q4State::F32(values) => 4 * values.len() as u64,
    }
}
