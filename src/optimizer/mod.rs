//! The stateful optimizer a trainer holds: parameter groups, state buffers, the step count,
//! and everything a step records, built once.

mod arena;
#[cfg(feature = "checkpoint")]
mod checkpoint;
mod clip;
pub(crate) mod device;
mod written;

use crate::gpu::dispatch::{Batch, DeviceScalars, Uniforms};
use crate::gpu::kernel::{Program, Scalars, VariantKey};
use crate::gpu::plan::{check_range, plan, slot_args, Arg, KernelArgs, SlotArgs};
use crate::gpu::q8::Q8Engine;
use crate::gpu::transfer::check_readable;
use crate::q8::Q8States;
use crate::step::rounding::RoundingHeader;
use crate::step::UNIFORM_SLOT_BYTES;
use crate::{Algorithm, DType, Error, GpuContext, GradClip, Result, Rounding, StateKind, Tensor};
use clip::{BoundNorm, ClipPass};
use device::DeviceState;
use written::WrittenRanges;

/// Gradient sets whose bind groups are kept: a trainer that alternates two (or a few)
/// gradient buffers binds each once.
const BOUND_GRADIENT_SETS: usize = 4;

/// Parameters that share hyperparameters, as in PyTorch's `param_groups` (e.g. no weight
/// decay on biases and norms).
#[derive(Clone, Debug)]
pub struct ParamGroup {
    /// The group's algorithm and hyperparameters.
    pub algorithm: Algorithm,
    /// The group's parameters.
    pub params: Vec<Tensor>,
}

impl ParamGroup {
    /// A group of `params` updated by `algorithm`.
    pub fn new(algorithm: impl Into<Algorithm>, params: &[Tensor]) -> Self {
        ParamGroup { algorithm: algorithm.into(), params: params.to_vec() }
    }
}

/// Choices made once, when an optimizer is built.
#[derive(Clone, Debug, Default)]
pub struct OptimizerOptions {
    /// The storage dtype of every state tensor; `None` keeps each parameter's dtype, as
    /// PyTorch does. f32 state for f16 or bf16 parameters is the common mix; all math is
    /// f32 either way and each store rounds once to nearest even.
    pub state_dtype: Option<DType>,
    /// One low-precision copy per parameter (same length, usually f16 or bf16, each with its
    /// own memory), which every step writes with the new parameter values in the same
    /// dispatch, so the model reads its copy with no separate cast pass. The parameters are
    /// then the f32 masters, which the caller made. [`Self::master_weights`] does this for you.
    pub model_copies: Vec<Tensor>,
    /// Master-weight mode: the parameters given (in every group) are the model's, usually
    /// f16 or bf16; the optimizer keeps f32 masters of them (read once, so the model's
    /// buffers need `COPY_SRC`), f32 state unless [`Self::state_dtype`] says otherwise, and
    /// writes the rounded new values into the model's tensors in the same dispatch as the
    /// update. [`Optimizer::params`] are then the masters and [`Optimizer::model_copies`]
    /// the model's tensors; construction errors name the latter `model_params[i]`.
    /// Composes with groups and capturable mode; excludes [`Self::model_copies`].
    /// Loading a checkpoint restores the model's tensors too, which needs `COPY_DST`.
    pub master_weights: bool,
    /// Capturable mode: the step counter and each group's learning rate live in a device
    /// buffer; the step is counted on the device and bias corrections are computed there,
    /// so nothing is read back or written from the host per step. Needed for AMP skipping
    /// ([`Optimizer::record_unscale`]).
    pub capturable: bool,
    /// Clip the global norm of all gradients (every group) before each step, as PyTorch's
    /// `clip_grad_norm_` does: on the GPU a deterministic two-dispatch reduction whose
    /// coefficient stays on the device and scales each gradient inside the update kernels
    /// as it is loaded (the gradient buffers are not rewritten; a 16-bit gradient is
    /// scaled in f32, not rounded back to its dtype first). [`Optimizer::read_grad_norm`]
    /// reads the last norm. Composes with groups, master weights, 8-bit state and capturable
    /// mode (after [`Optimizer::record_unscale`] the norm is that of the unscaled gradients).
    pub grad_clip: Option<GradClip>,
    /// How 16-bit stores round ([`Rounding`]): to nearest even (the default),
    /// stochastically, or with a Kahan compensation buffer per parameter. Stochastic and
    /// Kahan rounding need every parameter to be F16 or BF16 ([`Error::DTypeMismatch`]
    /// otherwise) and exclude [`Self::master_weights`] and [`Self::model_copies`]
    /// ([`Error::ConflictingOptions`]). The CPU backend honours it too, with the same bits.
    pub rounding: Rounding,
    /// Each parameter's shape (numbered across groups, as the checkpoint numbers them), so
    /// that checkpoints of either backend hold every state tensor (masters and Kahan
    /// compensations too) in its parameter's shape, as PyTorch's `state_dict` does
    /// (`tools/torch_checkpoint.py` converts between the two). Empty (the default): every
    /// tensor is saved flat, `[len]`. Otherwise one shape per parameter, whose elements
    /// multiply to its length ([`Error::CountMismatch`], or [`Error::LengthMismatch`]
    /// naming `param_shapes[i]` and the shape, with nothing created, otherwise). Loading
    /// takes a tensor stored flat or in this shape, and any shape of the parameter's length
    /// when this is empty.
    pub param_shapes: Vec<Vec<usize>>,
    /// Blockwise 8-bit state, bitsandbytes' format ([`Q8States`]): Adam's moments or SGD's
    /// momentum as one byte per element plus one f32 per block of 256, for every tensor of
    /// at least `min_8bit_size` elements (f32 state below). Needs F32 parameters; excludes
    /// `state_dtype`, `capturable`, `master_weights`, `model_copies` and non-default
    /// `rounding` ([`Error::ConflictingOptions`]), AMSGrad and Adagrad.
    pub q8_states: Option<Q8States>,
}

