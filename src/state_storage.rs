//! How an optimizer stores its state tensors: one option of both backends
//! ([`OptimizerBuilder::state_storage`](crate::OptimizerBuilder::state_storage)), so that a
//! dtype, 8-bit and 4-bit state exclude one another by construction.

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
    pub(crate) fn q8(&self) -> Option<Q8States> {
        match self {
            StateStorage::Q8(config) => Some(*config),
            _ => None,
        }
    }

    /// The 4-bit state's settings, with 4-bit storage.
    pub(crate) fn q4(&self) -> Option<Q4States> {
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
