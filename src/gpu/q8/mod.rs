//! Blockwise 8-bit state on the GPU ([`crate::q8`]): each parameter's state at its own place
//! in a state arena (per state: the codes, four to a word, then one absmax per block; or f32
//! values below `min_8bit_size`), arenas as large as a storage binding allows, and one
//! dispatch of the kernel [`shader::compose`] writes per variant and set of buffers: its
//! table lists the segments (tensors, or chunks of a tensor larger than a binding) it
//! updates, as the f32 path's multi-tensor dispatches do (`gpu::table`). Its pipelines are
//! in the context's registry (`gpu::pipeline`), shared with every other optimizer.

mod layout;
mod shader;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use wgpu::util::DeviceExt;

use crate::gpu::kernel::{binding, Scalars, TABLE_BYTES};
use crate::gpu::packing::{cover, overlap, pack_greedy};
use crate::gpu::pipeline::{buffer_entry, create, CachedPipeline};
use crate::gpu::plan::{check_range, Arg};
use crate::gpu::table::{share_workgroups, table_fits, workgroup_map, TableHead};
use crate::gpu::GpuContext;
use crate::q8::{blocks, check_replacement, Q8States, StoredState, BLOCK_SIZE};
use crate::step::Switches;
use crate::{Algorithm, DType, Error, Result, StateKind, Tensor};

/// What selects one compiled 8-bit pipeline.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Variant {
    switches: Switches,
    kinds: Vec<StateKind>,
    quantized: bool,
    grad_in_params: bool,
    /// One invocation per block (CPU adapters), not one workgroup.
    serial: bool,
    /// Gradients scaled by the clip coefficient (global clipping).
    clip: bool,
    /// How codes are found (8-bit states only; `Table` otherwise).
    requantize: shader::Requantize,
}

/// Where one state of one tensor lies in its tensor's state buffer, in words.
#[derive(Clone, Copy, Debug)]
struct Placement {
    values: u64,
    absmax: u64,
}

/// The states of a run of whole blocks of one tensor, all in one arena: a tensor whose states
/// take more than a storage binding is cut into chunks, as f32 state is.
#[derive(Debug)]
struct StateChunk {
    /// The chunk's first element within its tensor, and its elements.
    start: u64,
    len: u64,
    /// Word offsets within the arena, per state.
    placements: Vec<Placement>,
    /// The arena that holds the chunk's states.
    buffer: wgpu::Buffer,
}

/// One parameter's state.
#[derive(Debug)]
struct TensorState {
    len: u64,
    group: usize,
    quantized: bool,
    kinds: Vec<StateKind>,
    /// In element order; one chunk where f32 (below `min_8bit_size`).
    chunks: Vec<StateChunk>,
}

/// Words one state of `len` elements takes: its codes, four to a word, and one absmax per
/// block where `quantized`; f32 values otherwise.
fn state_words(len: u64, quantized: bool) -> (u64, u64) {
    if quantized {
        (len.div_ceil(4), blocks(len as usize) as u64)
    } else {
        (len, 0)
    }
}

/// Elements per chunk of a tensor of `len` elements whose `kinds` states are `quantized`, so
/// that a chunk's states fit an arena of `arena_cap` bytes: whole blocks of 8-bit state,
/// the whole tensor where it fits (f32 state is never cut: `Optimizer::state` hands it out
/// as one tensor). `None` where not even one block (or the f32 state) fits.
fn chunk_elements(len: u64, kinds: u64, quantized: bool, arena_cap: u64) -> Option<u64> {
    let (values, absmax) = state_words(len, quantized);
    if 4 * kinds * (values + absmax) <= arena_cap {
        return Some(len.max(1));
    }
    let block = BLOCK_SIZE as u64;
    let block_bytes = 4 * kinds * (block / 4 + 1);
    let blocks = arena_cap / block_bytes;
    (quantized && blocks > 0).then_some(blocks * block)
}

