//! The typed contract between an algorithm's configuration and the kernels that run it,
//! shared by the GPU and the CPU backend (this module knows neither wgpu nor rayon).
//!
//! A step of a family is its switches (compile-time: WGSL override constants on the GPU,
//! const generics on the CPU) and its uniform (per-step values: one `#[repr(C)]` Pod struct
//! whose bytes the GPU uploads and whose fields the CPU loops read). The WGSL declarations
//! of both are generated from the Rust definitions, so a field cannot move on one side only.
//!
//! Each family's own contract lives in its folder (`crate::family::<name>::contract`); this
//! module gathers them. Path of a hyperparameter: `Adam::kernel_step` fills
//! [`AdamUniform64`] in f64 → [`KernelStep::write_uniform`] (GPU) or
//! [`AdamUniform64::to_f32`] (CPU) → `hp.<field>` in `src/family/adam/adam.wgsl` and
//! `src/family/adam/cpu.rs`.

use crate::family::adafactor::contract as adafactor;
use crate::family::adagrad::contract as adagrad;
use crate::family::adam::contract as adam;
use crate::family::ademamix::contract as ademamix;
pub(crate) mod clip;
pub(crate) mod device;
pub(crate) mod fields;
use crate::family::lamb::contract as lamb;
use crate::family::lion::contract as lion;
use crate::family::momentum::contract as momentum;
use crate::family::muon::contract as muon;
use crate::family::rmsprop::contract as rmsprop;
pub(crate) mod rounding;
use crate::family::schedule_free::contract as schedule_free;

pub(crate) use adafactor::{AdafactorSwitches, AdafactorUniform, AdafactorUniform64};
pub(crate) use adagrad::{AdagradSwitches, AdagradUniform, AdagradUniform64};
pub(crate) use adam::{AdamSwitches, AdamUniform, AdamUniform64, EpsPlacement, FirstMoment};
pub(crate) use ademamix::{AdemamixSwitches, AdemamixUniform, AdemamixUniform64};
pub(crate) use fields::Override;
pub(crate) use lamb::{LambSwitches, LambUniform, LambUniform64};
pub(crate) use lion::{LionSwitches, LionUniform, LionUniform64};
pub(crate) use momentum::{MomentumSwitches, MomentumUniform, MomentumUniform64};
pub(crate) use muon::{MuonSwitches, MuonUniform, MuonUniform64};
pub(crate) use rmsprop::{RmsPropSwitches, RmsPropUniform, RmsPropUniform64};
pub(crate) use schedule_free::{ScheduleFreeSwitches, ScheduleFreeUniform, ScheduleFreeUniform64};

use crate::{DType, StateKind};

/// The algorithm families that have a fused update.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Family {
    /// Adam, AdamW and AMSGrad in the PyTorch, ONNX and DirectML conventions.
    Adam,
    /// SGD with standard or Nesterov momentum, or none (PyTorch SGD, ONNX Momentum).
    Momentum,
    /// Adagrad (ONNX and PyTorch).
    Adagrad,
    /// Lion (lion-pytorch).
    Lion,
    /// Schedule-Free AdamW (the `schedulefree` package).
    ScheduleFree,
    /// Adafactor (PyTorch): not elementwise, it runs passes of its own.
    Adafactor,
    /// Muon's elementwise end (`torch.optim.Muon`): decay and the orthogonalized update.
    Muon,
    /// RMSprop (PyTorch), plain or centered, with or without momentum.
    RmsProp,
    /// AdEMAMix (bitsandbytes).
    Ademamix,
    /// LAMB (torch-optimizer): two passes around each tensor's norms.
    Lamb,
}

