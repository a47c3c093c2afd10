//! Which tensors a checkpoint of an optimizer holds (names, dtypes, shapes), its metadata,
//! and the check of a file against an optimizer: one description that both backends fill
//! in, so that a checkpoint written by either loads into the other.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::Range;

use safetensors::tensor::TensorView;
use safetensors::Dtype;

use super::{bad, checksum, safetensors_dtype, Checkpoint, JsonMap, CHECKPOINT_FORMAT};
use crate::q8::{blocks, check_absmax, check_replacement, map_for, Q8States, StoredState, BLOCK_SIZE};
use crate::{Algorithm, DType, Result, Rounding, StateKind};

mod q4;
pub(crate) use q4::{Q4Part, Q4_BLOCK_SIZE, Q4_MIN_SIZE};

/// One parameter as a checkpoint stores it.
pub(crate) struct ParamLayout {
    /// Its number of elements.
    pub(crate) len: usize,
    /// Its state tensors' kinds and storage dtypes, in the order the backend keeps them
    /// (the algorithm's state kinds, then the Kahan compensation with [`Rounding::Kahan`]).
    pub(crate) state: Vec<(StateKind, DType)>,
    /// Master-weight mode: the masters' dtype.
    pub(crate) master: Option<DType>,
    /// With 8-bit state ([`Layout::q8`]): whether its states are 8-bit (it has at least
    /// `min_8bit_size` elements) rather than f32. The dtypes in `state` are then F32.
    pub(crate) quantized: bool,
}

/// Where a checkpoint tensor's data lives in the optimizer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Slot {
    /// Parameter `param`'s state tensor `k`, in [`ParamLayout::state`]'s order.
    State {
        /// The parameter, numbered across groups.
        param: usize,
        /// The state tensor.
        k: usize,
    },
    /// Parameter `param`'s f32 master.
    Master {
        /// The parameter, numbered across groups.
        param: usize,
    },
    /// With 8-bit state: a part of parameter `param`'s state `k` (bitsandbytes'
    /// `state{k+1}` and `absmax{k+1}`), which the backends keep as a [`StoredState`].
    Q8 {
        /// The parameter, numbered across groups.
        param: usize,
        /// The state tensor, in [`ParamLayout::state`]'s order.
        k: usize,
        /// Which part of it.
        part: Part,
    },
    /// With 8-bit state: the map states `k` are quantized with (bitsandbytes' `qmap{k+1}`),
    /// the crate's own, saved for readers and checked on load.
    Map {
        /// The state tensors it serves.
        k: usize,
        /// Their kind (the map is [`map_for`] it).
        kind: StateKind,
    },
    /// With 4-bit state: a part of parameter `param`'s state `k` (torchao's `codes`,
    /// `scale`, `qmap`, or f32 values), which the backends keep as a `Q4State`.
    Q4 {
        /// The parameter, numbered across groups.
        param: usize,
        /// The state tensor, in [`ParamLayout::state`]'s order.
        k: usize,
        /// Which part of it.
        part: Q4Part,
    },
}

/// A part of an 8-bit-mode state in a checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Part {
    /// The codes, one `u8` per element.
    Codes,
    /// One f32 absmax per block of [`BLOCK_SIZE`] elements.
    Absmax,
    /// The f32 values of a tensor below `min_8bit_size`.
    Values,
}

/// One tensor of a checkpoint besides the step scalars.
pub(crate) struct Entry {
    /// Its name in the file (PyTorch's `state_dict` names).
    pub(crate) name: String,
    /// Where its data lives.
    pub(crate) slot: Slot,
    dtype: Dtype,
    /// Its number of elements.
    len: usize,
    /// The caller's shape of the parameter, or flat.
    shape: Vec<usize>,
    /// One element per element of its parameter (so it may take the parameter's shape), not
    /// one per block or map code (always flat).
    per_element: bool,
    /// What a refusal adds to say what the tensor must be, or empty.
    note: String,
    /// `Some(h)`: half `h` of a file tensor of shape `[2, *shape]` that stacks this state
    /// and its neighbour under one name (bitsandbytes' `state1` of AdEMAMix: m1, then m2).
    stack: Option<usize>,
}

