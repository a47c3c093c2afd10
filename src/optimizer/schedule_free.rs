//! Schedule-Free AdamW on the GPU optimizer: the options it refuses, the accessors of each
//! group's running values (`k`, `weight_sum`, `lr_max`) and of the mode, which its passes
//! keep (`crate::family::schedule_free::gpu_passes`), and the `eval()`/`train()` swap pass.
//!
//! The swap is one more dispatch of the family's kernel with its `SWAP` switch: the same
//! tensors as a step (the parameters, z, the model copies and Kahan compensations), with
//! each parameter bound as its own gradient (never read), so it reuses the step's tables,
//! storage types and rounding, and in master-weight mode writes the model copies too.

use super::record::write_rounding;
use super::{Optimizer, ParamGroup};
use crate::algo::SWAP_ROUNDING_STEP;
use crate::family::schedule_free::gpu_passes::ScheduleFreeHost;
use crate::family::schedule_free::scalars::check_scalars;
use crate::gpu::dispatch::Batch;
use crate::gpu::kernel::{Program, Scalars};
use crate::step::UNIFORM_SLOT_BYTES;
use crate::{Algorithm, Error, OptimizerOptions, Result, ScheduleFreeMode, ScheduleFreeScalars};

/// Capturable mode (and so AMP, which needs it) is refused for schedule-free groups: each
/// step's averaging weight comes from the host's running `lr_max` and `weight_sum`.
pub(super) fn check_options(groups: &[ParamGroup], options: &OptimizerOptions) -> Result<()> {
    let schedule_free = groups.iter().any(|g| matches!(g.algorithm, Algorithm::ScheduleFreeAdamW(_)));
    if schedule_free && options.capturable {
        return Err(Error::ConflictingOptions {
            first: "capturable",
            second: "algorithm",
            reason: "Schedule-Free AdamW's averaging weight needs the host's running lr_max and \
                     weight_sum each step, which a captured step cannot take",
        });
    }
    Ok(())
}

impl Optimizer {
    /// Which point the parameters hold: y ([`ScheduleFreeMode::Train`], where every
    /// optimizer starts) or, after [`Self::eval`], the average x.
    pub fn mode(&self) -> ScheduleFreeMode {
        self.passes_of::<ScheduleFreeHost>().map_or(ScheduleFreeMode::Train, |host| host.mode)
    }

    /// Group `g`'s running Schedule-Free values (`k`, `weight_sum`, `lr_max`); `None` for a
    /// group past the last or one that runs another algorithm.
    pub fn schedule_free_scalars(&self, g: usize) -> Option<ScheduleFreeScalars> {
        let group = self.groups.get(g)?;
        let host = self.passes_of::<ScheduleFreeHost>()?;
        matches!(group.algorithm, Algorithm::ScheduleFreeAdamW(_)).then(|| host.scalars[g])
    }

    /// Replaces group `g`'s running Schedule-Free values (e.g. from a checkpoint), from the
    /// next step on. Refused for a `g` past the groups ([`Error::NoSuchGroup`]), a group that
    /// runs another algorithm, or values that cannot be a group's ([`Error::BadValue`]).
    pub fn set_schedule_free_scalars(&mut self, g: usize, scalars: ScheduleFreeScalars) -> Result<()> {
        let groups = self.groups.len();
        let group = self.groups.get(g).ok_or(Error::NoSuchGroup { index: g, groups })?;
        check_scalars(&group.algorithm, &scalars)?;
        if let Some(host) = self.passes_of_mut::<ScheduleFreeHost>() {
            host.scalars[g] = scalars;
        }
        Ok(())
    }

    /// Sets the mode without touching the parameters (a checkpoint saved in that mode, or
    /// Burn's module step moving parameters in x to a new optimizer).
    #[cfg_attr(not(any(feature = "checkpoint", feature = "burn")), allow(dead_code))]
    pub(crate) fn set_mode_unchanged(&mut self, mode: ScheduleFreeMode) {
        self.set_mode(mode);
    }

    /// Sets the mode Schedule-Free's passes keep (train, always, without them).
    fn set_mode(&mut self, mode: ScheduleFreeMode) {
        if let Some(host) = self.passes_of_mut::<ScheduleFreeHost>() {
            host.mode = mode;
        }
    }

    /// Refuses `call` in eval mode ([`Error::EvalMode`]).
    pub(super) fn check_train_mode(&self, call: &'static str) -> Result<()> {
        self.passes_of::<ScheduleFreeHost>().map_or(Ok(()), |host| host.check_train_mode(call))
    }

    /// Records Schedule-Free's `eval()` into the caller's encoder: every parameter y of every
    /// schedule-free group becomes the average `x = lerp(y, z, 1 - 1/beta1)` (and so does its
    /// model copy in master-weight mode), in one pass; steps are refused until
    /// [`Self::record_train`]. A no-op in eval mode already (as the package's), for groups
    /// before their first step (z is y then) and for optimizers without a schedule-free group
    /// (they stay in train mode). The mode changes when the pass is recorded; on error
    /// nothing is recorded and the mode is unchanged.
    pub fn record_eval(&mut self, encoder: &mut wgpu::CommandEncoder) -> Result<()> {
        if self.record_swap(encoder, ScheduleFreeMode::Eval)? {
            self.set_mode(ScheduleFreeMode::Eval);
        }
        Ok(())
    }

