//! The Adafactor passes' per-step values: `src/family/adafactor/adafactor.wgsl` and the CPU backend's
//! Adafactor loops. Adafactor is not an elementwise family (its passes reduce rows, columns
//! and whole tensors), but its per-step values travel in the group's uniform slot as every
//! family's do.

use crate::step::fields::{uniform, Override};
use crate::step::Slot::{self, *};

uniform! {
    /// The per-step values of Adafactor (`Hyper` in `src/family/adafactor/adafactor.wgsl`).
    AdafactorUniform, AdafactorUniform64 {
        /// `t^beta2_decay`: the new value's weight in the running means (`lerp`'s weight).
        weight,
        /// The relative step size `min(lr, 1/sqrt(t))`.
        rho,
        /// `eps[0]` as given (unused when `eps1_from_dtype` is 1).
        eps1,
        /// `eps[1]`: the floor of the parameter's RMS.
        eps2,
        /// The clipping threshold of the update's RMS.
        d,
        /// Decoupled weight decay: `p *= decay` (`1 - lr weight_decay`).
        decay,
        /// -1 with `maximize`, else 1: the gradient's sign.
        sign,
        /// 1 where `eps[0]` is `None`: the group's first parameter's machine epsilon.
        eps1_from_dtype,
    }
}

/// Adafactor's compile-time switches: none (maximize is the uniform's `sign`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct AdafactorSwitches;

impl AdafactorSwitches {
    /// The shader's override constants: none.
    pub(crate) fn overrides(&self) -> Vec<Override> {
        Vec::new()
    }
}

/// The registry's names for the family's switches, uniform and the uniform's f64 form
/// (`crate::step`).
pub(crate) type Switches = AdafactorSwitches;
pub(crate) type Uniform = AdafactorUniform;
pub(crate) type Uniform64 = AdafactorUniform64;

/// The slots the update reads, in the order its arguments are given. The Kahan compensation
/// is last: the body never names it, the generated `store_param` reads and writes it where
/// it is bound.
// Its own passes bind their tensors (`family::adafactor::gpu_passes`); never an elementwise kernel.
pub(crate) const INPUTS: &[Slot] = &[Param, Grad];

/// The slots the update writes, in the order its arguments are given.
pub(crate) const OUTPUTS: &[Slot] = &[Param];

/// Every combination of the switches, which the kernel tests validate one by one.
#[cfg(test)]
pub(crate) fn every_switches() -> Vec<Switches> {
    // Not elementwise: its own passes (`family::adafactor::gpu_passes`) run it, and their tests cover them.
    Vec::new()
}

/// The switches whose variant binds the most state, which the pipeline test compiles within
/// WebGPU's default limits.
/// None: not elementwise, it runs passes of its own (`family::adafactor::gpu_passes`).
#[cfg(test)]
pub(crate) const WIDEST_SWITCHES: Option<Switches> = None;
