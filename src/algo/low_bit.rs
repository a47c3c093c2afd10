//! What the 8-bit ([`crate::q8`]) and 4-bit ([`crate::q4`]) states read of a family: whether
//! they can keep its state, and its step as the reference implementations' low-bit kernels
//! run it. Each family implements [`FamilyLowBit`] in its folder
//! (`crate::family::<name>::low_bit`); the family registry (`crate::family::registry`) generates the dispatch.

use super::FamilyConfig;
use crate::step::KernelStep;

/// A family's rules for low-bit state, implemented in the family's folder. The defaults: 8-bit
/// state runs the family's own step, 4-bit state is refused.
pub(crate) trait FamilyLowBit: FamilyConfig {
    /// Why blockwise 8-bit state cannot run this configuration (no 8-bit form, or a setting
    /// bitsandbytes' kernels do not reproduce); `None`: it can. `clipped`: the optimizer
    /// clips gradients.
    fn q8_refusal(&self, clipped: bool) -> Option<&'static str> {
        let _ = clipped;
        None
    }

    /// The step at `t` (from 1) as bitsandbytes' 8-bit kernels run it.
    fn q8_kernel_step(&self, t: u64) -> KernelStep {
        self.kernel_step(t)
    }

    /// Why torchao's 4-bit state cannot run this configuration; `None`: it can.
    fn q4_refusal(&self) -> Option<&'static str> {
        Some("4-bit state is torchao's Adam4bit/AdamW4bit: only Adam and AdamW keep it")
    }

    /// The step at `t` (from 1) as torchao's 4-bit optimizers run it.
    fn q4_kernel_step(&self, t: u64) -> KernelStep {
        self.kernel_step(t)
    }
}
