//! The sharded optimizer on the GPU: an [`Optimizer`] over views of this rank's pieces of
//! the parameters, its gradients in one buffer of the reduced shard.

use std::time::Instant;

#[cfg(feature = "checkpoint")]
use super::checkpoint::PieceState;
use super::plan::{GradReduction, ShardPlan, StepBuffers, StepSplit};
mod adafactor;

use super::{Communicator, Piece};
use crate::gpu::plan::Arg;
#[cfg(feature = "checkpoint")]
use crate::QuantizedState;
use crate::{
    DType, Error, GpuContext, Optimizer, OptimizerBuilder, ParamGroup, Result, StateKind, StateView, Tensor,
};
use adafactor::AdafactorPieces;

/// A ZeRO-1 optimizer on the GPU: every rank holds every parameter on its device and
/// computes gradients for all of them; each rank keeps the state of its shard only (its
/// pieces of the flat layout, [`super::FlatLayout`], and the tensors of Muon it owns
/// whole), updates that shard in one fused step (Adafactor's pieces on the host, their
/// sums added across the ranks), and the
/// updated shards are gathered so that every rank's parameters are equal after the step.
///
/// What crosses ranks goes through the host: each step reads this rank's gradients back,
/// reduce-scatters them (in f32, added in rank order), uploads its shard, steps, reads its
/// updated pieces back and all-gathers them, writing the others' pieces into its
/// parameters. With clipping, each rank's partial norm is taken over its reduced shard on
/// the host, where the shard already is, and the ranks' partials are combined in rank
/// order, so every rank clips by the same bits. An
/// elementwise family's step is the unsharded optimizer's, bit for bit, over the reduced
/// gradients. [`ShardedCpuOptimizer`](super::ShardedCpuOptimizer) shows a group of ranks
/// on threads; `examples/train_mlp_sharded.rs` one under `mpirun`.
#[derive(Debug)]
pub struct ShardedOptimizer<C> {
    ctx: GpuContext,
    comm: C,
    plan: ShardPlan,
    params: Vec<Tensor>,
    /// The optimizers of this rank's pieces: one, or with low-bit storage one for the
    /// pieces of quantized tensors and one for the others (`ShardPlan::parts`).
    parts: Vec<Part>,
    /// This rank's shard of the reduced gradients (f32), into which the parts' gradients
    /// are views; `None` when its shard holds only padding.
    grad_shard: Option<Tensor>,
    /// The parameters' indices of each group it was built with.
    group_ranges: Vec<std::ops::Range<usize>>,
    /// This rank's pieces of the parameters in the plan's order (across the parts), as the
    /// all-gather sends them.
    pieces: Vec<Tensor>,
    /// Those the parts' optimizers update, which a step's all-gather reads back (the
    /// others are Adafactor's, whose bytes the host wrote).
    device_pieces: Vec<Tensor>,
    /// Steps taken (kept here too: a rank with no pieces has no inner optimizer to count).
    steps: u64,
    last: StepSplit,
    /// The host buffers each step reuses.
    buffers: StepBuffers,
    /// Adafactor's pieces, stepped on the host (`None` without Adafactor).
    adafactor: Option<AdafactorPieces>,
    /// The ranges of the gradient shard the parts' optimizers read (Adafactor's pieces'
    /// gradients stay on the host), merged where they touch.
    uploads: Vec<std::ops::Range<usize>>,
}

/// One optimizer over some of this rank's pieces.
#[derive(Debug)]
struct Part {
    optimizer: Optimizer,
    /// Its parameters' indices among the plan's pieces of this rank (`ShardPlan::mine`).
    indices: Vec<usize>,
    /// Its parameters: views of the pieces.
    pieces: Vec<Tensor>,
    /// Their gradients: views of the gradient shard.
    grads: Vec<Tensor>,
    /// Group g's index among its optimizer's groups (`None`: no piece of it here).
    groups: Vec<Option<usize>>,
}

