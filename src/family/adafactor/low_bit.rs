//! Adafactor with low-bit state: refused, its factored state being already sublinear.

use super::config::Adafactor;
use crate::algo::FamilyLowBit;
use crate::q8::Q8Switches;

impl FamilyLowBit for Adafactor {
    fn q8_refusal(&self, _clipped: bool) -> Option<&'static str> {
        Some(
            "Adafactor has no 8-bit form here: its factored state is already sublinear in the \
             parameter count (bitsandbytes has no Adafactor8bit)",
        )
    }
}

impl Q8Switches for super::contract::Switches {}
