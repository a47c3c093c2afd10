//! LAMB with low-bit state: neither bitsandbytes' nor torchao's form is implemented.

use super::config::Lamb;
use crate::algo::FamilyLowBit;
use crate::q8::Q8Switches;

impl FamilyLowBit for Lamb {
    fn q8_refusal(&self, _clipped: bool) -> Option<&'static str> {
        Some(
            "LAMB has no 8-bit form (bitsandbytes' LAMB8bit is not implemented); keep f32, f16 or bf16 \
             state for it",
        )
    }
}

impl Q8Switches for super::contract::Switches {}
