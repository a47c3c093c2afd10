//! ADOPT with low-bit state: 8-bit state runs ADOPT's own step on the dequantized blocks
//! (bitsandbytes has no ADOPT8bit to follow); torchao has no 4-bit ADOPT.

use super::config::Adopt;
use crate::algo::FamilyLowBit;
use crate::q8::Q8Switches;

impl FamilyLowBit for Adopt {}

impl Q8Switches for super::contract::Switches {}
