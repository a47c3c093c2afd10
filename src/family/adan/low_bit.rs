//! Adan with low-bit state: neither bitsandbytes nor torchao has an Adan, and the shared 8-bit
//! machinery keeps at most three states where Adan keeps four.

use super::config::Adan;
use crate::algo::FamilyLowBit;
use crate::q8::Q8Switches;

impl FamilyLowBit for Adan {
    fn q8_refusal(&self, _clipped: bool) -> Option<&'static str> {
        Some(
            "Adan has no 8-bit form (bitsandbytes has no Adan, and its four states exceed the 8-bit \
             path's three); keep f32, f16 or bf16 state for it",
        )
    }
}

impl Q8Switches for super::contract::Switches {}
