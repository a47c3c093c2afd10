//! The LAMB kernels' contract: `src/family/lamb/lamb.wgsl` (both passes, [`LambSwitches`]) and the
//! CPU backend's LAMB loops.

use crate::step::fields::{uniform, Override};
use crate::step::Slot::{self, *};
use crate::StateKind;

uniform! {
    /// The per-step values of the LAMB family (`Hyper` in `src/family/lamb/lamb.wgsl`).
    LambUniform, LambUniform64 {
        beta1,
        one_minus_beta1,
        beta2,
        one_minus_beta2,
        /// Added to `sqrt(exp_avg_sq)`.
        eps,
        /// The decay added to the update inside the trust ratio (`s += weight_decay p`);
        /// skipped when 0.
        weight_decay,
        /// `lr`, or with `debias` `lr sqrt(1 - beta2^t) / (1 - beta1^t)`. The CPU backend's
        /// apply loop reads the step size already multiplied by the tensor's trust ratio.
        step_size,
        /// The parameter norm's upper bound.
        clamp_value,
    }
    flags {
        /// 1: the trust ratio is computed (and kept) but the step uses 1 (`adam = True`).
        adam,
        /// Pads the flags to a pair.
        reserved,
    }
}

/// The LAMB family's compile-time switches: which of the two passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct LambSwitches {
    /// false: the moments pass (the moments updated, each workgroup's partial sums of `p^2`
    /// and `s^2` written); true: the apply pass (`p -= step_size trust_ratio s`, `s`
    /// recomputed from the stored moments).
    pub(crate) apply: bool,
}

impl LambSwitches {
    /// The shader's override constants.
    pub(crate) fn overrides(&self) -> Vec<Override> {
        vec![Override::Bool("APPLY", self.apply)]
    }
}

/// The registry's names for the family's switches, uniform and the uniform's f64 form
/// (`crate::step`).
pub(crate) type Switches = LambSwitches;
pub(crate) type Uniform = LambUniform;
pub(crate) type Uniform64 = LambUniform64;

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
    // Its two passes bind scalars of their own (`family::lamb::shader`), whose tests validate them.
    Vec::new()
}

/// The switches whose variant binds the most state, which the pipeline test compiles within
/// WebGPU's default limits.
/// None: its passes bind scalars of their own (`family::lamb::shader`).
#[cfg(test)]
pub(crate) const WIDEST_SWITCHES: Option<Switches> = None;
