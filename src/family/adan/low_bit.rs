//! Adan with low-bit state: 8-bit state runs Adan's own step on the dequantized blocks
//! (bitsandbytes has no Adan8bit to follow); torchao has no 4-bit Adan.

use super::config::Adan;
use crate::algo::FamilyLowBit;
use crate::q8::Q8Switches;

impl FamilyLowBit for Adan {}

impl Q8Switches for super::contract::Switches {}
