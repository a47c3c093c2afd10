//! Recording a step: the uniforms, the bind groups of the last few gradient sets (built
//! once per set and kept), and the compute pass.

use super::clip::BoundNorm;
use super::validate::check_disjoint;
use super::{Group, Optimizer};
use crate::gpu::dispatch::Batch;
use crate::gpu::kernel::{Program, Scalars, VariantKey};
use crate::gpu::plan::{check_like, plan, slot_args, Arg, KernelArgs, SlotArgs, TensorPlan};
use crate::step::rounding::RoundingHeader;
use crate::step::UNIFORM_SLOT_BYTES;
use crate::{Algorithm, Error, Result, Rounding, Tensor};

/// Gradient sets whose bind groups are kept: a trainer that alternates two (or a few)
/// gradient buffers binds each once.
pub(crate) const BOUND_GRADIENT_SETS: usize = 4;

/// Bind groups for one set of gradient tensors, a batch per parameter group.
pub(super) struct Bound {
    pub(super) grads: Vec<Tensor>,
    pub(super) batches: Vec<Batch>,
    /// The gradient-norm pass over `grads` when clipping, built at the first step that
    /// needs it.
    pub(super) norm: Option<BoundNorm>,
    /// With clipping and AMP: the unscale pass that takes the norm in the same read of
    /// `grads` (f32 gradients), built at the first [`Optimizer::record_unscale`] with them.
    pub(super) unscale_norm: Option<BoundNorm>,
}

impl Optimizer {
    /// Records one step into the caller's encoder; nothing is submitted. Any number of steps
    /// may be recorded before the encoders are submitted: each step's hyperparameters are
    /// copied into place by a command recorded with it, so they land in recording order.
    ///
    /// The step count advances here, when the step is recorded, not when it is submitted.
    /// Every group's update goes into one compute pass. Bind groups are built on the first
    /// step with a set of gradient tensors and kept for the last few sets (a trainer may
    /// alternate gradient buffers); with a known set a step creates no GPU objects, beyond
    /// 256 bytes of staging per group for each step in flight, which is reused once that
    /// step's submission has run. On error nothing is recorded and the step count is unchanged.
    ///
    /// `grads[i]` is `params[i]`'s gradient, of its length, in memory of its own or exactly
    /// `params[i]` (each element is read before it is written). A gradient that shares a byte
    /// with another parameter, a model copy or a state tensor is refused
    /// ([`Error::OverlapsWritten`], naming both): the step updates every tensor in one pass,
    /// so it would read values already updated.
    pub fn record_step(&mut self, encoder: &mut wgpu::CommandEncoder, grads: &[Tensor]) -> Result<()> {
        self.record_uncommitted(encoder, grads, false)?;
        self.commit_step();
        Ok(())
    }

    /// Records one step and submits it. On error (a refused step, or a submission wgpu
    /// refuses) the step count, the parameters and the state are as they were: the host's
    /// step values are committed only once the submission is accepted, and a refused
    /// submission runs none of the step's commands.
    pub fn step(&mut self, grads: &[Tensor]) -> Result<()> {
        // Named as the user called it, before `record_step` would name itself.
        self.check_train_mode("step")?;
        let ctx = self.ctx.clone();
        ctx.submit("wgpu-optim step", |encoder| self.record_uncommitted(encoder, grads, false))?;
        self.commit_step();
        Ok(())
    }