/// One chunk of one state to read back: its codes (or values) and absmax as one tensor, the
/// byte where the absmax starts in it, and the chunk's elements.
struct Readback {
    both: Tensor,
    split: usize,
    len: usize,
}

/// One dispatch: the segments of one variant over one set of buffers.
#[derive(Debug)]
struct Dispatch {
    pipeline: Arc<CachedPipeline>,
    bind_group: wgpu::BindGroup,
    workgroups: u32,
    group: usize,
}

/// The dispatches for one set of gradients.
#[derive(Debug)]
struct Bound {
    grads: Vec<Tensor>,
    dispatches: Vec<Dispatch>,
}

/// One segment (a tensor, or a chunk of one) before it joins a dispatch.
struct Segment {
    /// What the dispatch it joins must share.
    key: DispatchKey,
    /// Elements, and blocks of [`BLOCK_SIZE`].
    n: u64,
    blocks: u64,
    /// Bytes of the segment's parameters and gradients.
    param_bytes: (u64, u64),
    grad_bytes: (u64, u64),
    /// Per state: the first word of its codes (or f32 values), and of its absmax, in the arena.
    state_words: [(u64, u64); layout::MAX_STATES],
    /// Workgroups the segment takes uncapped.
    wanted: u32,
}

/// What one dispatch shares: the variant, the group's scalars and the buffers.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct DispatchKey {
    variant: Variant,
    group: usize,
    params: wgpu::Buffer,
    /// `None` where the gradients lie in the parameters' buffer (and binding).
    grads: Option<wgpu::Buffer>,
    state: wgpu::Buffer,
}

/// A dispatch being assembled: its bindings' byte ranges and its segments.
///
/// Beside `gpu::table::TableDispatch`, not one with it: both pack with `gpu::packing` and
/// write a `TableHead` and the same workgroup map, but an 8-bit dispatch binds whole
/// parameter, gradient and state ranges aligned to the storage offset alignment (blocks of
/// codes and their absmax live in one arena), where a multi-tensor dispatch binds one span
/// per slot in units of its element type, and its entries are `Segment`s, not
/// `TableRow`s with per-binding bases.
struct Pending {
    key: DispatchKey,
    params: (u64, u64),
    grads: (u64, u64),
    segments: Vec<usize>,
}

impl Pending {
    /// Adds segment `s` if the bindings' unions with its ranges stay within `max_binding`
    /// (starting at `align`ed offsets), the table has room, and it writes no byte another
    /// segment reads or writes (a race within one dispatch).
    fn try_add(&mut self, s: usize, segments: &[Segment], align: u64, max_binding: u64) -> bool {
        let segment = &segments[s];
        let wanted = self.segments.iter().chain([&s]).map(|&o| u64::from(segments[o].wanted)).sum();
        if !table_fits(self.segments.len() + 1, layout::ENTRY_ROWS, wanted) {
            return false;
        }
        let params = cover(self.params, segment.param_bytes, align);
        let params = if self.key.grads.is_none() { cover(params, segment.grad_bytes, align) } else { params };
        let grads = cover(self.grads, segment.grad_bytes, align);
        let fits = |(lo, hi): (u64, u64)| hi - lo <= max_binding;
        if !fits(params) || (self.key.grads.is_some() && !fits(grads)) {
            return false;
        }
        let races = self.segments.iter().any(|&o| {
            let other = &segments[o];
            // Gradients in the parameters' buffer: every range is in that one buffer.
            let shared = self.key.grads.is_none();
            overlap(segment.param_bytes, other.param_bytes)
                || (shared && overlap(segment.param_bytes, other.grad_bytes))
                || (shared && overlap(segment.grad_bytes, other.param_bytes))
        });
        if races {
            return false;
        }
        self.params = params;
        self.grads = grads;
        self.segments.push(s);
        true
    }

    /// Workgroups per segment ([`share_workgroups`]).
    fn groups(&self, segments: &[Segment]) -> Vec<u32> {
        share_workgroups(&self.segments.iter().map(|&s| segments[s].wanted).collect::<Vec<_>>())
    }

