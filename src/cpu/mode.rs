//! The modes of the families that have them (Schedule-Free AdamW's train and eval) on the
//! CPU backend: the mode, the refusal of steps in eval mode, and the `eval()`/`train()`
//! swap. The family's passes keep the mode and run the swap ([`CpuPasses::mode`],
//! [`CpuPasses::swap`], in `crate::family::<name>::cpu_passes`); the optimizer checks the
//! parameters and lends them with its states.

use super::host::HostSliceMut;
use super::passes::{CpuPasses, SwapTensors};
use super::CpuOptimizer;
use crate::{Error, Result, ScheduleFreeMode};

impl CpuOptimizer {
    /// Which point the parameters hold: y ([`ScheduleFreeMode::Train`], where every
    /// optimizer starts) or, after [`Self::eval`], x.
    pub fn mode(&self) -> ScheduleFreeMode {
        self.passes.as_deref().and_then(CpuPasses::mode).unwrap_or(ScheduleFreeMode::Train)
    }

    /// Schedule-Free's `eval()`: replaces each parameter y by the average
    /// `x = lerp(y, z, 1 - 1/beta1)`, in place, and enters eval mode, where steps are
    /// refused. A no-op in eval mode already (as the package's), before the first step (z
    /// is y then), and for optimizers that run another algorithm (they stay in train mode).
    /// `params` are checked as [`Self::step`] checks them; nothing is written when refused.
    pub fn eval(&mut self, params: &mut [HostSliceMut<'_>]) -> Result<()> {
        self.swap(params, ScheduleFreeMode::Eval)
    }

    /// Schedule-Free's `train()`: back from x to `y = lerp(x, z, 1 - beta1)` and train mode.
    /// A no-op in train mode (as the package's); otherwise as [`Self::eval`].
    pub fn train(&mut self, params: &mut [HostSliceMut<'_>]) -> Result<()> {
        self.swap(params, ScheduleFreeMode::Train)
    }

    /// Refuses `call` in eval mode ([`Error::EvalMode`]).
    pub(super) fn check_train_mode(&self, call: &'static str) -> Result<()> {
        match self.mode() {
            ScheduleFreeMode::Train => Ok(()),
            ScheduleFreeMode::Eval => Err(Error::EvalMode { call }),
        }
    }

    /// The swap to `to` by the passes of a family with modes; a no-op, with the parameters
    /// unchecked, for the others.
    fn swap(&mut self, params: &mut [HostSliceMut<'_>], to: ScheduleFreeMode) -> Result<()> {
        if self.passes.as_deref().and_then(CpuPasses::mode).is_none() {
            return Ok(());
        }
        self.check_params(params)?;
        let Some(passes) = self.passes.as_deref_mut() else { return Ok(()) };
        let tensors = SwapTensors {
            rounding: self.rounding,
            step: self.step,
            params,
            state: &mut self.state,
            compensation: &mut self.compensation,
            origins: &self.origins,
        };
        passes.swap(&self.algorithm, to, tensors)
    }
}