impl<C: Communicator> ShardedOptimizer<C> {
    /// Builds this rank's part over `groups` (every parameter, as every rank holds them)
    /// with `builder`'s options; the ranks' gradients combine as `reduction` says.
    ///
    /// Refused on every rank when the ranks' configurations differ, and
    /// ([`Error::ConflictingOptions`]) for what a sharded step does not run: capturable mode,
    /// model copies, F64 state, and stochastic rounding with a family stepped whole.
    /// Muon's tensors are each stepped whole by one owner rank; LAMB's and Adafactor's lie in
    /// the flat layout, each tensor's sums combined across the ranks (LAMB's whole on owner
    /// ranks with low-bit state). Stochastic rounding hashes a piece's elements as its whole
    /// tensor's. With 8-bit or 4-bit storage, blocks start at shard boundaries and whether a
    /// tensor's state is low-bit follows the whole tensor's size, as unsharded.
    /// F64 parameters are refused: the gradients are reduced in f32.
    pub fn build(
        ctx: &GpuContext,
        comm: C,
        builder: OptimizerBuilder,
        reduction: GradReduction,
        groups: Vec<ParamGroup>,
    ) -> Result<Self> {
        let params: Vec<Tensor> = groups.iter().flat_map(|g| g.params.iter().cloned()).collect();
        if let Some(i) = params.iter().position(|p| p.dtype == DType::F64) {
            return Err(Error::DTypeMismatch {
                argument: format!("params[{i}]"),
                got: DType::F64,
                expected: "F32, F16 or BF16 (a sharded step reduces gradients in f32)".into(),
            });
        }
        let lens: Vec<u64> = params.iter().map(|p| p.len).collect();
        let dtypes: Vec<DType> = params.iter().map(|p| p.dtype).collect();
        let algorithms: Vec<_> = groups.iter().flat_map(|g| vec![g.algorithm; g.params.len()]).collect();
        let plan = ShardPlan::new(&comm, &lens, &dtypes, &algorithms, &builder.options, reduction)?;
        // A step reads this rank's pieces back and writes the others': refused here, on every
        // rank, rather than mid-step.
        let usable = (0..plan.size).try_for_each(|rank| {
            plan.pieces[rank].iter().try_for_each(|piece| {
                let arg = Arg::new(format!("params[{}]", piece.tensor), &view(&params[piece.tensor], piece));
                match rank == plan.rank {
                    true => crate::gpu::transfer::check_readable(&arg),
                    false => crate::gpu::transfer::check_writable(&arg),
                }
            })
        });
        super::plan::agree(&comm, "build", usable)?;
        let mine = plan.mine();
        // The inner optimizers' gradients (Adafactor's pieces step on the host).
        let grad_shard = (!plan.parts().is_empty())
            .then(|| ctx.zeros("wgpu-optim shard gradients", plan.shard_len, DType::F32));
        let mut parts = Vec::new();
        for (storage, indices) in plan.parts() {
            let Some(grad_shard) = &grad_shard else { break };
            let (mut groups_here, mut param_groups, mut ordered) = (Vec::new(), Vec::new(), Vec::new());
            let mut first = 0;
            for group in &groups {
                let range = first..first + group.params.len();
                first = range.end;
                let members: Vec<usize> =
                    indices.iter().copied().filter(|&j| range.contains(&mine[j].tensor)).collect();
                groups_here.push((!members.is_empty()).then_some(param_groups.len()));
                if !members.is_empty() {
                    let views = members.iter().map(|&j| view(&params[mine[j].tensor], &mine[j])).collect();
                    param_groups.push(ParamGroup { algorithm: group.algorithm, params: views });
                    ordered.extend(members);
                }
            }
            let pieces = ordered.iter().map(|&j| view(&params[mine[j].tensor], &mine[j])).collect();
            let grads = ordered
                .iter()
                .map(|&j| grad_shard.slice(mine[j].at, mine[j].elements.end - mine[j].elements.start))
                .collect();
            // Pieces are flat, tensors stepped whole keep their shapes.
            let mut builder =
                builder.clone().state_storage(storage).param_shapes(plan.piece_shapes(&ordered));
            builder.options.origins = plan.origins(&ordered);
            let optimizer = builder.build_groups(ctx, param_groups)?;
            parts.push(Part { optimizer, indices: ordered, pieces, grads, groups: groups_here });
        }
        let pieces = mine.iter().map(|piece| view(&params[piece.tensor], piece)).collect();
        let mut group_ranges = Vec::new();
        let mut first_dtypes = Vec::new();
        for group in &groups {
            let start = group_ranges.last().map_or(0, |r: &std::ops::Range<usize>| r.end);
            group_ranges.push(start..start + group.params.len());
            let first = group.params.first().map_or(DType::F32, |p| p.dtype);
            first_dtypes.extend(std::iter::repeat_n(first, group.params.len()));
        }
        // torch's `eps1 = None` is the dtype of the group's first parameter.
        let adafactor =
            plan.sharded_adafactor(&first_dtypes).map(|a| AdafactorPieces::new(a, &plan, &params));
        let on_device = |j: &usize| !plan.own_step(mine[*j].tensor);
        let device_pieces =
            (0..mine.len()).filter(on_device).map(|j| view(&params[mine[j].tensor], &mine[j])).collect();
        // Without Adafactor, the whole shard in one write.
        let mut uploads: Vec<std::ops::Range<usize>> = Vec::new();
        if adafactor.is_none() {
            uploads.push(0..plan.shard_len as usize);
        }
        for piece in (0..mine.len()).filter(on_device).map(|j| &mine[j]).filter(|_| adafactor.is_some()) {
            let range = piece.at as usize..(piece.at + piece.elements.end - piece.elements.start) as usize;
            match uploads.last_mut() {
                Some(last) if last.end == range.start => last.end = range.end,
                _ => uploads.push(range),
            }
        }
        Ok(ShardedOptimizer {
            ctx: ctx.clone(),
            pieces,
            comm,
            plan,
            params,
            parts,
            grad_shard,
            group_ranges,
            steps: 0,
            last: StepSplit::default(),
            buffers: StepBuffers::default(),
            adafactor,
            uploads,
            device_pieces,
        })
    }

