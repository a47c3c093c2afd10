//! The Lion kernel's contract: `src/family/lion/lion.wgsl` and the CPU backend's Lion loop.

use crate::step::fields::{uniform, Override};

uniform! {
    /// The per-step values of the Lion family (`Hyper` in `src/family/lion/lion.wgsl`).
    LionUniform, LionUniform64 {
        /// The running average's weight in the update's direction.
        beta1,
        one_minus_beta1,
        /// The running average's own coefficient.
        beta2,
        one_minus_beta2,
        lr,
        /// The coefficient the capturable kernel turns into `decay`.
        weight_decay,
        /// Decoupled weight decay: `p *= decay` before the update (`1 - lr * weight_decay`;
        /// exactly 1 without decay, which changes no bit).
        decay,
    }
}

/// The Lion family's compile-time switches: none (lion-pytorch has no `maximize` and one
/// weight-decay mode), so one compiled variant per storage layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct LionSwitches;

impl LionSwitches {
    /// The shader's override constants: none.
    pub(crate) fn overrides(&self) -> Vec<Override> {
        Vec::new()
    }
}
