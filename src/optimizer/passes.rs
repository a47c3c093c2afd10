//! The extra passes of the algorithms that are not elementwise on the GPU optimizer: one
//! trait, [`GroupPasses`], implemented in each such family's folder
//! (`crate::family::<name>::gpu_passes`) with the algorithm's own state (Schedule-Free's
//! running values and mode, Adafactor's states and engine, Muon's scratch and dispatches),
//! so that [`Optimizer`] holds a list of passes instead of a field per algorithm, and a step
//! calls their hooks around the elementwise update.

use std::any::Any;

use super::{Group, Optimizer};
use crate::gpu::dispatch::Uniforms;
use crate::step::{Family, KernelStep};
use crate::{Algorithm, DType, GpuContext, Result, Rounding, ScheduleFreeMode, StateKind, Tensor};

/// What the passes read of the optimizer when they bind a gradient set.
pub(crate) struct PassView<'a> {
    /// The optimizer itself, for the plans of the updates the passes dispatch
    /// (`Optimizer::batch_item`).
    pub(crate) optimizer: &'a Optimizer,
    pub(crate) ctx: &'a GpuContext,
    pub(crate) groups: &'a [Group],
    pub(crate) params: &'a [Tensor],
    /// `state[i][k]` is parameter i's `state_kinds()[k]` of its group's algorithm.
    pub(crate) state: &'a [Vec<Tensor>],
    pub(crate) math: DType,
    pub(crate) rounding: Rounding,
    pub(crate) uniforms: &'a Uniforms,
}

/// One family's passes and per-group state beside the elementwise update. Every hook has a
/// default that leaves the step as it is, so a family implements those it needs; accessors
/// of a family's own values find its type through [`Self::as_any`].
pub(crate) trait GroupPasses: Any {
    /// The passes as `Any`, for the accessors of one family's values.
    fn as_any(&self) -> &dyn Any;
    /// [`Self::as_any`], writable.
    fn as_any_mut(&mut self) -> &mut dyn Any;
    /// The family whose passes these are.
    fn family(&self) -> Family;

    /// Group `g`'s kernel step where the family derives it from values of its own
    /// (Schedule-Free: the group's running `k`); those values advance at [`Self::commit`].
    /// `None`: the algorithm's own `kernel_step(t)`.
    fn kernel_step(&mut self, g: usize, algorithm: &Algorithm) -> Option<KernelStep> {
        let _ = (g, algorithm);
        None
    }

    /// The step whose uniforms [`Self::kernel_step`] gave was recorded.
    fn commit(&mut self) {}

    /// The step whose uniforms [`Self::kernel_step`] gave failed before its commit.
    fn discard(&mut self) {}

    /// Before recording a step with `grads` (checked already): the passes' bind groups for
    /// them, and whatever changed hyperparameters require.
    fn bind(&mut self, view: &PassView<'_>, grads: &[Tensor]) -> Result<()> {
        let _ = (view, grads);
        Ok(())
    }

    /// Records the passes that run before the elementwise update (`scalars`: each group's
    /// uniform bind group).
    fn record_before(&self, pass: &mut wgpu::ComputePass<'_>, scalars: &[wgpu::BindGroup]) {
        let _ = (pass, scalars);
    }

    /// Records the passes that run after the elementwise update.
    fn record_after(&self, pass: &mut wgpu::ComputePass<'_>, ctx: &GpuContext) {
        let _ = (pass, ctx);
    }

    /// Whether the passes run group `g`'s whole step (then it has no elementwise update);
    /// `algorithm` is the group's now.
    fn runs_group(&self, g: usize, algorithm: &Algorithm) -> bool {
        let _ = (g, algorithm);
        false
    }

    /// Whether group `g`'s gradients are bound by the passes rather than beside their
    /// parameters in an update's plan, so that the optimizer checks them against their
    /// parameters itself.
    fn checks_gradients(&self, g: usize) -> bool {
        let _ = g;
        false
    }

    /// What the elementwise update of parameter `i` binds as its gradient, where the passes
    /// make it (Muon's orthogonalized update).
    fn gradient(&self, i: usize) -> Option<&Tensor> {
        let _ = i;
        None
    }

    /// Parameter `index`'s state of `kind`, where the passes keep it.
    fn state(&self, index: usize, kind: StateKind) -> Option<&Tensor> {
        let _ = (index, kind);
        None
    }

    /// Every state the passes keep and a step writes: (parameter, kind, tensor).
    fn states(&self) -> Vec<(usize, StateKind, &Tensor)> {
        Vec::new()
    }

    /// Checkpoints: parameter `i`'s states the passes keep as kinds and dtypes (`shape`: its
    /// shape), `None` where they keep none of its.
    #[cfg(feature = "checkpoint")]
    fn checkpoint_states(&self, i: usize, shape: &[usize]) -> Option<Vec<(StateKind, DType)>> {
        let _ = (i, shape);
        None
    }

    /// Checkpoints: parameter `param`'s state `k` where the passes keep it.
    #[cfg(feature = "checkpoint")]
    fn checkpoint_tensor(&self, param: usize, k: usize) -> Option<&Tensor> {
        let _ = (param, k);
        None
    }

    /// Checkpoints: adds what the passes keep of group `g` (running `algorithm`) to its
    /// `param_groups` entry, under the keys its peer's `state_dict` uses.
    #[cfg(feature = "checkpoint")]
    fn save_group(&self, g: usize, algorithm: &Algorithm, entry: &mut crate::checkpoint::JsonMap) {
        let _ = (g, algorithm, entry);
    }

