//! The modes of the families that have them (Schedule-Free AdamW's train and eval) on the
//! GPU optimizer: the mode, the refusal of steps in eval mode, and the `eval()`/`train()`
//! swap pass. The family's passes keep the mode and prepare the swap
//! (`GroupPasses::prepare_swap`, in `crate::family::<name>::gpu_passes`); the optimizer
//! writes the swap's uniforms and records its pass.
//!
//! The swap is one more dispatch of the family's kernel (Schedule-Free's with its `SWAP`
//! switch): the same tensors as a step, with each parameter bound as its own gradient (never
//! read), so it reuses the step's tables, storage types and rounding, and in master-weight
//! mode writes the model copies too.

use super::record::write_rounding;
use super::Optimizer;
use crate::algo::SWAP_ROUNDING_STEP;
use crate::step::UNIFORM_SLOT_BYTES;
use crate::{Result, ScheduleFreeMode};

impl Optimizer {
    /// Which point the parameters hold: y ([`ScheduleFreeMode::Train`], where every
    /// optimizer starts) or, after [`Self::eval`], the average x.
    pub fn mode(&self) -> ScheduleFreeMode {
        self.passes.iter().find_map(|p| p.mode()).unwrap_or(ScheduleFreeMode::Train)
    }

    /// Sets the mode without touching the parameters: for parameters that are in that mode's
    /// point already (a checkpoint saved in it, or a front end moving parameters in x to a
    /// new optimizer, as the Burn crate's module step does). [`Self::eval`] and
    /// [`Self::train`] swap the parameters as well.
    pub fn set_mode_unchanged(&mut self, mode: ScheduleFreeMode) {
        self.set_mode(mode);
    }

    /// Sets the mode the families' passes keep (train, always, without such passes).
    fn set_mode(&mut self, mode: ScheduleFreeMode) {
        for passes in &mut self.passes {
            passes.set_mode(mode);
        }
    }

    /// Refuses `call` in eval mode ([`Error::EvalMode`](crate::Error::EvalMode)).
    pub(super) fn check_train_mode(&self, call: &'static str) -> Result<()> {
        self.passes.iter().try_for_each(|p| p.check_step(call))
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
    /// optimizer is in `to` already or has no family with modes); the caller changes it
    /// once the pass is recorded or submitted.
    fn record_swap(&mut self, encoder: &mut wgpu::CommandEncoder, to: ScheduleFreeMode) -> Result<bool> {
        self.ctx.check_alive()?;
        // Taken out while they prepare, so that they read the rest of the optimizer.
        let mut passes = std::mem::take(&mut self.passes);
        let prepared: Result<Vec<_>> =
            passes.iter_mut().map(|p| p.prepare_swap(&self.pass_view(), to)).collect();
        self.passes = passes;
        let prepared = prepared?;
        if prepared.iter().all(Option::is_none) {
            return Ok(false);
        }
        let slot = UNIFORM_SLOT_BYTES as usize;
        let mut any = false;
        for (g, step) in prepared.into_iter().flatten().flatten() {
            let bytes = &mut self.uniform_bytes[g * slot..(g + 1) * slot];
            step.write_uniform(self.math, bytes);
            write_rounding(self.rounding, SWAP_ROUNDING_STEP | self.step, bytes);
            any = true;
        }
        if any {
            self.uniforms.record_write(encoder, &self.uniform_bytes)?;
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(if to == ScheduleFreeMode::Eval {
                    "wgpu-optim eval"
                } else {
                    "wgpu-optim train"
                }),
                timestamp_writes: None,
            });
            for passes in &self.passes {
                passes.record_swap(&mut pass, &self.uniforms.bind_groups);
            }
        }
        Ok(true)
    }
}
