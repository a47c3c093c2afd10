//! The AdEMAMix kernel's contract: `src/family/ademamix/ademamix.wgsl` and the CPU backend's AdEMAMix loop.

use crate::step::fields::{uniform, Override};
use crate::step::Slot::{self, *};
use crate::StateKind;

uniform! {
    /// The per-step values of the AdEMAMix family (`Hyper` in `src/family/ademamix/ademamix.wgsl`).
    AdemamixUniform, AdemamixUniform64 {
        beta1,
        one_minus_beta1,
        beta2,
        one_minus_beta2,
        /// The slow EMA's coefficient at this step (its warmup applied).
        beta3_t,
        one_minus_beta3_t,
        /// The slow EMA's weight at this step (its warmup applied).
        alpha_t,
        /// `1 - beta1^t`, which `m1` is divided by.
        bias_correction1,
        /// `sqrt(1 - beta2^t)`, which `sqrt(nu)` is divided by.
        sqrt_bias_correction2,
        eps,
        lr,
        /// The coefficient the capturable kernel turns into `decay`.
        weight_decay,
        /// Decoupled weight decay: `p *= decay` before the update (`1 - lr * weight_decay`).
        decay,
        /// For the values computed on the device from its step (capturable mode):
        /// `ln(beta1)`, `ln(beta2)`, `ln(beta3)`, the held `beta3` and `1 - beta3`, the held
        /// `alpha`, and the warmups' lengths (0: none).
        ln_beta1,
        ln_beta2,
        ln_beta3,
        beta3,
        one_minus_beta3,
        alpha,
        t_alpha,
        t_beta3,
    }
}

/// The AdEMAMix family's compile-time switches (bitsandbytes' AdEMAMix has one weight decay
/// mode and no `maximize`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct AdemamixSwitches {
    /// `p *= decay` after the update instead of before it, as bitsandbytes' AdEMAMix kernels
    /// do (`crate::q8::kernel_step`).
    pub(crate) decay_after_update: bool,
}

impl AdemamixSwitches {
    /// The shader's override constants.
    pub(crate) fn overrides(&self) -> Vec<Override> {
        vec![Override::Bool("DECAY_AFTER_UPDATE", self.decay_after_update)]
    }
}

/// The registry's names for the family's switches, uniform and the uniform's f64 form
/// (`crate::step`).
pub(crate) type Switches = AdemamixSwitches;
pub(crate) type Uniform = AdemamixUniform;
pub(crate) type Uniform64 = AdemamixUniform64;

/// The slots the update reads, in the order its arguments are given. The Kahan compensation
/// is last: the body never names it, the generated `store_param` reads and writes it where
/// it is bound.
pub(crate) const INPUTS: &[Slot] = &[
    Param,
    Grad,
    State(StateKind::ExpAvg),
    State(StateKind::ExpAvgSlow),
    State(StateKind::ExpAvgSq),
    State(StateKind::KahanCompensation),
];

/// The slots the update writes, in the order its arguments are given.
pub(crate) const OUTPUTS: &[Slot] = &[
    Param,
    State(StateKind::ExpAvg),
    State(StateKind::ExpAvgSlow),
    State(StateKind::ExpAvgSq),
    ParamCopy,
    State(StateKind::KahanCompensation),
];

/// Every combination of the switches, which the kernel tests validate one by one.
#[cfg(test)]
pub(crate) fn every_switches() -> Vec<Switches> {
    [false, true].map(|decay_after_update| AdemamixSwitches { decay_after_update }).to_vec()
}

/// The switches whose variant binds the most state, which the pipeline test compiles within
/// WebGPU's default limits.
#[cfg(test)]
pub(crate) const WIDEST_SWITCHES: Option<Switches> = Some(AdemamixSwitches { decay_after_update: true });
