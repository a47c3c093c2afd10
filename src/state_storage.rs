//! How an optimizer stores its state tensors: one option of both backends
//! ([`OptimizerBuilder::state_storage`](crate::OptimizerBuilder::state_storage)), so that a
//! dtype, 8-bit and 4-bit state exclude one another by construction.
//!
//! # The storage types
//!
//! Parameters, gradients and state may each be `F32`, `F16` or `BF16` (`OptimizerBuilder::state_storage(StateStorage::Dtype(..))`
//! picks the state's), and ONNX ops also take `F64` (where the adapter has
//! `SHADER_F64`; the math is then f64). All other arithmetic is f32, and each store rounds once
//! to nearest even, done in integer arithmetic in the shader so every adapter rounds alike.
//!
//! - f16 uses native `f16` arrays where the adapter has `SHADER_F16` and pairs of halves in
//!   `u32` elsewhere, and on CPU adapters (lavapipe, SwiftShader, WARP), which convert native
//!   halves one at a time in software: on lavapipe the packed path ran f16 Adam about 1.7x
//!   faster. Results are bit-identical on both paths (the test kit runs both). bf16 is always bits in `u32`. Where the tensors of an update line up on
//!   4-element boundaries, each invocation moves four elements (two whole words of halves);
//!   the unaligned head and tail are updated a word-aligned pair of elements per invocation,
//!   so no two invocations ever write one word, whatever the tensor's length and offset.
//! - Master weights: `Optimizer::builder().master_weights(true)` (with parameter groups and
//!   capturable mode too) keeps f32 parameters and state for a model whose parameters are f16
//!   or bf16, and writes the model's copy in the same dispatch.
//! - Epsilon is applied in f32, so `eps = 1e-8` keeps its meaning with f16 storage (in f16
//!   it would round to 0, and a second moment that underflows would divide by zero).
//!
//! State bytes per parameter (add the parameter's own bytes: 4 in f32, 2 in f16 or bf16, plus 4
//! for f32 master weights or 2 for a Kahan compensation):
//!
//! | state | Adam | SGD with momentum |
//! |---|---|---|
//! | f32 | 8 | 4 |
//! | f16 / bf16 | 4 | 2 |
//! | 8-bit (`crate::q8`) | 2.03 (2 codes, 2 absmax per 256) | 1.02 |
//! | 4-bit (`crate::q4`; torchao's format, Adam and AdamW only) | 1.06 (2 half-byte codes, 2 scales per 128) | - |
//!
//! Each family's states, under their checkpoint names, and their bytes per parameter ("-":
//! refused by name, as the reference has no such form):
//!
//! | algorithm | config | reproduces | states (checkpoint names) | state bytes per parameter: f32 / 16-bit / 8-bit |
//! |---|---|---|---|---|
//! | Adam, AdamW | `Adam`, `Adam::adamw()` | `torch.optim.Adam`/`AdamW`; bitsandbytes `Adam8bit`/`AdamW8bit` | `exp_avg`, `exp_avg_sq` | 8 / 4 / 2.03 |
//! | AMSGrad | `Adam { amsgrad: true, .. }` | `torch.optim.Adam` | + `max_exp_avg_sq` | 12 / 6 / - |
//! | SGD | `Sgd` | `torch.optim.SGD`; bitsandbytes `SGD8bit` | `momentum_buffer` (with momentum) | 4 (0 without momentum) / 2 / 1.02 |
//! | Adagrad | `Adagrad` | `torch.optim.Adagrad` | `sum` | 4 / 2 / - |
//! | RMSprop | `RmsProp` | `torch.optim.RMSprop`; bitsandbytes `RMSprop8bit` | `square_avg`, + `momentum_buffer` (momentum > 0), + `grad_avg` (centered) | 4 to 12 / 2 to 6 / 1.02 |
//! | Lion | `Lion` | lion-pytorch `Lion`; bitsandbytes `Lion8bit` | `exp_avg` | 4 / 2 / 1.02 |
//! | AdEMAMix | `AdEMAMix` | bitsandbytes `AdEMAMix`; bitsandbytes `AdEMAMix8bit` | `state1` (`[2, *shape]`: the fast and the slow EMA), `state2` | 12 / 6 / 3.05 |
//! | Schedule-Free AdamW | `ScheduleFreeAdamW` | `schedulefree.AdamWScheduleFree` | `z`, `exp_avg_sq`; per group `k`, `weight_sum`, `lr_max`, `train_mode` | 8 / 4 / - |
//! | LAMB | `Lamb` | torch-optimizer `Lamb` (0.3.0) | `exp_avg`, `exp_avg_sq` | 8 / 4 / - |
//! | ADOPT | `Adopt` | the official `adopt.ADOPT` (torch-adopt 0.1.0): the first step only sets `exp_avg_sq`, then `g / max(sqrt(exp_avg_sq), eps)` clipped at `(t - 1)^q`, averaged, and `exp_avg_sq` updated after; 8-bit state in bitsandbytes' format (bitsandbytes has no ADOPT) | `exp_avg`, `exp_avg_sq` | 8 / 4 / 2.03 |
//! | Adan | `Adan` | the official `adan.Adan` (sail-sg/Adan): `exp_avg`, the moment of gradient differences `exp_avg_diff` and `exp_avg_sq` of `g + beta2 d`, bias-corrected, with the proximal decay (or `no_prox`); its own `max_grad_norm` clips the global norm with Adan's `eps` (where `grad_clip` adds 1e-6) | `exp_avg`, `exp_avg_sq`, `exp_avg_diff`, `neg_pre_grad` | 16 / 8 / 4.06 |