/// [`OptimizerOptions::param_shapes`] against the parameters' lengths.
pub(crate) fn check_shapes(shapes: &[Vec<usize>], lens: &[u64]) -> Result<()> {
    if shapes.is_empty() {
        return Ok(());
    }
    if shapes.len() != lens.len() {
        return Err(Error::CountMismatch {
            argument: "param_shapes".into(),
            got: shapes.len(),
            expected: lens.len(),
        });
    }
    for (i, (shape, len)) in shapes.iter().zip(lens).enumerate() {
        let elements = shape.iter().try_fold(1u64, |n, d| n.checked_mul(*d as u64));
        if elements != Some(*len) {
            return Err(Error::LengthMismatch {
                argument: format!("param_shapes[{i}] {shape:?}"),
                got: elements.unwrap_or(u64::MAX),
                expected: *len,
                reference: format!("params[{i}]"),
            });
        }
    }
    Ok(())
}

/// One parameter group as the optimizer keeps it.
struct Group {
    algorithm: Algorithm,
    /// The group's parameters are `params[first..first + len]`.
    first: usize,
    len: usize,
    /// Capturable mode: the hyperparameters changed, so the uniform must be rewritten
    /// before the next step (host mode rewrites it every step).
    dirty: bool,
}

/// Bind groups for one set of gradient tensors, a batch per parameter group.
struct Bound {
    grads: Vec<Tensor>,
    batches: Vec<Batch>,
    /// The gradient-norm pass over `grads` when clipping, built at the first step that
    /// needs it.
    norm: Option<BoundNorm>,
    /// With clipping and AMP: the unscale pass that takes the norm in the same read of
    /// `grads` (f32 gradients), built at the first [`Optimizer::record_unscale`] with them.
    unscale_norm: Option<BoundNorm>,
}

/// A stateful optimizer over parameter groups.
///
/// ```no_run
/// # fn main() -> wgpu_optim::Result<()> {
/// use wgpu_optim::{Adam, GpuContext, Optimizer};
/// let ctx = GpuContext::headless_blocking()?;
/// let params = vec![ctx.upload_f32("w", &[0.5; 1024])];
/// let grads = vec![ctx.upload_f32("dw", &[0.1; 1024])];
/// let mut opt = Optimizer::new(&ctx, Adam::default(), &params)?;
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
    /// [`OptimizerOptions::param_shapes`]: empty, or each parameter's shape (only
    /// checkpoints read them).
    #[cfg_attr(not(feature = "checkpoint"), allow(dead_code))]
    shapes: Vec<Vec<usize>>,
    /// The last `record_unscale` took the gradient norm of `bound[0]`'s gradients, so the
    /// step after it only finalizes the norm.
    norm_taken_by_unscale: bool,
    rounding: Rounding,
    /// With [`OptimizerOptions::q8_states`]: the state and its dispatches (then `state`
    /// holds only the f32 states of tensors below `min_8bit_size`).
    q8: Option<Q8Engine>,
    /// Every range a step writes, for the check of each new set of gradients.
    written: WrittenRanges,
    /// The last gradients `record_unscale` found pairwise disjoint, so a trainer that
    /// unscales the same set every step pays for the check once.
    disjoint_grads: Vec<Tensor>,
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

impl Optimizer {
    /// An optimizer over `params` with zeroed state (Adagrad: its initial accumulator
    /// value), at step 0, keeping state in each parameter's dtype.
    ///
    /// The parameter buffers need `STORAGE` usage.
    pub fn new(ctx: &GpuContext, algorithm: impl Into<Algorithm>, params: &[Tensor]) -> Result<Self> {
        Self::with_options(ctx, algorithm, params, OptimizerOptions::default())
    }

    /// An optimizer over one group of `params` with the given [`OptimizerOptions`].
    pub fn with_options(
        ctx: &GpuContext,
        algorithm: impl Into<Algorithm>,
        params: &[Tensor],
        options: OptimizerOptions,
    ) -> Result<Self> {
        Self::with_groups(ctx, vec![ParamGroup::new(algorithm, params)], options)
    }

    /// Master-weight mode over a model's low-precision parameters: the optimizer keeps f32
    /// master copies (initialized from `model_params`, which therefore need `STORAGE` and
    /// `COPY_SRC`, and `COPY_DST` to load a checkpoint) and f32 state, and each step writes
    /// the rounded new values back into `model_params`. Errors name them `model_params[i]`.
    ///
    /// The same as [`Self::with_options`] with [`OptimizerOptions::master_weights`] set, which
    /// also takes groups ([`Self::with_groups`]) and capturable mode.
    pub fn master_weights(
        ctx: &GpuContext,
        algorithm: impl Into<Algorithm>,
        model_params: &[Tensor],
    ) -> Result<Self> {
        let options = OptimizerOptions { master_weights: true, ..Default::default() };
        Self::with_options(ctx, algorithm, model_params, options)
    }

    /// An optimizer over parameter groups, each with its own algorithm and hyperparameters.
    /// Parameters are numbered across groups in order (for [`Self::state`] and the
    /// gradients of [`Self::record_step`]).
    ///
    /// Refused, with nothing created on the device, when there is no parameter at all
    /// ([`Error::NoParameters`]), when two parameters (in any groups) or model copies share
    /// a byte ([`Error::OverlappingParams`]), or when a tensor cannot be bound: range, usage
    /// and a last element that ends inside its buffer's last 4-byte word ([`Error::BadRange`],
    /// [`Error::MissingUsage`]). A group may be empty.
    ///
    /// In master-weight mode the masters are read from the model's tensors, which blocks: in
    /// wasm32 builds that returns [`Error::Readback`]; use [`Self::with_groups_async`].
    pub fn with_groups(ctx: &GpuContext, groups: Vec<ParamGroup>, options: OptimizerOptions) -> Result<Self> {
        Self::with_groups_read(ctx, groups, options, None)
    }

    /// [`Self::with_groups`] for callers that must not block (a browser's main thread): in
    /// master-weight mode the model's tensors are read back with awaited readbacks. Refuses
    /// exactly as [`Self::with_groups`] does.
    pub async fn with_groups_async(
        ctx: &GpuContext,
        groups: Vec<ParamGroup>,
        options: OptimizerOptions,
    ) -> Result<Self> {
        let mut read = None;
        if options.master_weights {
            let mut values = Vec::new();
            for p in groups.iter().flat_map(|g| &g.params) {
                // A tensor that cannot be read is refused below, by name, before any reading.
                match ctx.read_async(p).await {
                    Ok(v) => values.push(v),
                    Err(_) => break,
                }
            }
            if values.len() == groups.iter().map(|g| g.params.len()).sum::<usize>() {
                read = Some(values);
            }
        }
        Self::with_groups_read(ctx, groups, options, read)
    }