    /// Records Schedule-Free's `train()`: back from x to `y = lerp(x, z, 1 - beta1)` and
    /// train mode. A no-op in train mode; otherwise as [`Self::record_eval`].
    pub fn record_train(&mut self, encoder: &mut wgpu::CommandEncoder) -> Result<()> {
        if self.record_swap(encoder, ScheduleFreeMode::Train)? {
            self.set_mode(ScheduleFreeMode::Train);
        }
        Ok(())
    }

    /// [`Self::record_eval`], submitted; on error (a refused submission too) the parameters
    /// and the mode are as they were.
    pub fn eval(&mut self) -> Result<()> {
        self.swap(ScheduleFreeMode::Eval, "wgpu-optim eval")
    }

    /// [`Self::record_train`], submitted; on error the parameters and the mode are as they
    /// were.
    pub fn train(&mut self) -> Result<()> {
        self.swap(ScheduleFreeMode::Train, "wgpu-optim train")
    }

    /// The swap to `to`, submitted, and the mode changed once the submission is accepted.
    fn swap(&mut self, to: ScheduleFreeMode, label: &str) -> Result<()> {
        let ctx = self.ctx.clone();
        let mut changes = false;
        ctx.submit(label, |encoder| {
            changes = self.record_swap(encoder, to)?;
            Ok(())
        })?;
        if changes {
            self.set_mode(to);
        }
        Ok(())
    }

    /// Records the swap pass to `to` and says whether the mode changes to `to` (not when the
    /// optimizer is in `to` already or has no schedule-free group); the caller changes it
    /// once the pass is recorded or submitted.
    fn record_swap(&mut self, encoder: &mut wgpu::CommandEncoder, to: ScheduleFreeMode) -> Result<bool> {
        self.ctx.check_alive()?;
        let schedule_free: Vec<usize> = (0..self.groups.len())
            .filter(|&g| matches!(self.groups[g].algorithm, Algorithm::ScheduleFreeAdamW(_)))
            .collect();
        if schedule_free.is_empty() || self.mode() == to {
            return Ok(false);
        }
        for &g in &schedule_free {
            if let (Algorithm::ScheduleFreeAdamW(c), true) =
                (&self.groups[g].algorithm, to == ScheduleFreeMode::Eval)
            {
                crate::algo::check_eval(c)?;
            }
        }
        if self.passes_of::<ScheduleFreeHost>().is_some_and(|host| host.swap.is_none()) {
            let swap = self.bind_swap(&schedule_free)?;
            if let Some(host) = self.passes_of_mut::<ScheduleFreeHost>() {
                host.swap = Some(swap);
            }
        }
        // Its groups exist, so its passes do.
        let Some(host) = self.passes.iter().find_map(|p| p.as_any().downcast_ref::<ScheduleFreeHost>())
        else {
            return Ok(false);
        };
        let to_eval = to == ScheduleFreeMode::Eval;
        let slots = self.uniform_bytes.chunks_exact_mut(UNIFORM_SLOT_BYTES as usize);
        let mut any = false;
        for (g, bytes) in slots.enumerate() {
            if let (Algorithm::ScheduleFreeAdamW(c), true) =
                (&self.groups[g].algorithm, host.scalars[g].k > 0)
            {
                c.swap_step(to_eval).write_uniform(self.math, bytes);
                write_rounding(self.rounding, SWAP_ROUNDING_STEP | self.step, bytes);
                any = true;
            }
        }
        if any {
            self.uniforms.record_write(encoder, &self.uniform_bytes)?;
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(if to_eval { "wgpu-optim eval" } else { "wgpu-optim train" }),
                timestamp_writes: None,
            });
            for (g, batch) in host.swap.iter().flatten() {
                if host.scalars[*g].k > 0 {
                    batch.record(&mut pass, &self.uniforms.bind_groups[*g]);
                }
            }
        }
        Ok(true)
    }

    /// The swap pass of each schedule-free group: its tensors as a step binds them, each
    /// parameter standing in for its own gradient.
    fn bind_swap(&self, groups: &[usize]) -> Result<Vec<(usize, Batch)>> {
        let mut batches = Vec::with_capacity(groups.len());
        for &g in groups {
            let group = &self.groups[g];
            let Algorithm::ScheduleFreeAdamW(c) = &group.algorithm else { continue };
            let program = Program::Update(c.swap_step(true).switches());
            let items = (group.first..group.first + group.len)
                .map(|i| self.batch_item(Scalars::Host, program, &group.algorithm, i, &self.params[i]))
                .collect::<Result<Vec<_>>>()?;
            batches.push((g, Batch::build(&self.ctx, &items, "schedule-free swap")?));
        }
        Ok(batches)
    }
}