/// An optimizer as its checkpoints see it.
pub(crate) struct Layout<'a> {
    /// Each group's algorithm and its parameters' indices.
    pub(crate) groups: Vec<(Algorithm, Range<usize>)>,
    /// Every parameter, numbered across groups.
    pub(crate) params: Vec<ParamLayout>,
    /// [`OptimizerBuilder::param_shapes`](crate::OptimizerBuilder::param_shapes): empty, or
    /// each parameter's shape (checked against its length when the optimizer was built).
    pub(crate) shapes: &'a [Vec<usize>],
    pub(crate) rounding: Rounding,
    /// 8-bit [`OptimizerBuilder::state_storage`](crate::OptimizerBuilder::state_storage): states are saved
    /// under bitsandbytes' names (`state1`, `absmax1`, ...) instead of PyTorch's.
    pub(crate) q8: Option<Q8States>,
    /// 4-bit [`OptimizerBuilder::state_storage`](crate::OptimizerBuilder::state_storage): states are saved
    /// under torchao's names (`exp_avg.codes`, `exp_avg.scale`, `exp_avg.qmap`).
    pub(crate) q4: Option<crate::q4::Q4States>,
    /// What each group's family's passes add to its `param_groups` entry (their per-group
    /// values; `GroupPasses::save_group`, `CpuPasses::save_group`), empty for most.
    pub(crate) group_entries: Vec<JsonMap>,
}

/// A named view of `data`, or [`Error::BadFile`](crate::Error::BadFile) naming it.
fn view(name: String, dtype: Dtype, shape: Vec<usize>, data: &[u8]) -> Result<(String, TensorView<'_>)> {
    match TensorView::new(dtype, shape, data) {
        Ok(view) => Ok((name, view)),
        Err(e) => Err(bad(format!("`{name}`: {e}"))),
    }
}

