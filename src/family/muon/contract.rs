//! The Muon family's contract: `src/family/muon/muon.wgsl` and the CPU backend's Muon loop. Two
//! elementwise passes of one Muon step (the Newton-Schulz products between them are the
//! matrix kernels of `gpu::matmul`):
//!
//! - the momentum pass (`MOMENTUM_PASS`): the buffer's EMA, and the matrix to orthogonalize
//!   written in the parameter slot, which is then bound to an f32 scratch tensor;
//! - the apply pass: `p = p decay - lr O`, with `O` (already scaled by the shape's
//!   learning-rate ratio) in the gradient slot.

use crate::step::fields::{uniform, Override};
use crate::step::Slot::{self, *};
use crate::StateKind;

uniform! {
    /// The per-step values of the Muon family (`Hyper` in `src/family/muon/muon.wgsl`).
    MuonUniform, MuonUniform64 {
        lr,
        /// Decoupled weight decay: `p *= decay` before the update (`1 - lr * weight_decay`).
        decay,
        /// The EMA's weight of the new gradient, `1 - momentum` (torch's `lerp` weight).
        one_minus_momentum,
        /// `momentum`, the Nesterov blend's weight of the buffer.
        momentum,
    }
}

/// The Muon family's compile-time switches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct MuonSwitches {
    /// The momentum pass (else the apply pass).
    pub(crate) momentum_pass: bool,
    /// Orthogonalize `lerp(g, buffer, momentum)` rather than the buffer.
    pub(crate) nesterov: bool,
}

impl MuonSwitches {
    /// The shader's override constants.
    pub(crate) fn overrides(&self) -> Vec<Override> {
        vec![Override::Bool("MOMENTUM_PASS", self.momentum_pass), Override::Bool("NESTEROV", self.nesterov)]
    }
}

/// The registry's names for the family's switches, uniform and the uniform's f64 form
/// (`crate::step`).
pub(crate) type Switches = MuonSwitches;
pub(crate) type Uniform = MuonUniform;
pub(crate) type Uniform64 = MuonUniform64;

/// The slots the update reads, in the order its arguments are given. The Kahan compensation
/// is last: the body never names it, the generated `store_param` reads and writes it where
/// it is bound.
pub(crate) const INPUTS: &[Slot] =
    &[Param, Grad, State(StateKind::MomentumBuffer), State(StateKind::KahanCompensation)];

/// The slots the update writes, in the order its arguments are given.
pub(crate) const OUTPUTS: &[Slot] =
    &[Param, State(StateKind::MomentumBuffer), ParamCopy, State(StateKind::KahanCompensation)];

/// Every combination of the switches, which the kernel tests validate one by one.
#[cfg(test)]
pub(crate) fn every_switches() -> Vec<Switches> {
    let flags = [false, true];
    flags.iter().flat_map(|m| flags.map(move |n| MuonSwitches { momentum_pass: *m, nesterov: n })).collect()
}

/// The switches whose variant binds the most state, which the pipeline test compiles within
/// WebGPU's default limits.
#[cfg(test)]
pub(crate) const WIDEST_SWITCHES: Option<Switches> =
    Some(MuonSwitches { momentum_pass: true, nesterov: true });