    /// [`Self::master_weights`] for callers that must not block (see [`Self::with_groups_async`]).
    pub async fn master_weights_async(
        ctx: &GpuContext,
        algorithm: impl Into<Algorithm>,
        model_params: &[Tensor],
    ) -> Result<Self> {
        let options = OptimizerOptions { master_weights: true, ..Default::default() };
        Self::with_groups_async(ctx, vec![ParamGroup::new(algorithm, model_params)], options).await
    }

    /// [`Self::with_groups`], in master-weight mode with the model's values already `read`
    /// (in parameter order) when given.
    fn with_groups_read(
        ctx: &GpuContext,
        groups: Vec<ParamGroup>,
        options: OptimizerOptions,
        read: Option<Vec<Vec<f64>>>,
    ) -> Result<Self> {
        for group in &groups {
            group.algorithm.validate()?;
        }
        if let Some(clip) = &options.grad_clip {
            clip.validate()?;
        }
        check_rounding_options(&options)?;
        if options.q8_states.is_some() {
            let algorithms: Vec<Algorithm> = groups.iter().map(|g| g.algorithm).collect();
            let dtypes = groups.iter().flat_map(|g| g.params.iter().map(|p| p.dtype));
            crate::q8::check_options(&algorithms, &options, dtypes)?;
        }
        let (groups, options) = master_copies(ctx, groups, options, read)?;
        let params: Vec<Tensor> = groups.iter().flat_map(|g| g.params.iter().cloned()).collect();
        let math = check_params(&params, &options)?;
        check_shapes(&options.param_shapes, &params.iter().map(|p| p.len).collect::<Vec<_>>())?;
        check_rounding_dtypes(options.rounding, params.iter().map(|p| p.dtype), "params")?;
        if options.capturable && math == DType::F64 {
            return Err(Error::DTypeMismatch {
                argument: "params".into(),
                got: DType::F64,
                expected:
                    "F32, F16 or BF16 in capturable mode (the device computes the step's scalars in f32)"
                        .into(),
            });
        }
        let device = if options.capturable {
            Some(DeviceState::new(ctx, &groups.iter().map(|g| g.algorithm.lr()).collect::<Vec<_>>())?)
        } else {
            None
        };
        // Every parameter's state tensors, kind by kind, so that each kind's tensors sit
        // together in the shared buffers.
        let kinds = groups.iter().map(|g| g.algorithm.state_kinds().len()).max().unwrap_or(0);
        let mut requests = Vec::new();
        let q8 = match options.q8_states {
            Some(config) => {
                let algorithms: Vec<Algorithm> = groups.iter().map(|g| g.algorithm).collect();
                let owners: Vec<usize> = groups
                    .iter()
                    .enumerate()
                    .flat_map(|(g, group)| group.params.iter().map(move |_| g))
                    .collect();
                let clip = options.grad_clip.is_some();
                Some(Q8Engine::new(ctx, config, &params, &owners, &algorithms, clip)?)
            }
            None => None,
        };
        // 8-bit state lives in the engine.
        let kinds = if q8.is_some() { 0 } else { kinds };
        for k in 0..kinds {
            for group in &groups {
                let kinds = group.algorithm.state_kinds();
                for p in group.params.iter().filter(|_| k < kinds.len()) {
                    requests.push((p, options.state_dtype.unwrap_or(p.dtype)));
                }
            }
        }
        // Kahan compensations last, each in its parameter's dtype.
        let kahan = options.rounding == Rounding::Kahan;
        for group in groups.iter().filter(|_| kahan) {
            requests.extend(group.params.iter().map(|p| (p, p.dtype)));
        }
        let mut allocated = arena::allocate(ctx, "optimizer state", &requests).into_iter();
        let mut state: Vec<Vec<Tensor>> = groups
            .iter()
            .flat_map(|g| g.params.iter().map(|_| Vec::with_capacity(g.algorithm.state_kinds().len())))
            .collect();
        for k in 0..kinds {
            let mut i = 0;
            for group in &groups {
                for _ in &group.params {
                    if k < group.algorithm.state_kinds().len() {
                        state[i].extend(allocated.next());
                    }
                    i += 1;
                }
            }
        }
        for tensors in state.iter_mut().filter(|_| kahan) {
            tensors.extend(allocated.next());
        }
        if let Some(engine) = &q8 {
            for (i, (tensors, group)) in
                state.iter_mut().zip(groups.iter().flat_map(|g| g.params.iter().map(move |_| g))).enumerate()
            {
                for kind in group.algorithm.state_kinds() {
                    tensors.extend(engine.f32_state(i, *kind));
                }
            }
        }
        let mut kept = Vec::with_capacity(groups.len());
        let mut uniform_bytes = vec![0u8; groups.len() * UNIFORM_SLOT_BYTES as usize];
        let mut first = 0;
        for (group, bytes) in
            groups.into_iter().zip(uniform_bytes.chunks_exact_mut(UNIFORM_SLOT_BYTES as usize))
        {
            let initial = group.algorithm.initial_state();
            if initial != 0.0 {
                for (p, tensors) in group.params.iter().zip(&state[first..]) {
                    for tensor in tensors.iter().take(group.algorithm.state_kinds().len()) {
                        ctx.write(tensor, &vec![initial; p.len as usize])?;
                    }
                }
            }
            // Capturable kernels derive the step's values on the device from step 1's.
            group.algorithm.kernel_step(1).write_uniform(math, bytes);
            write_rounding(options.rounding, 1, bytes);
            kept.push(Group { algorithm: group.algorithm, first, len: group.params.len(), dirty: false });
            first += group.params.len();
        }
        let scalars = device.as_ref().map(|d| DeviceScalars {
            state: d.buffer(),
            lr_offsets: (0..kept.len()).map(|g| d.lr_offset(g)).collect(),
        });
        let clip = options
            .grad_clip
            .map(|c| ClipPass::new(ctx, c, device.as_ref().map(DeviceState::buffer)))
            .transpose()?;
        let uniforms =
            Uniforms::new(ctx, &uniform_bytes, "optimizer", scalars, clip.as_ref().map(ClipPass::buffer))?;
        let mut optimizer = Optimizer {
            ctx: ctx.clone(),
            groups: kept,
            params,
            model_copies: options.model_copies,
            shapes: options.param_shapes,
            state,
            step: 0,
            math,
            uniforms,
            uniform_bytes,
            bound: Vec::new(),
            device,
            clip,
            norm_taken_by_unscale: false,
            rounding: options.rounding,
            q8,
            written: WrittenRanges::default(),
            disjoint_grads: Vec::new(),
        };
        optimizer.written = WrittenRanges::new(&optimizer);
        Ok(optimizer)
    }