impl Layout<'_> {
    /// Parameter `i`'s shape in checkpoints: the caller's, or flat.
    fn shape(&self, i: usize) -> Vec<usize> {
        self.shapes.get(i).cloned().unwrap_or_else(|| vec![self.params[i].len])
    }

    /// The tensors a checkpoint holds besides the step scalars, in the order the file lists
    /// them: by group, then parameter, each parameter's states before its master; with
    /// 8-bit state, each state's codes before its absmax, and the maps last.
    pub(crate) fn entries(&self) -> Vec<Entry> {
        let mut entries = Vec::new();
        for (algorithm, range) in &self.groups {
            for i in range.clone() {
                let param = &self.params[i];
                if self.q8.is_some() {
                    entries.extend(self.q8_param_entries(algorithm, i));
                }
                entries.extend(self.q4_entries(i));
                for (k, (kind, dtype)) in param.state.iter().enumerate() {
                    if self.q8.is_some() {
                        continue;
                    }
                    if let Some(entry) = self.sublinear_entry(algorithm, i, k, *kind, *dtype) {
                        entries.push(entry);
                        continue;
                    }
                    if self.q4.is_some() {
                        continue;
                    }
                    if let Some((name, stack)) = algorithm.bnb_state_name(*kind) {
                        let slot = Slot::State { param: i, k };
                        let entry =
                            self.per_element(format!("state.{i}.{name}"), slot, i, safetensors_dtype(*dtype));
                        entries.push(Entry { stack, ..entry });
                        continue;
                    }
                    let name = format!("state.{i}.{}", kind.torch_name());
                    let slot = Slot::State { param: i, k };
                    entries.push(self.per_element(name, slot, i, safetensors_dtype(*dtype)));
                }
                if let Some(dtype) = param.master {
                    let slot = Slot::Master { param: i };
                    entries.push(self.per_element(format!("master.{i}"), slot, i, safetensors_dtype(dtype)));
                }
            }
        }
        entries.extend(self.map_entries());
        entries
    }

    /// An entry with one element per element of parameter `i`, in its shape.
    fn per_element(&self, name: String, slot: Slot, i: usize, dtype: Dtype) -> Entry {
        Entry {
            name,
            slot,
            dtype,
            len: self.params[i].len,
            shape: self.shape(i),
            per_element: true,
            note: String::new(),
            stack: None,
        }
    }

    /// Parameter `i`'s state `k` (of `kind`) where `algorithm`'s family keeps it in a shape
    /// of its own in files ([`Algorithm::checkpoint_state_shape`]: Adafactor's `row_var` and
    /// `col_var`, in torch's shapes `[.., rows, 1]` and `[.., 1, cols]`, sublinear, not one
    /// per element); `None` for a state kept one per element.
    fn sublinear_entry(
        &self,
        algorithm: &Algorithm,
        i: usize,
        k: usize,
        kind: StateKind,
        dtype: DType,
    ) -> Option<Entry> {
        let (state_shape, note) = algorithm.checkpoint_state_shape(kind, &self.shape(i))?;
        Some(Entry {
            name: format!("state.{i}.{}", kind.torch_name()),
            slot: Slot::State { param: i, k },
            dtype: safetensors_dtype(dtype),
            len: state_shape.iter().product(),
            shape: state_shape,
            per_element: false,
            note: note.into(),
            stack: None,
        })
    }

    /// Parameter `i`'s states with 8-bit state ([`Self::q8_entries`]), in `algorithm`'s
    /// group: a stacked pair (AdEMAMix's m1 and m2 in `state1` and `absmax1`) as its codes'
    /// halves, then its absmax's (or its f32 values' halves below `min_8bit_size`), so that
    /// each file tensor's halves are neighbours.
    fn q8_param_entries(&self, algorithm: &Algorithm, i: usize) -> Vec<Entry> {
        let mut entries: Vec<Entry> = Vec::new();
        let mut first_half: Option<Vec<Entry>> = None;
        for (k, (kind, _)) in self.params[i].state.iter().enumerate() {
            let (number, stack) = q8_number(algorithm, *kind, k);
            let own = self.q8_entries(i, k, number, stack);
            match (stack, first_half.take()) {
                (Some(0), _) => first_half = Some(own),
                (Some(_), Some(first)) => {
                    entries.extend(first.into_iter().zip(own).flat_map(|(a, b)| [a, b]));
                }
                _ => entries.extend(own),
            }
        }
        entries
    }

    /// Parameter `i`'s state `k` with 8-bit state, under bitsandbytes' names: `state{number}`
    /// (the codes in the parameter's shape) and `absmax{number}` (one per block, flat), or
    /// `state{number}` alone in f32 below `min_8bit_size`, as bitsandbytes keeps small
    /// tensors; `stack` as [`Entry::stack`].
    fn q8_entries(&self, i: usize, k: usize, number: usize, stack: Option<usize>) -> Vec<Entry> {
        let param = &self.params[i];
        let min = self.q8.map_or(0, |q8| q8.min_8bit_size);
        let state = |part: Part, dtype: Dtype| Entry {
            stack,
            ..self.per_element(format!("state.{i}.state{number}"), Slot::Q8 { param: i, k, part }, i, dtype)
        };
        if !param.quantized {
            return vec![Entry {
                note: format!(" (f32 state: {} elements, below min_8bit_size {min})", param.len),
                ..state(Part::Values, Dtype::F32)
            }];
        }
        let count = blocks(param.len);
        vec![
            Entry {
                note: format!(" (8-bit codes, one per element: {} elements, min_8bit_size {min})", param.len),
                ..state(Part::Codes, Dtype::U8)
            },
            Entry {
                name: format!("state.{i}.absmax{number}"),
                slot: Slot::Q8 { param: i, k, part: Part::Absmax },
                dtype: Dtype::F32,
                len: count,
                shape: vec![count],
                per_element: false,
                note: format!(
                    " (one absmax per block of {BLOCK_SIZE}: ceil({} / {BLOCK_SIZE}) = {count})",
                    param.len
                ),
                stack,
            },
        ]
    }

    /// With 8-bit state, `qmap{k+1}` for each `k` some 8-bit parameter keeps (bitsandbytes
    /// keeps maps with 8-bit states only): the signed map for first moments and momentum,
    /// the unsigned one for second moments.
    fn map_entries(&self) -> Vec<Entry> {
        if self.q8.is_none() {
            return Vec::new();
        }
        // Each map number's first state (AdEMAMix's m1 and m2 share `qmap1`).
        let mut maps: BTreeMap<usize, (usize, StateKind)> = BTreeMap::new();
        for (algorithm, range) in &self.groups {
            for param in self.params[range.clone()].iter().filter(|p| p.quantized) {
                for (k, (kind, _)) in param.state.iter().enumerate() {
                    maps.entry(q8_number(algorithm, *kind, k).0).or_insert((k, *kind));
                }
            }
        }
        maps.into_iter()
            .map(|(number, (k, kind))| {
                let signed = if crate::q8::is_signed(kind) { "signed" } else { "unsigned" };
                Entry {
                    name: format!("qmap{number}"),
                    slot: Slot::Map { k, kind },
                    dtype: Dtype::F32,
                    len: 256,
                    shape: vec![256],
                    per_element: false,
                    note: format!(" (bitsandbytes' {signed} dynamic map, 256 codes)"),
                    stack: None,
                }
            })
            .collect()
    }

    /// The checkpoint bytes at `step`, with `data[j]` the little-endian bytes of
    /// `entries()[j]`: a function of the state alone (sorted metadata, the tensors'
    /// checksums included), so the same state saves to the same bytes on either backend.
    pub(crate) fn serialize(&self, step: u64, data: &[impl AsRef<[u8]>]) -> Result<Vec<u8>> {
        let entries = self.entries();
        debug_assert_eq!(entries.len(), data.len(), "one data per entry");
        // PyTorch keeps the step per parameter as an f32 scalar; the metadata keeps it exact.
        let step_bytes = (step as f32).to_le_bytes();
        let mut views = Vec::with_capacity(entries.len() + self.params.len());
        let stacked = stacked_data(&entries, data);
        for (j, (entry, data)) in entries.iter().zip(data).enumerate() {
            match entry.stack {
                None => {
                    views.push(view(entry.name.clone(), entry.dtype, entry.shape.clone(), data.as_ref())?)
                }
                Some(0) => {
                    let shape = std::iter::once(2).chain(entry.shape.iter().copied()).collect();
                    views.push(view(entry.name.clone(), entry.dtype, shape, &stacked[&j])?);
                }
                // The second half is in the first's tensor.
                Some(_) => {}
            }
        }
        for i in 0..self.params.len() {
            views.push(view(format!("state.{i}.step"), Dtype::F32, vec![], &step_bytes)?);
        }
        let groups: Vec<serde_json::Value> = self
            .groups
            .iter()
            .enumerate()
            .map(|(g, (algorithm, range))| {
                let mut map = algorithm.to_json();
                map.insert("params".into(), range.clone().collect::<Vec<_>>().into());
                map.extend(
                    self.group_entries.get(g).into_iter().flatten().map(|(k, v)| (k.clone(), v.clone())),
                );
                serde_json::Value::Object(map)
            })
            .collect();
        let mut metadata = BTreeMap::from([
            ("format".to_string(), CHECKPOINT_FORMAT.to_string()),
            ("param_groups".to_string(), serde_json::Value::Array(groups).to_string()),
            ("step".to_string(), step.to_string()),
            ("rounding".to_string(), self.rounding.name().to_string()),
        ]);
        if let Rounding::Stochastic { seed, state } = self.rounding {
            metadata.insert("rounding_seed".to_string(), seed.to_string());
            metadata.insert("rounding_state".to_string(), state.to_string());
        }
        if let Some(q8) = self.q8 {
            metadata.insert(Q8_MIN_8BIT_SIZE.to_string(), q8.min_8bit_size.to_string());
            metadata.insert(Q8_BLOCK_SIZE.to_string(), BLOCK_SIZE.to_string());
        }
        if let Some(q4) = self.q4 {
            metadata.insert(Q4_BLOCK_SIZE.to_string(), q4.block_size.to_string());
            metadata.insert(Q4_MIN_SIZE.to_string(), q4.min_size.to_string());
        }
        checksum::serialize(views, metadata)
    }

    /// Checks a parsed file against the optimizer, all of it, and returns the data of each
    /// of [`Self::entries`], in order. The file must have the same rounding mode (for
    /// stochastic rounding the same `state` flag), the same number of groups, each with the
    /// same algorithm class and state tensors and the same parameter indices, every tensor
    /// of `entries` with its dtype, stored flat or in the parameter's shape (in any shape of
    /// its length when the optimizer was given no shapes), a step scalar per parameter
    /// equal to the metadata's step, and nothing else. With 8-bit state the file must have
    /// been saved with the same `min_8bit_size` (so every tensor keeps the same storage), and
    /// its maps must be the crate's. Any mismatch is [`Error::BadFile`] naming it.
    ///
    /// [`Error::BadFile`]: crate::Error::BadFile
    pub(crate) fn check<'f>(&self, checkpoint: &Checkpoint<'f>) -> Result<Vec<&'f [u8]>> {
        let same_mode = match (checkpoint.rounding, self.rounding) {
            (Rounding::Stochastic { state: a, .. }, Rounding::Stochastic { state: b, .. }) => a == b,
            (a, b) => a == b,
        };
        if !same_mode {
            return Err(bad(format!(
                "was saved with rounding {:?}, the optimizer rounds {:?}",
                checkpoint.rounding, self.rounding
            )));
        }
        self.check_q8(checkpoint.q8_states)?;
        self.check_q4(checkpoint.q4_states)?;
        if checkpoint.groups.len() != self.groups.len() {
            return Err(bad(format!(
                "{} parameter groups, the optimizer has {}",
                checkpoint.groups.len(),
                self.groups.len()
            )));
        }
        for (g, ((algorithm, params), (ours, range))) in
            checkpoint.groups.iter().zip(&self.groups).enumerate()
        {
            if algorithm.name() != ours.name() || algorithm.state_kinds() != ours.state_kinds() {
                return Err(bad(format!(
                    "param_groups[{g}] is {} with state {:?}; the optimizer's group is {} with state {:?}",
                    algorithm.name(),
                    algorithm.state_kinds(),
                    ours.name(),
                    ours.state_kinds()
                )));
            }
            if *params != range.clone().collect::<Vec<_>>() {
                return Err(bad(format!(
                    "param_groups[{g}] holds other parameters than the optimizer's group"
                )));
            }
        }
        let file = &checkpoint.file;
        let tensor = |name: &str| file.tensor(name).map_err(|_| bad(format!("has no tensor `{name}`")));
        let entries = self.entries();
        let mut data = Vec::with_capacity(entries.len());
        for entry in &entries {
            let view = tensor(&entry.name)?;
            match entry.stack {
                None => {
                    self.check_entry(entry, &view)?;
                    data.push(view.data());
                }
                Some(half) => data.push(self.check_stacked(entry, &view, half)?),
            }
        }
        let step = checkpoint.step;
        for i in 0..self.params.len() {
            let name = format!("state.{i}.step");
            let view = tensor(&name)?;
            if view.dtype() != Dtype::F32
                || !view.shape().is_empty()
                || view.data() != (step as f32).to_le_bytes()
            {
                return Err(bad(format!("`{name}` is not the f32 scalar {step}")));
            }
        }
        let halves = entries.iter().filter(|entry| entry.stack.is_some_and(|h| h > 0)).count();
        let expected = entries.len() - halves + self.params.len();
        if file.len() != expected {
            // Every expected tensor is there, so some other one is too: name it (e.g. the
            // masters of a master-weight run, which an optimizer without keeps nowhere).
            let mut names = file.names();
            names.sort();
            let known = |name: &str| {
                entries.iter().any(|entry| entry.name == name)
                    || (0..self.params.len()).any(|i| name == format!("state.{i}.step"))
            };
            let other = names
                .into_iter()
                .find(|name| !known(name))
                .map_or(String::new(), |name| format!(" (`{name}` is none of the optimizer's)"));
            return Err(bad(format!("holds {} tensors, the optimizer has {expected}{other}", file.len())));
        }
        Ok(data)
    }

    /// Refuses a file whose 8-bit settings differ from the optimizer's: with or without
    /// 8-bit state, or another `min_8bit_size`, under which some tensors would change storage.
    fn check_q8(&self, file: Option<Q8States>) -> Result<()> {
        let problem = match (file, self.q8) {
            (None, None) => return Ok(()),
            (Some(file), Some(ours)) if file == ours => return Ok(()),
            (Some(file), None) => format!(
                "holds blockwise 8-bit state (min_8bit_size {}), the optimizer keeps full-precision \
                 state: build it with OptimizerBuilder::state_storage(StateStorage::Q8(..))",
                file.min_8bit_size
            ),
            (None, Some(ours)) => format!(
                "holds full-precision state, the optimizer keeps blockwise 8-bit state \
                 (StateStorage::Q8 with min_8bit_size {})",
                ours.min_8bit_size
            ),
            (Some(file), Some(ours)) => format!(
                "was saved with 8-bit state from min_8bit_size {} elements on, the optimizer's \
                 min_8bit_size is {}: tensors between the two would change storage",
                file.min_8bit_size, ours.min_8bit_size
            ),
        };
        Err(bad(problem))
    }

    /// Half `half` of a stacked tensor (`[2, *shape]`, or `[2, len]`, or any shape of
    /// `2 * len` elements when the optimizer was given no shapes), refused as
    /// [`Error::BadFile`](crate::Error::BadFile) naming it when its dtype or shape differ.
    fn check_stacked<'f>(&self, entry: &Entry, view: &TensorView<'f>, half: usize) -> Result<&'f [u8]> {
        let stacked: Vec<usize> = std::iter::once(2).chain(entry.shape.iter().copied()).collect();
        let elements = view.shape().iter().try_fold(1usize, |n, d| n.checked_mul(*d));
        let shape_fits = view.shape() == [2, entry.len]
            || view.shape() == stacked
            || (self.shapes.is_empty() && elements == Some(2 * entry.len));
        if view.dtype() != entry.dtype || !shape_fits {
            return Err(bad(format!(
                "`{}` is {:?} {:?}, the optimizer's is {:?} {:?} (two states stacked)",
                entry.name,
                view.dtype(),
                view.shape(),
                entry.dtype,
                stacked,
            )));
        }
        let bytes = view.data().len() / 2;
        Ok(&view.data()[half * bytes..(half + 1) * bytes])
    }

    /// Refuses a tensor of the file that is not `entry`'s dtype and size, or a map that is
    /// not the crate's.
    fn check_entry(&self, entry: &Entry, view: &TensorView<'_>) -> Result<()> {
        // Flat or in the parameter's shape (any shape of its length when the optimizer was
        // given none): the same elements in the same order. Absmax and maps are flat.
        let elements = view.shape().iter().try_fold(1usize, |n, d| n.checked_mul(*d));
        let shape_fits = view.shape() == [entry.len]
            || view.shape() == entry.shape
            || (entry.per_element && self.shapes.is_empty() && elements == Some(entry.len));
        if view.dtype() != entry.dtype || !shape_fits {
            return Err(bad(format!(
                "`{}` is {:?} {:?}, the optimizer's is {:?} {:?}{}",
                entry.name,
                view.dtype(),
                view.shape(),
                entry.dtype,
                entry.shape,
                entry.note,
            )));
        }
        match entry.slot {
            Slot::Map { kind, .. } => check_map(&entry.name, view.data(), &map_for(kind)),
            _ => Ok(()),
        }
    }

    /// With 8-bit state, every parameter's states from the data [`Self::check`] returned
    /// (`stored[param][k]`, in [`ParamLayout::state`]'s order), each checked against its
    /// tensor (storage, length, one absmax per block) and every absmax a finite number >= 0;
    /// without, nothing.
    pub(crate) fn q8_states(&self, data: &[&[u8]]) -> Result<Vec<Vec<StoredState>>> {
        let Some(config) = self.q8 else { return Ok(Vec::new()) };
        let mut stored: Vec<Vec<StoredState>> = self
            .params
            .iter()
            .map(|p| p.state.iter().map(|_| StoredState::F32(Vec::new())).collect())
            .collect();
        for (entry, data) in self.entries().iter().zip(data) {
            let Slot::Q8 { param, k, part } = entry.slot else { continue };
            let state = &mut stored[param][k];
            match (part, state) {
                (Part::Values, state) => *state = StoredState::F32(f32s(data)),
                (Part::Codes, StoredState::Q8 { codes, .. }) => *codes = data.to_vec(),
                (Part::Absmax, StoredState::Q8 { absmax, .. }) => *absmax = f32s(data),
                (Part::Codes, state) => *state = StoredState::Q8 { codes: data.to_vec(), absmax: Vec::new() },
                (Part::Absmax, state) => *state = StoredState::Q8 { codes: Vec::new(), absmax: f32s(data) },
            }
        }
        for (i, (param, states)) in self.params.iter().zip(&stored).enumerate() {
            let algorithm = self.groups.iter().find(|(_, range)| range.contains(&i)).map(|(a, _)| a);
            for (k, state) in states.iter().enumerate() {
                let number = algorithm.map_or(k + 1, |a| q8_number(a, param.state[k].0, k).0);
                // Named as the file names it, before the state is checked whole.
                if let StoredState::Q8 { absmax, .. } = state {
                    check_absmax(absmax, &format!("state.{i}.absmax{number}"))
                        .map_err(|e| bad(e.to_string()))?;
                }
                check_replacement(state, config, param.len, &format!("state.{i}.state{number}"))
                    .map_err(|e| bad(e.to_string()))?;
            }
        }
        Ok(stored)
    }
}