impl Family {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Family::Adam => "adam",
            Family::Momentum => "momentum",
            Family::Adagrad => "adagrad",
            Family::Lion => "lion",
            Family::ScheduleFree => "schedule_free",
            Family::Adafactor => "adafactor",
            Family::Muon => "muon",
            Family::RmsProp => "rmsprop",
            Family::Ademamix => "ademamix",
            Family::Lamb => "lamb",
        }
    }

    /// The slots the update reads, in the order its arguments are given. The Kahan
    /// compensation is last: the body never names it, the generated `store_param` reads and
    /// writes it where it is bound.
    pub(crate) fn inputs(self) -> &'static [Slot] {
        use Slot::*;
        match self {
            Family::Adam => &[
                Param,
                Grad,
                State(StateKind::ExpAvg),
                State(StateKind::ExpAvgSq),
                State(StateKind::MaxExpAvgSq),
                State(StateKind::KahanCompensation),
            ],
            Family::Momentum => {
                &[Param, Grad, State(StateKind::MomentumBuffer), State(StateKind::KahanCompensation)]
            }
            Family::Adagrad => &[Param, Grad, State(StateKind::Sum), State(StateKind::KahanCompensation)],
            Family::Lion => &[Param, Grad, State(StateKind::ExpAvg), State(StateKind::KahanCompensation)],
            Family::ScheduleFree => &[
                Param,
                Grad,
                State(StateKind::Z),
                State(StateKind::ExpAvgSq),
                State(StateKind::KahanCompensation),
            ],
            // Its own passes bind their tensors (`gpu::adafactor`); never an elementwise kernel.
            Family::Adafactor => &[Param, Grad],
            Family::Muon => {
                &[Param, Grad, State(StateKind::MomentumBuffer), State(StateKind::KahanCompensation)]
            }
            Family::RmsProp => &[
                Param,
                Grad,
                State(StateKind::SquareAvg),
                State(StateKind::MomentumBuffer),
                State(StateKind::GradAvg),
                State(StateKind::KahanCompensation),
            ],
            Family::Ademamix => &[
                Param,
                Grad,
                State(StateKind::ExpAvg),
                State(StateKind::ExpAvgSlow),
                State(StateKind::ExpAvgSq),
                State(StateKind::KahanCompensation),
            ],
            Family::Lamb => &[
                Param,
                Grad,
                State(StateKind::ExpAvg),
                State(StateKind::ExpAvgSq),
                State(StateKind::KahanCompensation),
            ],
        }
    }

    /// The slots the update writes, in the order its arguments are given.
    pub(crate) fn outputs(self) -> &'static [Slot] {
        use Slot::*;
        match self {
            Family::Adam => &[
                Param,
                State(StateKind::ExpAvg),
                State(StateKind::ExpAvgSq),
                State(StateKind::MaxExpAvgSq),
                ParamCopy,
                State(StateKind::KahanCompensation),
            ],
            Family::Momentum => {
                &[Param, State(StateKind::MomentumBuffer), ParamCopy, State(StateKind::KahanCompensation)]
            }
            Family::Adagrad => {
                &[Param, State(StateKind::Sum), ParamCopy, State(StateKind::KahanCompensation)]
            }
            Family::Lion => {
                &[Param, State(StateKind::ExpAvg), ParamCopy, State(StateKind::KahanCompensation)]
            }
            Family::ScheduleFree => &[
                Param,
                State(StateKind::Z),
                State(StateKind::ExpAvgSq),
                ParamCopy,
                State(StateKind::KahanCompensation),
            ],
            Family::Adafactor => &[Param],
            Family::Muon => {
                &[Param, State(StateKind::MomentumBuffer), ParamCopy, State(StateKind::KahanCompensation)]
            }
            Family::RmsProp => &[
                Param,
                State(StateKind::SquareAvg),
                State(StateKind::MomentumBuffer),
                State(StateKind::GradAvg),
                ParamCopy,
                State(StateKind::KahanCompensation),
            ],
            Family::Ademamix => &[
                Param,
                State(StateKind::ExpAvg),
                State(StateKind::ExpAvgSlow),
                State(StateKind::ExpAvgSq),
                ParamCopy,
                State(StateKind::KahanCompensation),
            ],
            Family::Lamb => &[
                Param,
                State(StateKind::ExpAvg),
                State(StateKind::ExpAvgSq),
                ParamCopy,
                State(StateKind::KahanCompensation),
            ],
        }
    }
}

