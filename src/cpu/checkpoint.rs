//! Saving and loading the CPU optimizer's state in the GPU optimizer's checkpoint format
//! (the shared layout of `crate::checkpoint`), so a checkpoint of either backend loads
//! into the other.

use std::borrow::Cow;
use std::path::Path;

use super::state_memory::StateTensor;
use super::CpuOptimizer;
use crate::checkpoint::layout::{Layout, ParamLayout, Slot};
use crate::checkpoint::{load_file, write_atomically, Checkpoint, JsonMap};
use crate::q8::StoredState;
use crate::{DType, Result};

impl CpuOptimizer {
    /// The checkpoint as safetensors bytes, in the format of
    /// [`Optimizer::save_to_bytes`](crate::Optimizer::save_to_bytes), which lists what it
    /// holds: every state tensor (in its parameter's shape with
    /// [`OptimizerBuilder::param_shapes`](crate::OptimizerBuilder::param_shapes), flat
    /// otherwise), the step, the group's hyperparameters and the rounding (with Kahan
    /// rounding the compensations); with 8-bit state, bitsandbytes' `state1`, `absmax1`,
    /// `qmap1`, ... and the 8-bit settings. The GPU optimizer loads it as it loads its own.
    pub fn save_to_bytes(&self) -> Result<Vec<u8>> {
        let layout = self.layout();
        let stored: &[Vec<StoredState>] = self.q8.as_ref().map_or(&[], |(_, states)| states);
        let stored4: &[Vec<crate::q4::Q4State>] = self.q4.as_ref().map_or(&[], |(_, states)| states);
        let kind_of = |param: usize, k: usize| layout.params[param].state[k].0;
        let data: Vec<Cow<'_, [u8]>> = layout
            .entries()
            .iter()
            .map(|entry| match self.tensor(entry.slot) {
                Some(tensor) => little_endian(tensor.bytes(), tensor.dtype().size() as usize),
                None if matches!(entry.slot, Slot::Q4 { .. }) => entry.slot.q4_bytes(stored4, kind_of),
                None => entry.slot.q8_bytes(stored),
            })
            .collect();
        layout.serialize(self.step, &data)
    }

