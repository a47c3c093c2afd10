//! wgpu-optim's Burn integration: Burn 0.22's wgpu runtime and wgpu-optim's kernels on
//! one device and one queue, drop-in optimizers for Burn's training loops, and a fused step
//! over a whole module.
//!
//! - [`SharedDevice`] pairs a Burn [`Device`](burn::tensor::Device) with a
//!   [`GpuContext`](wgpu_optim::GpuContext) on the same wgpu device and queue, made from either
//!   side: [`SharedDevice::init`] lets Burn acquire the device and wraps its handles;
//!   [`SharedDevice::headless`] and [`SharedDevice::from_context`] hand this crate's device
//!   to Burn.
//! - [`FusedOptimizer`] implements Burn's per-tensor [`Optimizer`](burn::optim::Optimizer)
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
//! # Use
//!
//! This crate runs wgpu-optim's kernels on the tensors of [Burn](https://burn.dev) 0.22's
//! wgpu backend (Burn's version is this crate's concern, not the library's), on one device and one queue:
//!
//! ```rust,ignore
//! use burn::optim::GradientsParams;
//! use wgpu_optim_burn::{FusedOptimizer, ModuleStep, SharedDevice};
//! use wgpu_optim::Adam;
//!
//! let shared = SharedDevice::init()?;              // Burn acquires the device; we share it
//! let device = shared.device().clone().autodiff();  // create the model on this one
//!
//! // Drop-in: Burn's ModuleOptimizer loop, unchanged, one fused kernel per parameter.
//! let mut optim = FusedOptimizer::new(&shared, Adam::adamw())?.init();
//! model = optim.step(lr, model, GradientsParams::from_grads(loss.backward(), &model));
//!
//! // Or the whole module at once: one multi-tensor optimizer over every parameter.
//! let mut step = ModuleStep::builder().build(&shared, Adam::adamw())?;
//! model = step.step(lr, model, GradientsParams::from_grads(loss.backward(), &model))?;
//!
//! // Checkpoints: a Burn optimizer record, bit for bit on resume (before or after a step).
//! let bytes = step.to_bytes()?;
//! step.load_bytes(bytes)?;
//! ```
//!
//! `Adam::adamw()` is PyTorch's AdamW (eps 1e-8, weight decay 0.01). Burn's
//! `AdamWConfig::new()` is another one (eps 1e-5, weight decay 1e-4, in f32): use
//! `Adam::burn_adamw()` for Burn's defaults, or `adam_from_config(&adamw_config)?` to port a
//! config (its betas, eps, weight decay and AMSGrad; cautious weight decay and Burn's
//! per-parameter gradient clipping are refused).
//!
//! - **Drop-in optimizers.** `FusedOptimizer` implements Burn's per-tensor `Optimizer` trait
//!   for every algorithm here (Adam, AdamW, AMSGrad, SGD with momentum or Nesterov, Adagrad,
//!   RMSprop, Lion, AdEMAMix, Schedule-Free AdamW, LAMB, Adafactor, Muon; their sources'
//!   formulas). Its state is Burn tensors named as PyTorch names them (`exp_avg`,
//!   `exp_avg_sq`, `momentum_buffer`, Adafactor's `row_var`/`col_var` in torch's shapes or
//!   `variance`, ...) with the step count, so Burn's optimizer records save and load it
//!   (`optim.into_bytes()` / `from_bytes`), bit for bit.
//! - **Muon and Adafactor in Burn.** Both look at each tensor by its shape, which Burn's
//!   tensors carry. `ModuleStep` builds its optimizers with the module's shapes; the drop-in
//!   builds a one-tensor `Optimizer` per step, copying the state in and out of its Burn
//!   tensors (so it allocates per step: `ModuleStep` is the fast path). Muon takes 2-D
//!   parameters only; as torch users put biases and norms in an AdamW group, both front ends
//!   take a fallback algorithm for the others, and `ModuleStep` runs the module as the two
//!   groups of one optimizer. Both take Burn's one learning rate (`MuonLrAdjust::MatchRmsAdamW`
//!   makes one rate fit both):
//!
//!   ```rust,ignore
//!   let mut step = ModuleStep::builder().fallback(Adam::adamw()).build(&shared, Muon::default())?;
//!   let optim = FusedOptimizer::new(&shared, Muon::default())?.fallback(Adam::adamw())?.init();
//!   ```
//!
//!   Without a fallback, a step on a parameter that is not 2-D is refused with
//!   `Error::BadShape` naming its place and shape (`ModuleStep` hands the module back
//!   unchanged; under Burn's trait, a panic with that reason, `try_step` returns it); a
//!   fallback beside another algorithm than Muon, or a Muon fallback, is refused by name.
//! - **Schedule-Free AdamW in Burn.** Each parameter keeps the package's group values
//!   (`weight_sum`, `lr_max`; `k` is its step count) in its state and records: every tensor a
//!   Burn optimizer steps sees the same rate sequence, so they are its group's. `ModuleStep`
//!   has `eval(module)`/`train(module)` and `mode()`: the fused swap pass on the device,
//!   nothing read back; its records say the mode they were saved in. `FusedOptimizer` has
//!   `eval(&optim, module)`/`train` on a clone of itself (their mode is shared); Burn's
//!   per-tensor trait gives no other access to the state, so these read it through Burn's
//!   record (a copy through the host). A step in eval mode is refused (`Error::EvalMode`; a
//!   panic under Burn's trait).
//! - **Switching from Burn's AdamW mid-run.** Burn's Adam and AdamW records load into
//!   `FusedOptimizer` and `ModuleStep`: their `moment_1`, `moment_2`, `max_moment_2` and
//!   `time` are PyTorch's `exp_avg`, `exp_avg_sq`, `max_exp_avg_sq` and `step` (the same
//!   updates, the step counted from 1), so training continues Burn's trajectory (a test
//!   continues 2 steps within 1e-5 of Burn's own). Any other optimizer's record is refused by
//!   name: `FusedOptimizer::load_bytes` and `ModuleStep::load_bytes` return `Error::Burn`
//!   naming the entry; through Burn's own `from_bytes`, which cannot refuse, the first step on
//!   such a state panics with that reason instead of restarting from zero.
//! - **Module step.** `ModuleStep` updates every parameter with a gradient through one
//!   `Optimizer`: one dispatch per kernel variant and buffer (Burn pools small tensors into
//!   shared buffers), global gradient clipping (`OptimizerBuilder::grad_clip`) and AMP skipping
//!   (`step_unscaled`, capturable mode). Its whole state saves with `step.to_bytes()` and
//!   loads with `step.load_bytes(bytes)`, as a Burn optimizer record (the drop-in's format,
//!   so the two read each other's), before or after the first step, bit for bit on resume.
//!   With 4-bit state (`ModuleStep::builder().state_storage(StateStorage::Q4(Q4States::default()))`, Adam and AdamW)
//!   the record holds it under torchao's names, as the crate's checkpoints do:
//!   `{id}.exp_avg.codes` (U8, two codes per byte), `{id}.exp_avg.scale`, `{id}.exp_avg.qmap`
//!   (checked on load), or `{id}.exp_avg` in f32 for a tensor that keeps f32 state; a record
//!   whose storage does not fit a tensor is refused at its step.
//! - **Parameters without a gradient** (an unused branch, a frozen layer) keep their value
//!   and state, as in Burn, and each parameter counts its own steps (Burn's and PyTorch's
//!   per-parameter step count): a layer unfrozen after `k` steps resumes its bias correction
//!   at its own count. Parameters with equal counts share one optimizer; unequal counts take
//!   one optimizer each, in one submission. Global clipping and AMP cover one optimizer, so
//!   with them a step over unequal counts is refused.
//! - **A refused step hands the module back.** `ModuleStep::step` returns
//!   `Result<M, StepError<M>>`: `StepError { module, error }` carries the module, its values
//!   as they were and the state untouched (`?` converts it to `wgpu_optim::Error`, dropping
//!   the module; match on it, or `into_inner()`, to keep training without keeping a copy).
//!
//! A device made by [`SharedDevice::headless`] or [`SharedDevice::from_context`] is created
//! with the adapter's features and limits (Burn describes a device from its adapter; a device
//! with less is refused). A test interleaves Burn operations and steps and checks both (see
//! Ordering below). Burn's default features (and burn-wgpu's) turn `fusion` on: depend on
//! `burn` with `default-features = false` and name the features you use, e.g.
//! `features = ["std", "wgpu", "autodiff", "autotune"]`.
//!
//! `cargo run --release -p wgpu-optim-burn --example burn_mlp` trains one model from one
//! initialization with Burn's AdamW, the drop-in and the module step, prints the three loss
//! curves and times one optimizer step of each; the repository's `PERF.md` ("Burn") has what
//! it measured: each step within a few f32 ulp of Burn's AdamW, and the module step 5.4 to
//! 13.4 times as fast as Burn's AdamW on lavapipe.
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
//! constructor here refuses that build with [`Error::Burn`](wgpu_optim::Error::Burn); keep
//! `fusion` off (`default-features = false` on `burn`, or `burn-wgpu` without `fusion`).
//!
//! [`Optimizer`]: wgpu_optim::Optimizer

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

pub use config::adam_from_config;
pub use device::SharedDevice;
pub use fused_state::FusedState;
pub use module_step::{ModuleStep, ModuleStepBuilder, StepError};
pub use optimizer::FusedOptimizer;