    /// How the optimizer's 16-bit stores round ([`OptimizerOptions::rounding`]).
    pub fn rounding(&self) -> Rounding {
        self.rounding
    }

    /// The state kinds parameter tensors of `algorithm` keep here: the algorithm's, then the
    /// Kahan compensation where the rounding keeps one.
    fn state_kinds(&self, algorithm: &Algorithm) -> Vec<StateKind> {
        let mut kinds = algorithm.state_kinds().to_vec();
        if self.rounding == Rounding::Kahan {
            kinds.push(StateKind::KahanCompensation);
        }
        kinds
    }

    /// How many parameter groups there are.
    pub fn group_count(&self) -> usize {
        self.groups.len()
    }

    /// Group `g`'s algorithm and hyperparameters.
    pub fn group_algorithm(&self, g: usize) -> Option<&Algorithm> {
        self.groups.get(g).map(|group| &group.algorithm)
    }

    /// Group `g`'s parameters.
    pub fn group_params(&self, g: usize) -> Option<&[Tensor]> {
        self.groups.get(g).map(|group| &self.params[group.first..group.first + group.len])
    }

    /// Sets every group's learning rate to `lr` from the next step on; no pipeline is
    /// rebuilt. All groups get the same value, so ratios between groups (a head trained at
    /// 10x the base rate) are not kept: to scale a schedule per group, call
    /// [`Self::set_group_lr`] for each with its own rate. A refused `lr` changes no group.
    pub fn set_lr(&mut self, lr: f64) -> Result<()> {
        for g in 0..self.groups.len() {
            let next = self.groups[g].algorithm.with_lr(lr);
            self.set_group_algorithm(g, next)?;
        }
        Ok(())
    }

    /// Sets group `g`'s learning rate from the next step on, leaving its other
    /// hyperparameters and every other group as they are ([`Error::NoSuchGroup`] for a `g`
    /// past the groups).
    pub fn set_group_lr(&mut self, g: usize, lr: f64) -> Result<()> {
        let groups = self.groups.len();
        let algorithm = self.group_algorithm(g).ok_or(Error::NoSuchGroup { index: g, groups })?.with_lr(lr);
        self.set_group_algorithm(g, algorithm)
    }

    /// Changes group `g`'s hyperparameters from the next step on (a schedule). Learning
    /// rate, betas, eps, momentum, dampening and weight decay are uniforms and change no
    /// pipeline. The new algorithm must keep the same state tensors (no switching AMSGrad
    /// or momentum on or off). In capturable mode the new learning rate is written to the
    /// device (at the next submit).
    pub fn set_group_algorithm(&mut self, g: usize, algorithm: impl Into<Algorithm>) -> Result<()> {
        let algorithm = algorithm.into();
        algorithm.validate()?;
        let groups = self.groups.len();
        let group = self.groups.get_mut(g).ok_or(Error::NoSuchGroup { index: g, groups })?;
        if algorithm.state_kinds() != group.algorithm.state_kinds() {
            return Err(Error::StateMismatch {
                argument: format!("algorithm (for group {g})"),
                got: algorithm.state_kinds().to_vec(),
                expected: group.algorithm.state_kinds().to_vec(),
            });
        }
        let variant_changed =
            algorithm.kernel_step(1).switches() != group.algorithm.kernel_step(1).switches();
        if let Some(device) = &self.device {
            if algorithm.lr() != group.algorithm.lr() {
                device.write_lr(&self.ctx, g, algorithm.lr());
            }
        }
        if let Some(engine) = &mut self.q8 {
            engine.set_algorithm(g, &algorithm);
        }
        group.algorithm = algorithm;
        group.dirty = true;
        if variant_changed {
            self.bound.clear();
        }
        Ok(())
    }

    /// The parameters, numbered across groups (in master-weight mode, the f32 masters).
    pub fn params(&self) -> &[Tensor] {
        &self.params
    }

    /// The model copies (in master-weight mode, the model's own tensors); empty otherwise.
    pub fn model_copies(&self) -> &[Tensor] {
        &self.model_copies
    }

    /// Steps recorded so far. In capturable mode, steps that AMP skipped are counted here
    /// but not by the device ([`Self::read_device_step`]).
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// Parameter `index`'s state tensor of `kind`, if its algorithm keeps one.
    ///
    /// With [`OptimizerOptions::q8_states`] only the f32 states of tensors below
    /// `min_8bit_size` are tensors: for a state kept in 8 bits this returns `None`, though
    /// the parameter has one. Read those with [`Self::read_q8_state`] (codes and absmax, or
    /// the values through [`StoredState::values`](crate::q8::StoredState::values)).
    pub fn state(&self, index: usize, kind: StateKind) -> Option<&Tensor> {
        let group = self.groups.iter().find(|g| (g.first..g.first + g.len).contains(&index))?;
        let k = self.state_kinds(&group.algorithm).iter().position(|s| *s == kind)?;
        self.state.get(index)?.get(k)
    }

    /// With [`OptimizerOptions::q8_states`]: parameter `index`'s state of `kind` as stored,
    /// 8-bit codes and absmax (or f32 values below `min_8bit_size`), read back after every
    /// submitted step; `None` where the parameter keeps no such state. Refused without
    /// 8-bit state ([`Error::NeedsOption`]).
    pub fn read_q8_state(&self, index: usize, kind: StateKind) -> Result<Option<crate::q8::StoredState>> {
        let engine = self.q8.as_ref().ok_or_else(|| needs_q8("read_q8_state"))?;
        engine.read(&self.ctx, index, kind)
    }

    /// [`Self::read_q8_state`] as a future, for callers that must not block (a browser's
    /// main thread, where the blocking form returns [`Error::Readback`]).
    pub async fn read_q8_state_async(
        &self,
        index: usize,
        kind: StateKind,
    ) -> Result<Option<crate::q8::StoredState>> {
        let engine = self.q8.as_ref().ok_or_else(|| needs_q8("read_q8_state"))?;
        engine.read_async(&self.ctx, index, kind).await
    }

