//! Blockwise 8-bit state on the GPU ([`crate::q8`]): each parameter's state at its own place
//! in a state arena (per state: the codes, four to a word, then one absmax per block; or f32
//! values below `min_8bit_size`), arenas as large as a storage binding allows, and one
//! dispatch of the kernel [`shader::compose`] writes per variant and set of buffers: its
//! table lists the segments (tensors, or chunks of a tensor larger than a binding) it
//! updates, as the f32 path's multi-tensor dispatches do (`gpu::table`).

mod shader;

use std::collections::HashMap;
use std::sync::Arc;

use wgpu::util::DeviceExt;

use crate::gpu::kernel::{Scalars, TABLE_BYTES};
use crate::gpu::pipeline::{buffer_entry, create};
use crate::gpu::plan::{check_range, Arg};
use crate::gpu::table::{share_workgroups, table_fits, workgroup_map};
use crate::gpu::GpuContext;
use crate::q8::{blocks, check_replacement, Q8States, StoredState, BLOCK_SIZE};
use crate::step::Switches;
use crate::{Algorithm, DType, Error, Result, StateKind, Tensor};

/// What selects one compiled 8-bit pipeline.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Variant {
    switches: Switches,
    kinds: Vec<StateKind>,
    quantized: bool,
    grad_in_params: bool,
    /// One invocation per block (CPU adapters), not one workgroup.
    serial: bool,
    /// Gradients scaled by the clip coefficient (global clipping).
    clip: bool,
}

#[derive(Debug)]
struct Pipeline {
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
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
    pipeline: Arc<Pipeline>,
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
    state_words: [(u64, u64); 2],
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
        if !table_fits(self.segments.len() + 1, shader::ENTRY_ROWS, wanted) {
            return false;
        }
        let union = |(lo, hi): (u64, u64), (a, b): (u64, u64)| (lo.min(a / align * align), hi.max(b));
        let params = union(self.params, segment.param_bytes);
        let params = if self.key.grads.is_none() { union(params, segment.grad_bytes) } else { params };
        let grads = union(self.grads, segment.grad_bytes);
        let fits = |(lo, hi): (u64, u64)| hi - lo <= max_binding;
        if !fits(params) || (self.key.grads.is_some() && !fits(grads)) {
            return false;
        }
        let overlap = |(a, b): (u64, u64), (c, d): (u64, u64)| a < d && c < b;
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