    /// One step: `grads` are this rank's gradients of every parameter (in the order of the
    /// groups' parameters); they are reduced across ranks, this rank's shard is updated on
    /// its device, and every rank's updated shard is written into the parameters. Every
    /// write has been submitted when it returns.
    ///
    /// Refused, with nothing changed, when the count or a length differs from the
    /// parameters' or a gradient cannot be read back (`COPY_SRC`) on any rank: that rank gets
    /// its error, the others [`Error::Collective`], and the next step meets again. Parameters
    /// that a step could not copy are refused when it is built. A rank that fails or leaves
    /// mid-step makes the others' step
    /// [`Error::Collective`]; the parameters may then hold this rank's shard updated and the
    /// others' not.
    pub fn step(&mut self, grads: &[Tensor]) -> Result<()> {
        self.step_with(grads, None).map(drop)
    }

    /// AMP's step (PyTorch's `GradScaler.step`): `grads` are this rank's gradients of the
    /// loss multiplied by the loss scale; after the reduction each is unscaled
    /// (`* inv_scale`) and checked, and when any rank's held a NaN or an infinity every
    /// rank skips the step, leaving parameters, state and step count as they were. Returns
    /// whether it stepped (the trainer then lowers or raises its scale as `GradScaler`
    /// does). With clipping the norm is the unscaled gradients'.
    pub fn step_scaled(&mut self, grads: &[Tensor], inv_scale: f32) -> Result<bool> {
        self.step_with(grads, Some(inv_scale))
    }

    fn step_with(&mut self, grads: &[Tensor], inv_scale: Option<f32>) -> Result<bool> {
        // Every rank refuses together, so that none waits in a collective for a refused one.
        let checked =
            inv_scale.map_or(Ok(()), ShardPlan::check_inv_scale).and_then(|()| self.check_grads(grads));
        super::plan::agree(&self.comm, "step", checked)?;
        let ctx = &self.ctx;
        // The trainer's work that makes the gradients is not this step's: wait for it
        // before the clock starts (the gradients' readback would wait for it anyway).
        ctx.device().poll(wgpu::PollType::Wait { submission_index: None, timeout: None }).map_err(|e| {
            Error::Readback { cause: crate::ReadbackFailure::Poll { message: e.to_string() } }
        })?;
        let started = Instant::now();
        // Every gradient in one copy and one wait.
        let read = ctx.read_bytes_many(grads)?;
        let grad = |i: usize, elements: std::ops::Range<usize>, out: &mut [f32]| {
            widen_bytes(grads[i].dtype, &read[i], elements, out);
            Ok(())
        };
        if self.plan.reduce_and_unscale(&self.comm, &mut self.buffers, inv_scale, grad)? {
            self.last = StepSplit { communication: started.elapsed(), ..StepSplit::default() };
            return Ok(false);
        }
        let shard = &self.buffers.shard;
        if let Some(grad_shard) = &self.grad_shard {
            for range in &self.uploads {
                let slice = grad_shard.slice(range.start as u64, range.len() as u64);
                ctx.write_bytes(&slice, bytemuck::cast_slice(&shard[range.clone()]))?;
            }
        }

        let total_norm = self.plan.global_norm(&self.comm, shard)?;
        let mut communication = started.elapsed();

        let updating = Instant::now();
        // LAMB's sums over each tensor's pieces on every rank, combined in the step: once
        // per rank, by the part with LAMB's passes, or below with nothing of its own.
        let mut combined = false;
        for part in &mut self.parts {
            if !self.plan.sums {
                part.optimizer.step_with_norm(&part.grads, total_norm)?;
                continue;
            }
            let (plan, comm, indices) = (&self.plan, &self.comm, &part.indices);
            let mut combine = |params: &[usize], sums: &mut [[f64; 2]]| {
                let pieces: Vec<usize> = params.iter().map(|&k| indices[k]).collect();
                plan.combine_sums(comm, &pieces, sums)
            };
            combined |= part.optimizer.step_with_sums(&part.grads, total_norm, &mut combine)?;
        }
        if self.plan.sums && !combined {
            self.plan.combine_sums(&self.comm, &[], &mut [])?;
        }
        if let Some(adafactor) = &mut self.adafactor {
            adafactor.run(ctx, &self.plan, &self.comm, self.steps + 1, &self.buffers.shard)?;
        }
        let update = updating.elapsed();

        let gathering = Instant::now();
        self.gather(true)?;
        communication += gathering.elapsed();
        self.last = StepSplit { communication, update, sent_bytes: self.plan.sent_bytes() };
        self.steps += 1;
        Ok(true)
    }