    /// With [`OptimizerOptions::q8_states`]: replaces parameter `index`'s state of `kind`
    /// (queued, so it lands before the next submitted step). Refused, with nothing written,
    /// without 8-bit state ([`Error::NeedsOption`]), for a parameter or kind the optimizer
    /// does not have, or when `state` is not stored as this tensor's is (8-bit at and above
    /// `min_8bit_size`, f32 below), has another length, lacks one absmax per block, or has
    /// an absmax that is NaN, infinite or negative ([`Error::BadValue`], naming the block).
    pub fn write_q8_state(
        &self,
        index: usize,
        kind: StateKind,
        state: &crate::q8::StoredState,
    ) -> Result<()> {
        let engine = self.q8.as_ref().ok_or_else(|| needs_q8("write_q8_state"))?;
        engine.write(&self.ctx, index, kind, state)
    }

    /// The 8-bit state's engine, for tests that pick its kernel.
    #[cfg(test)]
    pub(crate) fn q8_engine_mut(&mut self) -> Option<&mut Q8Engine> {
        self.q8.as_mut()
    }

    /// With 8-bit state: the step, one dispatch per variant, group and set of buffers, after
    /// the norm pass when clipping.
    fn record_q8_step(&mut self, encoder: &mut wgpu::CommandEncoder, grads: &[Tensor]) -> Result<()> {
        self.check_grads(grads)?;
        let Some(engine) = &mut self.q8 else { return Ok(()) };
        engine.bind(&self.ctx, &self.params, grads)?;
        // With 8-bit state `bound` holds only the norm passes: the engine holds the update's
        // dispatches.
        if let Some(clip) = &self.clip {
            if let Some(k) = self.bound.iter().position(|b| b.grads == grads) {
                let hit = self.bound.remove(k);
                self.bound.insert(0, hit);
            } else {
                let norm = clip.bind(&self.ctx, grads, None)?;
                self.bound.truncate(BOUND_GRADIENT_SETS - 1);
                let bound = Bound {
                    grads: grads.to_vec(),
                    batches: Vec::new(),
                    norm: Some(norm),
                    unscale_norm: None,
                };
                self.bound.insert(0, bound);
            }
        }
        let t = self.step + 1;
        let slots = self.uniform_bytes.chunks_exact_mut(UNIFORM_SLOT_BYTES as usize);
        for (group, bytes) in self.groups.iter_mut().zip(slots) {
            group.algorithm.kernel_step(t).write_uniform(self.math, bytes);
            group.dirty = false;
        }
        self.uniforms.record_write(encoder, &self.uniform_bytes)?;
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("wgpu-optim 8-bit step"),
            timestamp_writes: None,
        });
        if let (Some(clip), Some(norm)) = (&self.clip, self.bound.first().and_then(|b| b.norm.as_ref())) {
            clip.record(&mut pass, norm);
        }
        engine.record(&mut pass, &self.uniforms.bind_groups);
        drop(pass);
        self.step = t;
        Ok(())
    }

    /// Records one step into the caller's encoder; nothing is submitted. Any number of steps
    /// may be recorded before the encoders are submitted: each step's hyperparameters are
    /// copied into place by a command recorded with it, so they land in recording order.
    ///
    /// The step count advances here, when the step is recorded, not when it is submitted.
    /// Every group's update goes into one compute pass. Bind groups are built on the first
    /// step with a set of gradient tensors and kept for the last few sets (a trainer may
    /// alternate gradient buffers); with a known set a step creates no GPU objects, beyond
    /// 256 bytes of staging per group for each step in flight, which is reused once that
    /// step's submission has run. On error nothing is recorded and the step count is unchanged.
    ///
    /// `grads[i]` is `params[i]`'s gradient, of its length, in memory of its own or exactly
    /// `params[i]` (each element is read before it is written). A gradient that shares a byte
    /// with another parameter, a model copy or a state tensor is refused
    /// ([`Error::OverlapsWritten`], naming both): the step updates every tensor in one pass,
    /// so it would read values already updated.
    pub fn record_step(&mut self, encoder: &mut wgpu::CommandEncoder, grads: &[Tensor]) -> Result<()> {
        self.ctx.check_alive()?;
        if self.q8.is_some() {
            return self.record_q8_step(encoder, grads);
        }
        // Taken for these gradients only; the plain norm pass is right in any case, since it
        // reads the gradients the unscale pass left.
        let norm_taken = std::mem::take(&mut self.norm_taken_by_unscale)
            && self.bound.first().is_some_and(|b| b.grads == grads);
        self.bind(grads)?;
        // The plain norm pass, built at the first step that needs it (with AMP and f32
        // gradients the unscale pass takes the norm instead).
        if let (Some(clip), Some(bound)) = (&self.clip, self.bound.first_mut()) {
            if !norm_taken && bound.norm.is_none() {
                bound.norm = Some(clip.bind(&self.ctx, grads, None)?);
            }
        }
        let t = self.step + 1;
        // Capturable kernels derive the step's values on the device, so their uniform only
        // changes with the hyperparameters; host-mode uniforms change every step.
        let capturable = self.device.is_some();
        if !capturable || self.groups.iter().any(|g| g.dirty) {
            let slots = self.uniform_bytes.chunks_exact_mut(UNIFORM_SLOT_BYTES as usize);
            for (group, bytes) in self.groups.iter_mut().zip(slots) {
                let at = if capturable { 1 } else { t };
                group.algorithm.kernel_step(at).write_uniform(self.math, bytes);
                write_rounding(self.rounding, at, bytes);
                group.dirty = false;
            }
            self.uniforms.record_write(encoder, &self.uniform_bytes)?;
        }
        if let Some(device) = &mut self.device {
            device.prepare_step(encoder);
        }
        let bound = &self.bound[0];
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("wgpu-optim step"),
            timestamp_writes: None,
        });
        if let Some(device) = &self.device {
            device.record_advance(&mut pass);
        }
        if let Some(clip) = &self.clip {
            match (&bound.unscale_norm, &bound.norm) {
                (Some(taken), _) if norm_taken => clip.record_finalize(&mut pass, taken),
                (_, Some(norm)) => clip.record(&mut pass, norm),
                _ => {}
            }
        }
        for (batch, scalars) in bound.batches.iter().zip(&self.uniforms.bind_groups) {
            batch.record(&mut pass, scalars);
        }
        drop(pass);
        self.step = t;
        Ok(())
    }

    /// Records one step and submits it.
    pub fn step(&mut self, grads: &[Tensor]) -> Result<()> {
        let ctx = self.ctx.clone();
        ctx.submit("wgpu-optim step", |encoder| self.record_step(encoder, grads)).map(|_| ())
    }

    /// Makes the bind groups for `grads` the first of `bound`, building them unless they
    /// are among the sets already bound.
    fn bind(&mut self, grads: &[Tensor]) -> Result<()> {
        if let Some(k) = self.bound.iter().position(|b| b.grads == grads) {
            // Most recent first; a set is a couple of vectors, so the move is cheap.
            let hit = self.bound.remove(k);
            self.bound.insert(0, hit);
            return Ok(());
        }
        self.check_grads(grads)?;
        let scalars = if self.device.is_some() { Scalars::Device } else { Scalars::Host };
        let scalar_bindings = scalars.storage_bindings(self.clip.is_some());
        let limit = self.ctx.device().limits().max_storage_buffers_per_shader_stage;
        let mut batches = Vec::with_capacity(self.groups.len());
        for group in &self.groups {
            let step = group.algorithm.kernel_step(1);
            let program = Program::Update(step.switches());
            let mut items = Vec::with_capacity(group.len);
            for (i, grad) in grads.iter().enumerate().skip(group.first).take(group.len) {
                let args = self.kernel_args(&group.algorithm, i, grad);
                let mut tensor_plan = plan(&self.ctx, program, &args)?;
                tensor_plan.ordinal = i as u32;
                let needed = tensor_plan.layout.bindings.len() as u32 + scalar_bindings;
                if needed > limit {
                    return Err(Error::TooManyBindings { needed, limit });
                }
                let key = VariantKey::new(scalars, program, self.math, tensor_plan.layout.clone())
                    .clipped(self.clip.is_some())
                    .with_stochastic(self.rounding.stochastic());
                items.push((key, tensor_plan));
            }
            batches.push(Batch::build(&self.ctx, &items, "optimizer")?);
        }
        self.bound.truncate(BOUND_GRADIENT_SETS - 1);
        self.bound.insert(0, Bound { grads: grads.to_vec(), batches, norm: None, unscale_norm: None });
        Ok(())
    }

    /// Capturable mode: group `g`'s learning rate on the device, an f32 tensor of one
    /// element that a trainer's scheduler may write from its own shaders or the queue.
    pub fn lr_tensor(&self, g: usize) -> Option<Tensor> {
        let device = self.device.as_ref()?;
        (g < self.groups.len()).then(|| device.lr_tensor(g))
    }

    /// Capturable mode: reads the device's step counter (steps taken, AMP skips excluded).
    pub fn read_device_step(&self) -> Result<u64> {
        let device = self.device.as_ref().ok_or_else(not_capturable)?;
        let bytes = self.ctx.read_bytes(&device.step_bytes())?;
        Ok(u64::from(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])))
    }

    /// With [`OptimizerOptions::grad_clip`]: reads the global gradient norm of the last
    /// submitted step (PyTorch's `clip_grad_norm_` return value, before clipping). Waits for
    /// that one value; the step path itself never reads anything back.
    ///
    /// Each call is a round trip: it copies 4 bytes to a staging buffer, submits, and blocks
    /// until the device has finished every submitted step and the copy is mapped. A trainer
    /// that logs the norm of every step should not call it per step (that serializes host
    /// and device, and recording several steps per submit would keep only the last norm):
    /// [`Self::record_grad_norm_copy`] keeps each step's norm on the device, to be read back
    /// in one readback every N steps.
    pub fn read_grad_norm(&self) -> Result<f64> {
        let clip = self
            .clip
            .as_ref()
            .ok_or(Error::NeedsOption { what: "a gradient norm".into(), option: "grad_clip" })?;
        let bytes = self.ctx.read_bytes(&clip.total_norm())?;
        Ok(f64::from(f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])))
    }

    /// With [`OptimizerOptions::grad_clip`]: records into `encoder` a copy of the gradient
    /// norm of the step recorded last (the value [`Self::read_grad_norm`] would read after
    /// it: the f32 norm before clipping, 4 little-endian bytes) into `dst` at byte `offset`.
    /// Recorded after each step, into consecutive slots of a trainer's buffer, it keeps every
    /// step's norm on the device, so N steps (recorded in one encoder or several) are read
    /// back with one readback instead of N. Refused, with nothing recorded, without clipping
    /// ([`Error::NeedsOption`]), for a `dst` without `COPY_DST` ([`Error::MissingUsage`]), or
    /// for an `offset` that is not a multiple of 4 or leaves no 4 bytes in `dst`
    /// ([`Error::BadRange`]).
    pub fn record_grad_norm_copy(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        dst: &wgpu::Buffer,
        offset: u64,
    ) -> Result<()> {
        let clip = self
            .clip
            .as_ref()
            .ok_or(Error::NeedsOption { what: "a gradient norm".into(), option: "grad_clip" })?;
        crate::gpu::transfer::check_writable(&Arg::new("dst", &Tensor::new(dst, offset, 1, DType::F32)))?;
        let norm = clip.total_norm();
        encoder.copy_buffer_to_buffer(&norm.buffer, norm.offset, dst, offset, norm.byte_len());
        Ok(())
    }

    /// Capturable mode: reads the AMP flag of the last unscale (true: that step was skipped).
    pub fn read_found_inf(&self) -> Result<bool> {
        let device = self.device.as_ref().ok_or_else(not_capturable)?;
        let bytes = self.ctx.read_bytes(&device.found_inf_bytes())?;
        Ok(bytes != [0, 0, 0, 0])
    }

    /// [`Self::read_device_step`] as a future, for callers that must not block (a browser's
    /// main thread, where the blocking form returns [`Error::Readback`]).
    pub async fn read_device_step_async(&self) -> Result<u64> {
        let device = self.device.as_ref().ok_or_else(not_capturable)?;
        let bytes = self.ctx.read_bytes_async(&device.step_bytes()).await?;
        Ok(u64::from(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])))
    }

    /// [`Self::read_grad_norm`] as a future, for callers that must not block.
    pub async fn read_grad_norm_async(&self) -> Result<f64> {
        let clip = self
            .clip
            .as_ref()
            .ok_or(Error::NeedsOption { what: "a gradient norm".into(), option: "grad_clip" })?;
        let bytes = self.ctx.read_bytes_async(&clip.total_norm()).await?;
        Ok(f64::from(f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])))
    }

    /// [`Self::read_found_inf`] as a future, for callers that must not block.
    pub async fn read_found_inf_async(&self) -> Result<bool> {
        let device = self.device.as_ref().ok_or_else(not_capturable)?;
        let bytes = self.ctx.read_bytes_async(&device.found_inf_bytes()).await?;
        Ok(bytes != [0, 0, 0, 0])
    }

    /// Sets the step count (on the host, and on the device in capturable mode, landing at
    /// the next submit), e.g. to resume a schedule.
    pub fn set_step_count(&mut self, step: u64) -> Result<()> {
        if let Some(device) = &self.device {
            let device_step = u32::try_from(step).map_err(|_| {
                Error::BadStep(format!("step {step} does not fit the device's u32 step counter"))
            })?;
            device.write_step(&self.ctx, device_step);
        }
        self.step = step;
        for group in &mut self.groups {
            group.dirty = true;
        }
        Ok(())
    }

    /// AMP (capturable mode): records PyTorch's unscale of `grads` by the device scalar
    /// `inv_scale` (an f32 tensor of one element with `COPY_SRC`), setting the device's
    /// `found_inf` flag when any gradient is NaN or infinite. The next [`Self::record_step`]
    /// then leaves parameters, state and the device step counter untouched if the flag is
    /// set, with no host round trip. Call it once per step, before the step.
    ///
    /// With [`OptimizerOptions::grad_clip`] and f32 gradients the same pass also takes the
    /// gradient norm (of the unscaled gradients), so the gradients are read once for both
    /// and the step only combines the partial norms.
    pub fn record_unscale(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        grads: &[Tensor],
        inv_scale: &Tensor,
    ) -> Result<()> {
        // The unscale rewrites the gradients, so one inside another tensor would corrupt it,
        // and two that share memory would be unscaled twice.
        self.check_grads(grads)?;
        self.check_grads_disjoint(grads)?;
        let ctx = self.ctx.clone();
        if self.device.is_none() {
            return Err(not_capturable());
        }
        if self.clip.is_none() || grads.iter().any(|g| g.dtype != DType::F32) {
            let device = self.device.as_mut().ok_or_else(not_capturable)?;
            return device.record_unscale(&ctx, encoder, grads, inv_scale);
        }
        device::check_inv_scale(inv_scale)?;
        self.bind(grads)?;
        let (Some(device), Some(clip), Some(bound)) = (&mut self.device, &self.clip, self.bound.first_mut())
        else {
            return Err(not_capturable());
        };
        if bound.unscale_norm.is_none() {
            bound.unscale_norm = Some(clip.bind(&ctx, grads, Some(device.buffer()))?);
        }
        device.record_scale(encoder, inv_scale);
        if let Some(taken) = &bound.unscale_norm {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("wgpu-optim unscale and gradient norm"),
                timestamp_writes: None,
            });
            taken.record_partials(&mut pass);
        }
        self.norm_taken_by_unscale = true;
        Ok(())
    }

    /// Refuses gradients of another count than the parameters, or one that lies in memory
    /// the step writes for another tensor: another parameter, a model copy or a state
    /// ([`Error::OverlapsWritten`]). `grads[i]` may be `params[i]` exactly.
    fn check_grads(&self, grads: &[Tensor]) -> Result<()> {
        if grads.len() != self.params.len() {
            return Err(Error::CountMismatch {
                argument: "grads".into(),
                got: grads.len(),
                expected: self.params.len(),
            });
        }
        self.written.check(grads)
    }

    /// Refuses gradients that share memory with each other ([`Error::OverlapsWritten`]
    /// naming both), for the passes that rewrite them.
    fn check_grads_disjoint(&mut self, grads: &[Tensor]) -> Result<()> {
        if self.disjoint_grads.as_slice() == grads {
            return Ok(());
        }
        let named: Vec<Arg> =
            grads.iter().enumerate().map(|(i, g)| Arg::new(format!("grads[{i}]"), g)).collect();
        check_disjoint(&named).map_err(|e| match e {
            Error::OverlappingParams { first, second } => {
                Error::OverlapsWritten { tensor: second, written: first }
            }
            other => other,
        })?;
        self.disjoint_grads.clear();
        self.disjoint_grads.extend_from_slice(grads);
        Ok(())
    }

    /// Parameter `i`'s tensors in its family's slot order, all updated in place.
    fn kernel_args(&self, algorithm: &Algorithm, i: usize, grad: &Tensor) -> KernelArgs {
        let param = Arg::new(format!("params[{i}]"), &self.params[i]);
        let kinds = self.state_kinds(algorithm);
        let state: Vec<Arg> = kinds
            .iter()
            .zip(&self.state[i])
            .map(|(kind, t)| Arg::new(format!("{}[{i}]", kind.torch_name()), t))
            .collect();
        let copy = self.model_copies.get(i).map(|c| Arg::new(format!("model_copies[{i}]"), c));
        let grad = Arg::new(format!("grads[{i}]"), grad);
        let args = SlotArgs {
            param: param.clone(),
            grad,
            state: &state,
            param_out: param,
            state_out: &state,
            param_copy: copy,
        };
        slot_args(algorithm.family(), &kinds, args)
    }
}

