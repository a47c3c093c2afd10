//! The f64 oracle (the `wgpu-optim-oracle` crate, re-exported whole) and the conversions of
//! wgpu-optim's values into its types and back.
//!
//! The oracle has types of its own, under its sources' names, so that it shares neither the
//! crate's definitions nor their defaults and checks; a test hands it the crate's
//! configuration with [`ToOracle::to_oracle`] and takes a low-bit state or an error back with
//! [`ToLibrary::to_library`]. (Orphan rules forbid `From` between two foreign types.) Each
//! conversion copies field by field, by name, so that a field added to either side without
//! its counterpart fails to compile here.

pub use wgpu_optim_oracle::*;

use wgpu_optim as lib;

/// A wgpu-optim value as the oracle's type of it.
pub trait ToOracle {
    /// The oracle's type.
    type Oracle;
    /// The same value in the oracle's type.
    fn to_oracle(&self) -> Self::Oracle;
}

/// An oracle value as wgpu-optim's type of it.
pub trait ToLibrary {
    /// wgpu-optim's type.
    type Library;
    /// The same value in wgpu-optim's type.
    fn to_library(&self) -> Self::Library;
}

impl ToOracle for lib::DType {
    type Oracle = DType;
    fn to_oracle(&self) -> DType {
        match self {
            lib::DType::F64 => DType::F64,
            lib::DType::F32 => DType::F32,
            lib::DType::F16 => DType::F16,
            lib::DType::BF16 => DType::BF16,
            // `DType` is `#[non_exhaustive]`: a storage type this oracle does not know stops
            // the test that uses it, by name.
            other => panic!("the oracle has no rounding for {other:?} yet"),
        }
    }
}

impl ToOracle for lib::Adam {
    type Oracle = Adam;
    fn to_oracle(&self) -> Adam {
        let lib::Adam { lr, beta1, beta2, eps, weight_decay, decoupled_weight_decay, amsgrad, maximize } =
            *self;
        Adam { lr, beta1, beta2, eps, weight_decay, decoupled_weight_decay, amsgrad, maximize }
    }
}

impl ToOracle for lib::Sgd {
    type Oracle = Sgd;
    fn to_oracle(&self) -> Sgd {
        let lib::Sgd { lr, momentum, dampening, weight_decay, nesterov, maximize } = *self;
        Sgd { lr, momentum, dampening, weight_decay, nesterov, maximize }
    }
}

impl ToOracle for lib::Adagrad {
    type Oracle = Adagrad;
    fn to_oracle(&self) -> Adagrad {
        let lib::Adagrad { lr, lr_decay, weight_decay, initial_accumulator_value, eps, maximize } = *self;
        Adagrad { lr, lr_decay, weight_decay, initial_accumulator_value, eps, maximize }
    }
}

impl ToOracle for lib::RmsProp {
    type Oracle = RmsProp;
    fn to_oracle(&self) -> RmsProp {
        let lib::RmsProp { lr, alpha, eps, weight_decay, momentum, centered, maximize } = *self;
        RmsProp { lr, alpha, eps, weight_decay, momentum, centered, maximize }
    }
}

impl ToOracle for lib::Lion {
    type Oracle = Lion;
    fn to_oracle(&self) -> Lion {
        let lib::Lion { lr, beta1, beta2, weight_decay } = *self;
        Lion { lr, beta1, beta2, weight_decay }
    }
}

impl ToOracle for lib::AdEMAMix {
    type Oracle = AdEMAMix;
    fn to_oracle(&self) -> AdEMAMix {
        let lib::AdEMAMix { lr, beta1, beta2, beta3, alpha, t_alpha, t_beta3, eps, weight_decay } = *self;
        AdEMAMix { lr, beta1, beta2, beta3, alpha, t_alpha, t_beta3, eps, weight_decay }
    }
}

impl ToOracle for lib::Adopt {
    type Oracle = AdoptHyperparameters;
    fn to_oracle(&self) -> AdoptHyperparameters {
        let lib::Adopt { lr, beta1, beta2, eps, weight_decay, decouple, clip_exponent, maximize } = *self;
        AdoptHyperparameters {
            lr,
            beta1,
            beta2,
            eps,
            clip_lambda: clip_exponent,
            weight_decay,
            decouple,
            maximize,
        }
    }
}

