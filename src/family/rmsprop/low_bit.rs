//! RMSprop with low-bit state: bitsandbytes' `RMSprop8bit`, as its kernels run it; torchao
//! has no 4-bit RMSprop.

use super::config::RmsProp;
use crate::algo::{FamilyConfig, FamilyLowBit};
use crate::q8::Q8Switches;
use super::contract::RmsPropSwitches;
use crate::step::KernelStep;

impl FamilyLowBit for RmsProp {
    /// What bitsandbytes' `RMSprop8bit` does not run as [`RmsProp`] does, by name:
    /// `centered` and `alpha == 0` (its constructor refuses both), `momentum` (accepted by its
    /// constructor, ignored by its kernel), `maximize` (it has none), and clipping, whose 8-bit
    /// kernel steps the parameter with the raw, unclipped gradient while the state takes the
    /// clipped one (`kOptimizerStatic8bit1StateBlockwise`), which the crate's clipped gradient
    /// loads do not reproduce. Weight decay runs as that kernel runs it
    /// ([`Self::q8_kernel_step`]).
    fn q8_refusal(&self, clipped: bool) -> Option<&'static str> {
        if self.centered {
            Some("bitsandbytes' RMSprop8bit refuses centered RMSprop")
        } else if self.alpha == 0.0 {
            Some("bitsandbytes' RMSprop8bit refuses alpha == 0")
        } else if self.momentum != 0.0 {
            Some("bitsandbytes' RMSprop8bit ignores momentum (its kernel has no momentum buffer); set momentum 0")
        } else if self.maximize {
            Some("bitsandbytes' RMSprop8bit has no maximize")
        } else if clipped {
            Some(
                "bitsandbytes' RMSprop8bit steps the parameter with the raw gradient but its state with the \
                 clipped one; grad_clip is not reproduced with 8-bit RMSprop state",
            )
        } else {
            None
        }
    }

    /// bitsandbytes' 1-state 8-bit kernel: the parameter steps with the gradient as loaded,
    /// the state with the decayed one.
    fn q8_kernel_step(&self, t: u64) -> KernelStep {
        match FamilyConfig::kernel_step(self, t) {
            KernelStep::RmsProp(switches, uniform) => {
                KernelStep::RmsProp(RmsPropSwitches { step_with_raw_grad: true, ..switches }, uniform)
            }
            step => step,
        }
    }
}

/// bitsandbytes' 32-bit RMSprop kernel (`kOptimizer32bit1State`), which it runs below
/// `min_8bit_size`, steps with the decayed gradient, as PyTorch's does.
impl Q8Switches for RmsPropSwitches {
    fn f32_state(self) -> Self {
        RmsPropSwitches { step_with_raw_grad: false, ..self }
    }
}