/// The error of an 8-bit-state method called without [`OptimizerOptions::q8_states`].
fn needs_q8(what: &str) -> Error {
    Error::NeedsOption { what: format!("`{what}`"), option: "q8_states" }
}

/// Writes stochastic rounding's seed and step `t` into a group's uniform slot.
fn write_rounding(rounding: Rounding, t: u64, slot: &mut [u8]) {
    if let Some(seed) = rounding.seed() {
        RoundingHeader::new(seed, t).write(slot);
    }
}

/// Stochastic and Kahan rounding keep the low-precision parameters themselves accurate; f32
/// masters (and model copies, which are written from f32 parameters) leave nothing to do.
pub(crate) fn check_rounding_options(options: &OptimizerOptions) -> Result<()> {
    if options.rounding == Rounding::NearestEven {
        return Ok(());
    }
    let reason = "stochastic and Kahan rounding keep 16-bit parameters accurate without f32 masters; \
                  with f32 masters the model copy is rounded once from exact values";
    if options.master_weights {
        return Err(Error::ConflictingOptions { first: "rounding", second: "master_weights", reason });
    }
    if !options.model_copies.is_empty() {
        return Err(Error::ConflictingOptions { first: "rounding", second: "model_copies", reason });
    }
    Ok(())
}

/// Stochastic and Kahan rounding act on 16-bit parameter stores: every parameter must be
/// F16 or BF16 (an f32 store does not round, so either would silently do nothing).
pub(crate) fn check_rounding_dtypes(
    rounding: Rounding,
    dtypes: impl Iterator<Item = DType>,
    argument: &str,
) -> Result<()> {
    if rounding == Rounding::NearestEven {
        return Ok(());
    }
    for (i, dtype) in dtypes.enumerate() {
        if !matches!(dtype, DType::F16 | DType::BF16) {
            return Err(Error::DTypeMismatch {
                argument: format!("{argument}[{i}]"),
                got: dtype,
                expected: format!("F16 or BF16 with {} rounding (f32 stores are exact)", rounding.name()),
            });
        }
    }
    Ok(())
}