/// The names of the 8-bit settings in a checkpoint's metadata: the size from which tensors
/// keep 8-bit state, and the elements per absmax block (always [`BLOCK_SIZE`] here).
pub(crate) const Q8_MIN_8BIT_SIZE: &str = "q8_min_8bit_size";
/// See [`Q8_MIN_8BIT_SIZE`].
pub(crate) const Q8_BLOCK_SIZE: &str = "q8_block_size";

impl Slot {
    /// An 8-bit-mode slot's bytes in a checkpoint: a part of `stored[param][k]`, or a map.
    /// Other slots live in the backends' own tensors and have no bytes here.
    pub(crate) fn q8_bytes(self, stored: &[Vec<StoredState>]) -> Cow<'_, [u8]> {
        match self {
            Slot::Q8 { param, k, part } => {
                let state = stored.get(param).and_then(|states| states.get(k));
                match (part, state) {
                    (Part::Codes, Some(StoredState::Q8 { codes, .. })) => Cow::Borrowed(codes),
                    (Part::Absmax, Some(StoredState::Q8 { absmax, .. })) => le_bytes(absmax),
                    (Part::Values, Some(StoredState::F32(values))) => le_bytes(values),
                    // The layout and the state come from one optimizer, so the storage agrees;
                    // were it not so, empty data makes `serialize` refuse the tensor by name.
                    _ => Cow::Borrowed(&[]),
                }
            }
            Slot::Map { kind, .. } => le_bytes(&map_for(kind)).into_owned().into(),
            Slot::State { .. } | Slot::Master { .. } => Cow::Borrowed(&[]),
            Slot::Q4 { .. } => Cow::Borrowed(&[]),
        }
    }
}