/// A tensor role in a kernel: what `load_<slot>`/`store_<slot>` read and write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Slot {
    /// The parameters (in master-weight mode, the f32 masters).
    Param,
    /// The gradients.
    Grad,
    /// A per-parameter state tensor.
    State(StateKind),
    /// Master-weight mode: the model's low-precision copy of the new parameters.
    ParamCopy,
}

impl Slot {
    /// The name in the generated WGSL (`load_exp_avg`): PyTorch's state names.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Slot::Param => "param",
            Slot::Grad => "grad",
            Slot::State(kind) => kind.torch_name(),
            Slot::ParamCopy => "param_copy",
        }
    }
}

/// The compile-time switches of one family: what selects a compiled variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Switches {
    Adam(AdamSwitches),
    Momentum(MomentumSwitches),
    Adagrad(AdagradSwitches),
    Lion(LionSwitches),
    ScheduleFree(ScheduleFreeSwitches),
    Adafactor(AdafactorSwitches),
    Muon(MuonSwitches),
    RmsProp(RmsPropSwitches),
    Ademamix(AdemamixSwitches),
    Lamb(LambSwitches),
}

impl Switches {
    pub(crate) fn family(&self) -> Family {
        match self {
            Switches::Adam(_) => Family::Adam,
            Switches::Momentum(_) => Family::Momentum,
            Switches::Adagrad(_) => Family::Adagrad,
            Switches::Lion(_) => Family::Lion,
            Switches::ScheduleFree(_) => Family::ScheduleFree,
            Switches::Adafactor(_) => Family::Adafactor,
            Switches::Muon(_) => Family::Muon,
            Switches::RmsProp(_) => Family::RmsProp,
            Switches::Ademamix(_) => Family::Ademamix,
            Switches::Lamb(_) => Family::Lamb,
        }
    }

    /// The shader's override constants, each declared and set from this one list.
    pub(crate) fn overrides(&self) -> Vec<Override> {
        match self {
            Switches::Adam(s) => s.overrides(),
            Switches::Momentum(s) => s.overrides(),
            Switches::Adagrad(s) => s.overrides(),
            Switches::Lion(s) => s.overrides(),
            Switches::ScheduleFree(s) => s.overrides(),
            Switches::Adafactor(s) => s.overrides(),
            Switches::Muon(s) => s.overrides(),
            Switches::RmsProp(s) => s.overrides(),
            Switches::Ademamix(s) => s.overrides(),
            Switches::Lamb(s) => s.overrides(),
        }
    }

    /// Bytes of the family's uniform in a kernel whose math runs in `math`.
    pub(crate) fn uniform_bytes(&self, math: DType) -> u64 {
        use std::mem::size_of;
        let wide = math == DType::F64;
        (match (self, wide) {
            (Switches::Adam(_), false) => size_of::<AdamUniform>(),
            (Switches::Adam(_), true) => size_of::<AdamUniform64>(),
            (Switches::Momentum(_), false) => size_of::<MomentumUniform>(),
            (Switches::Momentum(_), true) => size_of::<MomentumUniform64>(),
            (Switches::Adagrad(_), false) => size_of::<AdagradUniform>(),
            (Switches::Adagrad(_), true) => size_of::<AdagradUniform64>(),
            (Switches::Lion(_), false) => size_of::<LionUniform>(),
            (Switches::Lion(_), true) => size_of::<LionUniform64>(),
            (Switches::ScheduleFree(_), false) => size_of::<ScheduleFreeUniform>(),
            (Switches::ScheduleFree(_), true) => size_of::<ScheduleFreeUniform64>(),
            (Switches::Adafactor(_), false) => size_of::<AdafactorUniform>(),
            (Switches::Adafactor(_), true) => size_of::<AdafactorUniform64>(),
            (Switches::Muon(_), false) => size_of::<MuonUniform>(),
            (Switches::Muon(_), true) => size_of::<MuonUniform64>(),
            (Switches::RmsProp(_), false) => size_of::<RmsPropUniform>(),
            (Switches::RmsProp(_), true) => size_of::<RmsPropUniform64>(),
            (Switches::Ademamix(_), false) => size_of::<AdemamixUniform>(),
            (Switches::Ademamix(_), true) => size_of::<AdemamixUniform64>(),
            (Switches::Lamb(_), false) => size_of::<LambUniform>(),
            (Switches::Lamb(_), true) => size_of::<LambUniform64>(),
        }) as u64
    }

