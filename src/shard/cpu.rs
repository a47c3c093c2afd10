//! The sharded optimizer on the CPU backend: a [`CpuOptimizer`] over this rank's pieces of
//! the parameters.

use std::time::Instant;

use super::plan::{GradReduction, ShardPlan, StepBuffers, StepSplit};
use super::Communicator;
use crate::cpu::{CpuOptimizer, CpuOptimizerBuilder, HostSlice, HostSliceMut, StateView};
use crate::family::adafactor::shard::{PieceStep, ShardedAdafactor};
use crate::{Algorithm, DType, Result, StateKind};

/// A ZeRO-1 optimizer on the CPU backend: every rank holds every parameter and computes
/// gradients for all of them; each rank keeps the state of its shard only (its pieces of
/// the flat layout, [`super::FlatLayout`], and for Muon the tensors it owns whole),
/// updates that shard, and the updated shards are gathered so that every rank ends the
/// step with every parameter.
///
/// Every rank builds it alike (the same parameters' dtypes and lengths, algorithm and
/// options), with its own [`Communicator`] of one group, and calls [`Self::step`] at
/// every step; a rank built differently is refused at build time on every rank
/// ([`Error::Collective`](crate::Error::Collective)). An elementwise family's step is the
/// unsharded optimizer's, bit for bit, over the reduced gradients; with clipping, the
/// global norm is combined from the ranks' partial sums in rank order, so every rank
/// clips by the same bits.
///
/// ```
/// # fn main() -> wgpu_optim::Result<()> {
/// use std::time::Duration;
/// use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut};
/// use wgpu_optim::shard::{GradReduction, InProcess, ShardedCpuOptimizer};
/// use wgpu_optim::Adam;
///
/// let ranks = InProcess::group(2, Duration::from_secs(10))?;
/// let handles: Vec<_> = ranks.into_iter().map(|comm| std::thread::spawn(move || {
///     let mut weights = vec![0.5f32; 1000];
///     let builder = CpuOptimizer::builder();
///     let mut opt = ShardedCpuOptimizer::build(
///         comm, builder, GradReduction::Mean, Adam::default(), &[HostSlice::from(&weights[..])])?;
///     let grads = vec![0.01f32; 1000]; // this rank's gradients
///     opt.step(&mut [HostSliceMut::from(&mut weights[..])], &[HostSlice::from(&grads[..])])?;
///     Ok::<_, wgpu_optim::Error>(weights)
/// })).collect();
/// let results: Vec<Vec<f32>> = handles.into_iter().map(|h| h.join().unwrap()).collect::<Result<_, _>>()?;
/// assert_eq!(results[0], results[1]);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct ShardedCpuOptimizer<C> {
    comm: C,
    plan: ShardPlan,
    /// The optimizers of this rank's pieces: one, or with low-bit storage one for the
    /// pieces of quantized tensors and one for the others (none when its shard holds only
    /// padding).
    parts: Vec<Part>,
    /// Steps taken (kept here too: a rank with no pieces has no inner optimizer to count).
    steps: u64,
    last: StepSplit,
    /// The host buffers each step reuses.
    buffers: StepBuffers,
    /// Adafactor's sharded step over its tensors' pieces (`None` without Adafactor).
    adafactor: Option<ShardedAdafactor>,
    /// Its 16-bit pieces' values in f32, one buffer per Adafactor tensor, reused by every
    /// step.
    wide: Vec<Vec<f32>>,
}

/// One optimizer over some of this rank's pieces.
#[derive(Debug)]
struct Part {
    optimizer: CpuOptimizer,
    /// Its parameters' indices among the plan's pieces of this rank (`ShardPlan::mine`).
    indices: Vec<usize>,
}

