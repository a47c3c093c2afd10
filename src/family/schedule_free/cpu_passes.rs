//! Schedule-Free AdamW's passes on the CPU backend: the group's running values, which give
//! each step's kernel step, the mode, and the `eval()`/`train()` swap.

use std::any::Any;

use crate::algo::SWAP_ROUNDING_STEP;
use crate::cpu::host::{HostSlice, HostTensor};
use crate::cpu::kernels::{Kernel, MAX_STATE};
use crate::cpu::passes::{CpuPasses, SwapTensors};
use crate::cpu::storage::Stores;
use crate::cpu::work;
use crate::step::{rounding, KernelStep};
use super::scalars::check_scalars;
use crate::cpu::CpuOptimizer;
use crate::{Algorithm, Error, Result, ScheduleFreeMode, ScheduleFreeScalars};

/// Schedule-Free's group on the CPU: its running `k`, `weight_sum` and `lr_max`, and which
/// point the parameters hold.
#[derive(Clone, Debug)]
pub(crate) struct ScheduleFreePasses {
    pub(crate) scalars: ScheduleFreeScalars,
    /// The values after the step being taken, kept until it is taken.
    next: ScheduleFreeScalars,
    pub(crate) mode: ScheduleFreeMode,
}

impl ScheduleFreePasses {
    /// A group at step 0, in train mode.
    pub(crate) fn new() -> Self {
        ScheduleFreePasses {
            scalars: ScheduleFreeScalars::default(),
            next: ScheduleFreeScalars::default(),
            mode: ScheduleFreeMode::Train,
        }
    }
}

impl CpuPasses for ScheduleFreePasses {
    fn clone_box(&self) -> Box<dyn CpuPasses> {
        Box::new(self.clone())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    /// The step of the group's `k`, not of the optimizer's count.
    fn kernel_step(&mut self, algorithm: &Algorithm, t: u64) -> Option<KernelStep> {
        let _ = t;
        let Algorithm::ScheduleFreeAdamW(config) = algorithm else { return None };
        let (step, next) = config.advance(&self.scalars);
        self.next = next;
        Some(step)
    }

    fn stepped(&mut self) {
        self.scalars = self.next;
    }

    fn mode(&self) -> Option<ScheduleFreeMode> {
        Some(self.mode)
    }

    /// The group's running values and the mode.
    #[cfg(feature = "checkpoint")]
    fn save_group(&self, algorithm: &Algorithm, entry: &mut crate::checkpoint::JsonMap) {
        if matches!(algorithm, Algorithm::ScheduleFreeAdamW(_)) {
            super::checkpoint_layout::write(&self.scalars, self.mode, entry);
        }
    }

    /// The group's running values and the mode the parameters are in, without touching the
    /// parameters (saved in that mode).
    #[cfg(feature = "checkpoint")]
    fn load_group(&mut self, algorithm: &Algorithm, entry: &crate::checkpoint::JsonMap) -> Result<()> {
        if matches!(algorithm, Algorithm::ScheduleFreeAdamW(_)) {
            (self.scalars, self.mode) = super::checkpoint_layout::read(0, algorithm, entry)?;
        }
        Ok(())
    }

    /// Swaps the parameters to the point of `to` (x for eval, y for train), unless they
    /// hold it already; the tensors have been checked.
    fn swap(
        &mut self,
        algorithm: &Algorithm,
        to: ScheduleFreeMode,
        tensors: SwapTensors<'_, '_>,
    ) -> Result<()> {
        let Algorithm::ScheduleFreeAdamW(config) = algorithm else { return Ok(()) };
        if self.mode == to {
            return Ok(());
        }
        if to == ScheduleFreeMode::Eval {
            crate::algo::check_eval(config)?;
        }
        if self.scalars.k > 0 {
            let SwapTensors { rounding: round, step, params, state, compensation, origins } = tensors;
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
                stochastic: round.seed().map(|seed| (seed, SWAP_ROUNDING_STEP | step)),
                state: false,
                streams,
                origins: origins.clone(),
            };
            work::run(&kernel, &stores, params, &grads, state, compensation);
        }
        self.mode = to;
        Ok(())
    }
}

impl CpuOptimizer {
    /// A schedule-free group's running values (`k`, `weight_sum`, `lr_max`); `None` for a
    /// group past the last or one that runs another algorithm.
    pub fn schedule_free_scalars(&self, g: usize) -> Option<ScheduleFreeScalars> {
        (g == 0).then(|| self.passes_of::<ScheduleFreePasses>().map(|p| p.scalars)).flatten()
    }

    /// Replaces a schedule-free group's running values (e.g. from a checkpoint). Refused for
    /// a group that runs another algorithm ([`Error::NoSuchGroup`] past the last), or a `k`
    /// of 0 with other values than the initial ones ([`Error::BadValue`]).
    pub fn set_schedule_free_scalars(&mut self, g: usize, scalars: ScheduleFreeScalars) -> Result<()> {
        if g != 0 {
            return Err(Error::NoSuchGroup { index: g, groups: 1 });
        }
        check_scalars(&self.algorithm, &scalars)?;
        if let Some(passes) = self.passes_of_mut::<ScheduleFreePasses>() {
            passes.scalars = scalars;
        }
        Ok(())
    }
}
