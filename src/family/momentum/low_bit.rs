//! SGD with low-bit state: bitsandbytes' `SGD8bit` runs SGD's own step; torchao has no 4-bit
//! SGD.

use super::config::Sgd;
use crate::algo::FamilyLowBit;
use crate::q8::Q8Switches;

impl FamilyLowBit for Sgd {}

impl Q8Switches for super::contract::Switches {}
