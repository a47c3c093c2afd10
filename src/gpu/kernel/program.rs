//! What a compiled kernel computes: an update, AMP's unscale or a gradient norm pass, with
//! its WGSL body and the slots and override constants it declares.

use crate::step::clip::NormType;
use crate::step::Switches;
use crate::step::{Override, Slot};

/// What a compiled kernel computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Program {
    /// An optimizer family's update with its compile-time switches.
    Update(Switches),
    /// AMP: gradients multiplied by the device's `inv_scale`, non-finite ones flagged.
    Unscale,
    /// Gradient clipping's first pass: each workgroup's partial norm of the gradients it
    /// reads, written to its own slot (`shaders/grad_norm.wgsl`).
    GradNorm(NormType),
    /// AMP's unscale and clipping's first pass in one read of the gradients: each gradient
    /// unscaled (non-finite ones flagged) and its partial norm taken after unscaling.
    UnscaleNorm(NormType),
}

impl Program {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Program::Update(s) => s.family().name(),
            Program::Unscale => "unscale",
            Program::GradNorm(_) => "grad norm",
            Program::UnscaleNorm(_) => "unscale and grad norm",
        }
    }

    /// The WGSL body, embedded at build time.
    pub(super) fn source(self) -> &'static str {
        match self {
            // Adafactor's is "": not elementwise, its own passes (`family::adafactor::gpu_passes`) run it.
            Program::Update(s) => s.family().update_wgsl(),
            Program::Unscale | Program::UnscaleNorm(_) => include_str!("../../../shaders/unscale.wgsl"),
            Program::GradNorm(_) => "",
        }
    }

    /// The body's `at_step`, which derives the step-dependent uniform fields from the
    /// device's step counter and learning rate (capturable mode).
    pub(super) fn capturable_source(self) -> &'static str {
        match self {
            // "" for the families capturable mode refuses (each folder says why).
            Program::Update(s) => s.family().capturable_wgsl(),
            Program::Unscale | Program::GradNorm(_) | Program::UnscaleNorm(_) => "",
        }
    }

    /// Whether the kernel writes partial gradient norms (and runs the norm entry point).
    pub(crate) fn takes_norm(self) -> bool {
        matches!(self, Program::GradNorm(_) | Program::UnscaleNorm(_))
    }

    /// Slots the kernel reads, in the order the engine receives them.
    pub(crate) fn inputs(self) -> &'static [Slot] {
        match self {
            Program::Update(s) => s.family().inputs(),
            Program::Unscale | Program::GradNorm(_) | Program::UnscaleNorm(_) => &[Slot::Grad],
        }
    }

    /// Slots the kernel writes, in the order the engine receives them.
    pub(crate) fn outputs(self) -> &'static [Slot] {
        match self {
            Program::Update(s) => s.family().outputs(),
            Program::Unscale | Program::UnscaleNorm(_) => &[Slot::Grad],
            Program::GradNorm(_) => &[],
        }
    }

    /// The override constants, declared in the prelude and set at pipeline creation.
    pub(crate) fn overrides(self) -> Vec<Override> {
        match self {
            Program::Update(s) => s.overrides(),
            Program::Unscale => Vec::new(),
            Program::GradNorm(norm) | Program::UnscaleNorm(norm) => {
                vec![Override::Bool("NORM_INF", norm == NormType::Inf)]
            }
        }
    }
}