    /// Refuses gradients of another count or length than the parameters, or that cannot be
    /// read back.
    fn check_grads(&self, grads: &[Tensor]) -> Result<()> {
        self.plan.check_counts("grads", grads.len())?;
        for (i, grad) in grads.iter().enumerate() {
            self.plan.check_len("grads", i, grad.len)?;
            crate::gpu::transfer::check_readable(&Arg::new(format!("grads[{i}]"), grad))?;
        }
        Ok(())
    }

    /// All-gathers every rank's pieces (this rank's read back in one copy and one wait) and
    /// writes the others' into the parameters, submitted so that they are in place for
    /// whatever the trainer records next. Nothing to do for one rank.
    fn gather(&self, after_step: bool) -> Result<()> {
        if self.plan.size == 1 {
            return Ok(());
        }
        // After a step, Adafactor's pieces are the bytes the host wrote.
        let written = |j: usize| self.adafactor.as_ref().and_then(|a| a.written(j)).filter(|_| after_step);
        let read = match after_step && self.adafactor.is_some() {
            true => self.ctx.read_bytes_many(&self.device_pieces)?,
            false => self.ctx.read_bytes_many(&self.pieces)?,
        };
        let (mut read, mut mine) = (read.into_iter(), Vec::with_capacity(self.plan.gather_chunk));
        for j in 0..self.pieces.len() {
            match written(j) {
                Some(bytes) => mine.extend_from_slice(bytes),
                None => mine.extend(read.next().unwrap_or_default()),
            }
        }
        let (ctx, params) = (&self.ctx, &self.params);
        self.plan.gather_params(&self.comm, mine, |piece, data| {
            ctx.write_bytes(&view(&params[piece.tensor], piece), data)
        })?;
        ctx.queue().submit([]);
        Ok(())
    }

    /// Schedule-Free's `eval()`: every rank swaps its pieces to the point the family
    /// evaluates at (`x`), and the pieces are gathered, so that every rank's parameters are
    /// that point. Every rank calls it; steps are refused until [`Self::train`]. A no-op for
    /// the other families, as on [`Optimizer::eval`].
    pub fn eval(&mut self) -> Result<()> {
        self.swap(true)
    }

    /// Schedule-Free's `train()`: the swap back to the point the steps update (`y`),
    /// gathered alike.
    pub fn train(&mut self) -> Result<()> {
        self.swap(false)
    }

    fn swap(&mut self, eval: bool) -> Result<()> {
        let swapped = self.parts.iter_mut().try_for_each(|p| match eval {
            true => p.optimizer.eval(),
            false => p.optimizer.train(),
        });
        super::plan::agree(&self.comm, if eval { "eval" } else { "train" }, swapped)?;
        self.gather(false)
    }

    /// Steps taken so far.
    pub fn step_count(&self) -> u64 {
        self.steps
    }

    /// With clipping: the last step's global gradient norm, the same bits on every rank
    /// (read back from the device); `None` without clipping, and on a rank whose shard
    /// holds only padding.
    pub fn grad_norm(&self) -> Result<Option<f64>> {
        if self.plan.clip.is_none() {
            return Ok(None);
        }
        self.parts.first().map(|p| p.optimizer.grad_norm()).transpose()
    }

