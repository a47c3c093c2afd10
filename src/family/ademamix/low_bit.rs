//! AdEMAMix with low-bit state: bitsandbytes' `AdEMAMix8bit`, as its kernels run it; torchao
//! has no 4-bit AdEMAMix.

use super::config::AdEMAMix;
use crate::algo::{FamilyConfig, FamilyLowBit};
use crate::q8::Q8Switches;
use super::contract::AdemamixSwitches;
use crate::step::KernelStep;

impl FamilyLowBit for AdEMAMix {
    /// bitsandbytes' 2-state 8-bit kernel: decoupled decay after the update.
    fn q8_kernel_step(&self, t: u64) -> KernelStep {
        match FamilyConfig::kernel_step(self, t) {
            KernelStep::Ademamix(_, uniform) => {
                KernelStep::Ademamix(AdemamixSwitches { decay_after_update: true }, uniform)
            }
            step => step,
        }
    }
}

/// bitsandbytes' 2-state kernel tests every gradient before its update.
impl Q8Switches for super::contract::Switches {
    const RESTARTS_NON_FINITE: bool = true;
}
