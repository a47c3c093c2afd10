//! Schedule-Free AdamW's train/eval swap on the CPU backend, and its group values.

use super::host::{HostSlice, HostSliceMut, HostTensor};
use super::kernels::{Kernel, MAX_STATE};
use super::storage::Stores;
use super::{work, CpuOptimizer};
use crate::algo::SWAP_ROUNDING_STEP;
use crate::step::rounding;
use crate::{Algorithm, Error, Result, ScheduleFreeMode, ScheduleFreeScalars};

impl CpuOptimizer {
    /// Which point the parameters hold: y ([`ScheduleFreeMode::Train`], where every
    /// optimizer starts) or, after [`Self::eval`], x.
    pub fn mode(&self) -> ScheduleFreeMode {
        self.mode
    }

    /// A schedule-free group's running values (`k`, `weight_sum`, `lr_max`); `None` for a
    /// group past the last or one that runs another algorithm.
    pub fn schedule_free_scalars(&self, g: usize) -> Option<ScheduleFreeScalars> {
        (g == 0 && matches!(self.algorithm, Algorithm::ScheduleFreeAdamW(_))).then_some(self.schedule_free)
    }

    /// Replaces a schedule-free group's running values (e.g. from a checkpoint). Refused for
    /// a group that runs another algorithm ([`Error::NoSuchGroup`] past the last), or a `k`
    /// of 0 with other values than the initial ones ([`Error::BadValue`]).
    pub fn set_schedule_free_scalars(&mut self, g: usize, scalars: ScheduleFreeScalars) -> Result<()> {
        if g != 0 {
            return Err(Error::NoSuchGroup { index: g, groups: 1 });
        }
        crate::family::schedule_free::scalars::check_scalars(&self.algorithm, &scalars)?;
        self.schedule_free = scalars;
        Ok(())
    }

    /// Sets the mode the parameters are in without touching them (a checkpoint's
    /// `train_mode`, loaded with parameters saved in that mode).
    #[cfg(feature = "checkpoint")]
    pub(crate) fn set_mode_unchanged(&mut self, mode: ScheduleFreeMode) {
        self.mode = mode;
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
        match self.mode {
            ScheduleFreeMode::Train => Ok(()),
            ScheduleFreeMode::Eval => Err(Error::EvalMode { call }),
        }
    }

    fn swap(&mut self, params: &mut [HostSliceMut<'_>], to: ScheduleFreeMode) -> Result<()> {
        let Algorithm::ScheduleFreeAdamW(config) = self.algorithm else { return Ok(()) };
        self.check_params(params)?;
        if self.mode == to {
            return Ok(());
        }
        if to == ScheduleFreeMode::Eval {
            crate::algo::check_eval(&config)?;
        }
        if self.schedule_free.k > 0 {
            // The swap reads no gradient, but the step's loops take one: zeros of each
            // parameter's dtype keep them on their single-dtype paths. Made only when a swap
            // runs (an eval or a train that changes nothing allocates nothing).
            let zeros = params
                .iter()
                .map(|p| HostTensor::filled(p.dtype(), p.len(), 0.0))
                .collect::<Result<Vec<_>>>()?;
            let grads: Vec<HostSlice<'_>> = zeros.iter().map(HostTensor::as_slice).collect();
            let kernel = Kernel::new(&config.swap_step(to == ScheduleFreeMode::Eval));
            let streams = [rounding::stream(None); MAX_STATE];
            let stores = Stores {
                stochastic: self.rounding.seed().map(|seed| (seed, SWAP_ROUNDING_STEP | self.step)),
                state: false,
                streams,
            };
            work::run(&kernel, &stores, params, &grads, &mut self.state, &mut self.compensation);
        }
        self.mode = to;
        Ok(())
    }
}
