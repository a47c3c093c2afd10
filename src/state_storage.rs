//! How an optimizer stores its state tensors: one option of both backends
//! ([`OptimizerBuilder::state_storage`](crate::OptimizerBuilder::state_storage)), so that a
//! dtype, 8-bit and 4-bit state exclude one another by construction.

use crate::q4::Q4States;
use crate::q8::Q8States;
use crate::DType;

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