impl ToOracle for lib::Adan {
    type Oracle = AdanHyperparameters;
    fn to_oracle(&self) -> AdanHyperparameters {
        let lib::Adan { lr, beta1, beta2, beta3, eps, weight_decay, max_grad_norm, no_prox } = *self;
        AdanHyperparameters { lr, beta1, beta2, beta3, eps, weight_decay, max_grad_norm, no_prox }
    }
}

impl ToOracle for lib::Lamb {
    type Oracle = Lamb;
    fn to_oracle(&self) -> Lamb {
        let lib::Lamb { lr, beta1, beta2, eps, weight_decay, clamp_value, adam, debias } = *self;
        Lamb { lr, beta1, beta2, eps, weight_decay, clamp_value, adam, debias }
    }
}

impl ToOracle for lib::ScheduleFreeAdamW {
    type Oracle = AdamWScheduleFree;
    fn to_oracle(&self) -> AdamWScheduleFree {
        let lib::ScheduleFreeAdamW { lr, beta1, beta2, eps, weight_decay, warmup_steps, r, weight_lr_power } =
            *self;
        AdamWScheduleFree { lr, beta1, beta2, eps, weight_decay, warmup_steps, r, weight_lr_power }
    }
}

impl ToOracle for lib::Adafactor {
    type Oracle = Adafactor;
    fn to_oracle(&self) -> Adafactor {
        let lib::Adafactor { lr, beta2_decay, eps1, eps2, d, weight_decay, maximize } = *self;
        Adafactor { lr, beta2_decay, eps1, eps2, d, weight_decay, maximize }
    }
}

impl ToOracle for lib::MuonLrAdjust {
    type Oracle = AdjustLrFn;
    fn to_oracle(&self) -> AdjustLrFn {
        match self {
            lib::MuonLrAdjust::Original => AdjustLrFn::Original,
            lib::MuonLrAdjust::MatchRmsAdamW => AdjustLrFn::MatchRmsAdamW,
            lib::MuonLrAdjust::SpectralUnclamped => AdjustLrFn::SpectralUnclamped,
        }
    }
}

impl ToOracle for lib::NsPrecision {
    type Oracle = NsPrecision;
    fn to_oracle(&self) -> NsPrecision {
        match self {
            lib::NsPrecision::BF16 => NsPrecision::BF16,
            lib::NsPrecision::F32 => NsPrecision::F32,
        }
    }
}

impl ToOracle for lib::Muon {
    type Oracle = Muon;
    fn to_oracle(&self) -> Muon {
        let lib::Muon {
            lr,
            weight_decay,
            momentum,
            nesterov,
            ns_coefficients,
            eps,
            ns_steps,
            adjust_lr,
            ns_precision,
        } = *self;
        Muon {
            lr,
            weight_decay,
            momentum,
            nesterov,
            ns_coefficients,
            eps,
            ns_steps,
            adjust_lr_fn: adjust_lr.to_oracle(),
            ns_precision: ns_precision.to_oracle(),
        }
    }
}

impl ToOracle for lib::OnnxAdam {
    type Oracle = OnnxAdam;
    fn to_oracle(&self) -> OnnxAdam {
        let lib::OnnxAdam { alpha, beta, epsilon, norm_coefficient, norm_coefficient_post } = *self;
        OnnxAdam { alpha, beta, epsilon, norm_coefficient, norm_coefficient_post }
    }
}

impl ToOracle for lib::MomentumMode {
    type Oracle = MomentumMode;
    fn to_oracle(&self) -> MomentumMode {
        match self {
            lib::MomentumMode::Standard => MomentumMode::Standard,
            lib::MomentumMode::Nesterov => MomentumMode::Nesterov,
        }
    }
}

impl ToOracle for lib::OnnxMomentum {
    type Oracle = OnnxMomentum;
    fn to_oracle(&self) -> OnnxMomentum {
        let lib::OnnxMomentum { alpha, beta, mode, norm_coefficient } = *self;
        OnnxMomentum { alpha, beta, mode: mode.to_oracle(), norm_coefficient }
    }
}

impl ToOracle for lib::OnnxAdagrad {
    type Oracle = OnnxAdagrad;
    fn to_oracle(&self) -> OnnxAdagrad {
        let lib::OnnxAdagrad { decay_factor, epsilon, norm_coefficient } = *self;
        OnnxAdagrad { decay_factor, epsilon, norm_coefficient }
    }
}

impl ToOracle for lib::DmlAdam {
    type Oracle = DmlAdam;
    fn to_oracle(&self) -> DmlAdam {
        let lib::DmlAdam { learning_rate, beta1, beta2, epsilon } = *self;
        DmlAdam { learning_rate, beta1, beta2, epsilon }
    }
}

