//! The CPU reference: each convention's pseudo code transcribed line for line in f64. Slow
//! and obviously correct; every GPU and CPU-backend result in the tests is checked against
//! it.
//!
//! It sees wgpu-optim's public API only (the configurations it reads, [`StoredState`] for
//! 8-bit state) and computes everything else itself: the bitsandbytes maps and
//! quantization ([`bnb`]), the rounding of stores to a dtype ([`dtype`]), so that it does not
//! share the code it checks. Families the crate did not implement when their oracle was
//! written ([`adan`], [`adopt`]) bring their own hyperparameters, under their sources' names
//! and defaults.
//!
//! wgpu-optim's own unit tests reach it as a dev-dependency, through the testkit's build of
//! the library ([`crate::library`]), converting their values into its types.
//!
//! [`StoredState`]: wgpu_optim::q8::StoredState

/// The crate under test, as the oracle's files name it.
use wgpu_optim as api;

pub mod adafactor;
pub mod adan;
pub mod ademamix;
pub mod adopt;
pub mod ao4;
pub mod bnb;
pub mod dtype;
pub mod lamb;
pub mod lion;
pub mod muon;
pub mod onnx;
pub mod rmsprop;
pub mod schedule_free;
pub mod torch;

pub use adafactor::{AdafactorOracle, AdafactorTensorState};
pub use adan::{AdanHyperparameters, AdanOracle};
pub use ademamix::{ademamix_alpha, ademamix_beta3, ademamix_step};
pub use adopt::{adopt_step, AdoptHyperparameters, AdoptOracle};
pub use ao4::ao4_adam_step;
pub use bnb::bnb_ademamix8bit_step;
pub use bnb::bnb_lion8bit_step;
pub use bnb::{bnb_8bit_step, bnb_adam8bit_step, bnb_sgd8bit_step, BnbAdam, BnbSgd};
pub use bnb::{bnb_rmsprop8bit_step, BnbRmsProp};
pub use dtype::Storage;
pub use lamb::{LambOracle, LambOracleNorms};
pub use lion::lion_step;
pub use muon::muon_step;
pub use onnx::{dml_adam, onnx_adagrad, onnx_adam, onnx_momentum, OnnxAdamOutputs, OnnxOutputs2};
pub use rmsprop::{torch_rmsprop_step, TorchRmsPropState};
pub use schedule_free::ScheduleFreeOracle;
pub use torch::{
    clip_grad_norm, torch_adagrad_step, torch_adam_step, torch_sgd_step, TorchAdamState, TorchState,
};
