//! Schedule-Free AdamW's part of the GPU optimizer: each group's running values (`k`,
//! `weight_sum`, `lr_max`), which give its steps' uniforms, the mode, the swap pass of
//! `eval()`/`train()` once built (the optimizer writes its uniforms and records it:
//! `optimizer::mode`), and the optimizer's accessors of the running values.

use std::any::Any;

use super::scalars::check_scalars;
use crate::gpu::dispatch::Batch;
use crate::gpu::kernel::{Program, Scalars};
use crate::gpu::GpuContext;
use crate::optimizer::passes::{GroupPasses, PassView};
use crate::optimizer::Group;
use crate::step::KernelStep;
use crate::{Algorithm, Error, Optimizer, Result, ScheduleFreeMode, ScheduleFreeScalars, Tensor};

/// The schedule-free part of an optimizer's host state.
pub(crate) struct ScheduleFreeHost {
    /// Each group's running values (the initial ones for groups of other algorithms).
    pub(crate) scalars: Vec<ScheduleFreeScalars>,
    /// The values after the step being recorded, kept until it is recorded.
    next: Vec<ScheduleFreeScalars>,
    pending: bool,
    pub(crate) mode: ScheduleFreeMode,
    /// The swap pass of each schedule-free group, built at the first `eval()`.
    pub(crate) swap: Option<Vec<(usize, Batch)>>,
}

/// The passes of an optimizer over `groups` with a schedule-free group; `None` without one.
pub(crate) fn build(
    _: &GpuContext,
    groups: &[Group],
    _: &[Tensor],
    _: &[Vec<usize>],
) -> Result<Option<Box<dyn GroupPasses>>> {
    if !groups.iter().any(|g| matches!(g.algorithm, Algorithm::ScheduleFreeAdamW(_))) {
        return Ok(None);
    }
    Ok(Some(Box::new(ScheduleFreeHost {
        scalars: vec![ScheduleFreeScalars::default(); groups.len()],
        next: vec![ScheduleFreeScalars::default(); groups.len()],
        pending: false,
        mode: ScheduleFreeMode::Train,
        swap: None,
    })))
}

impl GroupPasses for ScheduleFreeHost {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn family(&self) -> crate::step::Family {
        crate::step::Family::ScheduleFree
    }

    /// A schedule-free group's step, from its running values; the values after it wait for
    /// the commit.
    fn kernel_step(&mut self, g: usize, algorithm: &Algorithm) -> Option<KernelStep> {
        let Algorithm::ScheduleFreeAdamW(config) = algorithm else { return None };
        let (step, next) = config.advance(&self.scalars[g]);
        self.next[g] = next;
        self.pending = true;
        Some(step)
    }

    fn commit(&mut self) {
        if std::mem::take(&mut self.pending) {
            self.scalars.copy_from_slice(&self.next);
        }
    }

    /// Drops the values of a step that was not committed.
    fn discard(&mut self) {
        self.pending = false;
    }

    /// Steps are refused in eval mode ([`Error::EvalMode`]).
    fn check_step(&self, call: &'static str) -> Result<()> {
        match self.mode {
            ScheduleFreeMode::Train => Ok(()),
            ScheduleFreeMode::Eval => Err(Error::EvalMode { call }),
        }
    }

    fn mode(&self) -> Option<ScheduleFreeMode> {
        Some(self.mode)
    }

    fn set_mode(&mut self, mode: ScheduleFreeMode) {
        self.mode = mode;
    }

    /// Nothing in `to` already; `eval()` refused for `beta1 = 0`; the swap passes bound at
    /// the first swap; the swap step of each group that has stepped (z is y before).
    fn prepare_swap(
        &mut self,
        view: &PassView<'_>,
        to: ScheduleFreeMode,
    ) -> Result<Option<Vec<(usize, KernelStep)>>> {
        let to_eval = to == ScheduleFreeMode::Eval;
        let configs: Vec<(usize, crate::ScheduleFreeAdamW)> = (view.groups.iter().enumerate())
            .filter_map(|(g, group)| match group.algorithm {
                Algorithm::ScheduleFreeAdamW(c) => Some((g, c)),
                _ => None,
            })
            .collect();
        if configs.is_empty() || self.mode == to {
            return Ok(None);
        }
        if to_eval {
            for (_, c) in &configs {
                crate::algo::check_eval(c)?;
            }
        }
        if self.swap.is_none() {
            self.swap = Some(bind_swap(view, &configs)?);
        }
        let moved = configs.iter().filter(|(g, _)| self.scalars[*g].k > 0);
        Ok(Some(moved.map(|(g, c)| (*g, c.swap_step(to_eval))).collect()))
    }

