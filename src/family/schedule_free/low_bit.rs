//! Schedule-Free AdamW with low-bit state: neither bitsandbytes nor torchao has such a form.

use super::config::ScheduleFreeAdamW;
use crate::algo::FamilyLowBit;
use crate::q8::Q8Switches;

impl FamilyLowBit for ScheduleFreeAdamW {
    fn q8_refusal(&self, _clipped: bool) -> Option<&'static str> {
        Some(
            "Schedule-Free AdamW has no 8-bit form (bitsandbytes has no schedule-free optimizer); \
             keep f32, f16 or bf16 state for it",
        )
    }
}

impl Q8Switches for super::contract::Switches {}