fn not_capturable() -> Error {
    Error::NeedsOption {
        what: "device step counters, device learning rates and AMP skipping".into(),
        option: "capturable",
    }
}

/// Master-weight mode ([`OptimizerOptions::master_weights`]): checks the model's tensors
/// and replaces them in their groups by f32 masters read from them, the model's tensors
/// becoming the model copies. Other modes pass through unchanged.
fn master_copies(
    ctx: &GpuContext,
    groups: Vec<ParamGroup>,
    mut options: OptimizerOptions,
    read: Option<Vec<Vec<f64>>>,
) -> Result<(Vec<ParamGroup>, OptimizerOptions)> {
    if !options.master_weights {
        return Ok((groups, options));
    }
    if !options.model_copies.is_empty() {
        return Err(Error::ConflictingOptions {
            first: "master_weights",
            second: "model_copies",
            reason: "master-weight mode makes the f32 masters itself and writes the parameters given \
                     as the model copies; give one or the other",
        });
    }
    let model: Vec<Arg> = groups
        .iter()
        .flat_map(|g| &g.params)
        .enumerate()
        .map(|(i, p)| Arg::new(format!("model_params[{i}]"), p))
        .collect();
    if model.is_empty() {
        return Err(Error::NoParameters { argument: "model_params".into() });
    }
    for arg in &model {
        check_range(arg)?;
        check_readable(arg)?;
        if arg.tensor.dtype == DType::F64 {
            return Err(Error::DTypeMismatch {
                argument: arg.name.clone(),
                got: DType::F64,
                expected: "F32, F16 or BF16 (the masters are f32)".into(),
            });
        }
    }
    check_disjoint(&model)?;
    let mut next = 0;
    let mut masters = Vec::with_capacity(groups.len());
    for group in groups {
        let mut params = Vec::with_capacity(group.params.len());
        for p in &group.params {
            let values = match read.as_ref().and_then(|read| read.get(next)) {
                Some(values) => values.clone(),
                None => ctx.read(p)?,
            };
            params.push(ctx.upload(&format!("master[{next}]"), &values, DType::F32));
            next += 1;
        }
        masters.push(ParamGroup { algorithm: group.algorithm, params });
    }
    options.model_copies = model.into_iter().map(|arg| arg.tensor).collect();
    options.state_dtype.get_or_insert(DType::F32);
    options.master_weights = false;
    Ok((masters, options))
}

