//! Saving and loading the GPU optimizer's state: reading its buffers back into the shared
//! checkpoint layout and writing a checked file's data into them. What a checkpoint holds
//! is documented on [`Optimizer::save_to_bytes`], what loading replaces on
//! [`Optimizer::load_from_bytes`].

use std::borrow::Cow;
use std::path::Path;

use super::Optimizer;
use crate::checkpoint::layout::{Layout, ParamLayout, Slot};
use crate::checkpoint::{bad, load_file, write_atomically, Checkpoint, JsonMap};
use crate::gpu::plan::Arg;
use crate::gpu::transfer::check_writable;
use crate::q8::StoredState;
use crate::{DType, Result, StateKind, Tensor};

impl Optimizer {
    /// The checkpoint as safetensors bytes. Waits for submitted work, then reads every state
    /// tensor back. The CPU backend (`cpu::CpuOptimizer`) writes and reads the same format,
    /// so a checkpoint of either loads into the other.
    ///
    /// It holds, under PyTorch's `state_dict` names (parameters numbered across groups):
    /// - each parameter's state, in its storage dtype, and in the parameter's shape from
    ///   [`OptimizerBuilder::param_shapes`](crate::OptimizerBuilder::param_shapes) (flat,
    ///   `[len]`, without them): `state.{i}.exp_avg`, `state.{i}.exp_avg_sq`,
    ///   `state.{i}.max_exp_avg_sq` (AMSGrad), `state.{i}.momentum_buffer` (SGD with
    ///   momentum), `state.{i}.sum` (Adagrad);
    /// - AdEMAMix's states under bitsandbytes' names: `state.{i}.state1` of shape `[2, *shape]`
    ///   (m1, the fast EMA, then m2, the slow one) and `state.{i}.state2` (nu);
    /// - the step count: `state.{i}.step`, an f32 scalar as PyTorch keeps it, and the exact
    ///   count in the `step` metadata (in capturable mode, the device's count: AMP skips
    ///   excluded);
    /// - every group's hyperparameters and parameter indices in the `param_groups` metadata
    ///   (JSON with PyTorch's keys: `optimizer` the class, `lr`, `betas`, `eps`,
    ///   `weight_decay`, `amsgrad`, `momentum`, ..., `params`). In capturable mode `lr` is the
    ///   group's rate as the optimizer knows it ([`Optimizer::group_algorithm`]), not a value
    ///   a trainer wrote into [`Optimizer::lr_tensor`] on the device;
    /// - in master-weight mode, the f32 masters, in the parameter's shape too: `master.{i}`;
    /// - with [`Rounding::Kahan`](crate::Rounding::Kahan), each parameter's compensation in its dtype and shape:
    ///   `state.{i}.kahan_comp`;
    /// - the rounding in the metadata: `rounding` ([`Rounding::name`](crate::Rounding::name)), and with stochastic
    ///   rounding `rounding_seed` (decimal) and `rounding_state` (`true` or `false`);
    /// - `format` = [`CHECKPOINT_FORMAT`](crate::CHECKPOINT_FORMAT) in the metadata
    ///   (`wgpu-optim-checkpoint/2`);
    /// - `crc32` in the metadata: a JSON object from every tensor's name to the CRC-32 of its
    ///   data bytes (IEEE, as zlib's `crc32`), 8 lowercase hex digits. Loading checks every
    ///   tensor against it and refuses a mismatch as [`Error::BadFile`](crate::Error::BadFile)
    ///   naming the tensor; a file without `crc32` (format 1, or converted from PyTorch by
    ///   `tools/torch_checkpoint.py`) loads unchecked.
    ///
    /// The bytes are a function of the state: the metadata is written sorted by key and the
    /// tensors in a fixed order, so saving the same state twice, or on the CPU backend, gives
    /// the same bytes.
    ///
    /// With 8-bit [`OptimizerBuilder::state_storage`](crate::OptimizerBuilder::state_storage) the states
    /// are kept under bitsandbytes' `state_dict` names instead: for state `k` (1 for
    /// `exp_avg` or `momentum_buffer`, 2 for `exp_avg_sq`) of a parameter of at least
    /// `min_8bit_size` elements, `state.{i}.state{k}` (U8 codes, one per element, in the
    /// parameter's shape) and `state.{i}.absmax{k}` (F32, one per block of 256, flat); of a
    /// smaller parameter, `state.{i}.state{k}` alone in F32. The maps the codes index are
    /// saved once as `qmap1` (signed) and `qmap2` (unsigned), F32 `[256]`, where some
    /// parameter keeps 8-bit state `k`, and the settings in the metadata:
    /// `q8_min_8bit_size` (decimal) and `q8_block_size` (`256`).
    ///
    /// It does not hold the model's parameters (outside master-weight mode the parameters are
    /// the model's, which the trainer saves with its model), the model copies (rounded from
    /// the masters on load), or the AMP flag and unscale factor.
    ///
    /// `tools/torch_checkpoint.py to-torch` turns it into a `torch.optim` state_dict (for
    /// parameters that are not 1-D, give the optimizer `param_shapes`, or PyTorch refuses the
    /// flat states).
    ///
    /// The readbacks block: in wasm32 builds this returns [`Error::Readback`](crate::Error::Readback);
    /// use [`Self::save_to_bytes_async`].
    pub fn save_to_bytes(&self) -> Result<Vec<u8>> {
        // With blocking readbacks the future is ready at its first poll.
        pollster::block_on(self.save_to_bytes_with(true))
    }

