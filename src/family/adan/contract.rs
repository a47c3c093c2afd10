//! The Adan kernel's contract: `src/family/adan/adan.wgsl` and the CPU backend's Adan loop.

use crate::step::fields::{uniform, Override};
use crate::step::Slot::{self, *};
use crate::StateKind;

uniform! {
    /// The per-step values of the Adan family (`Hyper` in `src/family/adan/adan.wgsl`).
    AdanUniform, AdanUniform64 {
        lr,
        /// The old first moment's weight.
        beta1,
        one_minus_beta1,
        /// The old gradient-difference moment's weight, also the difference's weight in the
        /// second moment's argument `g + beta2 d`.
        beta2,
        one_minus_beta2,
        /// The old second moment's weight.
        beta3,
        one_minus_beta3,
        /// `lr / (1 - beta1^t)`: `exp_avg`'s step.
        step_size,
        /// `lr beta2 / (1 - beta2^t)`: `exp_avg_diff`'s step.
        step_size_diff,
        /// `sqrt(1 - beta3^t)`, which divides `sqrt(exp_avg_sq)`.
        sqrt_bias_correction3,
        /// Added to the denominator outside the root.
        eps,
        /// The decay coefficient the capturable kernel turns into `decay` or `prox_divisor`.
        weight_decay,
        /// With `no_prox`, `p *= decay` before the update (`1 - lr weight_decay`); exactly 1
        /// otherwise, which changes no bit.
        decay,
        /// Without `no_prox`, `p /= prox_divisor` after the update (`1 + lr weight_decay`);
        /// exactly 1 otherwise.
        prox_divisor,
        /// `ln(beta1)`, for capturable mode's bias correction from the device's step.
        ln_beta1,
        /// `ln(beta2)`, likewise.
        ln_beta2,
        /// `ln(beta3)`, likewise.
        ln_beta3,
    }
    flags {
        /// 1 on the first step, whose previous gradient is the gradient itself (so the first
        /// difference is 0); 0 after it.
        first_step,
        /// 1 with `no_prox` (decay before the update), 0 for the proximal division after it.
        no_prox,
    }
}

/// The Adan family's compile-time switches: none. The first step and the decay's mode are
/// uniform values, so one compiled variant per storage layout serves every configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct AdanSwitches;

impl AdanSwitches {
    /// The shader's override constants: none.
    pub(crate) fn overrides(&self) -> Vec<Override> {
        Vec::new()
    }
}

/// The registry's names for the family's switches, uniform and the uniform's f64 form
/// (`crate::step`).
pub(crate) type Switches = AdanSwitches;
pub(crate) type Uniform = AdanUniform;
pub(crate) type Uniform64 = AdanUniform64;

/// The slots the update reads, in the order its arguments are given (the states in the
/// official code's order of creation). The Kahan compensation is last: the body never names
/// it, the generated `store_param` reads and writes it where it is bound.
pub(crate) const INPUTS: &[Slot] = &[
    Param,
    Grad,
    State(StateKind::ExpAvg),
    State(StateKind::ExpAvgSq),
    State(StateKind::ExpAvgDiff),
    State(StateKind::NegPreGrad),
    State(StateKind::KahanCompensation),
];

/// The slots the update writes, in the order its arguments are given.
pub(crate) const OUTPUTS: &[Slot] = &[
    Param,
    State(StateKind::ExpAvg),
    State(StateKind::ExpAvgSq),
    State(StateKind::ExpAvgDiff),
    State(StateKind::NegPreGrad),
    ParamCopy,
    State(StateKind::KahanCompensation),
];

/// Every combination of the switches, which the kernel tests validate one by one.
#[cfg(test)]
pub(crate) fn every_switches() -> Vec<Switches> {
    vec![AdanSwitches]
}

/// The switches whose variant binds the most state, which the pipeline test compiles within
/// WebGPU's default limits.
#[cfg(test)]
pub(crate) const WIDEST_SWITCHES: Option<Switches> = Some(AdanSwitches);
