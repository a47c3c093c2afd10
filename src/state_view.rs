//! A parameter's state as an optimizer keeps it, whatever its [`StateStorage`]: one view to
//! read a state of either backend and one value to replace a low-bit one.
//!
//! [`StateStorage`]: crate::StateStorage

use crate::q4::Q4State;
use crate::q8::StoredState;
use crate::{Error, Tensor};

/// Parameter state of one kind as the GPU optimizer keeps it
/// ([`Optimizer::state`](crate::Optimizer::state)): the tensor on the device for dense
/// storage, or the low-bit state read back.
#[derive(Clone, Debug)]
pub enum StateView<'a> {
    /// Dense state (in the parameter's dtype or the one of
    /// [`StateStorage::Dtype`](crate::StateStorage::Dtype); Adafactor's factored states; a
    /// Kahan compensation): its tensor on the device.
    Tensor(&'a Tensor),
    /// 8-bit storage: codes and absmax, or f32 values below `min_8bit_size`.
    Q8(StoredState),
    /// 4-bit storage: packed codes and scales, or f32 values for a tensor that keeps f32
    /// state.
    Q4(Q4State),
}

impl<'a> StateView<'a> {
    /// The dense state's tensor; `None` for low-bit state.
    pub fn dense(&self) -> Option<&'a Tensor> {
        match self {
            StateView::Tensor(tensor) => Some(tensor),
            _ => None,
        }
    }

    /// The 8-bit state; `None` for another storage.
    pub fn q8(self) -> Option<StoredState> {
        match self {
            StateView::Q8(state) => Some(state),
            _ => None,
        }
    }

    /// The 4-bit state; `None` for another storage.
    pub fn q4(self) -> Option<Q4State> {
        match self {
            StateView::Q4(state) => Some(state),
            _ => None,
        }
    }

    /// The low-bit state, as `set_state` takes it; `None` for dense state.
    pub fn quantized(self) -> Option<QuantizedState> {
        match self {
            StateView::Tensor(_) => None,
            StateView::Q8(state) => Some(QuantizedState::Q8(state)),
            StateView::Q4(state) => Some(QuantizedState::Q4(state)),
        }
    }
}

/// A low-bit state to replace one with
/// ([`Optimizer::set_state`](crate::Optimizer::set_state),
/// [`CpuOptimizer::set_state`](crate::cpu::CpuOptimizer::set_state)), in the format of the
/// optimizer's [`StateStorage`](crate::StateStorage). Dense state is written in place: through
/// its tensor on the GPU, through
/// [`CpuOptimizer::state_mut`](crate::cpu::CpuOptimizer::state_mut) on the CPU.
#[derive(Clone, Debug, PartialEq)]
pub enum QuantizedState {
    /// 8-bit state ([`StateStorage::Q8`](crate::StateStorage::Q8)).
    Q8(StoredState),
    /// 4-bit state ([`StateStorage::Q4`](crate::StateStorage::Q4)).
    Q4(Q4State),
}

impl QuantizedState {
    /// The refusal of this state by an optimizer whose storage is another: the state names
    /// its format, the error the option that would take it.
    pub(crate) fn wrong_storage(&self) -> Error {
        let format = match self {
            QuantizedState::Q8(_) => "8-bit",
            QuantizedState::Q4(_) => "4-bit",
        };
        Error::NeedsOption { what: format!("`set_state` with {format} state"), option: "state_storage" }
    }
}