    /// [`Self::save_to_bytes`] as a future, for callers that must not block (a browser's
    /// main thread).
    pub async fn save_to_bytes_async(&self) -> Result<Vec<u8>> {
        self.save_to_bytes_with(false).await
    }

    /// The checkpoint's bytes, read back with blocking readbacks or awaited ones.
    async fn save_to_bytes_with(&self, blocking: bool) -> Result<Vec<u8>> {
        let step = match (&self.device, blocking) {
            (Some(_), true) => self.read_device_step()?,
            (Some(_), false) => self.read_device_step_async().await?,
            (None, _) => self.step,
        };
        let layout = self.layout();
        let stored = self.q8_states(&layout, blocking).await?;
        let stored4 = self.q4_states(&layout, blocking).await?;
        let kind_of = |param: usize, k: usize| layout.params[param].state[k].0;
        let mut data = Vec::with_capacity(layout.entries().len());
        for entry in layout.entries() {
            data.push(match self.tensor(entry.slot) {
                Some(tensor) if blocking => Cow::Owned(self.ctx.read_bytes(tensor)?),
                Some(tensor) => Cow::Owned(self.ctx.read_bytes_async(tensor).await?),
                None if matches!(entry.slot, Slot::Q4 { .. }) => entry.slot.q4_bytes(&stored4, kind_of),
                None => entry.slot.q8_bytes(&stored),
            });
        }
        layout.serialize(step, &data)
    }

