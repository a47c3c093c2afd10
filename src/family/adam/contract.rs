//! The Adam kernel's contract: `src/family/adam/adam.wgsl` and the CPU backend's Adam loop.

use crate::step::fields::{uniform, Override};
use crate::step::Slot::{self, *};
use crate::StateKind;

uniform! {
    /// The per-step values of the Adam family (`Hyper` in `src/family/adam/adam.wgsl`).
    AdamUniform, AdamUniform64 {
        beta1,
        one_minus_beta1,
        beta2,
        one_minus_beta2,
        /// The L2 coefficient (`g += weight_decay * p`, skipped when 0) or, with decoupled
        /// weight decay, the coefficient the capturable kernel turns into `decay`.
        weight_decay,
        /// Decoupled weight decay: `p *= decay` before the update (`1 - lr * weight_decay`).
        decay,
        /// The rate the update `m / denom` is multiplied by.
        step_size,
        /// `sqrt(1 - beta2^t)`, which `sqrt(v)` is divided by where eps follows the correction.
        sqrt_bias_correction2,
        eps,
        /// ONNX `norm_coefficient_post`: the new parameter is scaled by this.
        post_scale,
        /// `ln(beta1)` and `ln(beta2)`, for bias corrections computed on the device.
        ln_beta1,
        ln_beta2,
    }
}

/// Where epsilon enters the denominator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum EpsPlacement {
    /// `sqrt(v) / sqrt(1 - beta2^t) + eps` (PyTorch).
    AfterCorrection,
    /// `sqrt(v) + eps`, the correction carried by `step_size` (ONNX, DirectML).
    OnRoot,
}

/// How the first moment is formed: the override `FIRST_MOMENT` of `src/family/adam/adam.wgsl`, which
/// compares it with the constants [`FirstMoment::CHOICES`] declares, and the CPU loop's
/// const generic. The discriminant is the value both see.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum FirstMoment {
    /// `beta1 * m + (1 - beta1) * g`, as ONNX and DirectML write it.
    Linear = 0,
    /// ATen's `lerp(m, g, w)` for weights `w = 1 - beta1 < 0.5`: `m + w * (g - m)`.
    LerpFromMoment = 1,
    /// ATen's `lerp(m, g, w)` for weights `w >= 0.5`: `g - (g - m) * (1 - w)`.
    LerpFromGrad = 2,
}

impl FirstMoment {
    /// PyTorch's `exp_avg.lerp_(grad, 1 - beta1)`, in the form ATen picks for that weight.
    pub(crate) fn lerp(beta1: f64) -> Self {
        if 1.0 - beta1 < 0.5 {
            FirstMoment::LerpFromMoment
        } else {
            FirstMoment::LerpFromGrad
        }
    }

    /// The value of the `FIRST_MOMENT` override (and of the CPU loop's const generic).
    pub(crate) const fn code(self) -> u32 {
        self as u32
    }

    /// Every form's WGSL constant and its value.
    pub(crate) const CHOICES: &'static [(&'static str, u32)] = &[
        ("FIRST_MOMENT_LINEAR", FirstMoment::Linear.code()),
        ("FIRST_MOMENT_LERP_FROM_MOMENT", FirstMoment::LerpFromMoment.code()),
        ("FIRST_MOMENT_LERP_FROM_GRAD", FirstMoment::LerpFromGrad.code()),
    ];
}

/// The Adam family's compile-time switches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct AdamSwitches {
    /// Keep the running maximum of the second moment and divide by it (AMSGrad).
    pub(crate) amsgrad: bool,
    pub(crate) eps: EpsPlacement,
    /// Negate the gradient.
    pub(crate) maximize: bool,
    /// `p *= decay` before the update (AdamW); otherwise weight decay is L2, applied where
    /// the coefficient is not 0.
    pub(crate) decoupled_weight_decay: bool,
    pub(crate) first_moment: FirstMoment,
    /// With decoupled weight decay, `p *= decay` after the update instead of before it, as
    /// bitsandbytes' Adam kernels do (`crate::q8::kernel_step`). The CPU backend runs it with
    /// the linear first moment and without AMSGrad only, the form those kernels have.
    pub(crate) decay_after_update: bool,
    /// Without decoupled weight decay, `g += weight_decay * p` where the coefficient is 0 as
    /// well, as torchao's 4-bit Adam does (`crate::q4::kernel_step`): a NaN or infinite
    /// parameter then makes its gradient NaN.
    pub(crate) l2_at_zero: bool,
}

