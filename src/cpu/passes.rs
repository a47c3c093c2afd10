//! The extra passes of the algorithms that are not elementwise (Schedule-Free, LAMB,
//! Adafactor, Muon) on the CPU backend: one trait, [`CpuPasses`], implemented in each such
//! family's folder (`crate::family::<name>::cpu_passes`) with the algorithm's own state,
//! so that [`CpuOptimizer`] keeps no per-algorithm field and its elementwise step runs no
//! family's code but the kernel's. The optimizer's accessors of that state are here too,
//! each asking the passes.

use std::any::Any;
use std::fmt::Debug;

use super::host::{HostSlice, HostSliceMut};
use super::kernels::Kernel;
use super::state_memory::StateTensor;
use super::storage::Stores;
use super::CpuOptimizer;
use crate::family::lamb::cpu_passes::LambPasses;
use crate::family::schedule_free::cpu_passes::ScheduleFreePasses;
use crate::step::KernelStep;
use crate::{Algorithm, DType, Error, LambNorms, Result, ScheduleFreeMode, ScheduleFreeScalars, StateKind};

/// What a step hands the passes: the checked tensors, and the elementwise kernel and stores
/// the optimizer prepared for the step.
pub(crate) struct CpuStep<'s, 'p, 'g> {
    pub(crate) algorithm: &'s Algorithm,
    /// The step being taken, counted from 1.
    pub(crate) t: u64,
    pub(crate) kernel: &'s Kernel,
    pub(crate) stores: &'s Stores,
    pub(crate) params: &'s mut [HostSliceMut<'p>],
    pub(crate) grads: &'s [HostSlice<'g>],
    /// `state[i]` is parameter i's state tensors, in the algorithm's `state_kinds` order.
    pub(crate) state: &'s mut [Vec<StateTensor>],
    /// Each parameter's Kahan compensation, or nothing.
    pub(crate) compensation: &'s mut [StateTensor],
}

/// What Schedule-Free's `eval()`/`train()` swap rewrites, and the stores' rounding.
pub(crate) struct SwapTensors<'s, 'p> {
    pub(crate) rounding: crate::Rounding,
    /// Steps taken (the swap's stochastic rounding stream derives from it).
    pub(crate) step: u64,
    pub(crate) params: &'s mut [HostSliceMut<'p>],
    pub(crate) state: &'s mut [Vec<StateTensor>],
    pub(crate) compensation: &'s mut [StateTensor],
}

/// One family's passes and per-group state beside the elementwise kernel. Every hook has a
/// default that leaves the elementwise step as it is, so a family implements only those it
/// needs; accessors of a family's own values find its type through [`Self::as_any`].
pub(crate) trait CpuPasses: Any + Debug + Send + Sync {
    /// A copy, so that the optimizer stays `Clone`.
    fn clone_box(&self) -> Box<dyn CpuPasses>;
    /// The passes as `Any`, for the accessors of one family's values.
    fn as_any(&self) -> &dyn Any;
    /// [`Self::as_any`], writable.
    fn as_any_mut(&mut self) -> &mut dyn Any;

    /// The elementwise kernel's step at `t` where the family derives it from values of its
    /// own (Schedule-Free: its running `k`); those values advance at [`Self::stepped`].
    /// `None`: the algorithm's own `kernel_step(t)`.
    fn kernel_step(&mut self, algorithm: &Algorithm, t: u64) -> Option<KernelStep> {
        let _ = (algorithm, t);
        None
    }

    /// Runs the step in place of the elementwise loop; `false` where the loop runs.
    fn step(&mut self, step: CpuStep<'_, '_, '_>) -> bool {
        let _ = step;
        false
    }

    /// The step that [`Self::kernel_step`] prepared was taken.
    fn stepped(&mut self) {}

    /// Whether the passes keep the parameters' states themselves (then the optimizer's
    /// `state` holds none, and [`Self::state`] answers for them).
    fn keeps_states(&self) -> bool {
        false
    }