    /// A schedule-free group's running values and the mode.
    #[cfg(feature = "checkpoint")]
    fn save_group(&self, g: usize, algorithm: &Algorithm, entry: &mut crate::checkpoint::JsonMap) {
        if let (Algorithm::ScheduleFreeAdamW(_), Some(scalars)) = (algorithm, self.scalars.get(g)) {
            super::checkpoint_layout::write(scalars, self.mode, entry);
        }
    }

    /// A schedule-free group's running values (the optimizer sets the mode).
    #[cfg(feature = "checkpoint")]
    fn load_group(&mut self, g: usize, algorithm: &Algorithm, entry: &crate::checkpoint::JsonMap) -> Result<()> {
        if !matches!(algorithm, Algorithm::ScheduleFreeAdamW(_)) {
            return Ok(());
        }
        let (scalars, _) = super::checkpoint_layout::read(g, algorithm, entry)?;
        let groups = self.scalars.len();
        *self.scalars.get_mut(g).ok_or(Error::NoSuchGroup { index: g, groups })? = scalars;
        Ok(())
    }

    fn record_swap(&self, pass: &mut wgpu::ComputePass<'_>, scalars: &[wgpu::BindGroup]) {
        for (g, batch) in self.swap.iter().flatten() {
            if self.scalars[*g].k > 0 {
                batch.record(pass, &scalars[*g]);
            }
        }
    }
}

/// The swap pass of each schedule-free group: its tensors as a step binds them, each
/// parameter standing in for its own gradient.
fn bind_swap(
    view: &PassView<'_>,
    configs: &[(usize, crate::ScheduleFreeAdamW)],
) -> Result<Vec<(usize, Batch)>> {
    let mut batches = Vec::with_capacity(configs.len());
    for (g, c) in configs {
        let group = &view.groups[*g];
        let program = Program::Update(c.swap_step(true).switches());
        let items = (group.first..group.first + group.len)
            .map(|i| view.optimizer.batch_item(Scalars::Host, program, &group.algorithm, i, &view.params[i]))
            .collect::<Result<Vec<_>>>()?;
        batches.push((*g, Batch::build(view.ctx, &items, "schedule-free swap")?));
    }
    Ok(batches)
}

impl Optimizer {
    /// Group `g`'s running Schedule-Free values (`k`, `weight_sum`, `lr_max`); `None` for a
    /// group past the last or one that runs another algorithm.
    pub fn schedule_free_scalars(&self, g: usize) -> Option<ScheduleFreeScalars> {
        let algorithm = self.group_algorithm(g)?;
        let host = self.passes_of::<ScheduleFreeHost>()?;
        matches!(algorithm, Algorithm::ScheduleFreeAdamW(_)).then(|| host.scalars[g])
    }

    /// Replaces group `g`'s running Schedule-Free values (e.g. from a checkpoint), from the
    /// next step on. Refused for a `g` past the groups ([`Error::NoSuchGroup`]), a group that
    /// runs another algorithm, or values that cannot be a group's ([`Error::BadValue`]).
    pub fn set_schedule_free_scalars(&mut self, g: usize, scalars: ScheduleFreeScalars) -> Result<()> {
        let groups = self.group_count();
        let algorithm = self.group_algorithm(g).ok_or(Error::NoSuchGroup { index: g, groups })?;
        check_scalars(algorithm, &scalars)?;
        if let Some(host) = self.passes_of_mut::<ScheduleFreeHost>() {
            host.scalars[g] = scalars;
        }
        Ok(())
    }
}
