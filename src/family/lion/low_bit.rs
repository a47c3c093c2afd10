//! Lion with low-bit state: bitsandbytes' `Lion8bit` runs Lion's own step; torchao has no
//! 4-bit Lion.

use super::config::Lion;
use crate::algo::FamilyLowBit;
use crate::q8::Q8Switches;

impl FamilyLowBit for Lion {}

impl Q8Switches for super::contract::Switches {}