impl ToOracle for lib::GradClip {
    type Oracle = GradClip;
    fn to_oracle(&self) -> GradClip {
        let norm_type = match self.norm_type {
            lib::NormType::L2 => NormType::L2,
            lib::NormType::Inf => NormType::Inf,
            other => panic!("the oracle clips no {other:?} norm yet"),
        };
        GradClip { max_norm: self.max_norm, norm_type }
    }
}

impl ToOracle for lib::Algorithm {
    type Oracle = Algorithm;
    fn to_oracle(&self) -> Algorithm {
        match self {
            lib::Algorithm::Adam(c) => Algorithm::Adam(c.to_oracle()),
            lib::Algorithm::Sgd(c) => Algorithm::Sgd(c.to_oracle()),
            lib::Algorithm::Adagrad(c) => Algorithm::Adagrad(c.to_oracle()),
            lib::Algorithm::RmsProp(c) => Algorithm::RmsProp(c.to_oracle()),
            lib::Algorithm::Lion(c) => Algorithm::Lion(c.to_oracle()),
            lib::Algorithm::AdEMAMix(c) => Algorithm::AdEMAMix(c.to_oracle()),
            lib::Algorithm::Adopt(c) => Algorithm::Adopt(c.to_oracle()),
            lib::Algorithm::Adan(c) => Algorithm::Adan(c.to_oracle()),
            lib::Algorithm::Lamb(c) => Algorithm::Lamb(c.to_oracle()),
            lib::Algorithm::ScheduleFreeAdamW(c) => Algorithm::ScheduleFreeAdamW(c.to_oracle()),
            lib::Algorithm::Adafactor(c) => Algorithm::Adafactor(c.to_oracle()),
            lib::Algorithm::Muon(c) => Algorithm::Muon(c.to_oracle()),
            // `Algorithm` is `#[non_exhaustive]`: a family the crate adds before the oracle
            // transcribes it stops the test that asks for it, by name.
            other => panic!("the oracle has no transcription of {other:?} yet"),
        }
    }
}

impl ToOracle for lib::q8::StoredState {
    type Oracle = State8bit;
    fn to_oracle(&self) -> State8bit {
        match self {
            lib::q8::StoredState::Q8 { codes, absmax } => {
                State8bit::Q8 { codes: codes.clone(), absmax: absmax.clone() }
            }
            lib::q8::StoredState::F32(values) => State8bit::F32(values.clone()),
        }
    }
}

impl ToLibrary for State8bit {
    type Library = lib::q8::StoredState;
    fn to_library(&self) -> lib::q8::StoredState {
        match self {
            State8bit::Q8 { codes, absmax } => {
                lib::q8::StoredState::Q8 { codes: codes.clone(), absmax: absmax.clone() }
            }
            State8bit::F32(values) => lib::q8::StoredState::F32(values.clone()),
        }
    }
}

impl ToOracle for lib::q4::Q4State {
    type Oracle = State4bit;
    fn to_oracle(&self) -> State4bit {
        match self {
            lib::q4::Q4State::Q4 { codes, scale } => {
                State4bit::Q4 { codes: codes.clone(), scale: scale.clone() }
            }
            lib::q4::Q4State::F32(values) => State4bit::F32(values.clone()),
        }
    }
}

impl ToLibrary for State4bit {
    type Library = lib::q4::Q4State;
    fn to_library(&self) -> lib::q4::Q4State {
        match self {
            State4bit::Q4 { codes, scale } => {
                lib::q4::Q4State::Q4 { codes: codes.clone(), scale: scale.clone() }
            }
            State4bit::F32(values) => lib::q4::Q4State::F32(values.clone()),
        }
    }
}

impl ToLibrary for Error {
    type Library = lib::Error;
    /// The refusal as the crate would word it, for a runner that returns the crate's errors.
    fn to_library(&self) -> lib::Error {
        match self {
            Error::LengthMismatch { argument, got, expected } => lib::Error::LengthMismatch {
                argument: argument.clone(),
                got: *got as u64,
                expected: *expected as u64,
                reference: "param".into(),
            },
            Error::CountMismatch { argument, got, expected } => {
                lib::Error::CountMismatch { argument: argument.clone(), got: *got, expected: *expected }
            }
            Error::Unsupported(reason) => {
                lib::Error::ConflictingOptions { first: "state_storage", second: "algorithm", reason }
            }
        }
    }
}