    /// Sets every group's learning rate (every rank sets the same, or their steps differ).
    pub fn set_lr(&mut self, lr: f64) -> Result<()> {
        if let Some(adafactor) = &mut self.adafactor {
            adafactor.step.set_lr(0..self.params.len(), lr)?;
        }
        self.parts.iter_mut().try_for_each(|p| p.optimizer.set_lr(lr))
    }

    /// Sets group `g`'s learning rate.
    pub fn set_group_lr(&mut self, g: usize, lr: f64) -> Result<()> {
        let Some(range) = self.group_ranges.get(g) else {
            return Err(Error::NoSuchGroup { index: g, groups: self.group_ranges.len() });
        };
        if let Some(adafactor) = &mut self.adafactor {
            adafactor.step.set_lr(range.clone(), lr)?;
        }
        for part in &mut self.parts {
            if let Some(here) = part.groups[g] {
                part.optimizer.set_group_lr(here, lr)?;
            }
        }
        Ok(())
    }

    /// Every parameter, in the order of the groups' parameters.
    pub fn params(&self) -> &[Tensor] {
        &self.params
    }

    /// The last step's communication and update time and the bytes this rank sent.
    pub fn last_step(&self) -> StepSplit {
        self.last
    }

    /// The communicator it steps with.
    pub fn communicator(&self) -> &C {
        &self.comm
    }

    /// The bytes of optimizer state this rank holds on its device, counted from the states
    /// its optimizers keep (codes and scales of low-bit state, read back): `1 / N` of the
    /// unsharded optimizer's, give or take a shard's padding.
    pub fn state_bytes(&self) -> Result<u64> {
        let mut total = self.adafactor.as_ref().map_or(0, |a| a.step.state_bytes());
        for part in &self.parts {
            for i in 0..part.pieces.len() {
                for &kind in StateKind::ALL {
                    total += match part.optimizer.state(i, kind)? {
                        Some(StateView::Tensor(tensor)) => tensor.byte_len(),
                        Some(StateView::Q8(state)) => super::plan::q8_bytes(&state),
                        Some(StateView::Q4(state)) => super::plan::q4_bytes(&state),
                        None => 0,
                    };
                }
            }
        }
        Ok(total)
    }

    /// The elements of each parameter this rank's shard holds, in order: `(tensor,
    /// elements)`.
    pub fn shard_pieces(&self) -> Vec<(usize, std::ops::Range<u64>)> {
        self.plan.mine().iter().map(|p| (p.tensor, p.elements.clone())).collect()
    }
}

/// Elements `elements` of a gradient read back as `dtype`'s `bytes`, widened to f32 into
/// `out` (exact for f32, f16 and bf16; an f64 gradient rounds once).
fn widen_bytes(dtype: DType, bytes: &[u8], elements: std::ops::Range<usize>, out: &mut [f32]) {
    let size = dtype.size() as usize;
    let chunks = bytes[elements.start * size..elements.end * size].chunks_exact(size);
    for (o, b) in out.iter_mut().zip(chunks) {
        *o = match dtype {
            DType::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f32(),
            DType::BF16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f32(),
            DType::F64 => f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32,
            _ => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        };
    }
}

/// The view of `param`'s elements in `piece`.
fn view(param: &Tensor, piece: &Piece) -> Tensor {
    param.slice(piece.elements.start, piece.elements.end - piece.elements.start)
}

#[cfg(feature = "checkpoint")]
impl<C: Communicator> ShardedOptimizer<C> {
    /// Where piece `j` of this rank (`ShardPlan::mine`) lives: its part and its index there.
    fn locate(&self, j: usize) -> Option<(&Part, usize)> {
        self.parts.iter().find_map(|part| part.indices.iter().position(|&i| i == j).map(|k| (part, k)))
    }

    /// Each group's Schedule-Free running values, where this rank holds pieces of it.
    fn schedule_free_values(&self) -> Vec<Option<crate::ScheduleFreeScalars>> {
        (0..self.group_ranges.len())
            .map(|g| {
                self.parts.iter().find_map(|p| p.groups[g].and_then(|h| p.optimizer.schedule_free_scalars(h)))
            })
            .collect()
    }

