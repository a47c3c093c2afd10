//! Fused optimizer updates as WGSL compute shaders on wgpu.
//!
//! One dispatch reads each parameter, gradient and state element once and writes the
//! parameter and state once. Three conventions are reproduced exactly: PyTorch's
//! `torch.optim` ([`Adam`], AdamW, AMSGrad), ONNX's `ai.onnx.preview.training` operators
//! ([`OnnxAdam`], [`ops::onnx`]) and DirectML's Adam operator ([`ops::directml`]), with a
//! CPU [`oracle`] in f64 that every GPU result is tested against.
//!
//! - [`GpuContext`] opens a headless device or wraps a trainer's own.
//! - [`Tensor`] is a range of a buffer the caller owns.
//! - [`Optimizer`] is what a trainer holds: state, step count, bind groups built once.
//! - [`ops`] are the stateless operator front ends, with DirectML's aliasing rule.
//! - [`q8`] is bitsandbytes' blockwise 8-bit state format: its maps and its quantization.
//!
//! Cargo features, both on by default: `cpu` (the CPU backend, `wgpu_optim::cpu`; rayon and
//! multiversion) and `checkpoint` (`Optimizer::save`/`load`, and `CpuOptimizer`'s with `cpu`;
//! safetensors and serde_json).
//! The GPU optimizer and operators need neither. The `burn` feature (off by default) adds
//! `wgpu_optim::burn`: Burn 0.22's wgpu tensors stepped by these kernels on a shared
//! device.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod algo;
#[cfg(feature = "burn")]
pub mod burn;
#[cfg(feature = "checkpoint")]
mod checkpoint;
#[cfg(feature = "cpu")]
pub mod cpu;
mod dtype;
mod error;
mod gpu;
pub mod ops;
mod optimizer;
pub mod oracle;
pub mod q8;
mod step;
mod tensor;

pub use algo::{
    Adagrad, Adam, Algorithm, DmlAdam, MomentumMode, OnnxAdagrad, OnnxAdam, OnnxMomentum, Sgd, StateKind,
};
#[cfg(feature = "checkpoint")]
pub use checkpoint::{Checkpoint, CHECKPOINT_FORMAT};
pub use dtype::DType;
pub use error::{BurnFailure, Error, ReadbackFailure, Result, StepProblem};
pub use gpu::{ContextReport, GpuContext, TENSOR_USAGES};
pub(crate) use optimizer::OptimizerOptions;
pub use optimizer::{Optimizer, OptimizerBuilder, ParamGroup};
pub use step::clip::{GradClip, NormType};
pub use step::rounding::Rounding;
pub use tensor::Tensor;

/// README's examples, compiled as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
