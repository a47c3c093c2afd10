//! The Adagrad kernel's contract: `src/family/adagrad/adagrad.wgsl` and the CPU backend's Adagrad loop.

use crate::step::fields::{uniform, Override};

uniform! {
    /// The per-step values of the Adagrad family (`Hyper` in `src/family/adagrad/adagrad.wgsl`).
    AdagradUniform, AdagradUniform64 {
        /// The step's rate, with the learning-rate decay folded in.
        lr,
        /// L2 coefficient, skipped when 0.
        weight_decay,
        eps,
        /// PyTorch's `lr_decay`, for the rate computed on the device (capturable mode).
        lr_decay,
    }
}

/// The Adagrad family's compile-time switches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct AdagradSwitches {
    /// Negate the gradient.
    pub(crate) maximize: bool,
}

impl AdagradSwitches {
    /// The shader's override constants.
    pub(crate) fn overrides(&self) -> Vec<Override> {
        vec![Override::Bool("MAXIMIZE", self.maximize)]
    }
}
