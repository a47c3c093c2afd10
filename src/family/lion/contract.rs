//! The Lion kernel's contract: `src/family/lion/lion.wgsl` and the CPU backend's Lion loop.

use crate::step::fields::{uniform, Override};
use crate::step::Slot::{self, *};
use crate::StateKind;

uniform! {
    /// The per-step values of the Lion family (`Hyper` in `src/family/lion/lion.wgsl`).
    LionUniform, LionUniform64 {
        /// The running average's weight in the update's direction.
        beta1,
        one_minus_beta1,
        /// The running average's own coefficient.
        beta2,
        one_minus_beta2,
        lr,
        /// The coefficient the capturable kernel turns into `decay`.
        weight_decay,
        /// Decoupled weight decay: `p *= decay` before the update (`1 - lr * weight_decay`;
        /// exactly 1 without decay, which changes no bit).
        decay,
    }
}

/// The Lion family's compile-time switches: none (lion-pytorch has no `maximize` and one
/// weight-decay mode), so one compiled variant per storage layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct LionSwitches;

impl LionSwitches {
    /// The shader's override constants: none.
    pub(crate) fn overrides(&self) -> Vec<Override> {
        Vec::new()
    }
}

/// The registry's names for the family's switches, uniform and the uniform's f64 form
/// (`crate::step`).
pub(crate) type Switches = LionSwitches;
pub(crate) type Uniform = LionUniform;
pub(crate) type Uniform64 = LionUniform64;

/// The slots the update reads, in the order its arguments are given. The Kahan compensation
/// is last: the body never names it, the generated `store_param` reads and writes it where
/// it is bound.
pub(crate) const INPUTS: &[Slot] =
    &[Param, Grad, State(StateKind::ExpAvg), State(StateKind::KahanCompensation)];

/// The slots the update writes, in the order its arguments are given.
pub(crate) const OUTPUTS: &[Slot] =
    &[Param, State(StateKind::ExpAvg), ParamCopy, State(StateKind::KahanCompensation)];

/// Every combination of the switches, which the kernel tests validate one by one.
#[cfg(test)]
pub(crate) fn every_switches() -> Vec<Switches> {
    vec![LionSwitches]
}

/// The switches whose variant binds the most state, which the pipeline test compiles within
/// WebGPU's default limits.
#[cfg(test)]
pub(crate) const WIDEST_SWITCHES: Option<Switches> = Some(LionSwitches);