    /// Records a step without changing what the host keeps of the step count (the count,
    /// the groups' dirty flags, Schedule-Free's running values, the AMP flags): those change
    /// in [`Self::commit_step`], once the step is recorded ([`Self::record_step`]) or
    /// submitted ([`Self::step`]), so that a step that fails at either leaves them as they
    /// were. What it caches (bind groups, rewritten Muon slots) is right whatever happens.
    /// `norm_given`: the clip buffer already holds this step's norm and coefficient (a
    /// sharded step's, combined across ranks), so no norm pass is recorded.
    pub(super) fn record_uncommitted(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        grads: &[Tensor],
        norm_given: bool,
    ) -> Result<()> {
        self.ctx.check_alive()?;
        self.check_train_mode("record_step")?;
        // Values of an earlier step that failed before its commit are not this step's.
        for passes in &mut self.passes {
            passes.discard();
        }
        if self.q8.is_some() || self.q4.is_some() {
            return self.record_low_bit_step(encoder, grads, norm_given);
        }
        // Taken for these gradients only; the plain norm pass is right in any case, since it
        // reads the gradients the unscale pass left.
        let norm_taken = self.norm_taken_by_unscale && self.bound.first().is_some_and(|b| b.grads == grads);
        self.bind(grads)?;
        self.bind_passes(grads)?;
        // The plain norm pass, built at the first step that needs it (with AMP and f32
        // gradients the unscale pass takes the norm instead).
        if let (Some(clip), Some(bound)) = (&self.clip, self.bound.first_mut()) {
            if !norm_taken && !norm_given && bound.norm.is_none() {
                bound.norm = Some(clip.bind(&self.ctx, grads, None)?);
            }
        }
        let t = self.step + 1;
        // Capturable kernels derive the step's values on the device, so their uniform only
        // changes with the hyperparameters; host-mode uniforms change every step.
        let capturable = self.device.is_some();
        if !capturable || self.groups.iter().any(|g| g.dirty) {
            let slot = UNIFORM_SLOT_BYTES as usize;
            for g in 0..self.groups.len() {
                let at = if capturable { 1 } else { t };
                let step = self.group_kernel_step(g, at);
                let bytes = &mut self.uniform_bytes[g * slot..(g + 1) * slot];
                step.write_uniform(self.math, bytes);
                write_rounding(self.rounding, at, bytes);
            }
            self.uniforms.record_write(encoder, &self.uniform_bytes)?;
        }
        if let Some(device) = &self.device {
            device.prepare_step(encoder);
        }
        let bound = &self.bound[0];
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("wgpu-optim step"),
            timestamp_writes: None,
        });
        if let Some(device) = &self.device {
            device.record_advance(&mut pass);
        }
        if let Some(clip) = self.clip.as_ref().filter(|_| !norm_given) {
            match (&bound.unscale_norm, &bound.norm) {
                (Some(taken), _) if norm_taken => clip.record_finalize(&mut pass, taken),
                (_, Some(norm)) => clip.record(&mut pass, norm),
                _ => {}
            }
        }
        for passes in &self.passes {
            passes.record_before(&mut pass, &self.uniforms.bind_groups);
        }
        for (batch, scalars) in bound.batches.iter().zip(&self.uniforms.bind_groups) {
            batch.record(&mut pass, scalars);
        }
        for passes in &self.passes {
            passes.record_after(&mut pass, &self.ctx);
        }
        Ok(())
    }

    /// The host's part of a step recorded by [`Self::record_uncommitted`]: the count
    /// advances, every group's uniform is current (it was written in the step), Schedule-Free
    /// takes its values after the step, and the AMP flags of the step's unscale are spent.
    pub(super) fn commit_step(&mut self) {
        self.step += 1;
        for group in &mut self.groups {
            group.dirty = false;
        }
        for passes in &mut self.passes {
            passes.commit();
        }
        self.norm_taken_by_unscale = false;
        if let Some(device) = &mut self.device {
            device.stepped();
        }
    }

    /// Tensor `i`'s plan in a dispatch of `program` (`grad` bound as its gradient) and the
    /// kernel variant it needs; refused where the variant needs more storage bindings than
    /// the device has.
    pub(crate) fn batch_item(
        &self,
        scalars: Scalars,
        program: Program,
        algorithm: &Algorithm,
        i: usize,
        grad: &Tensor,
    ) -> Result<(VariantKey, TensorPlan)> {
        let args = self.kernel_args(algorithm, i, grad);
        let mut tensor_plan = plan(&self.ctx, program, &args)?;
        // A sharded optimizer's piece hashes as the elements of its whole tensor.
        let (ordinal, first) = self.origins.get(i).copied().unwrap_or((i as u32, 0));
        tensor_plan.ordinal = ordinal;
        for segment in &mut tensor_plan.segments {
            segment.first += first;
        }
        let needed = tensor_plan.layout.bindings.len() as u32 + scalars.storage_bindings(self.clip.is_some());
        let limit = self.ctx.device().limits().max_storage_buffers_per_shader_stage;
        if needed > limit {
            return Err(Error::TooManyBindings { needed, limit });
        }
        let key = VariantKey::new(scalars, program, self.math, tensor_plan.layout.clone())
            .clipped(self.clip.is_some())
            .with_stochastic(self.rounding.stochastic());
        Ok((key, tensor_plan))
    }

    /// Makes the bind groups for `grads` the first of `bound`, building them unless they
    /// are among the sets already bound.
    pub(super) fn bind(&mut self, grads: &[Tensor]) -> Result<()> {
        if let Some(k) = self.bound.iter().position(|b| b.grads == grads) {
            // Most recent first; a set is a couple of vectors, so the move is cheap.
            let hit = self.bound.remove(k);
            self.bound.insert(0, hit);
            return Ok(());
        }
        self.check_grads(grads)?;
        let scalars = if self.device.is_some() { Scalars::Device } else { Scalars::Host };
        let mut batches = Vec::with_capacity(self.groups.len());
        for (g, group) in self.groups.iter().enumerate() {
            if self.passes_check_gradients(g) {
                // A family's passes bind these gradients (Adafactor's), or the apply pass
                // below binds what they made of them (Muon's update): checked here against
                // their parameters as a plan checks the others', before this set is kept.
                self.check_grads_against_params(group, grads)?;
            }
            if self.passes_run_group(g) {
                batches.push(Batch::default());
                continue;
            }
            let step = group.algorithm.kernel_step(1);
            let program = Program::Update(step.switches());
            let items = (group.first..group.first + group.len)
                .map(|i| {
                    self.batch_item(scalars, program, &group.algorithm, i, self.update_gradient(i, &grads[i]))
                })
                .collect::<Result<Vec<_>>>()?;
            batches.push(Batch::build(&self.ctx, &items, "optimizer")?);
        }
        self.bound.truncate(BOUND_GRADIENT_SETS - 1);
        self.bound.insert(0, Bound { grads: grads.to_vec(), batches, norm: None, unscale_norm: None });
        Ok(())
    }

    /// Refuses gradients of another count than the parameters, or one that lies in memory
    /// the step writes for another tensor: another parameter, a model copy or a state
    /// ([`Error::OverlapsWritten`]). `grads[i]` may be `params[i]` exactly.
    pub(super) fn check_grads(&self, grads: &[Tensor]) -> Result<()> {
        if grads.len() != self.params.len() {
            return Err(Error::CountMismatch {
                argument: "grads".into(),
                got: grads.len(),
                expected: self.params.len(),
            });
        }
        self.written.check(grads)
    }

    /// Refuses `group`'s gradients as the elementwise families' plans do (`gpu::plan`): a
    /// range its buffer cannot bind, a length other than its parameter's (the passes would
    /// read past the gradient), f64, or memory shared with its parameter other than exactly
    /// it (the passes would read elements already updated). `grads` has one per parameter.
    /// For the groups whose passes do not bind a gradient beside its parameter: Adafactor's,
    /// and Muon's (its momentum pass binds the gradient beside Muon's scratch).
    pub(super) fn check_grads_against_params(&self, group: &Group, grads: &[Tensor]) -> Result<()> {
        let members = self.params.iter().zip(grads).enumerate().skip(group.first).take(group.len);
        for (i, (param, grad)) in members {
            let (param, grad) =
                (Arg::new(format!("params[{i}]"), param), Arg::new(format!("grads[{i}]"), grad));
            check_like(&grad, &param)?;
            if grad.tensor.overlaps(&param.tensor) && grad.tensor != param.tensor {
                return Err(Error::PartialOverlap { output: param.name, other: grad.name });
            }
        }
        Ok(())
    }

    /// Refuses gradients that share memory with each other ([`Error::OverlapsWritten`]
    /// naming both), for the passes that rewrite them.
    pub(super) fn check_grads_disjoint(&mut self, grads: &[Tensor]) -> Result<()> {
        if self.disjoint_grads.as_slice() == grads {
            return Ok(());
        }
        let named: Vec<Arg> =
            grads.iter().enumerate().map(|(i, g)| Arg::new(format!("grads[{i}]"), g)).collect();
        check_disjoint(&named).map_err(|e| match e {
            Error::OverlappingParams { first, second } => {
                Error::OverlapsWritten { tensor: second, written: first }
            }
            other => other,
        })?;
        self.disjoint_grads.clear();
        self.disjoint_grads.extend_from_slice(grads);
        Ok(())
    }

    /// Parameter `i`'s tensors in its family's slot order, all updated in place.
    pub(super) fn kernel_args(&self, algorithm: &Algorithm, i: usize, grad: &Tensor) -> KernelArgs {
        let param = Arg::new(format!("params[{i}]"), &self.params[i]);
        let kinds = self.state_kinds(algorithm);
        let state: Vec<Arg> = kinds
            .iter()
            .zip(&self.state[i])
            .map(|(kind, t)| Arg::new(format!("{}[{i}]", kind.torch_name()), t))
            .collect();
        let copy = self.model_copies.get(i).map(|c| Arg::new(format!("model_copies[{i}]"), c));
        let grad = Arg::new(format!("grads[{i}]"), grad);
        let args = SlotArgs {
            param: param.clone(),
            grad,
            state: &state,
            param_out: param,
            state_out: &state,
            param_copy: copy,
        };
        slot_args(algorithm.family(), &kinds, args)
    }
}

/// Writes stochastic rounding's seed and step `t` into a group's uniform slot.
pub(super) fn write_rounding(rounding: Rounding, t: u64, slot: &mut [u8]) {
    if let Some(seed) = rounding.seed() {
        RoundingHeader::new(seed, t).write(slot);
    }
}