    /// The table's words: the [`TableHead`] (the entry count; no pairs, no norm partials),
    /// then a [`layout::Segment`] per segment, bases relative to the dispatch's bindings, then
    /// the workgroup map.
    fn table(&self, segments: &[Segment]) -> Vec<u32> {
        let head = TableHead { rows: self.segments.len() as u32, ..TableHead::default() };
        let mut words = head.words().to_vec();
        let mut first_group = 0;
        let groups = self.groups(segments);
        let grads_from = if self.key.grads.is_none() { self.params.0 } else { self.grads.0 };
        for (&s, &groups) in self.segments.iter().zip(&groups) {
            let segment = &segments[s];
            let entry = layout::Segment {
                n: segment.n as u32,
                blocks: segment.blocks as u32,
                first_group,
                groups,
                param: ((segment.param_bytes.0 - self.params.0) / 4) as u32,
                grad: ((segment.grad_bytes.0 - grads_from) / 4) as u32,
                reserved: [0; 2],
                values: std::array::from_fn(|k| segment.state_words.get(k).map_or(0, |w| w.0 as u32)),
                absmax: std::array::from_fn(|k| segment.state_words.get(k).map_or(0, |w| w.1 as u32)),
            };
            words.extend(entry.words());
            first_group += groups;
        }
        words.extend(workgroup_map(&groups));
        words
    }
}

/// The 8-bit state of an optimizer and the dispatches that update it.
#[derive(Debug)]
pub(crate) struct Q8Engine {
    config: Q8States,
    tensors: Vec<TensorState>,
    tables: wgpu::Buffer,
    switches: Vec<Switches>,
    bound: Option<Bound>,
    /// One invocation per block (CPU adapters) instead of one workgroup.
    serial: bool,
    /// Global clipping: the kernels scale each gradient by the coefficient in the clip
    /// buffer, which group 0 of the scalars binds.
    clip: bool,
    /// How codes are found: by the adapter's kind, or as `WGPU_OPTIM_Q8_REQUANTIZE` says.
    requantize: shader::Requantize,
}

