//! The Schedule-Free AdamW kernel's contract: `src/family/schedule_free/schedule_free.wgsl` and the CPU
//! backend's schedule-free loop.

use crate::step::fields::{uniform, Override};
use crate::step::Slot::{self, *};
use crate::StateKind;

uniform! {
    /// The per-step values of the schedule-free family (`Hyper` in
    /// `src/family/schedule_free/schedule_free.wgsl`), from the group's `k`, `weight_sum` and `lr_max`.
    ScheduleFreeUniform, ScheduleFreeUniform64 {
        /// The scheduled rate (warmup folded in): z's step.
        lr,
        beta2,
        one_minus_beta2,
        /// `1 - beta2^(k + 1)`.
        bias_correction2,
        eps,
        /// Decoupled decay taken at y; skipped when 0.
        weight_decay,
        /// The averaging weight `c = weight / weight_sum`: y moves towards z by it.
        ckp1,
        /// The package's `adaptive_y_lr = lr (beta1 (1 - c) - 1)`.
        y_rate,
        /// 1 at the group's first step: z starts from the parameter (the package clones it
        /// into the state then), so the stored z is not read.
        first,
        /// The swap pass's weight: `param = lerp(param, z, swap_weight)`.
        swap_weight,
    }
}

/// The schedule-free family's compile-time switches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ScheduleFreeSwitches {
    /// The `eval()`/`train()` pass: only `param = lerp(param, z, swap_weight)`, no gradient.
    pub(crate) swap: bool,
}

impl ScheduleFreeSwitches {
    /// The shader's override constants.
    pub(crate) fn overrides(&self) -> Vec<Override> {
        vec![Override::Bool("SWAP", self.swap)]
    }
}

/// The registry's names for the family's switches, uniform and the uniform's f64 form
/// (`crate::step`).
pub(crate) type Switches = ScheduleFreeSwitches;
pub(crate) type Uniform = ScheduleFreeUniform;
pub(crate) type Uniform64 = ScheduleFreeUniform64;

/// The slots the update reads, in the order its arguments are given. The Kahan compensation
/// is last: the body never names it, the generated `store_param` reads and writes it where
/// it is bound.
pub(crate) const INPUTS: &[Slot] =
    &[Param, Grad, State(StateKind::Z), State(StateKind::ExpAvgSq), State(StateKind::KahanCompensation)];

/// The slots the update writes, in the order its arguments are given.
pub(crate) const OUTPUTS: &[Slot] =
    &[Param, State(StateKind::Z), State(StateKind::ExpAvgSq), ParamCopy, State(StateKind::KahanCompensation)];

/// Every combination of the switches, which the kernel tests validate one by one.
#[cfg(test)]
pub(crate) fn every_switches() -> Vec<Switches> {
    [false, true].map(|swap| ScheduleFreeSwitches { swap }).to_vec()
}

/// The switches whose variant binds the most state, which the pipeline test compiles within
/// WebGPU's default limits.
#[cfg(test)]
pub(crate) const WIDEST_SWITCHES: Option<Switches> = Some(ScheduleFreeSwitches { swap: false });
