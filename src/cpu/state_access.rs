//! What a trainer reads and replaces of the CPU optimizer's state: one view of a state
//! whatever its storage, dense state writable in place, low-bit state replaced whole.

use super::{CpuOptimizer, HostSlice, HostSliceMut, StateTensor};
use crate::q4::Q4State;
use crate::q8::StoredState;
use crate::{Error, QuantizedState, Result, StateKind};

/// Parameter state of one kind as the CPU optimizer keeps it ([`CpuOptimizer::state`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum StateView<'a> {
    /// Dense state (in the parameter's dtype or the one of
    /// [`StateStorage::Dtype`](crate::StateStorage::Dtype); Adafactor's factored states; a
    /// Kahan compensation).
    Host(HostSlice<'a>),
    /// 8-bit storage: codes and absmax, or f32 values below `min_8bit_size`.
    Q8(&'a StoredState),
    /// 4-bit storage: packed codes and scales, or f32 values for a tensor that keeps f32
    /// state.
    Q4(&'a Q4State),
}

impl<'a> StateView<'a> {
    /// The dense state; `None` for low-bit state.
    pub fn dense(&self) -> Option<HostSlice<'a>> {
        match self {
            StateView::Host(slice) => Some(*slice),
            _ => None,
        }
    }

    /// The 8-bit state; `None` for another storage.
    pub fn q8(&self) -> Option<&'a StoredState> {
        match self {
            StateView::Q8(state) => Some(state),
            _ => None,
        }
    }

    /// The 4-bit state; `None` for another storage.
    pub fn q4(&self) -> Option<&'a Q4State> {
        match self {
            StateView::Q4(state) => Some(state),
            _ => None,
        }
    }

    /// A copy of the low-bit state, as [`CpuOptimizer::set_state`] takes it; `None` for
    /// dense state.
    pub fn quantized(&self) -> Option<QuantizedState> {
        match self {
            StateView::Host(_) => None,
            StateView::Q8(state) => Some(QuantizedState::Q8((*state).clone())),
            StateView::Q4(state) => Some(QuantizedState::Q4((*state).clone())),
        }
    }
}

impl CpuOptimizer {
    /// Parameter `index`'s state of `kind` as it is stored, if its algorithm keeps one:
    /// dense state as a [`HostSlice`], 8-bit and 4-bit state
    /// ([`StateStorage::Q8`](crate::StateStorage::Q8), [`StateStorage::Q4`](crate::StateStorage::Q4))
    /// as codes and scales (or f32 values where a tensor keeps f32 state). `None` for an
    /// index past the parameters or a kind the parameter does not keep.
    pub fn state(&self, index: usize, kind: StateKind) -> Option<StateView<'_>> {
        if let Some(passes) = self.passes.as_deref().filter(|p| p.keeps_states()) {
            return passes.state(index, kind).map(StateView::Host);
        }
        if kind == StateKind::KahanCompensation {
            return self.compensation.get(index).map(|c| StateView::Host(c.as_slice()));
        }
        let k = self.algorithm.state_kinds().iter().position(|s| *s == kind)?;
        if let Some((_, states)) = &self.q8 {
            return states.get(index)?.get(k).map(StateView::Q8);
        }
        if let Some((_, states)) = &self.q4 {
            return states.get(index)?.get(k).map(StateView::Q4);
        }
        Some(StateView::Host(self.state.get(index)?.get(k)?.as_slice()))
    }

    /// Replaces parameter `index`'s low-bit state of `kind` (e.g. from a checkpoint or the
    /// other backend). Refused, with nothing changed, when `state` is not of the optimizer's
    /// storage ([`Error::NeedsOption`], naming `state_storage`), for a parameter or kind the
    /// optimizer does not have ([`Error::BadRange`], [`Error::StateMismatch`]), or when
    /// `state` is not stored as this tensor's is (low-bit at and above the storage's minimum
    /// size, f32 below), has another length than the parameter, lacks one scale per block,
    /// or has a scale that is NaN, infinite or negative ([`Error::BadValue`], naming the
    /// block). Dense state is written in place through [`Self::state_mut`].
    pub fn set_state(&mut self, index: usize, kind: StateKind, state: QuantizedState) -> Result<()> {
        let kinds = self.algorithm.state_kinds();
        let argument = |format: &str| format!("{format} state {index} {kind:?}");
        match (state, &mut self.q8, &mut self.q4) {
            (QuantizedState::Q8(state), Some((config, states)), _) => {
                let slot = state_slot(kinds, states, index, kind)?;
                crate::q8::check_replacement(&state, *config, slot.len(), &argument("q8"))?;
                *slot = state;
            }
            (QuantizedState::Q4(state), _, Some((config, states))) => {
                let slot = state_slot(kinds, states, index, kind)?;
                let len = self.params[index].1;
                crate::q4::check_replacement(&state, *config, len, &argument("q4"))?;
                *slot = state;
            }
            (state, _, _) => return Err(state.wrong_storage()),
        }
        Ok(())
    }

    /// Parameter `index`'s dense state of `kind`, writable (e.g. to load a checkpoint); with
    /// low-bit storage, only the f32 state of a tensor that keeps f32 state. Low-bit state is
    /// replaced whole with [`Self::set_state`].
    pub fn state_mut(&mut self, index: usize, kind: StateKind) -> Option<HostSliceMut<'_>> {
        if let Some(passes) = self.passes.as_deref_mut().filter(|p| p.keeps_states()) {
            return passes.state_mut(index, kind);
        }
        if kind == StateKind::KahanCompensation {
            return self.compensation.get_mut(index).map(StateTensor::as_mut_slice);
        }
        let k = self.algorithm.state_kinds().iter().position(|s| *s == kind)?;
        if let Some((_, states)) = &mut self.q8 {
            return match states.get_mut(index)?.get_mut(k)? {
                StoredState::F32(values) => Some(HostSliceMut::F32(values)),
                StoredState::Q8 { .. } => None,
            };
        }
        if let Some((_, states)) = &mut self.q4 {
            return match states.get_mut(index)?.get_mut(k)? {
                Q4State::F32(values) => Some(HostSliceMut::F32(values)),
                Q4State::Q4 { .. } => None,
            };
        }
        Some(self.state.get_mut(index)?.get_mut(k)?.as_mut_slice())
    }
}

/// Parameter `index`'s state of `kind` among per-parameter state lists in `kinds`' order, or
/// the error that names which of the two the optimizer does not have.
fn state_slot<'a, S>(
    kinds: &[StateKind],
    states: &'a mut [Vec<S>],
    index: usize,
    kind: StateKind,
) -> Result<&'a mut S> {
    let k = kinds.iter().position(|s| *s == kind).ok_or_else(|| Error::StateMismatch {
        argument: format!("state kind {kind:?}"),
        got: vec![kind],
        expected: kinds.to_vec(),
    })?;
    let count = states.len();
    let slots = states.get_mut(index).ok_or_else(|| Error::BadRange {
        argument: format!("index {index}"),
        problem: format!("the optimizer has {count} parameters (indices from 0)"),
    })?;
    Ok(&mut slots[k])
}
