//! The RMSprop kernel's contract: `src/family/rmsprop/rmsprop.wgsl` and the CPU backend's RMSprop loop.

use crate::step::fields::{uniform, Override};
use crate::step::Slot::{self, *};
use crate::StateKind;

uniform! {
    /// The per-step values of the RMSprop family (`Hyper` in `src/family/rmsprop/rmsprop.wgsl`).
    RmsPropUniform, RmsPropUniform64 {
        lr,
        /// The previous averages' coefficient.
        alpha,
        /// `1 - alpha`, computed in f64 as PyTorch computes it in Python.
        one_minus_alpha,
        /// Added to the root of the (centered) second moment.
        eps,
        /// L2 coefficient, skipped when 0.
        weight_decay,
        /// The momentum buffer's coefficient.
        momentum,
    }
}

/// The RMSprop family's compile-time switches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RmsPropSwitches {
    /// Negate the gradient.
    pub(crate) maximize: bool,
    /// Keep `grad_avg` and divide by the root of the variance estimate.
    pub(crate) centered: bool,
    /// Keep a momentum buffer (PyTorch keeps none at momentum 0).
    pub(crate) momentum: bool,
    /// `grad_avg.lerp_(grad, w)` in ATen's form for weights `w >= 0.5`:
    /// `g - (g - grad_avg) * (1 - w)`; otherwise `grad_avg + w * (g - grad_avg)`.
    pub(crate) lerp_from_grad: bool,
    /// The parameter steps with the gradient as loaded, the state alone with the decayed one:
    /// bitsandbytes' 8-bit RMSprop kernel (`crate::q8::kernel_step`). The CPU backend runs
    /// it uncentered, without momentum and without `maximize` only, as bitsandbytes does.
    pub(crate) step_with_raw_grad: bool,
}

impl RmsPropSwitches {
    /// The shader's override constants.
    pub(crate) fn overrides(&self) -> Vec<Override> {
        vec![
            Override::Bool("MAXIMIZE", self.maximize),
            Override::Bool("CENTERED", self.centered),
            Override::Bool("MOMENTUM", self.momentum),
            Override::Bool("LERP_FROM_GRAD", self.lerp_from_grad),
            Override::Bool("STEP_WITH_RAW_GRAD", self.step_with_raw_grad),
        ]
    }
}

/// The registry's names for the family's switches, uniform and the uniform's f64 form
/// (`crate::step`).
pub(crate) type Switches = RmsPropSwitches;
pub(crate) type Uniform = RmsPropUniform;
pub(crate) type Uniform64 = RmsPropUniform64;

/// The slots the update reads, in the order its arguments are given. The Kahan compensation
/// is last: the body never names it, the generated `store_param` reads and writes it where
/// it is bound.
pub(crate) const INPUTS: &[Slot] = &[
    Param,
    Grad,
    State(StateKind::SquareAvg),
    State(StateKind::MomentumBuffer),
    State(StateKind::GradAvg),
    State(StateKind::KahanCompensation),
];

/// The slots the update writes, in the order its arguments are given.
pub(crate) const OUTPUTS: &[Slot] = &[
    Param,
    State(StateKind::SquareAvg),
    State(StateKind::MomentumBuffer),
    State(StateKind::GradAvg),
    ParamCopy,
    State(StateKind::KahanCompensation),
];

/// Every combination of the switches, which the kernel tests validate one by one.
#[cfg(test)]
pub(crate) fn every_switches() -> Vec<Switches> {
    let flags = [false, true];
    let triples = flags.iter().flat_map(|a| flags.iter().flat_map(move |m| flags.map(move |d| (*a, *m, d))));
    triples
        .map(|(centered, maximize, momentum)| RmsPropSwitches {
            maximize,
            centered,
            momentum,
            lerp_from_grad: maximize != centered,
            step_with_raw_grad: !maximize && !centered && !momentum,
        })
        .collect()
}

/// The switches whose variant binds the most state, which the pipeline test compiles within
/// WebGPU's default limits.
#[cfg(test)]
pub(crate) const WIDEST_SWITCHES: Option<Switches> = Some(RmsPropSwitches {
    maximize: false,
    centered: true,
    momentum: true,
    lerp_from_grad: false,
    step_with_raw_grad: false,
});