use crate::q4::Q4States;
use crate::q8::Q8States;
use crate::{DType, Error, OptimizerOptions, Result, Rounding};

/// The storage of every state tensor (Adam's moments, SGD's momentum, ...): in each
/// parameter's dtype (the default, as PyTorch does), in one dtype, or blockwise quantized.
///
/// ```
/// use wgpu_optim::q8::Q8States;
/// use wgpu_optim::{DType, Optimizer, StateStorage};
/// let f32_state = Optimizer::builder().state_storage(StateStorage::Dtype(DType::F32));
/// let q8_state = Optimizer::builder().state_storage(StateStorage::Q8(Q8States::default()));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StateStorage {
    /// Each state tensor in its parameter's dtype.
    #[default]
    ParamDtype,
    /// Every state tensor in this dtype: f32 state for f16 or bf16 parameters is the common
    /// mix. All math is f32 either way and each store rounds once to nearest even.
    Dtype(DType),
    /// Blockwise 8-bit state, bitsandbytes' format ([`Q8States`]).
    Q8(Q8States),
    /// Blockwise 4-bit state, torchao's `AdamW4bit` format ([`Q4States`]).
    Q4(Q4States),
}

impl StateStorage {
    /// The dtype every state tensor is stored in, when one was chosen.
    pub(crate) fn dtype(&self) -> Option<DType> {
        match self {
            StateStorage::Dtype(dtype) => Some(*dtype),
            _ => None,
        }
    }

    /// The 8-bit state's settings, with 8-bit storage.
    pub fn q8(&self) -> Option<Q8States> {
        match self {
            StateStorage::Q8(config) => Some(*config),
            _ => None,
        }
    }

    /// The 4-bit state's settings, with 4-bit storage.
    pub fn q4(&self) -> Option<Q4States> {
        match self {
            StateStorage::Q4(config) => Some(*config),
            _ => None,
        }
    }
}

/// A low-bit storage, for what both refuse alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LowBit {
    /// [`StateStorage::Q8`].
    Q8,
    /// [`StateStorage::Q4`].
    Q4,
}

/// Refuses the options that neither low-bit storage runs with (capturable mode, master
/// weights, model copies, a rounding other than nearest), naming the option
/// ([`Error::ConflictingOptions`], first `state_storage`), and a parameter other than F32
/// (`dtypes` names them `params[i]`, [`Error::DTypeMismatch`]): both storages keep f32
/// parameters and take their bias corrections from the host.
pub(crate) fn check_low_bit_options(
    format: LowBit,
    options: &OptimizerOptions,
    dtypes: impl Iterator<Item = DType>,
) -> Result<()> {
    // The reasons stay whole string literals, as `ConflictingOptions` keeps them.
    let conflicts: [(&'static str, bool, &'static str); 4] = match format {
        LowBit::Q8 => [
            ("capturable", options.capturable, "8-bit steps take their bias corrections from the host"),
            (
                "master_weights",
                options.master_weights,
                "8-bit state keeps f32 parameters, which are the masters",
            ),
            ("model_copies", !options.model_copies.is_empty(), "8-bit state keeps f32 parameters only"),
            (
                "rounding",
                options.rounding != Rounding::NearestEven,
                "8-bit state keeps f32 parameters, whose stores do not round",
            ),
        ],
        LowBit::Q4 => [
            ("capturable", options.capturable, "4-bit steps take their bias corrections from the host"),
            (
                "master_weights",
                options.master_weights,
                "4-bit state keeps f32 parameters, which are the masters",
            ),
            ("model_copies", !options.model_copies.is_empty(), "4-bit state keeps f32 parameters only"),
            (
                "rounding",
                options.rounding != Rounding::NearestEven,
                "4-bit state keeps f32 parameters, whose stores do not round",
            ),
        ],
    };
    if let Some((second, _, reason)) = conflicts.iter().find(|(_, set, _)| *set) {
        return Err(Error::ConflictingOptions { first: "state_storage", second, reason });
    }
    let name = match format {
        LowBit::Q8 => "8-bit",
        LowBit::Q4 => "4-bit",
    };
    for (i, dtype) in dtypes.enumerate() {
        if dtype != DType::F32 {
            return Err(Error::DTypeMismatch {
                argument: format!("params[{i}]"),
                got: dtype,
                expected: format!("F32 with {name} state_storage ({name} state is kept for f32 parameters)"),
            });
        }
    }
    Ok(())
}
