//! Schedule-Free AdamW's part of the GPU optimizer: each group's running values (`k`,
//! `weight_sum`, `lr_max`), which give its steps' uniforms, the mode, and the swap pass of
//! `eval()`/`train()` once built (the optimizer records it: `optimizer::schedule_free`).

use std::any::Any;

use crate::gpu::dispatch::Batch;
use crate::gpu::GpuContext;
use crate::optimizer::passes::GroupPasses;
use crate::optimizer::Group;
use crate::step::KernelStep;
use crate::{Algorithm, Error, Result, ScheduleFreeMode, ScheduleFreeScalars, Tensor};

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

impl ScheduleFreeHost {
    /// Refuses `call` in eval mode ([`Error::EvalMode`]).
    pub(crate) fn check_train_mode(&self, call: &'static str) -> Result<()> {
        match self.mode {
            ScheduleFreeMode::Train => Ok(()),
            ScheduleFreeMode::Eval => Err(Error::EvalMode { call }),
        }
    }
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
}
