//! What a trainer chooses when it builds an optimizer: parameter groups and options.

use super::Optimizer;
use crate::{Algorithm, GpuContext, GradClip, OptimizerOptions, Result, Rounding, StateStorage, Tensor};

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
    /// A group of `params` updated by `algorithm`: the struct literal's shorthand, taking
    /// any algorithm type (`Adam`, `Sgd`, ...) and a slice.
    pub fn new(algorithm: impl Into<Algorithm>, params: &[Tensor]) -> Self {
        ParamGroup { algorithm: algorithm.into(), params: params.to_vec() }
    }
}

/// How an [`Optimizer`] is built: [`Optimizer::builder`], the options chosen once (every one
/// off by default), then [`Self::build`] over one group of parameters or
/// [`Self::build_groups`] over several, or their `_async` forms in a browser.
///
/// ```no_run
/// # fn main() -> wgpu_optim::Result<()> {
/// use wgpu_optim::{Adam, DType, GpuContext, GradClip, Optimizer};
/// let ctx = GpuContext::headless_blocking()?;
/// let params = [ctx.upload("w", &[0.5; 1024], DType::BF16)];
/// let mut opt = Optimizer::builder()
///     .master_weights(true) // f32 masters of the bf16 parameters
///     .grad_clip(GradClip::l2(1.0))
///     .build(&ctx, Adam::adamw(), &params)?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[must_use = "an optimizer builder does nothing until `build`"]
pub struct OptimizerBuilder {
    pub(crate) options: OptimizerOptions,
}

impl Optimizer {
    /// The one way to build an optimizer: options first, then the parameters
    /// ([`OptimizerBuilder::build`]).
    pub fn builder() -> OptimizerBuilder {
        OptimizerBuilder { options: OptimizerOptions::default() }
    }
}

impl OptimizerBuilder {
    /// How every state tensor is stored ([`StateStorage`]): in each parameter's dtype (the
    /// default, as PyTorch does), in one dtype, or blockwise quantized.
    ///
    /// [`StateStorage::Q8`], bitsandbytes' format ([`Q8States`](crate::q8::Q8States)):
    /// Adam's moments or SGD's momentum as one byte per element plus one f32 per block of
    /// [`BLOCK_SIZE`](crate::q8::BLOCK_SIZE) elements, for every tensor of at least
    /// `min_8bit_size` elements (f32 state below).
    ///
    /// [`StateStorage::Q4`], torchao's `AdamW4bit` format ([`Q4States`](crate::q4::Q4States)),
    /// for Adam and AdamW: each moment as half a byte per element plus one f32 per block of
    /// `block_size` elements, for every tensor of at least `min_size` elements in whole
    /// blocks (f32 state otherwise).
    ///
    /// Both low-bit storages need F32 parameters ([`Error::DTypeMismatch`]) and exclude
    /// `capturable`, `master_weights`, `model_copies`, non-default `rounding` and the
    /// algorithms (or settings) they have no form for ([`Error::ConflictingOptions`], first
    /// `state_storage`): 8-bit state AMSGrad and Adagrad, 4-bit state anything but Adam and
    /// AdamW without AMSGrad and `maximize`.
    ///
    /// [`Error::DTypeMismatch`]: crate::Error::DTypeMismatch
    /// [`Error::ConflictingOptions`]: crate::Error::ConflictingOptions
    pub fn state_storage(mut self, storage: StateStorage) -> Self {
        self.options.state_storage = storage;
        self
    }

    /// One low-precision copy per parameter (same length, usually f16 or bf16, each with its
    /// own memory), which every step writes with the new parameter values in the same
    /// dispatch, so the model reads its copy with no separate cast pass. The parameters are
    /// then the f32 masters, which the caller made. [`Self::master_weights`] does this for you.
    pub fn model_copies(mut self, copies: Vec<Tensor>) -> Self {
        self.options.model_copies = copies;
        self
    }

    /// Master-weight mode: the parameters given (in every group) are the model's, usually
    /// f16 or bf16; the optimizer keeps f32 masters of them (read once, so the model's
    /// buffers need `COPY_SRC`), f32 state unless [`Self::state_storage`] says otherwise, and
    /// writes the rounded new values into the model's tensors in the same dispatch as the
    /// update. [`Optimizer::params`] are then the masters and [`Optimizer::model_copies`]
    /// the model's tensors; construction errors name the latter `model_params[i]`.
    /// Composes with groups and capturable mode; excludes [`Self::model_copies`].
    /// Loading a checkpoint restores the model's tensors too, which needs `COPY_DST`.
    pub fn master_weights(mut self, on: bool) -> Self {
        self.options.master_weights = on;
        self
    }

    /// Capturable mode: the step counter and each group's learning rate live in a device
    /// buffer; the step is counted on the device and bias corrections are computed there,
    /// so nothing is read back or written from the host per step. Needed for AMP skipping
    /// ([`Optimizer::record_unscale`]).
    pub fn capturable(mut self, on: bool) -> Self {
        self.options.capturable = on;
        self
    }

