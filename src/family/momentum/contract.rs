//! The momentum kernel's contract: `src/family/momentum/momentum.wgsl` and the CPU backend's SGD loop.

use crate::step::fields::{uniform, Override};
use crate::step::Slot::{self, *};
use crate::StateKind;

uniform! {
    /// The per-step values of the momentum family (`Hyper` in `src/family/momentum/momentum.wgsl`).
    MomentumUniform, MomentumUniform64 {
        /// The previous velocity's coefficient (ONNX `alpha`, PyTorch `momentum`).
        velocity_decay,
        /// The gradient's coefficient (ONNX `beta`, PyTorch `1 - dampening`).
        grad_scale,
        /// L2 coefficient, skipped when 0.
        weight_decay,
        lr,
        /// The velocity's coefficient in the Nesterov direction.
        nesterov_scale,
    }
    flags {
        /// 1 on the step where PyTorch creates the buffer as a copy of the gradient, else 0.
        restart,
        /// 0; keeps the f64 uniform free of padding.
        reserved,
    }
}

/// The momentum family's compile-time switches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct MomentumSwitches {
    /// Negate the gradient.
    pub(crate) maximize: bool,
    /// Step along `g + nesterov_scale * v` instead of `v`.
    pub(crate) nesterov: bool,
    /// Keep a velocity buffer (PyTorch keeps none at momentum 0: plain SGD).
    pub(crate) velocity: bool,
}

impl MomentumSwitches {
    /// The shader's override constants.
    pub(crate) fn overrides(&self) -> Vec<Override> {
        vec![
            Override::Bool("MAXIMIZE", self.maximize),
            Override::Bool("NESTEROV", self.nesterov),
            Override::Bool("VELOCITY", self.velocity),
        ]
    }
}

/// The registry's names for the family's switches, uniform and the uniform's f64 form
/// (`crate::step`).
pub(crate) type Switches = MomentumSwitches;
pub(crate) type Uniform = MomentumUniform;
pub(crate) type Uniform64 = MomentumUniform64;

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
    let triples = flags.iter().flat_map(|a| flags.iter().flat_map(move |m| flags.map(move |d| (*a, *m, d))));
    triples.map(|(nesterov, maximize, velocity)| MomentumSwitches { maximize, nesterov, velocity }).collect()
}

/// The switches whose variant binds the most state, which the pipeline test compiles within
/// WebGPU's default limits.
#[cfg(test)]
pub(crate) const WIDEST_SWITCHES: Option<Switches> =
    Some(MomentumSwitches { maximize: false, nesterov: true, velocity: true });

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_is_a_u32_flag_on_both_sides() {
        let wide = MomentumUniform64 { lr: 0.5, restart: 1, ..MomentumUniform64::default() };
        let narrow = wide.to_f32();
        assert_eq!((narrow.lr, narrow.restart, narrow.reserved), (0.5, 1, 0));
        let wgsl = MomentumUniform::wgsl("Hyper");
        assert!(wgsl.contains("    restart: u32,\n") && wgsl.contains("    lr: S,\n"), "{wgsl}");
        // The flags follow the five scalars: at 20 in f32, at 40 in f64, no padding in either.
        assert_eq!(std::mem::offset_of!(MomentumUniform, restart), 20);
        assert_eq!(std::mem::offset_of!(MomentumUniform64, restart), 40);
        assert_eq!(std::mem::size_of::<MomentumUniform64>(), 48);
    }
}