    /// The WGSL declaration of the family's uniform, `struct Hyper`.
    pub(crate) fn uniform_wgsl(&self) -> String {
        match self {
            Switches::Adam(_) => AdamUniform::wgsl("Hyper"),
            Switches::Momentum(_) => MomentumUniform::wgsl("Hyper"),
            Switches::Adagrad(_) => AdagradUniform::wgsl("Hyper"),
            Switches::Lion(_) => LionUniform::wgsl("Hyper"),
            Switches::ScheduleFree(_) => ScheduleFreeUniform::wgsl("Hyper"),
            Switches::Adafactor(_) => AdafactorUniform::wgsl("Hyper"),
            Switches::Muon(_) => MuonUniform::wgsl("Hyper"),
            Switches::RmsProp(_) => RmsPropUniform::wgsl("Hyper"),
            Switches::Ademamix(_) => AdemamixUniform::wgsl("Hyper"),
            Switches::Lamb(_) => LambUniform::wgsl("Hyper"),
        }
    }
}

/// One step of one family: its switches and its uniform, computed on the host in f64.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum KernelStep {
    Adam(AdamSwitches, AdamUniform64),
    Momentum(MomentumSwitches, MomentumUniform64),
    Adagrad(AdagradSwitches, AdagradUniform64),
    Lion(LionSwitches, LionUniform64),
    ScheduleFree(ScheduleFreeSwitches, ScheduleFreeUniform64),
    Adafactor(AdafactorSwitches, AdafactorUniform64),
    Muon(MuonSwitches, MuonUniform64),
    RmsProp(RmsPropSwitches, RmsPropUniform64),
    Ademamix(AdemamixSwitches, AdemamixUniform64),
    Lamb(LambSwitches, LambUniform64),
}

/// Bytes reserved for one uniform: room for the largest in f64, and a multiple of every
/// adapter's `min_uniform_buffer_offset_alignment` (WebGPU caps it at 256).
pub(crate) const UNIFORM_SLOT_BYTES: u64 = 256;

const _: () = assert!(std::mem::size_of::<AdamUniform64>() as u64 <= UNIFORM_SLOT_BYTES);
const _: () = assert!(std::mem::size_of::<MomentumUniform64>() as u64 <= UNIFORM_SLOT_BYTES);
const _: () = assert!(std::mem::size_of::<AdagradUniform64>() as u64 <= UNIFORM_SLOT_BYTES);
const _: () = assert!(std::mem::size_of::<LionUniform64>() as u64 <= UNIFORM_SLOT_BYTES);
const _: () = assert!(std::mem::size_of::<ScheduleFreeUniform64>() as u64 <= UNIFORM_SLOT_BYTES);
const _: () = assert!(std::mem::size_of::<AdafactorUniform64>() as u64 <= UNIFORM_SLOT_BYTES);
const _: () = assert!(std::mem::size_of::<MuonUniform64>() as u64 <= UNIFORM_SLOT_BYTES);
const _: () = assert!(std::mem::size_of::<RmsPropUniform64>() as u64 <= UNIFORM_SLOT_BYTES);
const _: () = assert!(std::mem::size_of::<AdemamixUniform64>() as u64 <= UNIFORM_SLOT_BYTES);
const _: () = assert!(std::mem::size_of::<LambUniform64>() as u64 <= UNIFORM_SLOT_BYTES);

