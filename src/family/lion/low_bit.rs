//! Lion with low-bit state: bitsandbytes' `Lion8bit` runs Lion's own step; torchao has no
//! 4-bit Lion.

use super::config::Lion;
use crate::algo::FamilyLowBit;

impl FamilyLowBit for Lion {}
