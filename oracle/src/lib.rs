//! The CPU reference: each convention's pseudo code transcribed line for line in f64. Slow
//! and obviously correct; every GPU and CPU-backend result in the tests is checked against
//! it.
//!
//! It depends on nothing of wgpu-optim: its types are its own, named as the sources name
//! them (PyTorch's, bitsandbytes', torchao's, ONNX's and the papers' code), with no defaults
//! or validation but what the reference code has, so that it shares neither the crate's
//! definitions nor its checks. It computes everything itself: the bitsandbytes maps and
//! quantization ([`bnb`]), torchao's 4-bit ones ([`ao4`]), the rounding of stores to a dtype
//! ([`dtype`]), so that it does not share the code it checks. Each file's docs name the
//! source it transcribes.
//!
//! The tests reach it through `wgpu_optim_testkit::oracle`, which re-exports this crate with
//! the conversions from wgpu-optim's configurations (`ToOracle`); wgpu-optim's own unit tests
//! convert their values into its types themselves.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod adafactor;
pub mod adan;
pub mod ademamix;
pub mod adopt;
pub mod algorithm;
pub mod ao4;
pub mod bnb;
pub mod dtype;
pub mod error;
pub mod lamb;
pub mod lion;
pub mod muon;
pub mod onnx;
pub mod rmsprop;
pub mod schedule_free;
pub mod torch;

pub use adafactor::{Adafactor, AdafactorOracle, AdafactorTensorState};
pub use adan::{AdanHyperparameters, AdanOracle};
pub use ademamix::{ademamix_alpha, ademamix_beta3, ademamix_step, AdEMAMix};
pub use adopt::{adopt_step, AdoptHyperparameters, AdoptOracle};
pub use algorithm::Algorithm;
pub use ao4::{ao4_adam_step, State4bit};
pub use bnb::bnb_ademamix8bit_step;
pub use bnb::bnb_lion8bit_step;
pub use bnb::{bnb_8bit_step, bnb_adam8bit_step, bnb_sgd8bit_step, BnbAdam, BnbSgd, State8bit};
pub use bnb::{bnb_rmsprop8bit_step, BnbRmsProp};
pub use dtype::{DType, Storage};
pub use error::{Error, Result};
pub use lamb::{Lamb, LambOracle, LambOracleNorms};
pub use lion::{lion_step, Lion};
pub use muon::{muon_step, AdjustLrFn, Muon, NsPrecision};
pub use onnx::{
    dml_adam, onnx_adagrad, onnx_adam, onnx_momentum, DmlAdam, MomentumMode, OnnxAdagrad, OnnxAdam,
    OnnxAdamOutputs, OnnxMomentum, OnnxOutputs2,
};
pub use rmsprop::{torch_rmsprop_step, RmsProp, TorchRmsPropState};
pub use schedule_free::{AdamWScheduleFree, ScheduleFreeOracle};
pub use torch::{
    clip_grad_norm, torch_adagrad_step, torch_adam_step, torch_sgd_step, Adagrad, Adam, GradClip, NormType,
    Sgd, TorchAdamState, TorchState,
};
