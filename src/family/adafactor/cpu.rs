//! Adafactor's CPU update for a step: nothing elementwise. Its own passes (`cpu_passes`)
//! reduce rows, columns and whole tensors and update the parameters.

use crate::cpu::kernels::{Bound, Loops};
use super::contract::{AdafactorSwitches, AdafactorUniform64};

/// What the family's CPU loops read of a step: the kernel's uniform, in f32.
pub(crate) type Hyper = super::contract::Uniform;

/// The family's CPU update for a step: loops that do nothing, for every storage type.
pub(crate) fn loops(_: &AdafactorSwitches, uniform: &AdafactorUniform64) -> Bound<Hyper> {
    Loops { f32: |_, _, _| {}, bf16: |_, _, _| {}, f16: |_, _, _| {}, q8: |_, _, _| {} }
        .with_uniform(uniform.to_f32())
}