impl<C: Communicator> ShardedCpuOptimizer<C> {
    /// Builds this rank's part over `params` (every parameter, as every rank holds them)
    /// with `builder`'s options; the ranks' gradients combine as `reduction` says.
    ///
    /// Refused on every rank when the ranks' configurations differ, and
    /// ([`Error::ConflictingOptions`](crate::Error::ConflictingOptions)) for what a
    /// sharded step does not run: F64 state, and stochastic rounding with a family stepped
    /// whole. Muon's tensors are each stepped whole by one owner rank; LAMB's and
    /// Adafactor's lie in the flat layout, each tensor's sums combined across the ranks
    /// (LAMB's whole on owner ranks with low-bit state), Adafactor's refused as its
    /// unsharded builder refuses them (without `param_shapes`, with clipping, ...).
    /// Stochastic rounding hashes a piece's elements as its whole tensor's. With 8-bit or
    /// 4-bit storage, blocks start at shard boundaries and whether a tensor's state is
    /// low-bit follows the whole tensor's size, as unsharded.
    pub fn build(
        comm: C,
        builder: CpuOptimizerBuilder,
        reduction: GradReduction,
        algorithm: impl Into<Algorithm>,
        params: &[HostSlice<'_>],
    ) -> Result<Self> {
        let algorithm = algorithm.into();
        let lens: Vec<u64> = params.iter().map(|p| p.len() as u64).collect();
        let dtypes: Vec<DType> = params.iter().map(|p| p.dtype()).collect();
        let algorithms = vec![algorithm; params.len()];
        let plan = ShardPlan::new(&comm, &lens, &dtypes, &algorithms, &builder.options, reduction)?;
        let mine = plan.mine();
        // torch's `eps1 = None` is the first parameter's dtype (one group here).
        let adafactor =
            plan.sharded_adafactor(&vec![dtypes.first().copied().unwrap_or(DType::F32); lens.len()]);
        let mut parts = Vec::new();
        for (storage, indices) in plan.parts() {
            let pieces: Vec<HostSlice<'_>> = indices
                .iter()
                .map(|&j| {
                    sub(
                        params[mine[j].tensor],
                        mine[j].elements.start as usize,
                        mine[j].elements.end as usize,
                    )
                })
                .collect();
            // Pieces are flat, tensors stepped whole keep their shapes.
            let mut builder =
                builder.clone().state_storage(storage).param_shapes(plan.piece_shapes(&indices));
            builder.options.origins = plan.origins(&indices);
            parts.push(Part { optimizer: builder.build(algorithm, &pieces)?, indices });
        }
        Ok(ShardedCpuOptimizer {
            comm,
            plan,
            parts,
            steps: 0,
            last: StepSplit::default(),
            buffers: StepBuffers::default(),
            wide: vec![Vec::new(); adafactor.as_ref().map_or(0, |a| a.indices().count())],
            adafactor,
        })
    }

    /// One step: `grads` are this rank's gradients of every parameter; they are reduced
    /// across ranks, this rank's shard of `params` is updated, and every rank's updated
    /// shard is gathered into `params`, so that `params` ends the step equal on every rank.
    ///
    /// Refused, with nothing changed, when the counts, dtypes or lengths differ from the
    /// parameters' on any rank: that rank gets its error, the others
    /// [`Error::Collective`](crate::Error::Collective), and the next step meets again. A
    /// rank that fails or leaves mid-step makes the others' step
    /// [`Error::Collective`](crate::Error::Collective); `params` may then hold this rank's
    /// shard updated and the others' not.
    pub fn step(&mut self, params: &mut [HostSliceMut<'_>], grads: &[HostSlice<'_>]) -> Result<()> {
        self.step_with(params, grads, None).map(drop)
    }

    /// AMP's step (PyTorch's `GradScaler.step`): `grads` are this rank's gradients of the
    /// loss multiplied by the loss scale; after the reduction each is unscaled
    /// (`* inv_scale`) and checked, and when any rank's held a NaN or an infinity every
    /// rank skips the step, leaving parameters, state and step count as they were. Returns
    /// whether it stepped (the trainer then lowers or raises its scale as `GradScaler`
    /// does). With clipping the norm is the unscaled gradients'.
    pub fn step_scaled(
        &mut self,
        params: &mut [HostSliceMut<'_>],
        grads: &[HostSlice<'_>],
        inv_scale: f32,
    ) -> Result<bool> {
        self.step_with(params, grads, Some(inv_scale))
    }

    fn step_with(
        &mut self,
        params: &mut [HostSliceMut<'_>],
        grads: &[HostSlice<'_>],
        inv_scale: Option<f32>,
    ) -> Result<bool> {
        // Every rank refuses together, so that none waits in a collective for a refused one.
        let checked =
            inv_scale.map_or(Ok(()), ShardPlan::check_inv_scale).and_then(|()| self.check(params, grads));
        super::plan::agree(&self.comm, "step", checked)?;
        let started = Instant::now();
        let grad = |i: usize, elements: std::ops::Range<usize>, out: &mut [f32]| {
            widen(sub(grads[i], elements.start, elements.end), out);
            Ok(())
        };
        if self.plan.reduce_and_unscale(&self.comm, &mut self.buffers, inv_scale, grad)? {
            self.last = StepSplit { communication: started.elapsed(), ..StepSplit::default() };
            return Ok(false);
        }
        let shard = &self.buffers.shard;
        let pieces = self.plan.mine();
        let piece_grads: Vec<HostSlice<'_>> = pieces
            .iter()
            .map(|p| {
                HostSlice::F32(&shard[p.at as usize..(p.at + p.elements.end - p.elements.start) as usize])
            })
            .collect();
        let total_norm = self.plan.global_norm(&self.comm, shard)?;
        let communicated = started.elapsed();

        let updating = Instant::now();
        // LAMB's sums over each tensor's pieces on every rank, combined in the step: once
        // per rank, by the part whose passes take them, or below with nothing of its own.
        let (plan, comm) = (&self.plan, &self.comm);
        let (mut combined, mut failed) = (false, None);
        let (adafactor, wide, t) = (&mut self.adafactor, &mut self.wide, self.steps + 1);
        let adafactor_step = |pieces: &mut [Option<HostSliceMut<'_>>]| match adafactor {
            Some(adafactor) => step_adafactor(plan, comm, adafactor, t, pieces, &piece_grads, wide),
            None => Ok(()),
        };
        let mine =
            each_part(plan, &mut self.parts, params, adafactor_step, |optimizer, params_here, indices| {
                let grads_here: Vec<HostSlice<'_>> = indices.iter().map(|&j| piece_grads[j]).collect();
                let mut combine = |sums: &mut [[f64; 2]]| {
                    combined = true;
                    if let Err(e) = plan.combine_sums(comm, indices, sums) {
                        failed = Some(e);
                    }
                };
                let sums = plan.sums.then_some(&mut combine as &mut crate::cpu::passes::TensorSums<'_>);
                optimizer.step_with_norm(params_here, &grads_here, total_norm, sums)
            })?;
        if plan.sums && !combined {
            plan.combine_sums(comm, &[], &mut [])?;
        }
        if let Some(e) = failed {
            return Err(e);
        }
        let update = updating.elapsed();

        let gathering = Instant::now();
        self.gather(params, mine)?;
        self.last = StepSplit {
            communication: communicated + gathering.elapsed(),
            update,
            sent_bytes: self.plan.sent_bytes(),
        };
        self.steps += 1;
        Ok(true)
    }

    /// All-gathers every rank's pieces (`mine`: this rank's bytes) and writes the others'
    /// into `params`.
    fn gather(&self, params: &mut [HostSliceMut<'_>], mine: Vec<u8>) -> Result<()> {
        if self.plan.size == 1 {
            return Ok(());
        }
        self.plan.gather_params(&self.comm, mine, |piece, data| {
            let (start, end) = (piece.elements.start as usize, piece.elements.end as usize);
            write_bytes(sub_mut(params[piece.tensor].reborrow(), start, end), data);
            Ok(())
        })
    }

    /// Schedule-Free's `eval()`: every rank swaps its pieces of `params` to the point the
    /// family evaluates at (`x`), and the pieces are gathered, so that `params` is that point
    /// on every rank. Every rank calls it; steps are refused until [`Self::train`]. A no-op
    /// for the other families, as on [`CpuOptimizer::eval`].
    pub fn eval(&mut self, params: &mut [HostSliceMut<'_>]) -> Result<()> {
        self.swap(params, true)
    }

    /// Schedule-Free's `train()`: the swap back to the point the steps update (`y`),
    /// gathered alike.
    pub fn train(&mut self, params: &mut [HostSliceMut<'_>]) -> Result<()> {
        self.swap(params, false)
    }

    fn swap(&mut self, params: &mut [HostSliceMut<'_>], eval: bool) -> Result<()> {
        // Refused on every rank together, as a step is.
        let swapped = self.check_params(params).and_then(|()| {
            let nothing = |_: &mut [Option<HostSliceMut<'_>>]| Ok(());
            each_part(&self.plan, &mut self.parts, params, nothing, |optimizer, params_here, _| match eval {
                true => optimizer.eval(params_here),
                false => optimizer.train(params_here),
            })
        });
        let mine = super::plan::agree(&self.comm, if eval { "eval" } else { "train" }, swapped)?;
        self.gather(params, mine)
    }

    fn check(&self, params: &[HostSliceMut<'_>], grads: &[HostSlice<'_>]) -> Result<()> {
        self.check_params(params)?;
        self.plan.check_counts("grads", grads.len())?;
        for (i, grad) in grads.iter().enumerate() {
            self.plan.check_len("grads", i, grad.len() as u64)?;
        }
        Ok(())
    }

    fn check_params(&self, params: &[HostSliceMut<'_>]) -> Result<()> {
        self.plan.check_counts("params", params.len())?;
        for (i, param) in params.iter().enumerate() {
            if param.dtype() != self.plan.dtypes[i] {
                return Err(crate::Error::DTypeMismatch {
                    argument: format!("params[{i}]"),
                    got: param.dtype(),
                    expected: format!("{:?}, the dtype it was built with", self.plan.dtypes[i]),
                });
            }
            self.plan.check_len("params", i, param.len() as u64)?;
        }
        Ok(())
    }

    /// Steps taken so far.
    pub fn step_count(&self) -> u64 {
        self.steps
    }

    /// Where piece `j` of this rank (`ShardPlan::mine`) lives: its part and its index there.
    #[cfg(feature = "checkpoint")]
    fn locate(&self, j: usize) -> Option<(usize, usize)> {
        self.parts
            .iter()
            .enumerate()
            .find_map(|(p, part)| part.indices.iter().position(|&i| i == j).map(|k| (p, k)))
    }

    /// Writes this rank's checkpoint file into `dir`, as
    /// [`ShardedOptimizer::save`](super::ShardedOptimizer::save) does (the same format: a
    /// checkpoint of either backend loads into the other).
    #[cfg(feature = "checkpoint")]
    pub fn save(&self, dir: impl AsRef<std::path::Path>) -> Result<()> {
        use super::checkpoint::PieceState;
        let schedule_free = vec![self.parts.first().and_then(|p| p.optimizer.schedule_free_scalars(0))];
        let adafactor = self.adafactor.as_ref();
        let written =
            super::checkpoint::collect(&self.plan, self.steps, schedule_free, adafactor, |j, kind| {
                let state = self.locate(j).and_then(|(p, k)| self.parts[p].optimizer.state(k, kind));
                Ok(match state {
                    Some(StateView::Host(slice)) => {
                        Some(PieceState::Dense(slice.to_f64().into_iter().map(|v| v as f32).collect()))
                    }
                    Some(StateView::Q8(state)) => Some(PieceState::Q8(state.clone())),
                    Some(StateView::Q4(state)) => Some(PieceState::Q4(state.clone())),
                    None => None,
                })
            })
            .and_then(|file| super::checkpoint::write(dir.as_ref(), self.plan.rank, &file));
        super::plan::agree(&self.comm, "save", written)
    }

    /// Loads a checkpoint saved on any number of ranks, as
    /// [`ShardedOptimizer::load`](super::ShardedOptimizer::load) does.
    #[cfg(feature = "checkpoint")]
    pub fn load(&mut self, dir: impl AsRef<std::path::Path>) -> Result<()> {
        use super::checkpoint::PieceState;
        let dir = dir.as_ref();
        let loaded = super::checkpoint::read_for(&self.plan, &self.comm, dir)?;
        let located: Vec<Option<(usize, usize)>> =
            (0..self.plan.mine().len()).map(|j| self.locate(j)).collect();
        let parts = &mut self.parts;
        let kinds: Vec<Vec<StateKind>> = located
            .iter()
            .map(|at| {
                let keeps = |kind| at.is_some_and(|(p, k)| parts[p].optimizer.state(k, kind).is_some());
                StateKind::ALL.iter().copied().filter(|&kind| keeps(kind)).collect()
            })
            .collect();
        super::checkpoint::apply(
            &self.plan,
            &loaded,
            dir,
            self.adafactor.as_mut(),
            |j, kind| kinds[j].contains(&kind),
            |j, kind, state| {
                let Some((p, k)) = located[j] else { return Ok(()) };
                let optimizer = &mut parts[p].optimizer;
                match state {
                    PieceState::Dense(values) => {
                        if let Some(slice) = optimizer.state_mut(k, kind) {
                            narrow_into(&values, slice);
                        }
                        Ok(())
                    }
                    PieceState::Q8(state) => optimizer.set_state(k, kind, crate::QuantizedState::Q8(state)),
                    PieceState::Q4(state) => optimizer.set_state(k, kind, crate::QuantizedState::Q4(state)),
                }
            },
        )?;
        for part in parts.iter_mut() {
            part.optimizer.set_step_count(loaded.step)?;
            if let Some(Some(scalars)) = loaded.schedule_free.first() {
                part.optimizer.set_schedule_free_scalars(0, *scalars)?;
            }
        }
        self.steps = loaded.step;
        Ok(())
    }

    /// With clipping: the last step's global gradient norm, the same bits on every rank.
    pub fn grad_norm(&self) -> Option<f64> {
        self.parts.first().and_then(|p| p.optimizer.grad_norm())
    }

    /// Sets the learning rate (every rank sets the same, or their steps differ).
    pub fn set_lr(&mut self, lr: f64) -> Result<()> {
        if let Some(adafactor) = &mut self.adafactor {
            adafactor.set_lr(0..self.plan.lens.len(), lr)?;
        }
        self.parts.iter_mut().try_for_each(|p| p.optimizer.set_lr(lr))
    }

    /// The last step's communication and update time and the bytes this rank sent.
    pub fn last_step(&self) -> StepSplit {
        self.last
    }

    /// The communicator it steps with.
    pub fn communicator(&self) -> &C {
        &self.comm
    }

    /// The bytes of optimizer state this rank holds, counted from the states it keeps
    /// (codes and scales of low-bit state): `1 / N` of the unsharded optimizer's, give or
    /// take a shard's padding.
    pub fn state_bytes(&self) -> u64 {
        let mut total = self.adafactor.as_ref().map_or(0, ShardedAdafactor::state_bytes);
        for part in &self.parts {
            for i in 0..part.optimizer.param_count() {
                for &kind in StateKind::ALL {
                    total += match part.optimizer.state(i, kind) {
                        Some(StateView::Host(slice)) => slice.len() as u64 * slice.dtype().size(),
                        Some(StateView::Q8(state)) => super::plan::q8_bytes(state),
                        Some(StateView::Q4(state)) => super::plan::q4_bytes(state),
                        None => 0,
                    };
                }
            }
        }
        total
    }

    /// The elements of each parameter this rank's shard holds, in order: `(tensor,
    /// elements)`.
    pub fn shard_pieces(&self) -> Vec<(usize, std::ops::Range<u64>)> {
        self.plan.mine().iter().map(|p| (p.tensor, p.elements.clone())).collect()
    }
}

/// Runs `run` on every part's optimizer with the part's pieces of `params` (and their
/// indices among this rank's pieces of `plan`), then `rest` with every piece of this rank
/// (the pieces no part holds are Adafactor's), then returns this rank's pieces' bytes in
/// order. `rest` runs even when a part fails, so that every rank makes its collectives.
fn each_part(
    plan: &ShardPlan,
    parts: &mut [Part],
    params: &mut [HostSliceMut<'_>],
    rest: impl FnOnce(&mut [Option<HostSliceMut<'_>>]) -> Result<()>,
    mut run: impl FnMut(&mut CpuOptimizer, &mut [HostSliceMut<'_>], &[usize]) -> Result<()>,
) -> Result<Vec<u8>> {
    let mut by_tensor: Vec<Option<&super::Piece>> = vec![None; params.len()];
    for piece in plan.mine() {
        by_tensor[piece.tensor] = Some(piece);
    }
    let mut piece_params: Vec<Option<HostSliceMut<'_>>> = params
        .iter_mut()
        .zip(&by_tensor)
        .filter_map(|(param, piece)| {
            piece.map(|p| Some(sub_mut(param.reborrow(), p.elements.start as usize, p.elements.end as usize)))
        })
        .collect();
    let mut ran = Ok(());
    for part in parts.iter_mut() {
        let mut params_here: Vec<HostSliceMut<'_>> =
            part.indices.iter().filter_map(|&j| piece_params[j].take()).collect();
        let outcome = run(&mut part.optimizer, &mut params_here, &part.indices);
        for (&j, param) in part.indices.iter().zip(params_here) {
            piece_params[j] = Some(param);
        }
        ran = ran.and(outcome);
    }
    let rested = rest(&mut piece_params);
    ran.and(rested)?;
    // One rank has nothing to gather.
    let mut mine = Vec::with_capacity(if plan.size > 1 { plan.gather_chunk } else { 0 });
    for piece in piece_params.iter().flatten().filter(|_| plan.size > 1) {
        append_bytes(piece.as_slice(), &mut mine);
    }
    Ok(mine)
}

/// Adafactor's sharded step (`t`) over this rank's pieces of its tensors (`pieces`: every
/// piece of this rank, by its index in `plan.mine()`; `grads`: theirs): f32 parameters in
/// place, 16-bit ones widened to f32 for it (into `wide`, one buffer per Adafactor tensor)
/// and rounded back after. Every rank calls it.
fn step_adafactor<C: Communicator>(
    plan: &ShardPlan,
    comm: &C,
    adafactor: &mut ShardedAdafactor,
    t: u64,
    pieces: &mut [Option<HostSliceMut<'_>>],
    grads: &[HostSlice<'_>],
    wide: &mut [Vec<f32>],
) -> Result<()> {
    /// A piece's parameters as the step takes them.
    enum Values<'a, 'b> {
        InPlace(&'a mut [f32]),
        Widened(&'a mut Vec<f32>, &'a mut HostSliceMut<'b>),
    }
    let mine = plan.mine();
    let mut by_piece: Vec<Option<&mut HostSliceMut<'_>>> = pieces.iter_mut().map(Option::as_mut).collect();
    let mut values: Vec<Option<(usize, Values<'_, '_>)>> = adafactor
        .indices()
        .zip(wide.iter_mut())
        .map(|(i, wide)| {
            let j = mine.iter().position(|p| p.tensor == i)?;
            let param = by_piece[j].take()?;
            Some((
                j,
                match param {
                    HostSliceMut::F32(v) => Values::InPlace(v),
                    other => {
                        wide.resize(other.len(), 0.0);
                        widen(other.as_slice(), wide);
                        Values::Widened(wide, other)
                    }
                },
            ))
        })
        .collect();
    let mut steps: Vec<PieceStep<'_>> = values
        .iter_mut()
        .map(|v| {
            let (j, values) = v.as_mut()?;
            let HostSlice::F32(g) = grads[*j] else { return None };
            match values {
                Values::InPlace(p) => Some((&mut **p, g)),
                Values::Widened(wide, _) => Some((&mut wide[..], g)),
            }
        })
        .collect();
    let mut all_reduce = |values: &mut [f64]| comm.all_reduce_f64(values, super::ReduceOp::Sum);
    adafactor.step(t, &mut steps, &mut all_reduce)?;
    drop(steps);
    for (_, v) in values.into_iter().flatten() {
        if let Values::Widened(wide, param) = v {
            narrow_into(wide, param.reborrow());
        }
    }
    Ok(())
}

/// Writes f32 `values` into `slice`, rounded to its dtype.
fn narrow_into(values: &[f32], slice: HostSliceMut<'_>) {
    match slice {
        HostSliceMut::F32(v) => v.copy_from_slice(values),
        HostSliceMut::F16(v) => v.iter_mut().zip(values).for_each(|(o, x)| *o = half::f16::from_f32(*x)),
        HostSliceMut::BF16(v) => v.iter_mut().zip(values).for_each(|(o, x)| *o = half::bf16::from_f32(*x)),
    }
}

/// Elements `start..end` of `slice`.
fn sub(slice: HostSlice<'_>, start: usize, end: usize) -> HostSlice<'_> {
    slice.split_at(end).0.split_at(start).1
}

/// Elements `start..end` of `slice`.
fn sub_mut(slice: HostSliceMut<'_>, start: usize, end: usize) -> HostSliceMut<'_> {
    slice.split_at(end).0.split_at(start).1
}

/// `slice`'s values in f32 (exact for every dtype it holds).
fn widen(slice: HostSlice<'_>, out: &mut [f32]) {
    match slice {
        HostSlice::F32(v) => out.copy_from_slice(v),
        HostSlice::F16(v) => out.iter_mut().zip(v).for_each(|(o, x)| *o = x.to_f32()),
        HostSlice::BF16(v) => out.iter_mut().zip(v).for_each(|(o, x)| *o = x.to_f32()),
    }
}

/// Appends a slice's elements as bytes to `out` (the targets this crate builds for are
/// little-endian).
fn append_bytes(slice: HostSlice<'_>, out: &mut Vec<u8>) {
    match slice {
        HostSlice::F32(v) => out.extend_from_slice(bytemuck::cast_slice(v)),
        HostSlice::F16(v) => out.extend_from_slice(bytemuck::cast_slice(v)),
        HostSlice::BF16(v) => out.extend_from_slice(bytemuck::cast_slice(v)),
    }
}

/// Overwrites a slice's elements from [`bytes`]' form.
fn write_bytes(slice: HostSliceMut<'_>, data: &[u8]) {
    match slice {
        HostSliceMut::F32(v) => bytemuck::cast_slice_mut(v).copy_from_slice(data),
        HostSliceMut::F16(v) => bytemuck::cast_slice_mut(v).copy_from_slice(data),
        HostSliceMut::BF16(v) => bytemuck::cast_slice_mut(v).copy_from_slice(data),
    }
}
