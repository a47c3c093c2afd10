//! Fused optimizer updates as WGSL compute shaders on wgpu, and the same updates on a CPU
//! backend ([`cpu`]).
//!
//! One dispatch reads each parameter, gradient and state element once and writes the
//! parameter and state once. Twelve families, each reproducing its source: PyTorch's
//! `torch.optim` ([`Adam`] with AdamW and AMSGrad, [`Sgd`], [`Adagrad`], [`RmsProp`],
//! [`Adafactor`], [`Muon`], its Newton-Schulz products in [`matmul`]), lion-pytorch
//! ([`Lion`]), bitsandbytes ([`AdEMAMix`] and the 8-bit states of [`q8`]), torchao (the
//! 4-bit states of [`q4`]), the `schedulefree` package ([`ScheduleFreeAdamW`]),
//! torch-optimizer ([`Lamb`]), the official ADOPT ([`Adopt`]) and Adan ([`Adan`]), ONNX's
//! `ai.onnx.preview.training` operators ([`OnnxAdam`], [`ops::onnx`]) and DirectML's Adam
//! operator ([`ops::directml`]), each tested against a CPU oracle in f64 (the repository's
//! `wgpu-optim-oracle`, which depends on nothing of this crate). The `wgpu-optim-burn`
//! crate steps Burn 0.22's wgpu tensors with the same kernels; without default features
//! the crate builds for browsers (wasm32, WebGPU).
//!
//! # Where to start
//!
//! 1. [`GpuContext`]: wrap the trainer's device and queue ([`GpuContext::from_device`]) or
//!    open one ([`GpuContext::headless`]).
//! 2. [`Tensor`]: a range of a buffer the trainer owns (a struct literal), or a new buffer
//!    from host data ([`GpuContext::upload_f32`], [`GpuContext::upload`]).
//! 3. [`Optimizer::builder`]: the options, then [`OptimizerBuilder::build`] over the
//!    parameters with an algorithm ([`Adam`], [`Sgd`], [`Adagrad`], [`RmsProp`], [`Lion`],
//!    [`AdEMAMix`], [`ScheduleFreeAdamW`], [`Lamb`], [`Adafactor`], [`Muon`], [`Adopt`],
//!    [`Adan`]) and its storage ([`StateStorage`]: a dtype, [`q8`] or [`q4`]).
//! 4. [`Optimizer::step`], or [`Optimizer::record_step`] into the trainer's own encoder.
//!
//! ```no_run
//! # fn main() -> wgpu_optim::Result<()> {
//! use wgpu_optim::{Adam, GpuContext, GradClip, Optimizer};
//!
//! let ctx = GpuContext::headless_blocking()?;
//! let params = [ctx.upload_f32("w", &[0.5; 1024])];
//! let grads = [ctx.upload_f32("dw", &[0.1; 1024])];
//! let mut opt =
//!     Optimizer::builder().grad_clip(GradClip::l2(1.0)).build(&ctx, Adam::adamw(), &params)?;
//! opt.step(&grads)?;
//! assert!(ctx.read_f32(&params[0])?[0] < 0.5);
//! # Ok(()) }
//! ```
//!
//! # Conventions
//!
//! Each family reproduces its source's arithmetic, which differs where eps goes and how the
//! step is counted (each configuration's documentation says the rest):
//!
//! | convention | eps default | where eps goes | step counting |
//! |---|---|---|---|
//! | PyTorch `Adam`/`AdamW` | 1e-8 | after dividing `sqrt(v)` by `sqrt(1 - beta2^t)` | from 1, kept by the optimizer |
//! | ONNX `Adam` | 1e-6 | added to `sqrt(H)`, the rate is corrected instead | input `T`; `T = 0`: no correction |
//! | DirectML Adam | none | added to `sqrt(V)`, the rate is corrected instead | input tensor; `T = 0` is refused |
//! | PyTorch `SGD` | | | the first step sets the buffer to the gradient |
//! | ONNX `Momentum` | | | `T = 0`: the gradient's coefficient `beta` is replaced by 1 |
//! | PyTorch `Adagrad` | 1e-10 | added to `sqrt(sum)` | `lr / (1 + (step - 1) lr_decay)` |
//! | ONNX `Adagrad` | 1e-6 | added to `sqrt(H)` | `R / (1 + T decay_factor)` |
//! | lion-pytorch `Lion` | | no epsilon: the update is a sign | the step does not enter |
//! | schedulefree `AdamWScheduleFree` | 1e-8 | after dividing `sqrt(v)` by `sqrt(1 - beta2^(k+1))` | group's `k` from 0, kept by the optimizer |
//! | PyTorch `RMSprop` | 1e-8 | added to `sqrt(square_avg)` (centered: of the variance) | no step dependence |
//! | bitsandbytes `AdEMAMix` | 1e-8 | as PyTorch Adam | from 1; warmups of `alpha` and `beta3` |
//! | torch-optimizer `Lamb` | 1e-6 | added to `sqrt(exp_avg_sq)`, moments never corrected | from 1; `debias` corrects the step size |
//! | PyTorch `Adafactor` | (dtype eps, 1e-3) | eps1 floors `V` and the row mean, eps2 the param RMS | from 1, per tensor |
//! | PyTorch `Muon` | 1e-7 | floor of the Frobenius norm before Newton-Schulz | no step dependence |
//! | official `ADOPT` | 1e-6 | a floor: `g / max(sqrt(v), eps)` | step 1 only sets `v`; the clip bound is `(t - 1)^q` |
//! | official `Adan` | 1e-8 | after dividing `sqrt(n)` by `sqrt(1 - beta3^t)` | from 1; step 1's difference is 0 |
//!
//! # The rest, and why each exists
//!
//! - [`ParamGroup`]: parameters with their own hyperparameters
//!   ([`OptimizerBuilder::build_groups`]).
//! - [`Algorithm`], [`StateKind`]: what a group runs and the state tensors it keeps (by
//!   PyTorch's names, for [`Optimizer::state`] and checkpoints).
//! - [`DType`]: the storage types (f32, f16, bf16, f64 for ONNX ops).
//! - [`GradClip`], [`NormType`], [`Rounding`]: option values of the builder.
//! - [`ScheduleFreeAdamW`] (the `schedulefree` package's `AdamWScheduleFree`), with
//!   [`ScheduleFreeScalars`] (a group's running `k`, `weight_sum`, `lr_max`) and
//!   [`ScheduleFreeMode`]: its parameters hold y in train mode and the average x after
//!   [`Optimizer::eval`] (or [`Optimizer::record_eval`]); steps are refused in eval mode.
//! - [`OnnxAdam`], [`OnnxMomentum`], [`OnnxAdagrad`], [`MomentumMode`], [`DmlAdam`]: the
//!   attributes of the stateless operators in [`ops`].
//! - [`Checkpoint`], [`CHECKPOINT_FORMAT`] (feature `checkpoint`): a saved optimizer's
//!   contents, read without an optimizer.
//! - [`cpu`] (feature `cpu`): [`cpu::CpuOptimizer`], the same algorithms on all cores.
//! - [`shard`] (not in wasm32): optimizer state sharded across ranks (ZeRO-1):
//!   [`shard::ShardedOptimizer`] and, with `cpu`, `shard::ShardedCpuOptimizer`, over
//!   [`shard::Communicator`]'s collectives, with ranks on threads ([`shard::InProcess`]) or,
//!   with `mpi`, MPI processes; every reduction gives every rank the same bits.
//! - [`q8`]: bitsandbytes' blockwise 8-bit state ([`q8::Q8States`] to ask for it,
//!   [`q8::StoredState`] to read, write and check it); [`q4`]: torchao's 4-bit state
//!   ([`q4::Q4States`], [`q4::Q4State`]).
//! - For a framework's front end (the `wgpu-optim-burn` crate is one):
//!   [`ops::StepScalars`] and [`ops::record_updates`] (a step whose scalars the front end
//!   keeps), [`ops::check_inv_scale`], [`GpuContext::choose_adapter`] and
//!   [`GpuContext::catch`], [`Algorithm::param_state_kinds`] and
//!   [`Optimizer::tensor_state`].
//! - [`Error`], [`Result`], [`StepProblem`], [`ReadbackFailure`], [`BurnFailure`]: every
//!   refusal, typed. [`ContextReport`], [`TENSOR_USAGES`]: what a context runs on, and the
//!   usages of the buffers the crate creates.
//!
//! Cargo features: `cpu` and `checkpoint` are on by default (rayon and multiversion;
//! safetensors and serde_json); the GPU optimizer and operators need neither. `gles` adds
//! wgpu's OpenGL ES backend.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod algo;
#[cfg(feature = "checkpoint")]
mod checkpoint;
#[cfg(feature = "cpu")]
pub mod cpu;
#[cfg(test)]
mod docs_tests;
mod dtype;
mod error;
mod family;
mod gpu;
pub mod ops;
mod optimizer;
mod options;
#[cfg(test)]
mod oracle;
pub mod q4;
pub mod q8;
#[cfg(not(target_arch = "wasm32"))]
pub mod shard;
mod state_storage;
mod state_view;
mod step;
mod tensor;
mod validate;

