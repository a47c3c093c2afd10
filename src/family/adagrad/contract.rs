//! The Adagrad kernel's contract: `src/family/adagrad/adagrad.wgsl` and the CPU backend's Adagrad loop.

use crate::step::fields::{uniform, Override};
use crate::step::Slot::{self, *};
use crate::StateKind;

uniform! {
    /// The per-step values of the Adagrad family (`Hyper` in `src/family/adagrad/adagrad.wgsl`).
    AdagradUniform, AdagradUniform64 {
        /// The step's rate, with the learning-rate decay folded in.
        lr,
        /// L2 coefficient, skipped when 0.
        weight_decay,
        eps,
        /// PyTorch's `lr_decay`, for the rate computed on the device (capturable mode).
        lr_decay,
    }
}

/// The Adagrad family's compile-time switches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct AdagradSwitches {
    /// Negate the gradient.
    pub(crate) maximize: bool,
}

impl AdagradSwitches {
    /// The shader's override constants.
    pub(crate) fn overrides(&self) -> Vec<Override> {
        vec![Override::Bool("MAXIMIZE", self.maximize)]
    }
}

/// The registry's names for the family's switches, uniform and the uniform's f64 form
/// (`crate::step`).
pub(crate) type Switches = AdagradSwitches;
pub(crate) type Uniform = AdagradUniform;
pub(crate) type Uniform64 = AdagradUniform64;

/// The slots the update reads, in the order its arguments are given. The Kahan compensation
/// is last: the body never names it, the generated `store_param` reads and writes it where
/// it is bound.
pub(crate) const INPUTS: &[Slot] = &[Param, Grad, State(StateKind::Sum), State(StateKind::KahanCompensation)];

/// The slots the update writes, in the order its arguments are given.
pub(crate) const OUTPUTS: &[Slot] =
    &[Param, State(StateKind::Sum), ParamCopy, State(StateKind::KahanCompensation)];

/// Every combination of the switches, which the kernel tests validate one by one.
#[cfg(test)]
pub(crate) fn every_switches() -> Vec<Switches> {
    [false, true].map(|maximize| AdagradSwitches { maximize }).to_vec()
}

/// The switches whose variant binds the most state, which the pipeline test compiles within
/// WebGPU's default limits.
#[cfg(test)]
pub(crate) const WIDEST_SWITCHES: Option<Switches> = Some(AdagradSwitches { maximize: false });