    /// Parameter `index`'s state of `kind`, where [`Self::keeps_states`].
    fn state(&self, index: usize, kind: StateKind) -> Option<HostSlice<'_>> {
        let _ = (index, kind);
        None
    }

    /// [`Self::state`], writable.
    fn state_mut(&mut self, index: usize, kind: StateKind) -> Option<HostSliceMut<'_>> {
        let _ = (index, kind);
        None
    }

    /// Checkpoints: parameter `index` (of `shape`)'s states the passes keep, as kinds and
    /// dtypes in the order [`Self::checkpoint_tensor`] numbers them.
    #[cfg(feature = "checkpoint")]
    fn checkpoint_states(&self, index: usize, shape: &[usize]) -> Vec<(StateKind, DType)> {
        let _ = (index, shape);
        Vec::new()
    }

    /// Checkpoints: parameter `index`'s state `k` that the passes keep.
    #[cfg(feature = "checkpoint")]
    fn checkpoint_tensor(&self, index: usize, k: usize) -> Option<&StateTensor> {
        let _ = (index, k);
        None
    }

    /// [`Self::checkpoint_tensor`], writable.
    #[cfg(feature = "checkpoint")]
    fn checkpoint_tensor_mut(&mut self, index: usize, k: usize) -> Option<&mut StateTensor> {
        let _ = (index, k);
        None
    }
}

impl Clone for Box<dyn CpuPasses> {
    fn clone(&self) -> Self {
        self.clone_box()
    }
}

impl CpuOptimizer {
    /// The passes as family `P`'s, where the optimizer runs that family.
    fn passes_of<P: CpuPasses>(&self) -> Option<&P> {
        self.passes.as_deref()?.as_any().downcast_ref()
    }

    /// [`Self::passes_of`], writable.
    fn passes_of_mut<P: CpuPasses>(&mut self) -> Option<&mut P> {
        self.passes.as_deref_mut()?.as_any_mut().downcast_mut()
    }

    /// Which point the parameters hold: y ([`ScheduleFreeMode::Train`], where every
    /// optimizer starts) or, after [`Self::eval`], x.
    pub fn mode(&self) -> ScheduleFreeMode {
        self.passes_of::<ScheduleFreePasses>().map_or(ScheduleFreeMode::Train, |p| p.mode)
    }

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
        crate::family::schedule_free::scalars::check_scalars(&self.algorithm, &scalars)?;
        if let Some(passes) = self.passes_of_mut::<ScheduleFreePasses>() {
            passes.scalars = scalars;
        }
        Ok(())
    }

    /// Sets what a checkpoint keeps of Schedule-Free's group: its running values and the
    /// mode the parameters are in, without touching the parameters (saved in that mode).
    #[cfg(feature = "checkpoint")]
    pub(super) fn restore_schedule_free(&mut self, scalars: ScheduleFreeScalars, mode: ScheduleFreeMode) {
        if let Some(passes) = self.passes_of_mut::<ScheduleFreePasses>() {
            passes.scalars = scalars;
            passes.mode = mode;
        }
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

    fn swap(&mut self, params: &mut [HostSliceMut<'_>], to: ScheduleFreeMode) -> Result<()> {
        if self.passes_of::<ScheduleFreePasses>().is_none() {
            return Ok(());
        }
        self.check_params(params)?;
        let passes =
            self.passes.as_deref_mut().and_then(|p| p.as_any_mut().downcast_mut::<ScheduleFreePasses>());
        let Some(passes) = passes else { return Ok(()) };
        let tensors = SwapTensors {
            rounding: self.rounding,
            step: self.step,
            params,
            state: &mut self.state,
            compensation: &mut self.compensation,
        };
        passes.swap(&self.algorithm, to, tensors)
    }

    /// Tensor `i`'s norms at the last step, when the optimizer runs LAMB and has stepped
    /// (torch-optimizer's `state['weight_norm']`, `['adam_norm']`, `['trust_ratio']`).
    pub fn lamb_norms(&self, i: usize) -> Option<LambNorms> {
        self.passes_of::<LambPasses>()?.norms.get(i).copied()
    }
}
