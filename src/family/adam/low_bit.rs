//! Adam with low-bit state: bitsandbytes' `Adam8bit`/`AdamW8bit` and torchao's
//! `Adam4bit`/`AdamW4bit`, as their kernels run it.

use super::config::Adam;
use crate::algo::{FamilyConfig, FamilyLowBit};
use crate::q8::Q8Switches;
use super::contract::{AdamSwitches, AdamUniform64, EpsPlacement, FirstMoment};
use crate::step::KernelStep;

impl FamilyLowBit for Adam {
    fn q8_refusal(&self, _clipped: bool) -> Option<&'static str> {
        self.amsgrad.then_some(
            "AMSGrad's running maximum of the second moment has no 8-bit form (bitsandbytes has none); \
             keep f32 state for AMSGrad",
        )
    }

    /// bitsandbytes' 2-state kernels: the first moment as `beta1 m + (1 - beta1) g` (not
    /// PyTorch's lerp), the update
    /// `p - lr sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + sqrt(1 - beta2^t) eps)`, and
    /// decoupled decay after the update (`p += step; p *= 1 - lr wd`).
    fn q8_kernel_step(&self, t: u64) -> KernelStep {
        match FamilyConfig::kernel_step(self, t) {
            KernelStep::Adam(switches, uniform) if switches.eps == EpsPlacement::AfterCorrection => {
                let switches = AdamSwitches {
                    first_moment: FirstMoment::Linear,
                    eps: EpsPlacement::OnRoot,
                    decay_after_update: switches.decoupled_weight_decay,
                    ..switches
                };
                // step_size = -lr * correction2 / correction1; eps next to sqrt(v), times
                // correction2 (the kernel's `sqrtf(s2) + correction2 * eps`).
                let correction2 = uniform.sqrt_bias_correction2;
                let uniform = AdamUniform64 {
                    step_size: uniform.step_size * correction2,
                    eps: uniform.eps * correction2,
                    ..uniform
                };
                KernelStep::Adam(switches, uniform)
            }
            step => step,
        }
    }

    fn q4_refusal(&self) -> Option<&'static str> {
        if self.amsgrad {
            Some("AMSGrad's 4-bit max_exp_avg_sq (torchao's) is not implemented; keep f32 or 8-bit state for AMSGrad")
        } else if self.maximize {
            Some("torchao's Adam4bit and AdamW4bit have no maximize")
        } else {
            None
        }
    }

    /// torchao's `single_param_adam`: Adam's L2 term `g + weight_decay p` is there at a
    /// coefficient of 0 too (PyTorch's Adam skips it), so that a NaN or infinite parameter's
    /// states go NaN and are stored as the code of 0, out of their block's scale, as torchao
    /// stores them.
    fn q4_kernel_step(&self, t: u64) -> KernelStep {
        match FamilyConfig::kernel_step(self, t) {
            KernelStep::Adam(switches, uniform) if !switches.decoupled_weight_decay => {
                KernelStep::Adam(AdamSwitches { l2_at_zero: true, ..switches }, uniform)
            }
            step => step,
        }
    }
}

/// bitsandbytes' 2-state kernel tests every gradient before its update.
impl Q8Switches for super::contract::Switches {
    const RESTARTS_NON_FINITE: bool = true;
}