pub use algo::LambNorms;
pub use algo::{adafactor_state_kinds, adafactor_state_shapes, machine_epsilon};
pub use algo::{
    Algorithm, DmlAdam, MomentumMode, OnnxAdagrad, OnnxAdam, OnnxMomentum, ScheduleFreeMode,
    ScheduleFreeScalars, StateKind,
};
pub use algo::{MuonLrAdjust, NsPrecision, MAX_NS_STEPS};
#[cfg(feature = "checkpoint")]
pub use checkpoint::{Checkpoint, CHECKPOINT_FORMAT};
pub use dtype::DType;
pub use error::{BurnFailure, Error, ReadbackFailure, Result, StepProblem};
/// Batched matrix products on the device (Muon's Newton-Schulz kernels), for a caller's own use.
pub use gpu::matmul;
pub use gpu::{ContextReport, GpuContext, TENSOR_USAGES};
pub use optimizer::{Optimizer, OptimizerBuilder, ParamGroup};
pub(crate) use options::OptimizerOptions;
pub use state_storage::StateStorage;
pub use state_view::{QuantizedState, StateView};
pub use step::clip::{GradClip, NormType};
pub use step::rounding::Rounding;
pub use tensor::Tensor;

/// The `mpi` crate (rsmpi 0.8) that the `mpi` feature's [`shard::Mpi`] runs on,
/// re-exported so that a trainer starts MPI with the very version the transport links:
/// `let universe = wgpu_optim::mpi::initialize()`, then `shard::Mpi::new(universe.world())`.
#[cfg(feature = "mpi")]
pub use mpi;

/// Every family's public configuration at the crate's root, from the family registry.
macro_rules! export_configs {
    ($($(#[$doc:meta])* $family:ident => $folder:ident: $variant:ident($config:ident),)*) => {
        $(pub use family::$folder::config::$config;)*
    };
}
family::registry!(export_configs);

/// README's examples, compiled as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
