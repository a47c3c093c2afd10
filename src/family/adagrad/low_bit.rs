//! Adagrad with low-bit state: neither bitsandbytes' nor torchao's form is implemented.

use super::config::Adagrad;
use crate::algo::FamilyLowBit;
use crate::q8::Q8Switches;

impl FamilyLowBit for Adagrad {
    fn q8_refusal(&self, _clipped: bool) -> Option<&'static str> {
        Some("Adagrad has no 8-bit form here (bitsandbytes' Adagrad8bit is not implemented)")
    }
}

impl Q8Switches for super::contract::Switches {}