    /// Clip the global norm of all gradients (every group) before each step, as PyTorch's
    /// `clip_grad_norm_` does: on the GPU a deterministic two-dispatch reduction whose
    /// coefficient stays on the device and scales each gradient inside the update kernels
    /// as it is loaded (the gradient buffers are not rewritten; a 16-bit gradient is
    /// scaled in f32, not rounded back to its dtype first). [`Optimizer::grad_norm`]
    /// reads the last norm. Composes with groups, master weights, 8-bit state and capturable
    /// mode (after [`Optimizer::record_unscale`] the norm is that of the unscaled gradients).
    pub fn grad_clip(mut self, clip: impl Into<Option<GradClip>>) -> Self {
        self.options.grad_clip = clip.into();
        self
    }

    /// How 16-bit stores round ([`Rounding`]): to nearest even (the default),
    /// stochastically, or with a Kahan compensation buffer per parameter. Stochastic and
    /// Kahan rounding need every parameter to be F16 or BF16 ([`Error::DTypeMismatch`]
    /// otherwise) and exclude [`Self::master_weights`] and [`Self::model_copies`]
    /// ([`Error::ConflictingOptions`]). The CPU backend honours it too, with the same bits.
    ///
    /// [`Error::DTypeMismatch`]: crate::Error::DTypeMismatch
    /// [`Error::ConflictingOptions`]: crate::Error::ConflictingOptions
    pub fn rounding(mut self, rounding: Rounding) -> Self {
        self.options.rounding = rounding;
        self
    }

    /// Each parameter's shape (numbered across groups, as the checkpoint numbers them), so
    /// that checkpoints of either backend hold every state tensor (masters and Kahan
    /// compensations too) in its parameter's shape, as PyTorch's `state_dict` does
    /// (`tools/torch_checkpoint.py` converts between the two). Empty (the default): every
    /// tensor is saved flat, `[len]`. Otherwise one shape per parameter, whose elements
    /// multiply to its length ([`Error::CountMismatch`], or [`Error::LengthMismatch`]
    /// naming `param_shapes[i]` and the shape, with nothing created, otherwise). Loading
    /// takes a tensor stored flat or in this shape, and any shape of the parameter's length
    /// when this is empty.
    ///
    /// [`Error::CountMismatch`]: crate::Error::CountMismatch
    /// [`Error::LengthMismatch`]: crate::Error::LengthMismatch
    pub fn param_shapes(mut self, shapes: Vec<Vec<usize>>) -> Self {
        self.options.param_shapes = shapes;
        self
    }

    /// An optimizer over one group of `params` updated by `algorithm`, with zeroed state
    /// (Adagrad: its initial accumulator value), at step 0. The parameter buffers need
    /// `STORAGE` usage. Refused as [`Self::build_groups`] refuses.
    pub fn build(
        self,
        ctx: &GpuContext,
        algorithm: impl Into<Algorithm>,
        params: &[Tensor],
    ) -> Result<Optimizer> {
        self.build_groups(ctx, vec![ParamGroup::new(algorithm, params)])
    }

    /// [`Self::build`] for callers that must not block (see [`Self::build_groups_async`]).
    pub async fn build_async(
        self,
        ctx: &GpuContext,
        algorithm: impl Into<Algorithm>,
        params: &[Tensor],
    ) -> Result<Optimizer> {
        self.build_groups_async(ctx, vec![ParamGroup::new(algorithm, params)]).await
    }

    /// An optimizer over parameter groups, each with its own algorithm and hyperparameters.
    /// Parameters are numbered across groups in order (for [`Optimizer::state`] and the
    /// gradients of [`Optimizer::record_step`]).
    ///
    /// Refused, with nothing created on the device, when there is no parameter at all
    /// ([`Error::NoParameters`]), when two parameters (in any groups) or model copies share
    /// a byte ([`Error::OverlappingParams`]), or when a tensor cannot be bound: range, usage
    /// and a last element that ends inside its buffer's last 4-byte word ([`Error::BadRange`],
    /// [`Error::MissingUsage`]). A group may be empty.
    ///
    /// In master-weight mode the masters are read from the model's tensors, which blocks: in
    /// wasm32 builds that returns [`Error::Readback`]; use [`Self::build_groups_async`].
    ///
    /// [`Error::NoParameters`]: crate::Error::NoParameters
    /// [`Error::OverlappingParams`]: crate::Error::OverlappingParams
    /// [`Error::BadRange`]: crate::Error::BadRange
    /// [`Error::MissingUsage`]: crate::Error::MissingUsage
    /// [`Error::Readback`]: crate::Error::Readback
    pub fn build_groups(self, ctx: &GpuContext, groups: Vec<ParamGroup>) -> Result<Optimizer> {
        Optimizer::with_groups_read(ctx, groups, self.options, None)
    }

    /// [`Self::build_groups`] for callers that must not block (a browser's main thread): in
    /// master-weight mode the model's tensors are read back with awaited readbacks. Refuses
    /// exactly as [`Self::build_groups`] does.
    pub async fn build_groups_async(self, ctx: &GpuContext, groups: Vec<ParamGroup>) -> Result<Optimizer> {
        Optimizer::with_groups_async(ctx, groups, self.options).await
    }
}