    /// Writes this rank's checkpoint file into `dir` (shared by the ranks, created if
    /// missing): its shard's state (low-bit state as its codes and scales; in master-weight
    /// mode the f32 masters too), which elements
    /// of which tensors it holds, the step count and the groups' Schedule-Free values
    /// (format [`SHARD_FORMAT`](super::SHARD_FORMAT)). Every rank calls it; when one rank's
    /// write fails, every rank returns an error.
    pub fn save(&self, dir: impl AsRef<std::path::Path>) -> Result<()> {
        let adafactor = self.adafactor.as_ref().map(|a| &a.step);
        let written = super::checkpoint::collect(
            &self.plan,
            self.steps,
            self.schedule_free_values(),
            adafactor,
            |j, kind| {
                let Some((part, k)) = self.locate(j) else { return Ok(None) };
                Ok(match part.optimizer.state(k, kind)? {
                    Some(StateView::Tensor(state)) => {
                        Some(PieceState::Dense(self.ctx.read(state)?.into_iter().map(|v| v as f32).collect()))
                    }
                    Some(StateView::Q8(state)) => Some(PieceState::Q8(state)),
                    Some(StateView::Q4(state)) => Some(PieceState::Q4(state)),
                    None => None,
                })
            },
        )
        .and_then(|mut file| {
            if self.plan.masters {
                for (j, piece) in self.plan.mine().iter().enumerate() {
                    if let Some((part, k)) = self.locate(j) {
                        file.place_masters(piece, &self.ctx.read_f32(&part.optimizer.params()[k])?);
                    }
                }
            }
            super::checkpoint::write(dir.as_ref(), self.plan.rank, &file)
        });
        super::plan::agree(&self.comm, "save", written)
    }

    /// Loads a checkpoint that [`Self::save`] wrote on any number of ranks (of the same
    /// parameters' lengths and dtypes and the same state storage): this rank takes its
    /// pieces' state from the files that hold it, and their step count and Schedule-Free
    /// values. Refused ([`Error::BadFile`]) before anything is written when the files are
    /// not one save of these tensors, lack a state this rank keeps, or are corrupt; when one
    /// rank's load is refused, every rank returns an error.
    pub fn load(&mut self, dir: impl AsRef<std::path::Path>) -> Result<()> {
        let dir = dir.as_ref();
        let loaded = super::checkpoint::read_for(&self.plan, &self.comm, dir)?;
        let mut keeps = Vec::new();
        for j in 0..self.plan.mine().len() {
            let mut kinds = Vec::new();
            if let Some((part, k)) = self.locate(j) {
                for &kind in StateKind::ALL {
                    if part.optimizer.state(k, kind)?.is_some() {
                        kinds.push(kind);
                    }
                }
            }
            keeps.push(kinds);
        }
        let masters = match self.plan.masters {
            true => self
                .plan
                .mine()
                .iter()
                .map(|piece| loaded.masters_of(dir, piece))
                .collect::<Result<Vec<_>>>()?,
            false => Vec::new(),
        };
        // Out of `self` while `write` reads the parts.
        let mut adafactor = self.adafactor.take();
        let applied = super::checkpoint::apply(
            &self.plan,
            &loaded,
            dir,
            adafactor.as_mut().map(|a| &mut a.step),
            |j, kind| keeps[j].contains(&kind),
            |j, kind, state| {
                let Some((part, k)) = self.locate(j) else { return Ok(()) };
                match state {
                    PieceState::Dense(values) => match part.optimizer.tensor_state(k, kind) {
                        Some(tensor) => {
                            self.ctx.write(tensor, &values.iter().map(|&v| f64::from(v)).collect::<Vec<_>>())
                        }
                        None => Ok(()),
                    },
                    PieceState::Q8(state) => part.optimizer.set_state(k, kind, &QuantizedState::Q8(state)),
                    PieceState::Q4(state) => part.optimizer.set_state(k, kind, &QuantizedState::Q4(state)),
                }
            },
        );
        self.adafactor = adafactor;
        applied?;
        for (j, values) in masters.iter().enumerate() {
            if let Some((part, k)) = self.locate(j) {
                let values: Vec<f64> = values.iter().map(|&v| f64::from(v)).collect();
                self.ctx.write(&part.optimizer.params()[k], &values)?;
            }
        }
        for part in &mut self.parts {
            part.optimizer.set_step_count(loaded.step)?;
            for (here, scalars) in part.groups.iter().zip(&loaded.schedule_free) {
                if let (Some(here), Some(scalars)) = (here, scalars) {
                    part.optimizer.set_schedule_free_scalars(*here, *scalars)?;
                }
            }
        }
        self.steps = loaded.step;
        Ok(())
    }
}