impl AdamSwitches {
    /// The shader's override constants.
    pub(crate) fn overrides(&self) -> Vec<Override> {
        vec![
            Override::Bool("AMSGRAD", self.amsgrad),
            Override::Bool("EPS_AFTER_CORRECTION", self.eps == EpsPlacement::AfterCorrection),
            Override::Bool("MAXIMIZE", self.maximize),
            Override::Bool("DECOUPLED_WEIGHT_DECAY", self.decoupled_weight_decay),
            Override::Choice("FIRST_MOMENT", self.first_moment.code(), FirstMoment::CHOICES),
            Override::Bool("DECAY_AFTER_UPDATE", self.decay_after_update),
            Override::Bool("L2_AT_ZERO", self.l2_at_zero),
        ]
    }
}

/// The registry's names for the family's switches, uniform and the uniform's f64 form
/// (`crate::step`).
pub(crate) type Switches = AdamSwitches;
pub(crate) type Uniform = AdamUniform;
pub(crate) type Uniform64 = AdamUniform64;

/// The slots the update reads, in the order its arguments are given. The Kahan compensation
/// is last: the body never names it, the generated `store_param` reads and writes it where
/// it is bound.
pub(crate) const INPUTS: &[Slot] = &[
    Param,
    Grad,
    State(StateKind::ExpAvg),
    State(StateKind::ExpAvgSq),
    State(StateKind::MaxExpAvgSq),
    State(StateKind::KahanCompensation),
];

/// The slots the update writes, in the order its arguments are given.
pub(crate) const OUTPUTS: &[Slot] = &[
    Param,
    State(StateKind::ExpAvg),
    State(StateKind::ExpAvgSq),
    State(StateKind::MaxExpAvgSq),
    ParamCopy,
    State(StateKind::KahanCompensation),
];

/// Every combination of the switches, which the kernel tests validate one by one.
#[cfg(test)]
pub(crate) fn every_switches() -> Vec<Switches> {
    let flags = [false, true];
    let mut all = Vec::new();
    for (amsgrad, maximize, decoupled_weight_decay) in
        flags.iter().flat_map(|a| flags.iter().flat_map(move |m| flags.map(move |d| (*a, *m, d))))
    {
        for eps in [EpsPlacement::AfterCorrection, EpsPlacement::OnRoot] {
            for first_moment in [FirstMoment::Linear, FirstMoment::LerpFromMoment, FirstMoment::LerpFromGrad]
            {
                all.push(AdamSwitches {
                    amsgrad,
                    eps,
                    maximize,
                    decoupled_weight_decay,
                    first_moment,
                    decay_after_update: decoupled_weight_decay && !amsgrad,
                    l2_at_zero: !decoupled_weight_decay && !amsgrad,
                });
            }
        }
    }
    all
}

/// The switches whose variant binds the most state, which the pipeline test compiles within
/// WebGPU's default limits.
#[cfg(test)]
pub(crate) const WIDEST_SWITCHES: Option<Switches> = Some(AdamSwitches {
    amsgrad: true,
    eps: EpsPlacement::AfterCorrection,
    maximize: false,
    decoupled_weight_decay: true,
    first_moment: FirstMoment::LerpFromGrad,
    decay_after_update: false,
    l2_at_zero: false,
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_moment_is_declared_in_wgsl_by_name_with_the_enum_values() {
        let switches = AdamSwitches {
            amsgrad: false,
            eps: EpsPlacement::AfterCorrection,
            maximize: false,
            decoupled_weight_decay: false,
            first_moment: FirstMoment::LerpFromGrad,
            decay_after_update: false,
            l2_at_zero: false,
        };
        let wgsl: String = switches.overrides().iter().map(|o| o.wgsl()).collect();
        for line in [
            "const FIRST_MOMENT_LINEAR: u32 = 0u;",
            "const FIRST_MOMENT_LERP_FROM_MOMENT: u32 = 1u;",
            "const FIRST_MOMENT_LERP_FROM_GRAD: u32 = 2u;",
            "override FIRST_MOMENT: u32;",
        ] {
            assert!(wgsl.lines().any(|l| l == line), "{line} in\n{wgsl}");
        }
        let constants: Vec<_> = switches.overrides().iter().map(|o| o.constant()).collect();
        assert!(constants.contains(&("FIRST_MOMENT", 2.0)), "{constants:?}");
    }
}
