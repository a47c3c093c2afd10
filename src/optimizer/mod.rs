//! The stateful optimizer a trainer holds: parameter groups, state buffers, the step count,
//! and everything a step records, built once.
//!
//! One job per module:
//!
//! - `options`: what a trainer chooses ([`ParamGroup`], [`OptimizerBuilder`]).
//! - `validate`: the checks made before anything is created on the device.
//! - `build`: construction, the state's layout in shared buffers and its initial values.
//! - `accessors`: groups, hyperparameters, parameters and state between steps.
//! - `record`: a step's uniforms, the bind-group cache of recent gradient sets, the pass.
//! - `capturable`: device step counter and learning rates, AMP's unscale, scalar readbacks.
//! - `arena`, `clip`, `device`, `written`, `checkpoint`: the shared state buffers, the
//!   gradient-norm passes, the capturable device state, the ranges a step writes, and
//!   save/load.
//! - `passes`: the hooks of the families that are not elementwise (their passes and state
//!   live in their folders, `crate::family::<name>::gpu_passes`).
//! - `mode`: the modes of the families that have them (Schedule-Free's train and eval):
//!   the mode, and the `eval()`/`train()` swap pass their passes prepare.

mod accessors;
mod arena;
mod build;
mod capturable;
#[cfg(feature = "checkpoint")]
mod checkpoint;
mod clip;
pub(crate) mod device;
mod low_bit;
mod mode;
mod options;
pub(crate) mod passes;
mod record;
#[cfg(not(target_arch = "wasm32"))]
mod sharded;
mod validate;
mod written;

pub use options::{OptimizerBuilder, ParamGroup};
use record::Bound;
pub(crate) use record::BOUND_GRADIENT_SETS;

use crate::gpu::dispatch::Uniforms;
use crate::gpu::q4::Q4Engine;
use crate::gpu::q8::Q8Engine;
use crate::{Algorithm, DType, GpuContext, Rounding, Tensor};
use clip::ClipPass;
use device::DeviceState;
use written::WrittenRanges;

/// One parameter group as the optimizer keeps it.
pub(crate) struct Group {
    pub(crate) algorithm: Algorithm,
    /// The group's parameters are `params[first..first + len]`.
    pub(crate) first: usize,
    pub(crate) len: usize,
    /// Capturable mode: the hyperparameters changed, so the uniform must be rewritten
    /// before the next step (host mode rewrites it every step).
    dirty: bool,
}