    /// Saves the checkpoint ([`Self::save_to_bytes`]) to `path` atomically, as
    /// [`Optimizer::save`](crate::Optimizer::save) does.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        write_atomically(path.as_ref(), &self.save_to_bytes()?)
    }

    /// Loads a checkpoint file written by [`Self::save`] or by the GPU optimizer's `save`;
    /// see [`Self::load_from_bytes`].
    pub fn load(&mut self, path: impl AsRef<Path>) -> Result<()> {
        load_file(path.as_ref(), |bytes| self.load_from_bytes(bytes))
    }

    /// Loads checkpoint bytes saved by this backend or by the GPU optimizer
    /// ([`Optimizer::load_from_bytes`](crate::Optimizer::load_from_bytes) says what must
    /// match). Replaces every state tensor (with 8-bit state, its codes and absmax), the
    /// step count, the group's hyperparameters (learning rate included), and with
    /// stochastic rounding the seed. The parameters are the caller's and are not touched. A
    /// file that does not match (one of several groups, one with master weights, which the
    /// CPU backend does not keep, or one with 8-bit state of other settings or into an
    /// optimizer without, included, and one with an 8-bit absmax that is NaN, infinite or
    /// negative), or a truncated or corrupt one (tensor data that does not match its
    /// checksum included), is refused with
    /// [`Error::BadFile`](crate::Error::BadFile) before anything is written: the optimizer
    /// is left as it was.
    pub fn load_from_bytes(&mut self, bytes: &[u8]) -> Result<()> {
        let checkpoint = Checkpoint::parse(bytes)?;
        let layout = self.layout();
        let data = layout.check(&checkpoint)?;
        let stored = layout.q8_states(&data)?;
        let stored4 = layout.q4_states(&data)?;
        // Last, so that a file altered by hand is refused for what is wrong with its contents
        // when something is, and for its checksums otherwise.
        checkpoint.verify_checksums()?;
        self.algorithm.check_change(&checkpoint.groups[0].0)?;
        crate::step::clip::check_own_clip_change(&self.algorithm, &checkpoint.groups[0].0)?;
        let slots: Vec<Slot> = layout.entries().iter().map(|entry| entry.slot).collect();
        // Everything matches: write.
        for (slot, data) in slots.into_iter().zip(data) {
            let Some(tensor) = self.tensor_mut(slot) else { continue };
            let size = tensor.dtype().size() as usize;
            // The check compared dtypes and element counts, so the lengths agree.
            tensor.bytes_mut().copy_from_slice(&little_endian(data, size));
        }
        if let Some((_, states)) = &mut self.q8 {
            *states = stored;
        }
        if let Some((_, states)) = &mut self.q4 {
            *states = stored4;
        }
        self.algorithm = checkpoint.groups[0].0;
        self.rounding = checkpoint.rounding;
        self.step = checkpoint.step;
        // The family's group values and mode, from the group's entry.
        if let (Some(passes), Some(entry)) = (&mut self.passes, checkpoint.entries.first()) {
            passes.load_group(&self.algorithm, entry)?;
        }
        Ok(())
    }

    /// What the family's passes add to the group's `param_groups` entry (empty without).
    fn group_entry(&self) -> JsonMap {
        let mut entry = JsonMap::new();
        if let Some(passes) = &self.passes {
            passes.save_group(&self.algorithm, &mut entry);
        }
        entry
    }

    /// The optimizer as checkpoints see it: one group.
    fn layout(&self) -> Layout<'_> {
        let kinds = self.algorithm.state_kinds();
        let q8 = self.q8.as_ref().map(|(config, _)| *config);
        let q4 = self.q4.as_ref().map(|(config, _)| *config);
        let params = self
            .params
            .iter()
            .enumerate()
            .map(|(i, &(_, len))| {
                // 8-bit states are kept as codes or (small tensors) f32, not in `state`.
                let mut tensors: Vec<_> = match q8 {
                    Some(_) => kinds.iter().map(|kind| (*kind, DType::F32)).collect(),
                    // (4-bit: `state` is empty, and the kinds are set below.)
                    None => kinds
                        .iter()
                        .zip(self.state.get(i).into_iter().flatten())
                        .map(|(kind, t)| (*kind, t.dtype()))
                        .collect(),
                };
                if let Some(passes) = &self.passes {
                    let shape = self.shapes.get(i).map_or(&[][..], Vec::as_slice);
                    tensors.extend(passes.checkpoint_states(i, shape));
                }
                // So are 4-bit states.
                if q4.is_some() {
                    tensors = kinds.iter().map(|kind| (*kind, DType::F32)).collect();
                }
                if let Some(compensation) = self.compensation.get(i) {
                    tensors.push((crate::StateKind::KahanCompensation, compensation.dtype()));
                }
                let quantized = q8.is_some_and(|config| config.quantizes(len as u64));
                let quantized = quantized || q4.is_some_and(|config| config.quantizes(len as u64));
                ParamLayout { len, state: tensors, master: None, quantized }
            })
            .collect();
        Layout {
            groups: vec![(self.algorithm, 0..self.params.len())],
            params,
            shapes: &self.shapes,
            rounding: self.rounding,
            q8,
            q4,
            group_entries: vec![self.group_entry()],
        }
    }

    /// The tensor behind a checkpoint slot: the algorithm's states, then the Kahan
    /// compensation. `None` for 8-bit state (kept whole, as [`StoredState`]s) and masters
    /// (which the CPU backend does not keep, so its layout lists none).
    fn tensor(&self, slot: Slot) -> Option<&StateTensor> {
        let Slot::State { param, k } = slot else { return None };
        if let Some(tensor) = self.passes.as_ref().and_then(|p| p.checkpoint_tensor(param, k)) {
            return Some(tensor);
        }
        self.state[param].get(k).or(self.compensation.get(param))
    }

    fn tensor_mut(&mut self, slot: Slot) -> Option<&mut StateTensor> {
        let Slot::State { param, k } = slot else { return None };
        if let Some(passes) = self.passes.as_deref_mut().filter(|p| p.keeps_states()) {
            return passes.checkpoint_tensor_mut(param, k);
        }
        match self.state[param].get_mut(k) {
            Some(tensor) => Some(tensor),
            None => self.compensation.get_mut(param),
        }
    }
}

/// The CPU keeps elements of `size` bytes in the host's byte order, checkpoints keep them
/// little-endian: the same bytes on little-endian hosts, each element reversed on others
/// (either way round).
fn little_endian(bytes: &[u8], size: usize) -> Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        return Cow::Borrowed(bytes);
    }
    Cow::Owned(bytes.chunks_exact(size).flat_map(|element| element.iter().rev().copied()).collect())
}
