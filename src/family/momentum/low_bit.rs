//! SGD with low-bit state: bitsandbytes' `SGD8bit` runs SGD's own step; torchao has no 4-bit
//! SGD.

use super::config::Sgd;
use crate::algo::FamilyLowBit;

impl FamilyLowBit for Sgd {}