/// A stateful optimizer over parameter groups.
///
/// ```no_run
/// # fn main() -> wgpu_optim::Result<()> {
/// use wgpu_optim::{Adam, GpuContext, Optimizer};
/// let ctx = GpuContext::headless_blocking()?;
/// let params = vec![ctx.upload_f32("w", &[0.5; 1024])];
/// let grads = vec![ctx.upload_f32("dw", &[0.1; 1024])];
/// let mut opt = Optimizer::builder().build(&ctx, Adam::default(), &params)?;
/// opt.step(&grads)?; // or opt.record_step(&mut encoder, &grads) inside a trainer's encoder
/// # Ok(()) }
/// ```
///
/// # In a trainer
///
/// `record_step` advances the step count when the step is recorded, not when it is submitted,
/// and any number of steps may be recorded before one submit: each step's hyperparameters are
/// copied into place by a command recorded with the step, so they land in order. `step`
/// records and submits one step and counts it once wgpu accepts the submission: a step it
/// refuses is an error that leaves the step count, the parameters and the state as they were.
///
/// - **Any size.** Tensors larger than the adapter's `max_storage_buffer_binding_size` are
///   updated in bound chunks; element counts and offsets are `u64` on the host; a grid-stride
///   loop covers more than 65,535 workgroups.
/// - **Many tensors, one dispatch.** A step over every tensor of every group is one compute
///   pass, and tensors that run the same kernel variant over the same buffers are one
///   dispatch: each is a row of the dispatch's table (up to a few hundred rows), the way
///   `multi_tensor_apply` walks many tensors in one launch, and a workgroup finds its row in
///   one load from the table's workgroup map. The optimizer packs its own state
///   into a few shared buffers; a trainer that keeps its parameters and its gradients in one
///   buffer each (tensors as `Tensor { buffer: flat.clone(), offset: offset_bytes, len, dtype }`) gets one dispatch
///   per variant for the whole model, and one with a buffer per tensor gets one per tensor.
///   On CPU adapters (lavapipe, SwiftShader, WARP) each invocation updates four accesses'
///   worth of elements rather than one, which amortizes the per-invocation table lookup that
///   such an adapter runs as code: Adam on 200 tensors of 4096 took 0.74x the time on lavapipe.
///   Bind groups are built once per gradient set (the last four sets are kept, so a trainer
///   may alternate gradient buffers) and a step creates no GPU objects beyond 256 bytes of
///   staging per group for each step in flight, which is reused. Recording one step of GPT-2
///   small's 148 tensors takes about 9 µs of host time on Zen 4
///   (`cargo bench --bench step -- record_step`).
/// - **Parameter groups** (`ParamGroup`, `OptimizerBuilder::build_groups`) with their own learning
///   rate, betas and weight decay, changed every step with `set_group_algorithm`: these are
///   uniforms, so a schedule compiles nothing.
/// - **Capturable mode** (`OptimizerBuilder::capturable`): the step counter and each group's
///   learning rate live in a device buffer (`lr_tensor`); bias corrections are computed on the
///   device from `ln(beta)` (accurate at small t); nothing is uploaded per step.
/// - **AMP** (`record_unscale`, capturable mode): gradients are unscaled by a device
///   `inv_scale`, and a NaN or infinity sets `found_inf`, which makes the following step leave
///   parameters, state and the step counter untouched, with no host round trip.
/// - **Gradient clipping** (`OptimizerBuilder::grad_clip`, `GradClip { max_norm, norm_type }`,
///   on `Optimizer` and `CpuOptimizer`): PyTorch's `clip_grad_norm_` over every gradient of
///   every group as one vector (L2 or infinity norm), each gradient scaled by
///   `min(1, max_norm / (total_norm + 1e-6))`. On the GPU one multi-tensor dispatch per
///   gradient dtype writes a partial norm per workgroup and one workgroup combines them in a
///   fixed order (no float atomics: the same gradients give the same bits every run); the
///   coefficient stays on the device and the update kernels apply it as they load each
///   gradient, so no pass rewrites the gradients and nothing is read back
///   (`grad_norm` reads the last norm when you want it; `record_grad_norm_copy` copies
///   each step's norm into a buffer of yours, so a log of N steps takes one readback). A NaN norm propagates as in
///   PyTorch; with AMP the norm is taken after unscaling and a skipped step stays skipped.
///   With AMP and f32 gradients, unscaling, the non-finite check and the partial norms share
///   one pass and one read of the gradients; the step then only combines the partials.
///
/// The measurements are in the repository's `PERF.md`.
pub struct Optimizer {
    ctx: GpuContext,
    groups: Vec<Group>,
    params: Vec<Tensor>,
    model_copies: Vec<Tensor>,
    /// `state[i][k]` is parameter i's `state_kinds()[k]` of its group's algorithm.
    state: Vec<Vec<Tensor>>,
    /// Steps recorded (in capturable mode the device's count may be lower: AMP skips).
    step: u64,
    math: DType,
    /// Group g's uniform is slot g.
    uniforms: Uniforms,
    /// The uniforms' next contents (no allocation per step).
    uniform_bytes: Vec<u8>,
    /// Bind groups of the most recently used gradient sets, most recent first.
    bound: Vec<Bound>,
    device: Option<DeviceState>,
    clip: Option<ClipPass>,
    /// [`OptimizerBuilder::param_shapes`]: empty, or each parameter's shape (only
    /// checkpoints read them).
    #[cfg_attr(not(feature = "checkpoint"), allow(dead_code))]
    shapes: Vec<Vec<usize>>,
    /// The last `record_unscale` took the gradient norm of `bound[0]`'s gradients, so the
    /// step after it only finalizes the norm.
    norm_taken_by_unscale: bool,
    rounding: Rounding,
    /// [`crate::OptimizerOptions::origins`]: empty, or each parameter's ordinal and first
    /// element for stochastic rounding.
    origins: Vec<(u32, u64)>,
    /// With 8-bit [`OptimizerBuilder::state_storage`]: the state and its dispatches (then
    /// `state` holds only the f32 states of tensors below `min_8bit_size`).
    q8: Option<Q8Engine>,
    /// With 4-bit [`OptimizerBuilder::state_storage`]: the state and its dispatches.
    q4: Option<Q4Engine>,
    /// Every range a step writes, for the check of each new set of gradients.
    written: WrittenRanges,
    /// The last gradients `record_unscale` found pairwise disjoint, so a trainer that
    /// unscales the same set every step pays for the check once.
    disjoint_grads: Vec<Tensor>,
    /// The passes and per-group state of the families that are not elementwise, one entry
    /// per such family among the groups.
    passes: Vec<Box<dyn passes::GroupPasses>>,
}

impl std::fmt::Debug for Optimizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Optimizer")
            .field("groups", &self.groups.iter().map(|g| (g.algorithm, g.len)).collect::<Vec<_>>())
            .field("step", &self.step)
            .field("capturable", &self.device.is_some())
            .finish()
    }
}
