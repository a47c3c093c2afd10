//! The sharded optimizer on the GPU: an [`Optimizer`] over views of this rank's pieces of
//! the parameters, its gradients in one buffer of the reduced shard.

use std::time::Instant;

use super::plan::{GradReduction, ShardPlan, StepSplit};
use super::{Communicator, Piece};
use crate::{DType, Error, GpuContext, Optimizer, OptimizerBuilder, ParamGroup, Result, StateKind, Tensor};

/// A ZeRO-1 optimizer on the GPU: every rank holds every parameter on its device and
/// computes gradients for all of them; each rank keeps the state of its shard only (its
/// pieces of the flat layout, [`super::FlatLayout`]), updates that shard in one fused
/// step, and the updated shards are gathered so that every rank's parameters are equal
/// after the step.
///
/// What crosses ranks goes through the host: each step reads this rank's gradients back,
/// reduce-scatters them (in f32, added in rank order), uploads its shard, steps, reads its
/// updated pieces back and all-gathers them, writing the others' pieces into its
/// parameters. With clipping, the norm of each rank's shard is taken on its device and the
/// ranks' partials are combined in rank order, so every rank clips by the same bits. An
/// elementwise family's step is the unsharded optimizer's, bit for bit, over the reduced
/// gradients. [`ShardedCpuOptimizer`](super::ShardedCpuOptimizer) shows a group of ranks
/// on threads; `examples/train_mlp_sharded.rs` one under `mpirun`.
#[derive(Debug)]
pub struct ShardedOptimizer<C> {
    ctx: GpuContext,
    comm: C,
    plan: ShardPlan,
    params: Vec<Tensor>,
    /// The optimizer of this rank's pieces, and their gradients' views into `grad_shard`
    /// (`None` when its shard holds only padding).
    inner: Option<Inner>,
    /// Group g's index among the inner optimizer's groups (`None`: no piece of it here).
    inner_groups: Vec<Option<usize>>,
    /// Steps taken (kept here too: a rank with no pieces has no inner optimizer to count).
    steps: u64,
    last: StepSplit,
}

#[derive(Debug)]
struct Inner {
    optimizer: Optimizer,
    pieces: Vec<Tensor>,
    grads: Vec<Tensor>,
    /// This rank's shard of the reduced gradients (f32).
    grad_shard: Tensor,
}

