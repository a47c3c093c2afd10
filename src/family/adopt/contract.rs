//! The ADOPT kernel's contract: `src/family/adopt/adopt.wgsl` and the CPU backend's ADOPT loop.

use crate::step::fields::{uniform, Override};
use crate::step::Slot::{self, *};
use crate::StateKind;

uniform! {
    /// The per-step values of the ADOPT family (`Hyper` in `src/family/adopt/adopt.wgsl`).
    AdoptUniform, AdoptUniform64 {
        lr,
        /// The weight of the normalized gradient in `exp_avg`'s lerp.
        one_minus_beta1,
        /// The old second moment's weight.
        beta2,
        one_minus_beta2,
        /// The floor of `sqrt(exp_avg_sq)`.
        eps,
        /// `-1` with `maximize`, else `1`: the gradient's factor (exact either way).
        grad_sign,
        /// Coupled (L2) decay added to the gradient, skipped when 0 (0 with `decouple`).
        l2,
        /// The decoupled coefficient the capturable kernel turns into `decay` (0 without
        /// `decouple`).
        weight_decay,
        /// Decoupled decay from the second step on: `p *= decay` (`1 - lr * weight_decay`;
        /// exactly 1 without it, which changes no bit).
        decay,
        /// The normalized gradient's bound at this step, `(t - 1)^q`; infinite without
        /// clipping.
        clip_bound,
        /// The exponent `q` of the bound, for capturable mode's bound from the device's step.
        clip_exponent,
    }
    flags {
        /// 1 on the first step, which only sets `exp_avg_sq = g^2`; 0 after it.
        first_step,
        /// 1 where the normalized gradient is clipped (`clip_exponent` is set), else 0.
        clips,
    }
}

/// The ADOPT family's compile-time switches: none. Everything that differs between
/// configurations or steps (`maximize`, the decay's mode, the first step, clipping, the form
/// of the lerp) is a uniform value, so one compiled variant per storage layout serves all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct AdoptSwitches;

impl AdoptSwitches {
    /// The shader's override constants: none.
    pub(crate) fn overrides(&self) -> Vec<Override> {
        Vec::new()
    }
}

/// The registry's names for the family's switches, uniform and the uniform's f64 form
/// (`crate::step`).
pub(crate) type Switches = AdoptSwitches;
pub(crate) type Uniform = AdoptUniform;
pub(crate) type Uniform64 = AdoptUniform64;

/// The slots the update reads, in the order its arguments are given. The Kahan compensation
/// is last: the body never names it, the generated `store_param` reads and writes it where
/// it is bound.
pub(crate) const INPUTS: &[Slot] =
    &[Param, Grad, State(StateKind::ExpAvg), State(StateKind::ExpAvgSq), State(StateKind::KahanCompensation)];

/// The slots the update writes, in the order its arguments are given.
pub(crate) const OUTPUTS: &[Slot] = &[
    Param,
    State(StateKind::ExpAvg),
    State(StateKind::ExpAvgSq),
    ParamCopy,
    State(StateKind::KahanCompensation),
];

/// Every combination of the switches, which the kernel tests validate one by one.
#[cfg(test)]
pub(crate) fn every_switches() -> Vec<Switches> {
    vec![AdoptSwitches]
}

/// The switches whose variant binds the most state, which the pipeline test compiles within
/// WebGPU's default limits.
#[cfg(test)]
pub(crate) const WIDEST_SWITCHES: Option<Switches> = Some(AdoptSwitches);