impl Q8Engine {
    /// Zeroed state for `params`, parameter i in group `groups[i]`, each group run by
    /// `algorithms[g]` (checked by [`crate::q8::check_options`]); with `clip`, kernels that
    /// scale the gradients by the clip coefficient.
    pub(crate) fn new(
        ctx: &GpuContext,
        config: Q8States,
        params: &[Tensor],
        groups: &[usize],
        algorithms: &[Algorithm],
        clip: bool,
    ) -> Result<Self> {
        let limits = ctx.device().limits();
        let max_binding = limits.max_storage_buffer_binding_size;
        // An arena is bound whole, so it is no larger than a binding.
        let arena_cap = max_binding.min(limits.max_buffer_size) / 4 * 4;
        // Per tensor, its chunks: (first element, elements, placements, arena).
        let mut layouts = Vec::with_capacity(params.len());
        // Bytes of each arena, filled in parameter order.
        let mut arenas: Vec<u64> = Vec::new();
        for (i, (param, &group)) in params.iter().zip(groups).enumerate() {
            let kinds = algorithms[group].state_kinds().to_vec();
            let quantized = config.quantizes(param.len);
            let Some(chunk) = chunk_elements(param.len, kinds.len() as u64, quantized, arena_cap) else {
                let (values, absmax) = state_words(param.len, quantized);
                let bytes = 4 * kinds.len() as u64 * (values + absmax);
                return Err(Error::BadRange {
                    argument: format!("params[{i}]"),
                    problem: format!(
                        "its state takes {bytes} bytes, more than the device's largest storage \
                         binding ({max_binding} bytes, max_storage_buffer_binding_size), and the \
                         f32 state of a tensor below min_8bit_size is kept in one binding: lower \
                         min_8bit_size so that it keeps 8-bit state"
                    ),
                });
            };
            let mut chunks = Vec::new();
            for start in (0..param.len.max(1)).step_by(chunk as usize) {
                let len = (param.len - start).min(chunk);
                let (value_words, absmax_words) = state_words(len, quantized);
                let bytes = 4 * kinds.len() as u64 * (value_words + absmax_words);
                if arenas.last().is_none_or(|&used| used + bytes > arena_cap) {
                    arenas.push(0);
                }
                let arena = arenas.len() - 1;
                let first = arenas[arena] / 4;
                arenas[arena] += bytes;
                let placements: Vec<Placement> = (0..kinds.len() as u64)
                    .map(|k| {
                        let at = first + k * (value_words + absmax_words);
                        Placement { values: at, absmax: at + value_words }
                    })
                    .collect();
                chunks.push((start, len, placements, arena));
            }
            layouts.push((param.len, group, quantized, kinds, chunks));
        }
        let tables_words = shader::tables_words();
        ctx.catch("creating the 8-bit state", || {
            let device = ctx.device();
            let buffers: Vec<wgpu::Buffer> = arenas
                .iter()
                .map(|&bytes| {
                    device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("wgpu-optim 8-bit state"),
                        size: bytes.max(4),
                        usage: wgpu::BufferUsages::STORAGE
                            | wgpu::BufferUsages::COPY_SRC
                            | wgpu::BufferUsages::COPY_DST,
                        mapped_at_creation: false,
                    })
                })
                .collect();
            let tensors = layouts
                .into_iter()
                .map(|(len, group, quantized, kinds, chunks)| TensorState {
                    len,
                    group,
                    quantized,
                    kinds,
                    chunks: chunks
                        .into_iter()
                        .map(|(start, len, placements, arena)| StateChunk {
                            start,
                            len,
                            placements,
                            buffer: buffers[arena].clone(),
                        })
                        .collect(),
                })
                .collect();
            let tables = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("wgpu-optim 8-bit code tables"),
                contents: bytemuck::cast_slice(&tables_words),
                usage: wgpu::BufferUsages::STORAGE,
            });
            Q8Engine {
                config,
                tensors,
                tables,
                switches: algorithms.iter().map(|a| a.kernel_step(1).switches()).collect(),
                bound: None,
                // A CPU adapter runs a workgroup barrier as a switch through every invocation:
                // there, one invocation owns a block and needs none, which PERF.md measures.
                serial: ctx.report().device_type == wgpu::DeviceType::Cpu,
                clip,
                requantize: shader::Requantize::chosen(ctx.report().device_type),
            }
        })
    }

    /// Dispatches the bound step records.
    #[cfg(test)]
    pub(crate) fn dispatch_count(&self) -> usize {
        self.bound.as_ref().map_or(0, |b| b.dispatches.len())
    }

    /// Chooses who owns a block: one invocation (`serial`) or one workgroup, whatever the
    /// adapter, so that tests cover both on any adapter.
    #[cfg(test)]
    pub(crate) fn set_serial(&mut self, serial: bool) {
        self.serial = serial;
        self.bound = None;
    }

    /// Chooses how codes are found, whatever the adapter, so that tests cover both.
    #[cfg(test)]
    pub(crate) fn set_requantize(&mut self, requantize: shader::Requantize) {
        self.requantize = requantize;
        self.bound = None;
    }

    /// Group `g` now runs `algorithm` (same state kinds): its pipelines change with its
    /// switches.
    pub(crate) fn set_algorithm(&mut self, g: usize, algorithm: &Algorithm) {
        let switches = algorithm.kernel_step(1).switches();
        if self.switches[g] != switches {
            self.switches[g] = switches;
            self.bound = None;
        }
    }

    /// Builds the dispatches for `grads` unless they are the last ones bound. Refused, with
    /// nothing recorded, for gradients that are not F32, not of their parameter's length,
    /// not bindable, or that overlap their parameter.
    pub(crate) fn bind(&mut self, ctx: &GpuContext, params: &[Tensor], grads: &[Tensor]) -> Result<()> {
        if self.bound.as_ref().is_some_and(|b| b.grads == grads) {
            return Ok(());
        }
        if grads.len() != params.len() {
            return Err(Error::CountMismatch {
                argument: "grads".into(),
                got: grads.len(),
                expected: params.len(),
            });
        }
        for (i, (param, grad)) in params.iter().zip(grads).enumerate() {
            let arg = Arg::new(format!("grads[{i}]"), grad);
            check_range(&arg)?;
            if grad.dtype != DType::F32 {
                return Err(Error::DTypeMismatch {
                    argument: arg.name,
                    got: grad.dtype,
                    expected: "F32 with q8_states".into(),
                });
            }
            if grad.len != param.len {
                return Err(Error::LengthMismatch {
                    argument: arg.name,
                    got: grad.len,
                    expected: param.len,
                    reference: format!("params[{i}]"),
                });
            }
            // As every kernel here: a gradient may be its parameter exactly (each element is
            // read before it is written), never overlap it otherwise.
            let overlaps = grad.buffer == param.buffer
                && grad.offset < param.offset + 4 * param.len
                && param.offset < grad.offset + 4 * grad.len;
            if overlaps && grad != param {
                return Err(Error::PartialOverlap { output: format!("params[{i}]"), other: arg.name });
            }
        }
        let limits = ctx.device().limits();
        let align = u64::from(limits.min_storage_buffer_offset_alignment);
        let uniform_align = u64::from(limits.min_uniform_buffer_offset_alignment);
        let max_binding = limits.max_storage_buffer_binding_size;
        // Elements per chunk: whole blocks whose f32 range fits a binding after alignment.
        let chunk = ((max_binding.saturating_sub(align)) / 4 / BLOCK_SIZE as u64 * BLOCK_SIZE as u64)
            .max(BLOCK_SIZE as u64);
        let mut segments: Vec<Segment> = Vec::new();
        for (i, (param, grad)) in params.iter().zip(grads).enumerate() {
            let tensor = &self.tensors[i];
            let shared = grad.buffer == param.buffer;
            let quantized = tensor.quantized && !tensor.kinds.is_empty();
            let variant = Variant {
                switches: self.switches[tensor.group],
                kinds: tensor.kinds.clone(),
                quantized,
                grad_in_params: shared,
                serial: self.serial && quantized,
                clip: self.clip,
                requantize: if quantized { self.requantize } else { shader::Requantize::Table },
            };
            // Each state chunk (one arena), cut again where its parameters outgrow a binding;
            // both cuts fall on whole blocks.
            let pieces = tensor.chunks.iter().flat_map(|state| {
                (0..state.len).step_by(chunk as usize).map(move |at| (state, at, (state.len - at).min(chunk)))
            });
            for (state, at, n) in pieces {
                let key = DispatchKey {
                    variant: variant.clone(),
                    group: tensor.group,
                    params: param.buffer.clone(),
                    grads: (!shared).then(|| grad.buffer.clone()),
                    state: state.buffer.clone(),
                };
                let start = state.start + at;
                let bytes = |t: &Tensor| (t.offset + 4 * start, t.offset + 4 * (start + n));
                let (param_bytes, grad_bytes) = (bytes(param), bytes(grad));
                if shared {
                    let lo = param_bytes.0.min(grad_bytes.0) / align * align;
                    let hi = param_bytes.1.max(grad_bytes.1);
                    if hi - lo > max_binding {
                        return Err(Error::BadRange {
                            argument: format!("grads[{i}]"),
                            problem: format!(
                                "it shares a buffer with params[{i}] too far apart to bind both at once \
                                 ({} bytes, more than max_storage_buffer_binding_size {max_binding}): \
                                 put gradients in a buffer of their own",
                                hi - lo
                            ),
                        });
                    }
                }
                let mut state_words = [(0, 0); layout::MAX_STATES];
                for (k, placement) in state.placements.iter().enumerate() {
                    state_words[k] = if tensor.quantized {
                        (placement.values + at / 4, placement.absmax + at / BLOCK_SIZE as u64)
                    } else {
                        (placement.values + at, 0)
                    };
                }
                let blocks = blocks(n as usize) as u64;
                let owners =
                    if key.variant.serial { blocks.div_ceil(u64::from(shader::WORKGROUP)) } else { blocks };
                let wanted = owners as u32;
                segments.push(Segment { key, n, blocks, param_bytes, grad_bytes, state_words, wanted });
            }
        }
        // Segments of one variant over the same buffers share a dispatch while its bindings
        // fit.
        let empty = (u64::MAX, 0);
        let pending = pack_greedy(
            segments.iter().enumerate().map(|(s, segment)| (Some(segment.key.clone()), s)),
            |s| {
                let key = segments[s].key.clone();
                let mut fresh = Pending { key, params: empty, grads: empty, segments: Vec::new() };
                // A lone segment always fits: its ranges were checked above.
                let added = fresh.try_add(s, &segments, align, max_binding);
                debug_assert!(added);
                fresh
            },
            |dispatch, &s| dispatch.try_add(s, &segments, align, max_binding),
        );
        let mut pipelines = Vec::with_capacity(pending.len());
        for dispatch in &pending {
            pipelines.push(ctx.inner.pipelines.get_q8(ctx, &dispatch.key.variant)?);
        }
        let slot = TABLE_BYTES.next_multiple_of(uniform_align);
        let mut contents = vec![0u8; pending.len() * slot as usize];
        for (dispatch, bytes) in pending.iter().zip(contents.chunks_exact_mut(slot as usize)) {
            let table = dispatch.table(&segments);
            bytes[..4 * table.len()].copy_from_slice(bytemuck::cast_slice(&table));
        }
        let device = ctx.device();
        let dispatches = ctx.catch("binding the 8-bit step", || {
            let uniforms = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("wgpu-optim 8-bit segment tables"),
                contents: &contents,
                usage: wgpu::BufferUsages::UNIFORM,
            });
            let mut dispatches = Vec::with_capacity(pending.len());
            for (d, (dispatch, pipeline)) in pending.iter().zip(pipelines).enumerate() {
                let key = &dispatch.key;
                let at = d as u64 * slot;
                let table = (at, at + TABLE_BYTES);
                let mut entries = vec![
                    buffer(binding::TABLE, &uniforms, table),
                    buffer(binding::Q8_PARAMS, &key.params, dispatch.params),
                    buffer(binding::Q8_STATE, &key.state, (0, key.state.size())),
                ];
                if let Some(grad_buffer) = &key.grads {
                    entries.push(buffer(binding::Q8_GRADS, grad_buffer, dispatch.grads));
                }
                if key.variant.quantized {
                    entries.push(buffer(binding::Q8_CODE_TABLES, &self.tables, (0, self.tables.size())));
                }
                let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some("wgpu-optim 8-bit step"),
                    layout: &pipeline.segment_layout,
                    entries: &entries,
                });
                let workgroups = dispatch.groups(&segments).iter().sum::<u32>();
                dispatches.push(Dispatch { pipeline, bind_group, workgroups, group: key.group });
            }
            dispatches
        })?;
        self.bound = Some(Bound { grads: grads.to_vec(), dispatches });
        Ok(())
    }

    /// Records the bound dispatches; `scalars[g]` is group g's hyperparameter bind group.
    pub(crate) fn record(&self, pass: &mut wgpu::ComputePass<'_>, scalars: &[wgpu::BindGroup]) {
        let Some(bound) = &self.bound else { return };
        for dispatch in &bound.dispatches {
            pass.set_pipeline(&dispatch.pipeline.pipeline);
            pass.set_bind_group(binding::GROUP_SCALARS, &scalars[dispatch.group], &[]);
            pass.set_bind_group(binding::GROUP_TABLE, &dispatch.bind_group, &[]);
            pass.dispatch_workgroups(dispatch.workgroups, 1, 1);
        }
    }

    /// State `kind` of parameter `i` as a tensor, where it is f32 (below `min_8bit_size`).
    pub(crate) fn f32_state(&self, i: usize, kind: StateKind) -> Option<Tensor> {
        let tensor = self.tensors.get(i)?;
        let k = tensor.kinds.iter().position(|s| *s == kind)?;
        // f32 state is one chunk.
        let chunk = tensor.chunks.first().filter(|_| !tensor.quantized)?;
        Some(Tensor::new(&chunk.buffer, 4 * chunk.placements[k].values, tensor.len, DType::F32))
    }

    /// The words of state `k` of parameter `i`, chunk by chunk: its values (codes), and its
    /// absmax.
    fn views(&self, i: usize, k: usize) -> impl Iterator<Item = (Tensor, Tensor)> + '_ {
        let tensor = &self.tensors[i];
        tensor.chunks.iter().map(move |chunk| {
            let placement = chunk.placements[k];
            let (value_words, absmax_words) = state_words(chunk.len, tensor.quantized);
            let values = Tensor::new(&chunk.buffer, 4 * placement.values, value_words, DType::F32);
            (values, Tensor::new(&chunk.buffer, 4 * placement.absmax, absmax_words, DType::F32))
        })
    }

    /// The 8-bit settings (only checkpoints read them).
    #[cfg_attr(not(feature = "checkpoint"), allow(dead_code))]
    pub(crate) fn config(&self) -> Q8States {
        self.config
    }

    /// Parameter `i`'s state of `kind`, read back (waits for the queue).
    pub(crate) fn read(&self, ctx: &GpuContext, i: usize, kind: StateKind) -> Result<Option<StoredState>> {
        let Some(views) = self.readback_views(i, kind) else { return Ok(None) };
        let mut parts = Vec::with_capacity(views.len());
        for view in &views {
            parts.push(ctx.read_bytes(&view.both)?);
        }
        Ok(Some(self.decode(i, &views, &parts)))
    }

    /// [`Self::read`] without blocking (a browser's main thread).
    pub(crate) async fn read_async(
        &self,
        ctx: &GpuContext,
        i: usize,
        kind: StateKind,
    ) -> Result<Option<StoredState>> {
        let Some(views) = self.readback_views(i, kind) else { return Ok(None) };
        let mut parts = Vec::with_capacity(views.len());
        for view in &views {
            parts.push(ctx.read_bytes_async(&view.both).await?);
        }
        Ok(Some(self.decode(i, &views, &parts)))
    }

    /// Parameter `i`'s state of `kind`, one readback per chunk; `None` where there is no
    /// such state.
    fn readback_views(&self, i: usize, kind: StateKind) -> Option<Vec<Readback>> {
        let tensor = self.tensors.get(i)?;
        let k = tensor.kinds.iter().position(|s| *s == kind)?;
        let views = self.views(i, k).zip(&tensor.chunks).map(|((values, absmax), chunk)| {
            // A state's absmax words follow its codes: one readback takes both.
            debug_assert_eq!(absmax.offset, values.offset + 4 * values.len);
            let both = Tensor::new(&values.buffer, values.offset, values.len + absmax.len, DType::F32);
            Readback { both, split: 4 * values.len as usize, len: chunk.len as usize }
        });
        Some(views.collect())
    }

    /// Parameter `i`'s state from the bytes of its [`Self::readback_views`], chunk by chunk.
    fn decode(&self, i: usize, views: &[Readback], parts: &[Vec<u8>]) -> StoredState {
        let tensor = &self.tensors[i];
        let mut codes = Vec::with_capacity(tensor.len as usize);
        let mut absmax: Vec<f32> = Vec::with_capacity(blocks(tensor.len as usize));
        for (view, bytes) in views.iter().zip(parts) {
            let (value_bytes, absmax_bytes) = bytes.split_at(view.split);
            if !tensor.quantized {
                // f32 state is one chunk.
                return StoredState::F32(bytemuck::pod_collect_to_vec(value_bytes));
            }
            codes.extend_from_slice(&value_bytes[..view.len]);
            absmax.extend(bytemuck::pod_collect_to_vec::<u8, f32>(absmax_bytes));
        }
        StoredState::Q8 { codes, absmax }
    }

    /// Replaces parameter `i`'s state of `kind` (queued: lands before the next submitted
    /// step). Refused, with nothing written, where `state` is not stored as this tensor's is
    /// or has the wrong length.
    pub(crate) fn write(
        &self,
        ctx: &GpuContext,
        i: usize,
        kind: StateKind,
        state: &StoredState,
    ) -> Result<()> {
        let count = self.tensors.len();
        let tensor = self.tensors.get(i).ok_or_else(|| Error::BadRange {
            argument: format!("index {i}"),
            problem: format!("the optimizer has {count} parameters (indices from 0)"),
        })?;
        let k = tensor.kinds.iter().position(|s| *s == kind).ok_or_else(|| Error::StateMismatch {
            argument: format!("state kind {kind:?}"),
            got: vec![kind],
            expected: tensor.kinds.clone(),
        })?;
        check_replacement(state, self.config, tensor.len as usize, &format!("q8 state {i} {kind:?}"))?;
        for ((values, absmax_view), chunk) in self.views(i, k).zip(&tensor.chunks) {
            let (start, end) = (chunk.start as usize, (chunk.start + chunk.len) as usize);
            match state {
                StoredState::F32(v) => ctx.write_bytes(&values, bytemuck::cast_slice(&v[start..end]))?,
                StoredState::Q8 { codes, absmax } => {
                    let mut words = codes[start..end].to_vec();
                    words.resize(4 * values.len as usize, 0);
                    ctx.write_bytes(&values, &words)?;
                    let first = start / BLOCK_SIZE;
                    let absmax = &absmax[first..first + absmax_view.len as usize];
                    if !absmax.is_empty() {
                        ctx.write_bytes(&absmax_view, bytemuck::cast_slice(absmax))?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Binding `binding` of bytes `lo..hi` of `buffer`.
fn buffer(binding: u32, buffer: &wgpu::Buffer, (lo, hi): (u64, u64)) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry {
        binding,
        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer,
            offset: lo,
            size: wgpu::BufferSize::new(hi - lo),
        }),
    }
}

/// The pipeline of `variant`; the context's registry (`gpu::pipeline`) calls this once per
/// variant.
pub(crate) fn compile(ctx: &GpuContext, variant: &Variant) -> Result<CachedPipeline> {
    let source = shader::compose(variant);
    let overrides = variant.switches.overrides();
    let label = format!("wgpu-optim 8-bit {} {overrides:?}", variant.switches.family().name());
    use wgpu::BufferBindingType::{Storage, Uniform};
    let mut entries = vec![
        buffer_entry(binding::TABLE, Uniform, false, TABLE_BYTES),
        buffer_entry(binding::Q8_PARAMS, Storage { read_only: false }, false, 4),
        buffer_entry(binding::Q8_STATE, Storage { read_only: false }, false, 4),
    ];
    if !variant.grad_in_params {
        entries.push(buffer_entry(binding::Q8_GRADS, Storage { read_only: true }, false, 4));
    }
    if variant.quantized {
        entries.push(buffer_entry(binding::Q8_CODE_TABLES, Storage { read_only: true }, false, 4));
    }
    let group0 = ctx.inner.scalar_layouts.get(Scalars::Host, variant.clip);
    let constants: Vec<(&str, f64)> = overrides.iter().map(|o| o.constant()).collect();
    let (pipeline, segment_layout) = create(ctx, &label, &source, group0, &entries, &constants)?;
    log::debug!("compiled {label}");
    Ok(CachedPipeline { pipeline, segment_layout })
}
