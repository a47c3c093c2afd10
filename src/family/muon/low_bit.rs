//! Muon with low-bit state: neither bitsandbytes nor torchao has such a form.

use super::config::Muon;
use crate::algo::FamilyLowBit;
use crate::q8::Q8Switches;

impl FamilyLowBit for Muon {
    fn q8_refusal(&self, _clipped: bool) -> Option<&'static str> {
        Some(
            "Muon has no 8-bit form (bitsandbytes has none; its momentum is orthogonalized as a \
             whole matrix); keep f32, f16 or bf16 state for it",
        )
    }
}

impl Q8Switches for super::contract::Switches {}