impl KernelStep {
    pub(crate) fn family(&self) -> Family {
        self.switches().family()
    }

    pub(crate) fn switches(&self) -> Switches {
        match self {
            KernelStep::Adam(s, _) => Switches::Adam(*s),
            KernelStep::Momentum(s, _) => Switches::Momentum(*s),
            KernelStep::Adagrad(s, _) => Switches::Adagrad(*s),
            KernelStep::Lion(s, _) => Switches::Lion(*s),
            KernelStep::ScheduleFree(s, _) => Switches::ScheduleFree(*s),
            KernelStep::Adafactor(s, _) => Switches::Adafactor(*s),
            KernelStep::Muon(s, _) => Switches::Muon(*s),
            KernelStep::RmsProp(s, _) => Switches::RmsProp(*s),
            KernelStep::Ademamix(s, _) => Switches::Ademamix(*s),
            KernelStep::Lamb(s, _) => Switches::Lamb(*s),
        }
    }

    /// Writes the uniform's bytes for a kernel whose math runs in `math` (f64 for double
    /// tensors, f32 otherwise) into `out`, zero-padding the rest of it.
    pub(crate) fn write_uniform(&self, math: DType, out: &mut [u8]) {
        fn copy(out: &mut [u8], bytes: &[u8]) {
            out.fill(0);
            out[..bytes.len()].copy_from_slice(bytes);
        }
        match (self, math == DType::F64) {
            (KernelStep::Adam(_, u), true) => copy(out, bytemuck::bytes_of(u)),
            (KernelStep::Momentum(_, u), true) => copy(out, bytemuck::bytes_of(u)),
            (KernelStep::Adagrad(_, u), true) => copy(out, bytemuck::bytes_of(u)),
            (KernelStep::Lion(_, u), true) => copy(out, bytemuck::bytes_of(u)),
            (KernelStep::ScheduleFree(_, u), true) => copy(out, bytemuck::bytes_of(u)),
            (KernelStep::Adafactor(_, u), true) => copy(out, bytemuck::bytes_of(u)),
            (KernelStep::Muon(_, u), true) => copy(out, bytemuck::bytes_of(u)),
            (KernelStep::RmsProp(_, u), true) => copy(out, bytemuck::bytes_of(u)),
            (KernelStep::Ademamix(_, u), true) => copy(out, bytemuck::bytes_of(u)),
            (KernelStep::Lamb(_, u), true) => copy(out, bytemuck::bytes_of(u)),
            (KernelStep::Adam(_, u), false) => copy(out, bytemuck::bytes_of(&u.to_f32())),
            (KernelStep::Momentum(_, u), false) => copy(out, bytemuck::bytes_of(&u.to_f32())),
            (KernelStep::Adagrad(_, u), false) => copy(out, bytemuck::bytes_of(&u.to_f32())),
            (KernelStep::Lion(_, u), false) => copy(out, bytemuck::bytes_of(&u.to_f32())),
            (KernelStep::ScheduleFree(_, u), false) => copy(out, bytemuck::bytes_of(&u.to_f32())),
            (KernelStep::Adafactor(_, u), false) => copy(out, bytemuck::bytes_of(&u.to_f32())),
            (KernelStep::Muon(_, u), false) => copy(out, bytemuck::bytes_of(&u.to_f32())),
            (KernelStep::RmsProp(_, u), false) => copy(out, bytemuck::bytes_of(&u.to_f32())),
            (KernelStep::Ademamix(_, u), false) => copy(out, bytemuck::bytes_of(&u.to_f32())),
            (KernelStep::Lamb(_, u), false) => copy(out, bytemuck::bytes_of(&u.to_f32())),
        }
    }
}
