//! Burn integration (the `burn` cargo feature): Burn 0.22's wgpu runtime and this crate on
//! one device and one queue, drop-in optimizers for Burn's training loops, and a fused step
//! over a whole module.
//!
//! - [`SharedDevice`] pairs a Burn [`Device`](::burn::tensor::Device) with a
//!   [`GpuContext`](crate::GpuContext) on the same wgpu device and queue, made from either
//!   side: [`SharedDevice::init`] lets Burn acquire the device and wraps its handles;
//!   [`SharedDevice::headless`] and [`SharedDevice::from_context`] hand this crate's device
//!   to Burn.
//! - [`FusedOptimizer`] implements Burn's per-tensor [`Optimizer`](::burn::optim::Optimizer)
//!   trait with this crate's fused kernels, so `ModuleOptimizer` training loops
//!   (`optim.step(lr, model, grads)`) work unchanged, states included in Burn's records
//!   (and Burn's own Adam and AdamW records loaded as its state).
//! - [`ModuleStep`] updates every parameter of a module at once: one [`Optimizer`] whose
//!   multi-tensor dispatches cover all of them, with global gradient clipping and AMP
//!   skipping available; parameters without a gradient are skipped, each parameter counts
//!   its own steps, the state saves and loads as a Burn optimizer record, and a refused step
//!   hands the module back ([`StepError`]).
//! - Every algorithm of the crate runs in both front ends, Muon and Adafactor with the
//!   shapes Burn's tensors carry; Muon's parameters that are not 2-D go to a fallback
//!   algorithm ([`FusedOptimizer::fallback`], [`ModuleStepBuilder::fallback`]).
//!
//! # Ordering
//!
//! Nothing waits on the host. Reading a Burn tensor's buffer makes Burn submit the work it
//! has queued for that tensor, so everything Burn computed before a step is on the queue
//! before the step is; the step is submitted before the call returns, so Burn's next kernels
//! come after it on the same queue.
//!
//! # In place, or copied
//!
//! A parameter (or state) tensor that nothing else holds is updated in its own buffer. One
//! whose storage Burn shares with another tensor (a clone kept by the caller, a view) gets a
//! new buffer instead, so the other holder keeps the old values.
//!
//! # Burn's `fusion` feature
//!
//! With `fusion` on, Burn's tensors are lazy handles with no buffer behind them yet. Every
//! constructor here refuses that build with [`Error::Burn`](crate::Error::Burn); keep
//! `fusion` off (`default-features = false` on `burn`, or `burn-wgpu` without `fusion`).
//!
//! [`Optimizer`]: crate::Optimizer

mod config;
mod device;
mod fallback;
mod fused_state;
mod lease;
mod module_step;
mod optimizer;
mod q4;
mod record;
mod schedule_free;
mod shaped;

pub use device::SharedDevice;
pub use fused_state::FusedState;
pub use module_step::{ModuleStep, ModuleStepBuilder, StepError};
pub use optimizer::FusedOptimizer;