/// Refuses two tensors that share a byte; names them in the order given. Sorting by buffer
/// and offset keeps this O(n log n) for models with thousands of tensors.
fn check_disjoint(args: &[Arg]) -> Result<()> {
    let mut order: Vec<usize> = (0..args.len()).filter(|&i| args[i].tensor.len > 0).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (&args[a].tensor, &args[b].tensor);
        a.buffer.cmp(&b.buffer).then(a.offset.cmp(&b.offset))
    });
    // The tensor reaching furthest into the current buffer so far.
    let mut furthest: Option<usize> = None;
    for &i in &order {
        let t = &args[i].tensor;
        if let Some(f) = furthest.filter(|&f| args[f].tensor.buffer == t.buffer) {
            if t.offset < args[f].tensor.byte_range().end {
                let (first, second) = (f.min(i), f.max(i));
                return Err(Error::OverlappingParams {
                    first: args[first].name.clone(),
                    second: args[second].name.clone(),
                });
            }
            if t.byte_range().end <= args[f].tensor.byte_range().end {
                continue;
            }
        }
        furthest = Some(i);
    }
    Ok(())
}

/// Checks the parameters and options; returns the math type (f64 only for f64 parameters).
fn check_params(params: &[Tensor], options: &OptimizerOptions) -> Result<DType> {
    if params.is_empty() {
        return Err(Error::NoParameters { argument: "params".into() });
    }
    let double = params.first().is_some_and(|p| p.dtype == DType::F64);
    for (i, p) in params.iter().enumerate() {
        check_range(&Arg::new(format!("params[{i}]"), p))?;
        if (p.dtype == DType::F64) != double {
            return Err(Error::DTypeMismatch {
                argument: format!("params[{i}]"),
                got: p.dtype,
                expected: "F64 for every parameter or for none (the math runs in one type)".into(),
            });
        }
    }
    if let Some(dtype) = options.state_dtype {
        if (dtype == DType::F64) != double {
            return Err(Error::DTypeMismatch {
                argument: "options.state_dtype".into(),
                got: dtype,
                expected: if double { "F64 for F64 parameters".into() } else { "F32, F16 or BF16".into() },
            });
        }
    }
    if !options.model_copies.is_empty() && options.model_copies.len() != params.len() {
        return Err(Error::CountMismatch {
            argument: "options.model_copies".into(),
            got: options.model_copies.len(),
            expected: params.len(),
        });
    }
    for (i, (copy, p)) in options.model_copies.iter().zip(params).enumerate() {
        check_range(&Arg::new(format!("model_copies[{i}]"), copy))?;
        if copy.len != p.len {
            return Err(Error::LengthMismatch {
                argument: format!("model_copies[{i}]"),
                got: copy.len,
                expected: p.len,
                reference: format!("params[{i}]"),
            });
        }
    }
    let named = params.iter().enumerate().map(|(i, p)| Arg::new(format!("params[{i}]"), p)).chain(
        options.model_copies.iter().enumerate().map(|(i, c)| Arg::new(format!("model_copies[{i}]"), c)),
    );
    check_disjoint(&named.collect::<Vec<_>>())?;
    Ok(if double { DType::F64 } else { DType::F32 })
}