    /// The optimizer as checkpoints see it.
    fn layout(&self) -> Layout<'_> {
        let master = !self.model_copies.is_empty();
        let q8 = self.q8.as_ref().map(|engine| engine.config());
        let q4 = self.q4.as_ref().map(|engine| engine.config());
        let mut params: Vec<ParamLayout> = Vec::with_capacity(self.params.len());
        for group in &self.groups {
            let kinds = self.state_kinds(&group.algorithm);
            for i in group.first..group.first + group.len {
                let len = self.params[i].len as usize;
                // 8-bit states live in the engine, as codes or (small tensors) f32.
                let state = match q8 {
                    Some(_) => kinds.iter().map(|kind| (*kind, DType::F32)).collect(),
                    None => kinds.iter().zip(&self.state[i]).map(|(kind, t)| (*kind, t.dtype)).collect(),
                };
                let shape = self.shapes.get(i).map_or(&[][..], Vec::as_slice);
                let kept = self.passes.iter().find_map(|p| p.checkpoint_states(i, shape));
                let state = kept.unwrap_or(state);
                // So do 4-bit states.
                let state =
                    if q4.is_some() { kinds.iter().map(|kind| (*kind, DType::F32)).collect() } else { state };
                params.push(ParamLayout {
                    len,
                    state,
                    master: master.then_some(self.params[i].dtype),
                    quantized: q8.is_some_and(|config| config.quantizes(len as u64)),
                });
                if let (Some(config), Some(param)) = (q4, params.last_mut()) {
                    param.quantized = config.quantizes(len as u64);
                }
            }
        }
        Layout {
            groups: self.groups.iter().map(|g| (g.algorithm, g.first..g.first + g.len)).collect(),
            params,
            shapes: &self.shapes,
            rounding: self.rounding,
            q8,
            q4,
            group_entries: (self.groups.iter().enumerate())
                .map(|(g, group)| {
                    let mut entry = JsonMap::new();
                    for passes in &self.passes {
                        passes.save_group(g, &group.algorithm, &mut entry);
                    }
                    entry
                })
                .collect(),
        }
    }

    /// The buffer behind a checkpoint tensor; `None` for 8-bit state, which the engine
    /// reads and writes whole.
    fn tensor(&self, slot: Slot) -> Option<&Tensor> {
        let kept = match slot {
            Slot::State { param, k } => self.passes.iter().find_map(|p| p.checkpoint_tensor(param, k)),
            _ => None,
        };
        if let Some(tensor) = kept {
            return Some(tensor);
        }
        match slot {
            Slot::State { param, k } => Some(&self.state[param][k]),
            // In master-weight mode the optimizer's parameters are the masters.
            Slot::Master { param } => Some(&self.params[param]),
            Slot::Q8 { .. } | Slot::Map { .. } => None,
            Slot::Q4 { .. } => None,
        }
    }

    /// Saves the checkpoint ([`Self::save_to_bytes`] says what it holds) to `path`
    /// atomically: a temporary file beside it is written, flushed to disk and renamed over
    /// `path`, so a crash never leaves a half-written checkpoint in its place.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        write_atomically(path.as_ref(), &self.save_to_bytes()?)
    }

    /// Loads a checkpoint file written by [`Optimizer::save`] (or by the CPU backend's
    /// `save`); see [`Self::load_from_bytes`] for what it replaces.
    pub fn load(&mut self, path: impl AsRef<Path>) -> Result<()> {
        load_file(path.as_ref(), |bytes| self.load_from_bytes(bytes))
    }

    /// Loads checkpoint bytes ([`Self::save_to_bytes`] says what they hold), saved by this
    /// backend or by the CPU backend.
    ///
    /// Replaces every state tensor, the step count and **every group's hyperparameters**
    /// (learning rate included) with the file's: a schedule that wants other values sets them
    /// after loading. In master-weight mode it also replaces the masters and writes the model
    /// copies (the masters rounded once), which needs `COPY_DST` on the model's buffers.
    /// Outside master-weight mode the parameters are not touched: load the model yourself.
    ///
    /// With stochastic rounding it also replaces the seed (so a resumed run draws the bits
    /// the uninterrupted run would have), and with Kahan rounding the compensations.
    ///
    /// The file must match the optimizer: the same rounding mode ([`Rounding::name`](crate::Rounding::name), and for
    /// stochastic rounding the same `state` flag), the same number of groups, each with the
    /// same algorithm class and state tensors and the same parameter indices, and every
    /// tensor with the dtype of the optimizer's, stored flat or in the parameter's shape (in
    /// any shape of its length when the optimizer was given no shapes). With 8-bit state the
    /// file must hold 8-bit state saved with the same `min_8bit_size` (`q8_block_size` 256),
    /// codes and absmax of each tensor's length and block count, every absmax a finite
    /// number >= 0 (the error names it, e.g. `state.0.absmax1[3]`), and the crate's maps; a
    /// file of 8-bit state does not load into an optimizer without. Where the file has
    /// checksums, every tensor's data must match its CRC-32. All of it, and
    /// whether every target buffer takes its write, is checked before anything is written;
    /// on a mismatch ([`Error::BadFile`](crate::Error::BadFile)), a target that cannot be written
    /// ([`Error::MissingUsage`](crate::Error::MissingUsage)), or a truncated or corrupt file, the optimizer and the model
    /// are left as they were.
    ///
    /// A 16-bit state tensor that starts or ends inside a 4-byte word is written after a
    /// readback of that word, which blocks: in wasm32 builds such a load is refused with
    /// [`Error::Readback`](crate::Error::Readback) before anything is written; use
    /// [`Self::load_from_bytes_async`].
    pub fn load_from_bytes(&mut self, bytes: &[u8]) -> Result<()> {
        // With blocking writes the future is ready at its first poll.
        pollster::block_on(self.load_from_bytes_with(bytes, true))
    }

    /// [`Self::load_from_bytes`] as a future, for callers that must not block (a browser's
    /// main thread); it checks and refuses exactly as the blocking form does.
    pub async fn load_from_bytes_async(&mut self, bytes: &[u8]) -> Result<()> {
        self.load_from_bytes_with(bytes, false).await
    }

    /// Loads checkpoint bytes with blocking writes or awaited ones.
    async fn load_from_bytes_with(&mut self, bytes: &[u8], blocking: bool) -> Result<()> {
        let checkpoint = Checkpoint::parse(bytes)?;
        let layout = self.layout();
        let data = layout.check(&checkpoint)?;
        let stored = layout.q8_states(&data)?;
        let stored4 = layout.q4_states(&data)?;
        // Last, so that a file altered by hand is refused for what is wrong with its contents
        // when something is, and for its checksums otherwise.
        checkpoint.verify_checksums()?;
        let mut writes: Vec<(String, Tensor, Cow<'_, [u8]>)> = Vec::with_capacity(data.len());
        for (entry, data) in layout.entries().iter().zip(data) {
            let Some(tensor) = self.tensor(entry.slot) else { continue };
            let argument = match entry.slot {
                Slot::Master { param } => format!("params[{param}]"),
                Slot::State { param, k } | Slot::Q8 { param, k, .. } => {
                    format!("{}[{param}]", layout.params[param].state[k].0.torch_name())
                }
                Slot::Map { k, .. } => format!("qmap{}", k + 1),
                Slot::Q4 { param, .. } => format!("q4 state {param}"),
            };
            writes.push((argument, tensor.clone(), data.into()));
        }
        let kinds: Vec<Vec<StateKind>> =
            layout.params.iter().map(|p| p.state.iter().map(|(kind, _)| *kind).collect()).collect();
        // In master-weight mode the model's copies are the masters rounded once, so they are
        // restored with them and the first forward pass after loading sees the right values.
        for (i, (master, copy)) in self.params.iter().zip(&self.model_copies).enumerate() {
            let Some(data) = writes.iter().find(|(_, t, _)| t == master).map(|(_, _, d)| d) else { continue };
            let rounded = copy.dtype.encode(&master.dtype.decode(data));
            writes.push((format!("model_copies[{i}]"), copy.clone(), rounded.into()));
        }
        let step = checkpoint.step;
        if self.device.is_some() && u32::try_from(step).is_err() {
            return Err(bad(format!("step {step} does not fit the device's u32 step counter")));
        }
        // Every target must take its write (the caller's buffers may lack a copy usage), or
        // a refusal would come after some tensors were already overwritten.
        for (argument, tensor, _) in &writes {
            check_writable(&Arg::new(argument.clone(), tensor))?;
            let range = tensor.byte_range();
            let whole_words = range.start.is_multiple_of(4) && range.end.is_multiple_of(4);
            if blocking && cfg!(target_arch = "wasm32") && !whole_words {
                // The word's other half is read back first, which a browser cannot wait for.
                return Err(crate::Error::Readback {
                    cause: crate::ReadbackFailure::WouldBlock {
                        call: format!("{argument}'s partial-word write"),
                        instead: "load_from_bytes_async",
                    },
                });
            }
        }
        // A group changes to or from some families (Muon, Adafactor) only in a new optimizer.
        for (group, (algorithm, _)) in self.groups.iter().zip(&checkpoint.groups) {
            group.algorithm.check_change(algorithm)?;
        }
        // Everything matches: write.
        for (_, tensor, data) in writes {
            if blocking {
                self.ctx.write_bytes(&tensor, &data)?;
            } else {
                self.ctx.write_bytes_async(&tensor, &data).await?;
            }
        }
        self.set_q8_states(&kinds, &stored)?;
        self.set_q4_states(&kinds, &stored4)?;
        for (g, (algorithm, _)) in checkpoint.groups.iter().enumerate() {
            self.set_group_algorithm(g, *algorithm)?;
        }
        // The seed travels in the uniforms, which the next step rewrites (every group is dirty).
        self.rounding = checkpoint.rounding;
        // The families' per-group values, from their groups' entries, and the mode.
        for (g, ((algorithm, _), entry)) in checkpoint.groups.iter().zip(&checkpoint.entries).enumerate() {
            for passes in &mut self.passes {
                passes.load_group(g, algorithm, entry)?;
            }
        }
        self.set_mode_unchanged(checkpoint.mode);
        self.set_step_count(step)
    }

    /// Every parameter's 4-bit states, `[i][k]` in the layout's order, read back (waits for
    /// the queue); nothing without 4-bit state.
    async fn q4_states(&self, layout: &Layout<'_>, blocking: bool) -> Result<Vec<Vec<crate::q4::Q4State>>> {
        let Some(engine) = &self.q4 else { return Ok(Vec::new()) };
        let mut stored = Vec::with_capacity(layout.params.len());
        for (i, param) in layout.params.iter().enumerate() {
            let mut states = Vec::with_capacity(param.state.len());
            for (kind, _) in &param.state {
                let state = match blocking {
                    true => engine.read(&self.ctx, i, *kind)?,
                    false => engine.read_async(&self.ctx, i, *kind).await?,
                };
                states.push(state.ok_or_else(|| bad(format!("parameter {i} keeps no 4-bit {kind:?}")))?);
            }
            stored.push(states);
        }
        Ok(stored)
    }

    /// Writes checked 4-bit states into the engine; nothing without 4-bit state.
    fn set_q4_states(&self, kinds: &[Vec<StateKind>], stored: &[Vec<crate::q4::Q4State>]) -> Result<()> {
        let Some(engine) = &self.q4 else { return Ok(()) };
        for (i, (kinds, states)) in kinds.iter().zip(stored).enumerate() {
            for (kind, state) in kinds.iter().zip(states) {
                // `Layout::q4_states` checked each as the engine does.
                engine.write(&self.ctx, i, *kind, state)?;
            }
        }
        Ok(())
    }

    /// Every parameter's 8-bit states, `[i][k]` in the layout's order, read back (waits for
    /// the queue); nothing without 8-bit state.
    async fn q8_states(&self, layout: &Layout<'_>, blocking: bool) -> Result<Vec<Vec<StoredState>>> {
        let Some(engine) = &self.q8 else { return Ok(Vec::new()) };
        let mut stored = Vec::with_capacity(layout.params.len());
        for (i, param) in layout.params.iter().enumerate() {
            let mut states = Vec::with_capacity(param.state.len());
            for (kind, _) in &param.state {
                // The layout lists the kinds the engine keeps, so each is there.
                let state = match blocking {
                    true => engine.read(&self.ctx, i, *kind)?,
                    false => engine.read_async(&self.ctx, i, *kind).await?,
                };
                states.push(state.ok_or_else(|| bad(format!("parameter {i} keeps no 8-bit {kind:?}")))?);
            }
            stored.push(states);
        }
        Ok(stored)
    }

    /// Writes checked 8-bit states (`stored[i][k]` of kind `kinds[i][k]`) into the engine;
    /// nothing without 8-bit state.
    fn set_q8_states(&self, kinds: &[Vec<StateKind>], stored: &[Vec<StoredState>]) -> Result<()> {
        let Some(engine) = &self.q8 else { return Ok(()) };
        for (i, (kinds, states)) in kinds.iter().zip(stored).enumerate() {
            for (kind, state) in kinds.iter().zip(states) {
                // `Layout::q8_states` checked each as the engine does, so none is refused
                // after others were written.
                engine.write(&self.ctx, i, *kind, state)?;
            }
        }
        Ok(())
    }
}