    /// The table's words: the header `(entries, 0, 0, 0)`, then per segment
    /// [`shader::SEGMENT_FIELDS`], bases relative to the dispatch's bindings, then the
    /// workgroup map.
    fn table(&self, segments: &[Segment]) -> Vec<u32> {
        let mut words = vec![self.segments.len() as u32, 0, 0, 0];
        let mut first = 0;
        let groups = self.groups(segments);
        for (&s, &groups) in self.segments.iter().zip(&groups) {
            let (segment, groups) = (&segments[s], u64::from(groups));
            let grads_from = if self.key.grads.is_none() { self.params.0 } else { self.grads.0 };
            let [(s0, a0), (s1, a1)] = segment.state_words;
            let fields = [
                segment.n,
                segment.blocks,
                first,
                groups,
                (segment.param_bytes.0 - self.params.0) / 4,
                (segment.grad_bytes.0 - grads_from) / 4,
                s0,
                a0,
                s1,
                a1,
                0,
                0,
            ];
            words.extend(fields.iter().map(|&f| f as u32));
            first += groups;
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
    pipelines: HashMap<Variant, Arc<Pipeline>>,
    bound: Option<Bound>,
    /// One invocation per block (CPU adapters) instead of one workgroup.
    serial: bool,
    /// Global clipping: the kernels scale each gradient by the coefficient in the clip
    /// buffer, which group 0 of the scalars binds.
    clip: bool,
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
                pipelines: HashMap::new(),
                bound: None,
                // A CPU adapter runs a workgroup barrier as a switch through every invocation:
                // there, one invocation owns a block and needs none (16 Mi-element Adam on
                // lavapipe took 348 ms with a workgroup per block, 155 ms with one invocation).
                serial: ctx.report().device_type == wgpu::DeviceType::Cpu,
                clip,
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
        let chunk =
            ((max_binding.saturating_sub(align)) / 4 / BLOCK_SIZE as u64 * BLOCK_SIZE as u64).max(256);
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
                let mut state_words = [(0, 0); 2];
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
        // fit; the map holds the dispatch still open for each key.
        let mut pending: Vec<Pending> = Vec::new();
        #[allow(clippy::mutable_key_type)]
        let mut open: HashMap<DispatchKey, usize> = HashMap::new();
        for (s, segment) in segments.iter().enumerate() {
            let key = &segment.key;
            if let Some(&d) = open.get(key) {
                if pending[d].try_add(s, &segments, align, max_binding) {
                    continue;
                }
            }
            let empty = (u64::MAX, 0);
            let mut fresh = Pending { key: key.clone(), params: empty, grads: empty, segments: Vec::new() };
            // A lone segment always fits: its ranges were checked above.
            let added = fresh.try_add(s, &segments, align, max_binding);
            debug_assert!(added);
            open.insert(key.clone(), pending.len());
            pending.push(fresh);
        }
        let mut pipelines = Vec::with_capacity(pending.len());
        for dispatch in &pending {
            pipelines.push(self.pipeline(ctx, &dispatch.key.variant)?);
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
                let mut entries = vec![
                    buffer(0, &uniforms, (at, at + TABLE_BYTES)),
                    buffer(1, &key.params, dispatch.params),
                    buffer(3, &key.state, (0, key.state.size())),
                ];
                if let Some(grad_buffer) = &key.grads {
                    entries.push(buffer(2, grad_buffer, dispatch.grads));
                }
                if key.variant.quantized {
                    entries.push(buffer(4, &self.tables, (0, self.tables.size())));
                }
                let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some("wgpu-optim 8-bit step"),
                    layout: &pipeline.layout,
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
            pass.set_bind_group(0, &scalars[dispatch.group], &[]);
            pass.set_bind_group(1, &dispatch.bind_group, &[]);
            pass.dispatch_workgroups(dispatch.workgroups, 1, 1);
        }
    }

    fn pipeline(&mut self, ctx: &GpuContext, variant: &Variant) -> Result<Arc<Pipeline>> {
        if let Some(hit) = self.pipelines.get(variant) {
            return Ok(hit.clone());
        }
        let compiled = Arc::new(compile(ctx, variant)?);
        self.pipelines.insert(variant.clone(), compiled.clone());
        Ok(compiled)
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

fn compile(ctx: &GpuContext, variant: &Variant) -> Result<Pipeline> {
    let source = shader::compose(
        &variant.switches,
        &variant.kinds,
        variant.quantized,
        variant.grad_in_params,
        variant.serial,
        variant.clip,
    );
    let overrides = variant.switches.overrides();
    let label = format!("wgpu-optim 8-bit {} {overrides:?}", variant.switches.family().name());
    use wgpu::BufferBindingType::{Storage, Uniform};
    let mut entries = vec![
        buffer_entry(0, Uniform, false, TABLE_BYTES),
        buffer_entry(1, Storage { read_only: false }, false, 4),
        buffer_entry(3, Storage { read_only: false }, false, 4),
    ];
    if !variant.grad_in_params {
        entries.push(buffer_entry(2, Storage { read_only: true }, false, 4));
    }
    if variant.quantized {
        entries.push(buffer_entry(4, Storage { read_only: true }, false, 4));
    }
    let group0 = ctx.inner.scalar_layouts.get(Scalars::Host, variant.clip);
    let constants: Vec<(&str, f64)> = overrides.iter().map(|o| o.constant()).collect();
    let (pipeline, layout) = create(ctx, &label, &source, group0, &entries, &constants)?;
    Ok(Pipeline { pipeline, layout })
}

#[cfg(test)]
mod tests {
    use crate::oracle::{bnb_8bit_step, bnb_adam8bit_step, bnb_sgd8bit_step, BnbAdam, BnbSgd};
    use crate::q8::{Q8States, StoredState};
    use crate::{
        Adam, Algorithm, DType, GpuContext, Optimizer, OptimizerOptions, ParamGroup, Sgd, StateKind, Tensor,
    };

    /// Asserts that `got` (read back) follows the oracle's 8-bit state `want` as FORMAT.md
    /// compares them: codes within 1 and at most 1 % differing, absmax within 1e-4 relative;
    /// f32 state within 1e-6.
    fn assert_state_follows(what: &str, got: Option<StoredState>, want: &StoredState) {
        match (got, want) {
            (
                Some(StoredState::Q8 { codes, absmax }),
                StoredState::Q8 { codes: w_codes, absmax: w_absmax },
            ) => {
                let differing = codes.iter().zip(w_codes).filter(|(a, b)| a != b).count();
                let furthest = codes.iter().zip(w_codes).map(|(a, b)| a.abs_diff(*b)).max().unwrap_or(0);
                assert!(
                    codes.len() == w_codes.len() && furthest <= 1 && differing * 100 <= codes.len(),
                    "{what}: {differing} codes differ, by up to {furthest}"
                );
                assert_eq!(absmax.len(), w_absmax.len(), "{what}: absmax count");
                for (a, b) in absmax.iter().zip(w_absmax) {
                    assert!((a - b).abs() <= 1e-4 * b.abs(), "{what}: absmax {a} against {b}");
                }
            }
            (Some(StoredState::F32(values)), StoredState::F32(w_values)) => {
                assert_eq!(values.len(), w_values.len(), "{what}: length");
                for (a, b) in values.iter().zip(w_values) {
                    assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "{what}: {a} against {b}");
                }
            }
            (got, _) => panic!("{what}: stored as {got:?}, not as the oracle's"),
        }
    }

    /// A device of its own whose storage bindings hold 64 KiB (WebGPU's defaults otherwise),
    /// whatever the adapter's limit: small enough that a few thousand elements outgrow one.
    fn ctx_with_64k_bindings() -> GpuContext {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = pollster::block_on(wgpu::util::initialize_adapter_from_env_or_default(&instance, None))
            .unwrap_or_else(|e| panic!("{e}"));
        let limits = wgpu::Limits { max_storage_buffer_binding_size: 64 << 10, ..wgpu::Limits::default() };
        let descriptor = wgpu::DeviceDescriptor { required_limits: limits, ..Default::default() };
        let (device, queue) =
            pollster::block_on(adapter.request_device(&descriptor)).unwrap_or_else(|e| panic!("{e}"));
        GpuContext::from_device(device, queue)
    }

    /// A device whose storage bindings hold 64 KiB: a tensor larger than a binding is
    /// updated in chunks, the states fill several arenas, and bindings that would outgrow a
    /// binding start new dispatches; every tensor still follows the oracle.
    #[test]
    fn tensors_past_a_small_binding_limit_split_into_chunks_arenas_and_dispatches() {
        let ctx = ctx_with_64k_bindings();
        // 25000 elements: two chunks of whole blocks, and 51 KB of 8-bit state, so the next
        // tensor's state starts a new arena.
        let sizes = [25_000usize, 4096, 4096, 300, 4096];
        let adam = Adam { lr: 1e-2, weight_decay: 0.1, decoupled_weight_decay: true, ..Adam::default() };
        let config =
            BnbAdam { lr: adam.lr, beta1: adam.beta1, beta2: adam.beta2, eps: adam.eps, weight_decay: 0.1 };
        let total: usize = sizes.iter().sum::<usize>() + 1;
        let initial: Vec<f64> = (0..total).map(|i| ((i * 7919) % 1000) as f64 * 1e-3 - 0.5).collect();
        let grads: Vec<Vec<f64>> = (0..2)
            .map(|k| (0..total).map(|i| ((i * 104_729 + k * 31) % 997) as f64 * 1e-4 - 0.05).collect())
            .collect();
        // Tensor t covers elements at[t].. of the flat buffers, one element in.
        let at: Vec<usize> =
            sizes.iter().scan(1, |next, &n| Some(std::mem::replace(next, *next + n))).collect();
        let mut want: Vec<Vec<f64>> =
            at.iter().zip(&sizes).map(|(&a, &n)| initial[a..a + n].to_vec()).collect();
        let mut states: Vec<[StoredState; 2]> = sizes
            .iter()
            .map(|&n| [StoredState::zeros(n, n >= 4096), StoredState::zeros(n, n >= 4096)])
            .collect();
        for (k, g) in grads.iter().enumerate() {
            for (t, [m, v]) in states.iter_mut().enumerate() {
                let g: Vec<f64> = g[at[t]..at[t] + sizes[t]].iter().map(|&x| f64::from(x as f32)).collect();
                bnb_adam8bit_step(&config, k as u64 + 1, &mut want[t], &g, m, v)
                    .unwrap_or_else(|e| panic!("{e}"));
                want[t] = want[t].iter().map(|&x| f64::from(x as f32)).collect();
            }
        }
        for serial in [false, true] {
            let flat = ctx.upload("params", &initial, DType::F32);
            let flat_grads = ctx.zeros("grads", total as u64, DType::F32);
            let view =
                |b: &Tensor, t: usize| Tensor::new(&b.buffer, 4 * at[t] as u64, sizes[t] as u64, DType::F32);
            let params: Vec<Tensor> = (0..sizes.len()).map(|t| view(&flat, t)).collect();
            let grad_tensors: Vec<Tensor> = (0..sizes.len()).map(|t| view(&flat_grads, t)).collect();
            let options = OptimizerOptions { q8_states: Some(Q8States::default()), ..Default::default() };
            let mut opt =
                Optimizer::with_options(&ctx, adam, &params, options).unwrap_or_else(|e| panic!("{e}"));
            if let Some(engine) = opt.q8_engine_mut() {
                engine.set_serial(serial);
            }
            for g in &grads {
                ctx.write(&flat_grads, g).unwrap_or_else(|e| panic!("{e}"));
                opt.step(&grad_tensors).unwrap_or_else(|e| panic!("{e}"));
            }
            let dispatches = opt.q8_engine_mut().map_or(0, |e| e.dispatch_count());
            assert!(dispatches >= 3, "serial {serial}: {dispatches} dispatches, expected a split");
            for (t, param) in params.iter().enumerate() {
                let got = ctx.read(param).unwrap_or_else(|e| panic!("{e}"));
                let worst = got.iter().zip(&want[t]).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
                assert!(worst < 1e-4, "serial {serial}: params[{t}] {worst} from the oracle's");
                for (kind, want) in [StateKind::ExpAvg, StateKind::ExpAvgSq].iter().zip(&states[t]) {
                    let got = opt.read_q8_state(t, *kind).unwrap_or_else(|e| panic!("{e}"));
                    assert_state_follows(&format!("serial {serial}: params[{t}] {kind:?}"), got, want);
                }
            }
        }
    }

    /// Many tensors in shared buffers (odd offsets, a tensor below `min_8bit_size`, three
    /// groups of two algorithms, gradients in a buffer of their own or beside the
    /// parameters): one dispatch per variant and group, each tensor as the oracle steps it,
    /// for both owners of a block.
    #[test]
    fn tensors_in_shared_buffers_step_in_one_dispatch_per_variant_and_follow_the_oracle() {
        let ctx = GpuContext::headless_blocking().unwrap_or_else(|e| panic!("{e}"));
        // Group 0 (AdamW): two 8-bit tensors and one below min_8bit_size; group 1 (Adam, no
        // decay): two 8-bit tensors, one ending in a partial block; group 2 (SGD momentum).
        let sizes = [5003usize, 4096, 300, 8209, 4096, 6000];
        let group_of = [0usize, 0, 0, 1, 1, 2];
        let adamw = Adam { lr: 1e-2, weight_decay: 0.1, decoupled_weight_decay: true, ..Adam::default() };
        let adam = Adam { lr: 3e-3, weight_decay: 0.0, decoupled_weight_decay: true, ..Adam::default() };
        let sgd = Sgd { lr: 1e-2, momentum: 0.9, ..Sgd::default() };
        let bnb = |a: &Adam| BnbAdam {
            lr: a.lr,
            beta1: a.beta1,
            beta2: a.beta2,
            eps: a.eps,
            weight_decay: a.weight_decay,
        };
        let initial: Vec<Vec<f64>> = sizes
            .iter()
            .enumerate()
            .map(|(t, &n)| (0..n).map(|i| ((i * 7919 + t * 13) % 1000) as f64 * 1e-3 - 0.5).collect())
            .collect();
        let grads: Vec<Vec<Vec<f64>>> = (0..3)
            .map(|k| {
                sizes
                    .iter()
                    .enumerate()
                    .map(|(t, &n)| {
                        (0..n).map(|i| ((i * 104_729 + k * 31 + t) % 997) as f64 * 1e-4 - 0.05).collect()
                    })
                    .collect()
            })
            .collect();
        // The oracle, tensor by tensor.
        let mut want = initial.clone();
        let mut states: Vec<Vec<StoredState>> = sizes
            .iter()
            .zip(group_of)
            .map(|(&n, g)| {
                let kinds = if g == 2 { 1 } else { 2 };
                (0..kinds).map(|_| StoredState::zeros(n, n >= 4096)).collect()
            })
            .collect();
        for (k, step_grads) in grads.iter().enumerate() {
            for t in 0..sizes.len() {
                let g: Vec<f64> = step_grads[t].iter().map(|&x| f64::from(x as f32)).collect();
                let step = k as u64 + 1;
                let result = match (group_of[t], states[t].as_mut_slice()) {
                    (2, [buffer]) => {
                        let config = BnbSgd { lr: sgd.lr, momentum: sgd.momentum, weight_decay: 0.0 };
                        bnb_sgd8bit_step(&config, step, &mut want[t], &g, buffer)
                    }
                    (group, [m, v]) => {
                        let config = bnb(if group == 0 { &adamw } else { &adam });
                        bnb_adam8bit_step(&config, step, &mut want[t], &g, m, v)
                    }
                    _ => unreachable!(),
                };
                result.unwrap_or_else(|e| panic!("{e}"));
                want[t] = want[t].iter().map(|&x| f64::from(x as f32)).collect();
            }
        }
        // Elements of padding before each tensor, so none starts at an aligned offset.
        let place = |first_pad: usize, between: usize| {
            let mut at = Vec::new();
            let mut next = first_pad;
            for &n in &sizes {
                at.push(next);
                next += n + between;
            }
            (at, next)
        };
        for grads_beside_params in [false, true] {
            for serial in [false, true] {
                let what = format!("grads beside params {grads_beside_params}, serial {serial}");
                // Beside: each gradient right after its parameter, in the parameters' buffer.
                let (at, total) = place(
                    3,
                    if grads_beside_params { sizes.iter().max().copied().unwrap_or(0) + 5 } else { 7 },
                );
                let mut flat = vec![0.0; total];
                for (t, p) in initial.iter().enumerate() {
                    flat[at[t]..at[t] + p.len()].copy_from_slice(p);
                }
                let param_buffer = ctx.upload("params", &flat, DType::F32);
                let grad_buffer = ctx.zeros("grads", total as u64, DType::F32);
                let params: Vec<Tensor> = at
                    .iter()
                    .zip(&sizes)
                    .map(|(&a, &n)| Tensor::new(&param_buffer.buffer, 4 * a as u64, n as u64, DType::F32))
                    .collect();
                let grad_at = |t: usize| if grads_beside_params { at[t] + sizes[t] + 2 } else { at[t] };
                let grad_home = if grads_beside_params { &param_buffer } else { &grad_buffer };
                let grad_tensors: Vec<Tensor> = (0..sizes.len())
                    .map(|t| {
                        Tensor::new(&grad_home.buffer, 4 * grad_at(t) as u64, sizes[t] as u64, DType::F32)
                    })
                    .collect();
                let groups = vec![
                    ParamGroup::new(adamw, &params[..3]),
                    ParamGroup::new(adam, &params[3..5]),
                    ParamGroup::new(sgd, &params[5..]),
                ];
                let options = OptimizerOptions { q8_states: Some(Q8States::default()), ..Default::default() };
                let mut opt = Optimizer::with_groups(&ctx, groups, options).unwrap_or_else(|e| panic!("{e}"));
                if let Some(engine) = opt.q8_engine_mut() {
                    engine.set_serial(serial);
                }
                for step_grads in &grads {
                    for (t, g) in grad_tensors.iter().enumerate() {
                        ctx.write(g, &step_grads[t]).unwrap_or_else(|e| panic!("{e}"));
                    }
                    opt.step(&grad_tensors).unwrap_or_else(|e| panic!("{e}"));
                }
                // Group 0: its 8-bit tensors, and its f32-state tensor; groups 1 and 2: one each.
                let dispatches = opt.q8_engine_mut().map_or(0, |e| e.dispatch_count());
                assert_eq!(dispatches, 4, "{what}: dispatches");
                for (t, param) in params.iter().enumerate() {
                    let got = ctx.read(param).unwrap_or_else(|e| panic!("{e}"));
                    let worst = got.iter().zip(&want[t]).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
                    assert!(worst < 1e-4, "{what}: params[{t}] {worst} from the oracle's");
                    let kinds: &[StateKind] = if group_of[t] == 2 {
                        &[StateKind::MomentumBuffer]
                    } else {
                        &[StateKind::ExpAvg, StateKind::ExpAvgSq]
                    };
                    for (kind, want) in kinds.iter().zip(&states[t]) {
                        let got = opt.read_q8_state(t, *kind).unwrap_or_else(|e| panic!("{e}"));
                        assert_state_follows(&format!("{what}: params[{t}] {kind:?}"), got, want);
                    }
                }
                // Gradients beside parameters are read, never written.
                for (t, g) in grad_tensors.iter().enumerate() {
                    let got = ctx.read(g).unwrap_or_else(|e| panic!("{e}"));
                    let last = grads.last().map(|s| &s[t]).unwrap_or_else(|| unreachable!());
                    let worst = got.iter().zip(last).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
                    assert!(worst < 1e-6, "{what}: grads[{t}] changed by {worst}");
                }
            }
        }
    }

    /// `algorithm` with 8-bit state over one tensor of `initial` values, stepped by `grads`
    /// with blocks owned by one invocation each (`serial`) or by a workgroup; its parameters
    /// must land within 1e-4 of the oracle's `want`. Returns the optimizer, for its state.
    fn run_adam_8bit(
        ctx: &GpuContext,
        algorithm: Algorithm,
        initial: &[f64],
        grads: &[Vec<f64>],
        serial: bool,
        want: &[f64],
    ) -> Optimizer {
        let p = ctx.upload("param", initial, DType::F32);
        let g = ctx.zeros("grad", initial.len() as u64, DType::F32);
        let options = OptimizerOptions { q8_states: Some(Q8States::default()), ..Default::default() };
        let mut opt = Optimizer::with_options(ctx, algorithm, std::slice::from_ref(&p), options)
            .unwrap_or_else(|e| panic!("serial {serial}: {e}"));
        if let Some(engine) = opt.q8_engine_mut() {
            engine.set_serial(serial);
        }
        for grad in grads {
            ctx.write(&g, grad).unwrap_or_else(|e| panic!("{e}"));
            opt.step(std::slice::from_ref(&g)).unwrap_or_else(|e| panic!("{e}"));
        }
        let got = ctx.read(&p).unwrap_or_else(|e| panic!("{e}"));
        let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(worst < 1e-4, "serial {serial}: parameters {worst} from the oracle's");
        opt
    }

    /// Both owners of a block (a workgroup, one invocation) against the oracle, over a
    /// tensor that ends in a partial block and a word of fewer than four codes.
    #[test]
    fn a_workgroup_and_a_single_invocation_per_block_both_follow_the_oracle() {
        let ctx = GpuContext::headless_blocking().unwrap_or_else(|e| panic!("{e}"));
        let n = 5000 + 3;
        let param: Vec<f64> = (0..n).map(|i| ((i * 7919) % 1000) as f64 * 1e-3 - 0.5).collect();
        let grads: Vec<Vec<f64>> = (0..3)
            .map(|k| (0..n).map(|i| ((i * 104_729 + k * 31) % 997) as f64 * 1e-4 - 0.05).collect())
            .collect();
        let adam = Adam { weight_decay: 0.1, decoupled_weight_decay: true, ..Adam::default() };
        let config =
            BnbAdam { lr: adam.lr, beta1: adam.beta1, beta2: adam.beta2, eps: adam.eps, weight_decay: 0.1 };
        let (mut want, mut m, mut v) =
            (param.clone(), StoredState::zeros(n, true), StoredState::zeros(n, true));
        for (k, g) in grads.iter().enumerate() {
            let narrowed: Vec<f64> = g.iter().map(|&x| f64::from(x as f32)).collect();
            bnb_adam8bit_step(&config, k as u64 + 1, &mut want, &narrowed, &mut m, &mut v)
                .unwrap_or_else(|e| panic!("{e}"));
            want = want.iter().map(|&x| f64::from(x as f32)).collect();
        }
        for serial in [false, true] {
            let opt = run_adam_8bit(&ctx, adam.into(), &param, &grads, serial, &want);
            for (kind, want) in [(StateKind::ExpAvg, &m), (StateKind::ExpAvgSq, &v)] {
                let got = opt.read_q8_state(0, kind).unwrap_or_else(|e| panic!("{e}"));
                let (
                    Some(StoredState::Q8 { codes, absmax }),
                    StoredState::Q8 { codes: w_codes, absmax: w_absmax },
                ) = (got, want)
                else {
                    panic!("serial {serial}: {kind:?} is not 8-bit");
                };
                let differing = codes.iter().zip(w_codes).filter(|(a, b)| a != b).count();
                let furthest = codes.iter().zip(w_codes).map(|(a, b)| a.abs_diff(*b)).max().unwrap_or(0);
                assert!(
                    furthest <= 1 && differing * 100 <= n,
                    "serial {serial} {kind:?}: {differing} codes differ"
                );
                for (a, b) in absmax.iter().zip(w_absmax) {
                    assert!(
                        (a - b).abs() <= 1e-4 * b.abs(),
                        "serial {serial} {kind:?}: absmax {a} against {b}"
                    );
                }
            }
        }
    }

    /// The code of 0 in the map of `kind` (the signed map's is not its first code).
    fn zero_code(kind: StateKind) -> u8 {
        let map = crate::q8::map_for(kind);
        map.iter().position(|&c| c == 0.0).unwrap_or_else(|| panic!("no 0 in the map")) as u8
    }

    /// One NaN or infinite gradient element with 8-bit state: its parameter goes non-finite
    /// as with f32 state, its state takes the code of 0 and its block's absmax leaves it out,
    /// so the block's 255 other elements and the next step follow the oracle; for every
    /// 8-bit algorithm, NaN, +inf and -inf, and both owners of a block.
    #[test]
    fn a_non_finite_gradient_element_makes_only_its_own_parameter_non_finite() {
        use wgpu_optim_testkit::compare::{assert_close, compare_codes, Tolerance};
        let ctx = GpuContext::headless_blocking().unwrap_or_else(|e| panic!("{e}"));
        // Four blocks, the last partial; the bad element in the second.
        let (n, bad) = (1000usize, 300usize);
        let config = Q8States { min_8bit_size: 256 };
        let algorithms: [Algorithm; 3] = [
            Adam { lr: 1e-2, ..Adam::default() }.into(),
            Adam { lr: 1e-2, weight_decay: 0.1, decoupled_weight_decay: true, ..Adam::default() }.into(),
            Sgd { lr: 1e-2, momentum: 0.9, ..Sgd::default() }.into(),
        ];
        let initial: Vec<f64> = (0..n).map(|i| ((i * 7919) % 1000) as f64 * 1e-3 - 0.5).collect();
        for algorithm in algorithms {
            let kinds = algorithm.state_kinds();
            for bad_value in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
                // A good step, the bad one, and a good one after it.
                let grads: Vec<Vec<f64>> = (0..3)
                    .map(|k| {
                        let mut g: Vec<f64> = (0..n)
                            .map(|i| f64::from((((i * 104_729 + k * 31) % 997) as f64 * 1e-4 - 0.05) as f32))
                            .collect();
                        if k == 1 {
                            g[bad] = bad_value;
                        }
                        g
                    })
                    .collect();
                let mut want = initial.clone();
                let mut states: Vec<StoredState> =
                    kinds.iter().map(|_| StoredState::zeros(n, true)).collect();
                let mut after: Vec<(Vec<f64>, Vec<StoredState>)> = Vec::new();
                for (k, g) in grads.iter().enumerate() {
                    bnb_8bit_step(&algorithm, k as u64 + 1, &mut want, g, &mut states)
                        .unwrap_or_else(|e| panic!("{e}"));
                    after.push((want.clone(), states.clone()));
                }
                for serial in [false, true] {
                    let what = format!("{algorithm:?}, gradient {bad_value}, serial {serial}");
                    let p = ctx.upload("param", &initial, DType::F32);
                    let g = ctx.zeros("grad", n as u64, DType::F32);
                    let options = OptimizerOptions { q8_states: Some(config), ..Default::default() };
                    let mut opt = Optimizer::with_options(&ctx, algorithm, std::slice::from_ref(&p), options)
                        .unwrap_or_else(|e| panic!("{e}"));
                    if let Some(engine) = opt.q8_engine_mut() {
                        engine.set_serial(serial);
                    }
                    for (k, (grad, (want, want_states))) in grads.iter().zip(&after).enumerate() {
                        let what = format!("{what}, after step {}", k + 1);
                        ctx.write(&g, grad).unwrap_or_else(|e| panic!("{e}"));
                        opt.step(std::slice::from_ref(&g)).unwrap_or_else(|e| panic!("{e}"));
                        let got = ctx.read(&p).unwrap_or_else(|e| panic!("{e}"));
                        let non_finite: Vec<usize> = (0..n).filter(|&i| !got[i].is_finite()).collect();
                        let expected: &[usize] = if k == 0 { &[] } else { &[bad] };
                        assert_eq!(non_finite, expected, "{what}: non-finite parameters");
                        let tolerance = Tolerance::Close { rtol: 0.0, atol: 1e-4 };
                        assert_close(&format!("{what}: parameters"), &got, want, tolerance);
                        for (kind, want) in kinds.iter().zip(want_states) {
                            let what = format!("{what}: {kind:?}");
                            let Some(StoredState::Q8 { codes, absmax }) =
                                opt.read_q8_state(0, *kind).unwrap_or_else(|e| panic!("{e}"))
                            else {
                                panic!("{what} is not 8-bit");
                            };
                            assert!(absmax.iter().all(|a| a.is_finite()), "{what}: absmax {absmax:?}");
                            if k == 1 {
                                assert_eq!(codes[bad], zero_code(*kind), "{what}: the bad element's code");
                            }
                            let StoredState::Q8 { codes: want_codes, absmax: want_absmax } = want else {
                                panic!("{what}: the oracle's state is not 8-bit");
                            };
                            let widen = |c: &[u8]| c.iter().map(|&c| f64::from(c)).collect::<Vec<_>>();
                            let codes_match = compare_codes(&widen(&codes), &widen(want_codes));
                            assert!(codes_match.passed(), "{what}: codes {codes_match}");
                            let widen = |a: &[f32]| a.iter().map(|&a| f64::from(a)).collect::<Vec<_>>();
                            let absmax_tolerance = Tolerance::Close { rtol: 1e-4, atol: 0.0 };
                            assert_close(&what, &widen(&absmax), &widen(want_absmax), absmax_tolerance);
                        }
                    }
                }
            }
        }
    }

    /// An 8-bit Adam state larger than a storage binding (64 KiB here; 40000 elements keep
    /// 81 KB of codes and absmax) is cut into chunks of whole blocks, each in an arena of its
    /// own: the tensor steps as the oracle does, and `read_q8_state` and `write_q8_state` see
    /// the whole tensor's state across the chunks.
    #[test]
    fn an_8bit_state_larger_than_a_binding_is_cut_into_chunks() {
        let ctx = ctx_with_64k_bindings();
        let n = 40_000usize;
        let adam: Algorithm =
            Adam { lr: 1e-2, weight_decay: 0.1, decoupled_weight_decay: true, ..Adam::default() }.into();
        let initial: Vec<f64> = (0..n).map(|i| ((i * 7919) % 1000) as f64 * 1e-3 - 0.5).collect();
        let grads: Vec<Vec<f64>> = (0..2)
            .map(|k| {
                (0..n)
                    .map(|i| f64::from((((i * 104_729 + k * 31) % 997) as f64 * 1e-4 - 0.05) as f32))
                    .collect()
            })
            .collect();
        let mut want = initial.clone();
        let mut states = [StoredState::zeros(n, true), StoredState::zeros(n, true)];
        for (k, g) in grads.iter().enumerate() {
            bnb_8bit_step(&adam, k as u64 + 1, &mut want, g, &mut states).unwrap_or_else(|e| panic!("{e}"));
        }
        for serial in [false, true] {
            let opt = run_adam_8bit(&ctx, adam, &initial, &grads, serial, &want);
            for (kind, want) in [StateKind::ExpAvg, StateKind::ExpAvgSq].iter().zip(&states) {
                let got = opt.read_q8_state(0, *kind).unwrap_or_else(|e| panic!("{e}"));
                assert_state_follows(&format!("serial {serial}: {kind:?}"), got, want);
            }
            // A state of distinct codes and absmax, written and read back whole.
            let written = StoredState::Q8 {
                codes: (0..n).map(|i| (i * 7 % 256) as u8).collect(),
                absmax: (0..crate::q8::blocks(n)).map(|b| b as f32 + 0.5).collect(),
            };
            opt.write_q8_state(0, StateKind::ExpAvgSq, &written).unwrap_or_else(|e| panic!("{e}"));
            let back = opt.read_q8_state(0, StateKind::ExpAvgSq).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(back.as_ref(), Some(&written), "serial {serial}: the state written, read back");
            let other = opt.read_q8_state(0, StateKind::ExpAvg).unwrap_or_else(|e| panic!("{e}"));
            assert_state_follows(&format!("serial {serial}: ExpAvg after the write"), other, &states[0]);
        }
    }

    /// Every 8-bit kernel variant, clipped or not, is created on a device with exactly
    /// WebGPU's default limits: its storage bindings (parameters, gradients, the state arena,
    /// the code tables and the clip buffer) stay within the 8 a stage may bind.
    #[test]
    fn every_8bit_kernel_variant_compiles_within_webgpus_default_limits() {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = pollster::block_on(wgpu::util::initialize_adapter_from_env_or_default(&instance, None))
            .unwrap_or_else(|e| panic!("{e}"));
        let descriptor =
            wgpu::DeviceDescriptor { required_limits: wgpu::Limits::default(), ..Default::default() };
        let (device, queue) =
            pollster::block_on(adapter.request_device(&descriptor)).unwrap_or_else(|e| panic!("{e}"));
        let ctx = GpuContext::from_device(device, queue);
        assert_eq!(ctx.device().limits().max_storage_buffers_per_shader_stage, 8);
        let algorithms: [Algorithm; 2] =
            [Adam::adamw().into(), Sgd { momentum: 0.9, nesterov: true, ..Sgd::default() }.into()];
        for algorithm in algorithms {
            for (quantized, serial) in [(true, false), (true, true), (false, false)] {
                for (grad_in_params, clip) in [(false, false), (false, true), (true, true)] {
                    let variant = super::Variant {
                        switches: algorithm.kernel_step(1).switches(),
                        kinds: algorithm.state_kinds().to_vec(),
                        quantized,
                        grad_in_params,
                        serial,
                        clip,
                    };
                    super::compile(&ctx, &variant).unwrap_or_else(|e| panic!("{variant:?}: {e}"));
                }
            }
        }
    }
}