/// Refuses a map `data` (f32, little-endian) that differs from `ours`, naming the first
/// differing code: codes quantized under another map would decode to other values.
fn check_map(name: &str, data: &[u8], ours: &[f32; 256]) -> Result<()> {
    let theirs = f32s(data);
    let differs = theirs.iter().zip(ours).position(|(a, b)| a.to_bits() != b.to_bits());
    match differs {
        None => Ok(()),
        Some(code) => Err(bad(format!(
            "`{name}` is not the map this crate quantizes with (bitsandbytes' dynamic map): \
             code {code} is {:e}, expected {:e}",
            theirs[code], ours[code]
        ))),
    }
}

/// Little-endian f32 bytes as f32s (the caller checked the length is a multiple of 4).
fn f32s(data: &[u8]) -> Vec<f32> {
    data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

/// f32s as little-endian bytes: borrowed on little-endian hosts.
fn le_bytes(values: &[f32]) -> Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        return Cow::Borrowed(bytemuck::cast_slice(values));
    }
    Cow::Owned(values.iter().flat_map(|v| v.to_le_bytes()).collect())
}

/// The number of state `k` (of `kind`) in bitsandbytes' 8-bit names (`state{number}`,
/// `absmax{number}`, `qmap{number}`) and its half of a stacked tensor: a state the family
/// names ([`Algorithm::bnb_state_name`]: AdEMAMix's m1 and m2 are halves of `state1`, its nu
/// is `state2`) keeps its name's number; any other state `k` is `state{k+1}`.
fn q8_number(algorithm: &Algorithm, kind: StateKind, k: usize) -> (usize, Option<usize>) {
    match algorithm.bnb_state_name(kind) {
        Some(("state1", stack)) => (1, stack),
        Some(("state2", stack)) => (2, stack),
        _ => (k + 1, None),
    }
}

/// The data of each stacked tensor, by the index of its first half's entry: the two halves'
/// bytes one after the other.
fn stacked_data(entries: &[Entry], data: &[impl AsRef<[u8]>]) -> BTreeMap<usize, Vec<u8>> {
    let mut stacked = BTreeMap::new();
    for (j, entry) in entries.iter().enumerate() {
        if entry.stack == Some(0) {
            let mut bytes = data[j].as_ref().to_vec();
            if let Some(next) = data.get(j + 1) {
                bytes.extend_from_slice(next.as_ref());
            }
            stacked.insert(j, bytes);
        }
    }
    stacked
}
