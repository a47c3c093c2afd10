//! 4-bit state ([`Q4States`]) in checkpoints, under torchao's names: each `OptimState4bit`
//! flattened into its inner tensors, `state.{i}.exp_avg.codes` (u8, two codes per byte as
//! torchao packs them), `state.{i}.exp_avg.scale` (f32, one per block) and
//! `state.{i}.exp_avg.qmap` (f32, the 16 entries, checked on load), and a tensor that keeps
//! f32 state as PyTorch names it (`state.{i}.exp_avg`). The metadata holds the settings
//! (`q4_block_size`, `q4_min_size`), which a loading optimizer must share.

use std::borrow::Cow;

use safetensors::Dtype;

use super::{bad, f32s, le_bytes, Entry, Layout, Slot};
use crate::q4::{check_replacement, check_scale, map_for, Q4State, Q4States, CODES};
use crate::Result;

/// The metadata names of the 4-bit settings.
pub(crate) const Q4_BLOCK_SIZE: &str = "q4_block_size";
/// See [`Q4_BLOCK_SIZE`].
pub(crate) const Q4_MIN_SIZE: &str = "q4_min_size";

/// A part of a 4-bit-mode state in a checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Q4Part {
    /// The packed codes: half a byte per element.
    Codes,
    /// One f32 scale per block.
    Scale,
    /// The state's map (torchao keeps one per state tensor).
    Qmap,
    /// The f32 values of a tensor that keeps f32 state.
    Values,
}

impl Layout<'_> {
    /// Parameter `i`'s states with 4-bit state, under torchao's names.
    pub(super) fn q4_entries(&self, i: usize) -> Vec<Entry> {
        let Some(config) = self.q4 else { return Vec::new() };
        let param = &self.params[i];
        let mut entries = Vec::new();
        for (k, (kind, _)) in param.state.iter().enumerate() {
            let name = format!("state.{i}.{}", kind.torch_name());
            let slot = |part| Slot::Q4 { param: i, k, part };
            if !param.quantized {
                entries.push(Entry {
                    note: format!(
                        " (f32 state: {} elements, below min_size {} or not whole blocks of {})",
                        param.len, config.min_size, config.block_size
                    ),
                    ..self.per_element(name, slot(Q4Part::Values), i, Dtype::F32)
                });
                continue;
            }
            let flat = |name: String, part, dtype, len: usize, note: String| Entry {
                name,
                slot: slot(part),
                dtype,
                len,
                shape: vec![len],
                per_element: false,
                note,
                stack: None,
            };
            let blocks = param.len / config.block_size;
            entries.push(flat(
                format!("{name}.codes"),
                Q4Part::Codes,
                Dtype::U8,
                param.len / 2,
                format!(" (4-bit codes, two per byte: {} elements)", param.len),
            ));
            entries.push(flat(
                format!("{name}.scale"),
                Q4Part::Scale,
                Dtype::F32,
                blocks,
                format!(" (one scale per block of {}: {blocks})", config.block_size),
            ));
            entries.push(flat(
                format!("{name}.qmap"),
                Q4Part::Qmap,
                Dtype::F32,
                CODES,
                " (16 entries)".into(),
            ));
        }
        entries
    }

    /// Refuses a file whose 4-bit settings differ from the optimizer's (with or without
    /// 4-bit state, another block size or `min_size`).
    pub(super) fn check_q4(&self, file: Option<Q4States>) -> Result<()> {
        if file == self.q4 {
            return Ok(());
        }
        let describe = |config: Option<Q4States>| match config {
            None => "no 4-bit state".to_string(),
            Some(c) => format!("4-bit state with block_size {} and min_size {}", c.block_size, c.min_size),
        };
        Err(bad(format!(
            "was saved with {}, the optimizer keeps {}: build it with the same StateStorage::Q4",
            describe(file),
            describe(self.q4)
        )))
    }

    /// With 4-bit state, every parameter's states from the data [`Self::check`] returned,
    /// each checked against its tensor (storage, lengths, scales finite and >= 0, the map
    /// the crate's); without, nothing.
    pub(crate) fn q4_states(&self, data: &[&[u8]]) -> Result<Vec<Vec<Q4State>>> {
        let Some(config) = self.q4 else { return Ok(Vec::new()) };
        let mut stored: Vec<Vec<Q4State>> =
            self.params.iter().map(|p| p.state.iter().map(|_| Q4State::F32(Vec::new())).collect()).collect();
        for (entry, data) in self.entries().iter().zip(data) {
            let Slot::Q4 { param, k, part } = entry.slot else { continue };
            let kind = self.params[param].state[k].0;
            let state = &mut stored[param][k];
            match (part, state) {
                (Q4Part::Values, state) => *state = Q4State::F32(f32s(data)),
                (Q4Part::Codes, Q4State::Q4 { codes, .. }) => *codes = data.to_vec(),
                (Q4Part::Scale, Q4State::Q4 { scale, .. }) => *scale = f32s(data),
                (Q4Part::Codes, state) => *state = Q4State::Q4 { codes: data.to_vec(), scale: Vec::new() },
                (Q4Part::Scale, state) => *state = Q4State::Q4 { codes: Vec::new(), scale: f32s(data) },
                (Q4Part::Qmap, _) => {
                    let theirs = f32s(data);
                    let ours = map_for(kind);
                    if let Some(c) = theirs.iter().zip(&ours).position(|(a, b)| a.to_bits() != b.to_bits()) {
                        return Err(bad(format!(
                            "`{}` is not the map this crate quantizes with (torchao's): entry {c} is {:e}, \
                             expected {:e}",
                            entry.name, theirs[c], ours[c]
                        )));
                    }
                }
            }
        }
        for (i, (param, states)) in self.params.iter().zip(&stored).enumerate() {
            for (state, (kind, _)) in states.iter().zip(&param.state) {
                let name = format!("state.{i}.{}", kind.torch_name());
                if let Q4State::Q4 { scale, .. } = state {
                    check_scale(scale, &format!("{name}.scale")).map_err(|e| bad(e.to_string()))?;
                }
                check_replacement(state, config, param.len, &name).map_err(|e| bad(e.to_string()))?;
            }
        }
        Ok(stored)
    }
}

impl Slot {
    /// A 4-bit-mode slot's bytes: a part of `stored[param][k]`, or its map.
    pub(crate) fn q4_bytes(
        self,
        stored: &[Vec<Q4State>],
        kinds: impl Fn(usize, usize) -> crate::StateKind,
    ) -> Cow<'_, [u8]> {
        let Slot::Q4 { param, k, part } = self else { return Cow::Borrowed(&[]) };
        match (part, stored.get(param).and_then(|states| states.get(k))) {
            (Q4Part::Codes, Some(Q4State::Q4 { codes, .. })) => Cow::Borrowed(codes),
            (Q4Part::Scale, Some(Q4State::Q4 { scale, .. })) => le_bytes(scale),
            (Q4Part::Values, Some(Q4State::F32(values))) => le_bytes(values),
            (Q4Part::Qmap, _) => le_bytes(&map_for(kinds(param, k))).into_owned().into(),
            // The layout and the state come from one optimizer; empty data makes `serialize`
            // refuse the tensor by name were it not so.
            _ => Cow::Borrowed(&[]),
        }
    }
}
