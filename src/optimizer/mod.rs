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
