//! The extra passes of the algorithms that are not elementwise (Schedule-Free, LAMB,
//! Adafactor, Muon) on the CPU backend: one trait, [`CpuPasses`], implemented in each such
//! family's folder (`crate::family::<name>::cpu_passes`) with the algorithm's own state,
//! so that [`CpuOptimizer`] keeps no per-algorithm field and its elementwise step runs no
//! family's code but the kernel's. The accessors of one family's values are in its folder,
//! each finding its passes through [`CpuOptimizer::passes_of`]; the mode and its swap are
//! in `super::mode`, through [`CpuPasses::mode`] and [`CpuPasses::swap`].

use std::any::Any;
use std::fmt::Debug;

use super::host::{HostSlice, HostSliceMut};
use super::kernels::Kernel;
use super::state_memory::StateTensor;
use super::storage::Stores;
use super::CpuOptimizer;
use crate::step::KernelStep;
use crate::{Algorithm, DType, Result, ScheduleFreeMode, StateKind};

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
    /// A sharded step's: the per-tensor sums a family takes over its tensors (LAMB's `p^2`
    /// and `s^2`), handed over to be replaced by the sums over every rank's pieces of the
    /// same tensors before they are used.
    pub(crate) sums: Option<&'s mut TensorSums<'s>>,
}

/// [`CpuStep::sums`]: given the sums of this optimizer's tensors, leaves the sums over
/// every rank's pieces of their tensors in their place.
pub(crate) type TensorSums<'s> = dyn FnMut(&mut [[f64; 2]]) + 's;

/// What Schedule-Free's `eval()`/`train()` swap rewrites, and the stores' rounding.
pub(crate) struct SwapTensors<'s, 'p> {
    pub(crate) rounding: crate::Rounding,
    /// Steps taken (the swap's stochastic rounding stream derives from it).
    pub(crate) step: u64,
    pub(crate) params: &'s mut [HostSliceMut<'p>],
    pub(crate) state: &'s mut [Vec<StateTensor>],
    pub(crate) compensation: &'s mut [StateTensor],
    /// `OptimizerOptions::origins`: stochastic rounding's ordinal and first element of each.
    pub(crate) origins: &'s std::sync::Arc<[(u32, u64)]>,
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

    /// The mode the passes keep (Schedule-Free's train or eval); `None` for a family
    /// without modes, whose optimizer stays in train mode and whose swap is a no-op.
    fn mode(&self) -> Option<ScheduleFreeMode> {
        None
    }

    /// Swaps the parameters to the point of `to` and enters that mode, unless they hold it
    /// already; the tensors have been checked.
    fn swap(
        &mut self,
        algorithm: &Algorithm,
        to: ScheduleFreeMode,
        tensors: SwapTensors<'_, '_>,
    ) -> Result<()> {
        let _ = (algorithm, to, tensors);
        Ok(())
    }

    /// Checkpoints: adds what the passes keep of the group (running `algorithm`) to its
    /// `param_groups` entry, under the keys its peer's `state_dict` uses.
    #[cfg(feature = "checkpoint")]
    fn save_group(&self, algorithm: &Algorithm, entry: &mut crate::checkpoint::JsonMap) {
        let _ = (algorithm, entry);
    }

    /// Checkpoints: restores what [`Self::save_group`] wrote from the group's entry (checked
    /// when the file was parsed: `FamilyCheckpoint::check_saved_group`).
    #[cfg(feature = "checkpoint")]
    fn load_group(&mut self, algorithm: &Algorithm, entry: &crate::checkpoint::JsonMap) -> Result<()> {
        let _ = (algorithm, entry);
        Ok(())
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
    pub(crate) fn passes_of<P: CpuPasses>(&self) -> Option<&P> {
        self.passes.as_deref()?.as_any().downcast_ref()
    }

    /// [`Self::passes_of`], writable.
    pub(crate) fn passes_of_mut<P: CpuPasses>(&mut self) -> Option<&mut P> {
        self.passes.as_deref_mut()?.as_any_mut().downcast_mut()
    }
}
