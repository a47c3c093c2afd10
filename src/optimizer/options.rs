//! What a trainer chooses when it builds an optimizer: parameter groups and options.

use crate::q8::Q8States;
use crate::{Algorithm, DType, GradClip, Rounding, Tensor};

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