    /// Checkpoints: restores what [`Self::save_group`] wrote from group `g`'s entry (checked
    /// when the file was parsed: `FamilyCheckpoint::check_saved_group`).
    #[cfg(feature = "checkpoint")]
    fn load_group(
        &mut self,
        g: usize,
        algorithm: &Algorithm,
        entry: &crate::checkpoint::JsonMap,
    ) -> Result<()> {
        let _ = (g, algorithm, entry);
        Ok(())
    }

    /// Refuses `call`, a step, where the family's mode refuses steps (Schedule-Free's eval
    /// mode: [`Error::EvalMode`](crate::Error::EvalMode)).
    fn check_step(&self, call: &'static str) -> Result<()> {
        let _ = call;
        Ok(())
    }

    /// Which point the parameters hold, where the family has modes (Schedule-Free: y in
    /// train mode, the average x in eval mode); `None`: it has none.
    fn mode(&self) -> Option<ScheduleFreeMode> {
        None
    }

    /// Sets the mode without touching the parameters.
    fn set_mode(&mut self, mode: ScheduleFreeMode) {
        let _ = mode;
    }

    /// The swap of the family's parameters to mode `to` (`eval()`, `train()`): checks it,
    /// binds its dispatches, and gives the kernel step of each group whose parameters move,
    /// which the optimizer writes into the group's uniform before [`Self::record_swap`].
    /// `None`: nothing changes (no modes, or in `to` already); an empty list: the mode
    /// changes but no parameter moves (no group has stepped).
    fn prepare_swap(
        &mut self,
        view: &PassView<'_>,
        to: ScheduleFreeMode,
    ) -> Result<Option<Vec<(usize, KernelStep)>>> {
        let _ = (view, to);
        Ok(None)
    }

    /// Records the swap [`Self::prepare_swap`] prepared (`scalars`: each group's uniform
    /// bind group).
    fn record_swap(&self, pass: &mut wgpu::ComputePass<'_>, scalars: &[wgpu::BindGroup]) {
        let _ = (pass, scalars);
    }
}

/// The signature of each family's constructor of its passes over the optimizer's groups
/// (`None` where no group runs the family).
pub(crate) type Build =
    fn(&GpuContext, &[Group], &[Tensor], &[Vec<usize>]) -> Result<Option<Box<dyn GroupPasses>>>;

/// The passes of the families among `groups` (parameter i's shape is `shapes[i]`).
pub(super) fn build(
    ctx: &GpuContext,
    groups: &[Group],
    params: &[Tensor],
    shapes: &[Vec<usize>],
) -> Result<Vec<Box<dyn GroupPasses>>> {
    let mut passes = Vec::new();
    for build in crate::Algorithm::gpu_passes() {
        passes.extend(build(ctx, groups, params, shapes)?);
    }
    Ok(passes)
}

impl Optimizer {
    /// The passes of family `P`, where a group runs it.
    pub(crate) fn passes_of<P: GroupPasses>(&self) -> Option<&P> {
        self.passes.iter().find_map(|p| p.as_any().downcast_ref())
    }

    /// [`Self::passes_of`], writable.
    pub(crate) fn passes_of_mut<P: GroupPasses>(&mut self) -> Option<&mut P> {
        self.passes.iter_mut().find_map(|p| p.as_any_mut().downcast_mut())
    }

    /// Binds every family's passes to `grads` (checked already).
    pub(super) fn bind_passes(&mut self, grads: &[Tensor]) -> Result<()> {
        // Taken out while they bind, so that they read the rest of the optimizer.
        let mut passes = std::mem::take(&mut self.passes);
        let bound = passes.iter_mut().try_for_each(|p| p.bind(&self.pass_view(), grads));
        self.passes = passes;
        bound
    }

    /// What the passes read of the optimizer (taken out of it while they do).
    pub(super) fn pass_view(&self) -> PassView<'_> {
        PassView {
            optimizer: self,
            ctx: &self.ctx,
            groups: &self.groups,
            params: &self.params,
            state: &self.state,
            math: self.math,
            rounding: self.rounding,
            uniforms: &self.uniforms,
        }
    }

    /// Group `g`'s kernel step at step `t`: its family's passes', or its algorithm's.
    pub(super) fn group_kernel_step(&mut self, g: usize, t: u64) -> KernelStep {
        let algorithm = self.groups[g].algorithm;
        let from_passes = self.passes.iter_mut().find_map(|p| p.kernel_step(g, &algorithm));
        from_passes.unwrap_or_else(|| algorithm.kernel_step(t))
    }

    /// What parameter `i`'s elementwise update binds as its gradient, given `grad`.
    pub(super) fn update_gradient<'a>(&'a self, i: usize, grad: &'a Tensor) -> &'a Tensor {
        self.passes.iter().find_map(|p| p.gradient(i)).unwrap_or(grad)
    }

    /// Whether a family's passes bind group `g`'s gradients (`GroupPasses::checks_gradients`).
    pub(super) fn passes_check_gradients(&self, g: usize) -> bool {
        self.passes.iter().any(|p| p.checks_gradients(g))
    }

    /// Whether a family's passes run group `g`'s whole step.
    pub(super) fn passes_run_group(&self, g: usize) -> bool {
        self.passes.iter().any(|p| p.runs_group(g, &self.groups[g].algorithm))
    }

    /// After group `g` changed family (between Adam and LAMB, which share their states): the
    /// passes of its new family, if it has passes and no group ran it before. Passes kept for
    /// a family no group runs any more are idle: they bind and record nothing.
    pub(super) fn add_family_passes(&mut self, g: usize) -> Result<()> {
        let algorithm = &self.groups[g].algorithm;
        if self.passes.iter().any(|p| p.family() == algorithm.family()) {
            return Ok(());
        }
        let Some(build) = algorithm.gpu_passes_of() else { return Ok(()) };
        let built = build(&self.ctx, &self.groups, &self.params, &self.shapes)?;
        self.passes.extend(built);
        Ok(())
    }
}