impl<C: Communicator> ShardedOptimizer<C> {
    /// Builds this rank's part over `groups` (every parameter, as every rank holds them)
    /// with `builder`'s options; the ranks' gradients combine as `reduction` says.
    ///
    /// Refused on every rank when the ranks' configurations differ, and
    /// ([`Error::ConflictingOptions`]) for what a sharded step does not run yet: LAMB,
    /// Adafactor and Muon, low-bit state, stochastic rounding, capturable mode, model copies.
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
        let mine = plan.mine();
        let mut inner_groups = Vec::with_capacity(groups.len());
        let mut pieces_by_group = Vec::new();
        let mut first = 0;
        for group in &groups {
            let range = first..first + group.params.len();
            first = range.end;
            let pieces: Vec<Tensor> = mine
                .iter()
                .filter(|p| range.contains(&p.tensor))
                .map(|p| view(&params[p.tensor], p))
                .collect();
            inner_groups.push((!pieces.is_empty()).then_some(pieces_by_group.len()));
            if !pieces.is_empty() {
                pieces_by_group.push(ParamGroup { algorithm: group.algorithm, params: pieces });
            }
        }
        let inner = match pieces_by_group.is_empty() {
            true => None,
            false => {
                let pieces: Vec<Tensor> =
                    pieces_by_group.iter().flat_map(|g| g.params.iter().cloned()).collect();
                let grad_shard = ctx.zeros("wgpu-optim shard gradients", plan.layout.shard_len(), DType::F32);
                let grads =
                    mine.iter().map(|p| grad_shard.slice(p.at, p.elements.end - p.elements.start)).collect();
                // Pieces are flat: the parameters' shapes are not theirs.
                let optimizer = builder.param_shapes(Vec::new()).build_groups(ctx, pieces_by_group)?;
                Some(Inner { optimizer, pieces, grads, grad_shard })
            }
        };
        Ok(ShardedOptimizer {
            ctx: ctx.clone(),
            comm,
            plan,
            params,
            inner,
            inner_groups,
            steps: 0,
            last: StepSplit::default(),
        })
    }

    /// One step: `grads` are this rank's gradients of every parameter (in the order of the
    /// groups' parameters); they are reduced across ranks, this rank's shard is updated on
    /// its device, and every rank's updated shard is written into the parameters. Every
    /// write has been submitted when it returns.
    ///
    /// Refused before any collective when the count or a length differs from the
    /// parameters'. A rank that fails or leaves mid-step makes the others' step
    /// [`Error::Collective`]; the parameters may then hold this rank's shard updated and the
    /// others' not.
    pub fn step(&mut self, grads: &[Tensor]) -> Result<()> {
        self.plan.check_counts("grads", grads.len())?;
        for (i, grad) in grads.iter().enumerate() {
            self.plan.check_len("grads", i, grad.len)?;
        }
        let started = Instant::now();
        let ctx = &self.ctx;
        let shard = self.plan.reduce_gradients(&self.comm, |i, out| {
            let values = ctx.read(&grads[i])?;
            out.iter_mut().zip(values).for_each(|(o, v)| *o = v as f32);
            Ok(())
        })?;
        if let Some(inner) = &self.inner {
            ctx.write_bytes(&inner.grad_shard, bytemuck::cast_slice(&shard))?;
        }
        let mut communication = started.elapsed();

        let updating = Instant::now();
        let local = match &mut self.inner {
            Some(inner) => inner.optimizer.local_grad_norm(&inner.grads)?,
            None => None,
        };
        let partial = local.map_or(0.0, |(norm, norm_type)| match norm_type {
            crate::NormType::L2 => f64::from(norm) * f64::from(norm),
            crate::NormType::Inf => f64::from(norm),
        });
        let mut update = updating.elapsed();
        let reducing = Instant::now();
        let total_norm = self.plan.global_norm(&self.comm, partial)?;
        communication += reducing.elapsed();

        let updating = Instant::now();
        let mut mine = Vec::with_capacity(self.plan.gather_chunk);
        if let Some(inner) = &mut self.inner {
            inner.optimizer.step_with_norm(&inner.grads, total_norm)?;
            for piece in &inner.pieces {
                mine.extend(ctx.read_bytes(piece)?);
            }
        }
        update += updating.elapsed();

        let gathering = Instant::now();
        let params = &self.params;
        self.plan.gather_params(&self.comm, mine, |piece, data| {
            ctx.write_bytes(&view(&params[piece.tensor], piece), data)
        })?;
        // The writes land with the next submission: make it now, so that they are in
        // place for whatever the trainer records next.
        ctx.queue().submit([]);
        communication += gathering.elapsed();
        self.last = StepSplit { communication, update, sent_bytes: self.plan.sent_bytes() };
        self.steps += 1;
        Ok(())
    }

    /// Steps taken so far.
    pub fn step_count(&self) -> u64 {
        self.steps
    }

    /// Each group's Schedule-Free running values, where this rank holds pieces of it.
    #[cfg(feature = "checkpoint")]
    fn schedule_free_values(&self) -> Vec<Option<crate::ScheduleFreeScalars>> {
        let inner = self.inner.as_ref();
        let values =
            |g: &Option<usize>| inner.zip(*g).and_then(|(i, g)| i.optimizer.schedule_free_scalars(g));
        self.inner_groups.iter().map(values).collect()
    }

    /// Writes this rank's checkpoint file into `dir` (shared by the ranks, created if
    /// missing): its shard's state, the flat range it covers, the step count and the groups'
    /// Schedule-Free values (format [`SHARD_FORMAT`](super::SHARD_FORMAT)). Every rank calls
    /// it; when one rank's write fails, every rank returns an error.
    #[cfg(feature = "checkpoint")]
    pub fn save(&self, dir: impl AsRef<std::path::Path>) -> Result<()> {
        let written = (|| {
            let file = super::checkpoint::collect(
                &self.plan,
                self.steps,
                self.schedule_free_values(),
                |j, kind| match self.inner.as_ref().and_then(|i| i.optimizer.tensor_state(j, kind)) {
                    Some(state) => Ok(Some(self.ctx.read(state)?.into_iter().map(|v| v as f32).collect())),
                    None => Ok(None),
                },
            )?;
            super::checkpoint::write(dir.as_ref(), self.plan.rank, &file)
        })();
        super::plan::agree(&self.comm, "save", written)
    }

    /// Loads a checkpoint that [`Self::save`] wrote on any number of ranks (of the same
    /// parameters' lengths and dtypes): this rank reads its range of the flat state from
    /// the files that hold it, and takes their step count and Schedule-Free values. Refused
    /// ([`Error::BadFile`]) before anything is written when the files are not one save of
    /// these tensors, lack a state this rank keeps, or are corrupt; when one rank's load is
    /// refused, every rank returns an error.
    #[cfg(feature = "checkpoint")]
    pub fn load(&mut self, dir: impl AsRef<std::path::Path>) -> Result<()> {
        let dir = dir.as_ref();
        let shard = self.plan.layout.shard(self.plan.rank);
        let loaded = super::checkpoint::read(dir, &self.plan.structure(), shard);
        let loaded = super::plan::agree(&self.comm, "load", loaded)?;
        if let Some(inner) = &mut self.inner {
            let (ctx, optimizer) = (&self.ctx, &inner.optimizer);
            let keeps = |j, kind| optimizer.tensor_state(j, kind).is_some();
            super::checkpoint::apply(&self.plan, &loaded, dir, keeps, |j, kind, values| {
                let values: Vec<f64> = values.iter().map(|&v| f64::from(v)).collect();
                match optimizer.tensor_state(j, kind) {
                    Some(state) => ctx.write(state, &values),
                    None => Ok(()),
                }
            })?;
            inner.optimizer.set_step_count(loaded.step)?;
            for (g, scalars) in self.inner_groups.iter().zip(&loaded.schedule_free) {
                if let (Some(g), Some(scalars)) = (g, scalars) {
                    inner.optimizer.set_schedule_free_scalars(*g, *scalars)?;
                }
            }
        }
        self.steps = loaded.step;
        Ok(())
    }

    /// With clipping: the last step's global gradient norm, the same bits on every rank
    /// (read back from the device). `None` on a rank whose shard holds only padding.
    /// `None` without clipping.
    pub fn grad_norm(&self) -> Result<Option<f64>> {
        if self.plan.clip.is_none() {
            return Ok(None);
        }
        self.inner.as_ref().map(|i| i.optimizer.grad_norm()).transpose()
    }

    /// Sets every group's learning rate (every rank sets the same, or their steps differ).
    pub fn set_lr(&mut self, lr: f64) -> Result<()> {
        self.inner.as_mut().map_or(Ok(()), |i| i.optimizer.set_lr(lr))
    }

    /// Sets group `g`'s learning rate.
    pub fn set_group_lr(&mut self, g: usize, lr: f64) -> Result<()> {
        match self.inner_groups.get(g) {
            None => Err(Error::NoSuchGroup { index: g, groups: self.inner_groups.len() }),
            Some(None) => Ok(()),
            Some(Some(inner_g)) => match &mut self.inner {
                Some(inner) => inner.optimizer.set_group_lr(*inner_g, lr),
                None => Ok(()),
            },
        }
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

    /// The bytes of optimizer state this rank holds on its device, counted from the state
    /// tensors it keeps: `1 / N` of the unsharded optimizer's, give or take a shard's
    /// padding.
    pub fn state_bytes(&self) -> u64 {
        let Some(inner) = &self.inner else { return 0 };
        let kinds = StateKind::ALL.iter();
        (0..inner.pieces.len())
            .flat_map(|i| kinds.clone().filter_map(move |kind| inner.optimizer.tensor_state(i, *kind)))
            .map(Tensor::byte_len)
            .sum()
    }

    /// The elements of each parameter this rank's shard holds, in order: `(tensor,
    /// elements)`.
    pub fn shard_pieces(&self) -> Vec<(usize, std::ops::Range<u64>)> {
        self.plan.mine().iter().map(|p| (p.tensor, p.elements.clone())).collect()
    }
}

/// The view of `param`'s elements in `piece`.
fn view(param: &Tensor, piece: &Piece) -> Tensor {
    param.slice(piece.elements.start, piece.elements.end - piece.elements.start)
}
