//! The engine of blockwise low-bit state on the GPU, shared by 8-bit ([`crate::gpu::q8`])
//! and 4-bit ([`crate::gpu::q4`]) state: each parameter's state at its own place in a state
//! arena (per state: its codes, then one scale per block; or f32 values for a tensor that
//! keeps f32 state), arenas as large as a storage binding allows, and one dispatch per
//! variant and set of buffers, whose table ([`layout`]) lists the segments (tensors, or
//! chunks of a tensor larger than a binding) it updates, as the f32 path's multi-tensor
//! dispatches do (`gpu::table`). Pipelines are in the context's registry (`gpu::pipeline`),
//! shared with every other optimizer.
//!
//! What differs between the formats is a [`Format`]: codes per word, the block size, which
//! tensors keep quantized state, how many workgroups a segment takes, its pipeline and
//! 8-bit's code tables. The WGSL, the host-side codecs and the state types stay in the
//! formats' modules.

pub(in crate::gpu) mod layout;
pub(in crate::gpu) mod wgsl;

use std::sync::Arc;

use wgpu::util::DeviceExt;

use crate::gpu::kernel::{binding, Scalars, TABLE_BYTES};
use crate::gpu::packing::{cover, overlap, pack_greedy};
use crate::gpu::pipeline::{buffer_entry, create, CachedPipeline};
use crate::gpu::plan::{check_range, Arg};
use crate::gpu::q8::Requantize;
use crate::gpu::table::{share_workgroups, table_fits, workgroup_map, TableHead};
use crate::gpu::GpuContext;
use crate::step::{KernelStep, Switches};
use crate::{Algorithm, DType, Error, Result, StateKind, Tensor};

/// What a format of blockwise state brings to the shared [`Engine`].
pub(crate) trait Format {
    /// "8-bit" or "4-bit", for labels and errors.
    const NAME: &'static str;
    /// The builder option that turns the format on, for errors.
    const OPTION: &'static str;
    /// Codes per `u32` word of quantized state.
    const CODES_PER_WORD: u64;
    /// The end of the error of a tensor whose f32 state outgrows a binding: that f32 state
    /// is kept in one binding, and what to do about it.
    const F32_TOO_LARGE: &'static str;
    /// Elements per block of quantized state.
    fn block_size(&self) -> u64;
    /// Whether a tensor of `len` elements keeps quantized state.
    fn quantizes(&self, len: u64) -> bool;
    /// Elements a binding-sized piece of a tensor is cut in whole multiples of: whole blocks
    /// of quantized state and of the f32 kernel's.
    fn piece_unit(&self) -> u64;
    /// Blocks of a segment of `n` elements of `variant`, and the workgroups it wants.
    fn blocks(&self, variant: &Variant, n: u64) -> (u64, u64);
    /// The pipeline of `variant` from the context's registry.
    fn pipeline(ctx: &GpuContext, variant: &Variant) -> Result<Arc<CachedPipeline>>;
    /// The format's state as the optimizer hands it out and takes it (`q8::StoredState`,
    /// `q4::Q4State`).
    type State;
    /// How errors about a replacement state name it, before its index and kind.
    const STATE_ARGUMENT: &'static str;
    /// A state read back, as the format's type.
    fn to_state(stored: Stored<Vec<u8>, Vec<f32>>) -> Self::State;
    /// `state`'s codes and scales (or f32 values), where it is stored as this format keeps
    /// a tensor of `len` elements and has that length; refused otherwise, naming it
    /// `argument`.
    fn check_replacement<'a>(
        &self,
        state: &'a Self::State,
        len: usize,
        argument: &str,
    ) -> Result<Stored<&'a [u8], &'a [f32]>>;
    /// A read-only buffer every quantized variant binds besides its three (8-bit's code
    /// tables).
    fn code_tables(&self) -> Option<&wgpu::Buffer> {
        None
    }
    /// How quantized variants find their codes (8-bit's choice per adapter).
    fn requantize(&self) -> Requantize {
        Requantize::Table
    }
    /// The step of `algorithm` at `t` (from 1) as the format runs it (8-bit:
    /// bitsandbytes' kernels' form, `crate::q8::kernel_step`).
    fn kernel_step(algorithm: &Algorithm, t: u64) -> KernelStep {
        algorithm.kernel_step(t)
    }
    /// The switches of a tensor's kernel in a group whose step has `switches`: those where
    /// its state is `quantized`, the format's f32 kernel's otherwise.
    fn tensor_switches(switches: Switches, quantized: bool) -> Switches {
        let _ = quantized;
        switches
    }
    /// Whether a non-finite gradient leaves its parameter as it was and restarts its
    /// element's quantized states from 0, in a group whose step has `switches`.
    fn restarts_non_finite(switches: &Switches) -> bool {
        let _ = switches;
        false
    }
}

/// What selects one compiled low-bit pipeline (the registry keeps each format's apart).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Variant {
    pub(in crate::gpu) switches: Switches,
    pub(in crate::gpu) kinds: Vec<StateKind>,
    pub(in crate::gpu) quantized: bool,
    pub(in crate::gpu) grad_in_params: bool,
    /// One invocation per block (CPU adapters), not a workgroup per block (or group of
    /// blocks).
    pub(in crate::gpu) serial: bool,
    /// Gradients scaled by the clip coefficient (global clipping).
    pub(in crate::gpu) clip: bool,
    /// Elements per block of quantized state (8-bit's is always `q8::BLOCK_SIZE`).
    pub(in crate::gpu) block_size: u32,
    /// How 8-bit codes are found (`Table` for f32 state and for 4-bit, which searches its
    /// 16-entry maps).
    pub(in crate::gpu) requantize: Requantize,
    /// A non-finite gradient leaves its parameter as it was and restarts its element's
    /// quantized states from 0 ([`Format::restarts_non_finite`]).
    pub(in crate::gpu) restart_non_finite: bool,
}

/// Where one state of one tensor chunk lies in its arena, in words.
#[derive(Clone, Copy, Debug)]
struct Placement {
    values: u64,
    scale: u64,
}

/// The states of a run of whole blocks of one tensor, all in one arena: a tensor whose
/// states take more than a storage binding is cut into chunks, as f32 state is.
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
    /// In element order; one chunk where f32.
    chunks: Vec<StateChunk>,
}

/// Words one state of `len` elements takes: its codes, `F::CODES_PER_WORD` to a word, and
/// one scale per block where `quantized`; f32 values otherwise.
fn state_words<F: Format>(format: &F, len: u64, quantized: bool) -> (u64, u64) {
    if quantized {
        (len.div_ceil(F::CODES_PER_WORD), len.div_ceil(format.block_size()))
    } else {
        (len, 0)
    }
}

/// Elements per chunk of a tensor of `len` elements whose `kinds` states are `quantized`, so
/// that a chunk's states fit an arena of `arena_cap` bytes: whole blocks of quantized state,
/// the whole tensor where it fits (f32 state is never cut: `Optimizer::state` hands it out
/// as one tensor). `None` where not even one block (or the f32 state) fits.
fn chunk_elements<F: Format>(
    format: &F,
    len: u64,
    kinds: u64,
    quantized: bool,
    arena_cap: u64,
) -> Option<u64> {
    let (values, scale) = state_words(format, len, quantized);
    if 4 * kinds * (values + scale) <= arena_cap {
        return Some(len.max(1));
    }
    let block = format.block_size();
    let (block_values, block_scale) = state_words(format, block, true);
    let blocks = arena_cap / (4 * kinds * (block_values + block_scale));
    (quantized && blocks > 0).then_some(blocks * block)
}

/// One chunk of one state to read back: its codes (or values) and scales as one tensor, the
/// byte where the scales start in it, and the chunk's elements.
struct Readback {
    both: Tensor,
    split: usize,
    len: usize,
}

/// A state as stored, whichever the format: what the formats' own state types wrap.
pub(crate) enum Stored<C, S> {
    /// Packed codes (`CODES_PER_WORD / 4` to a byte) and one scale per block.
    Codes { codes: C, scale: S },
    /// f32 values.
    F32(S),
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
    /// Elements, and blocks.
    n: u64,
    blocks: u64,
    /// Bytes of the segment's parameters and gradients.
    param_bytes: (u64, u64),
    grad_bytes: (u64, u64),
    /// Per state: the first word of its codes (or f32 values), and of its scales, in the arena.
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
/// write a `TableHead` and the same workgroup map, but a low-bit dispatch binds whole
/// parameter, gradient and state ranges aligned to the storage offset alignment (blocks of
/// codes and their scales live in one arena), where a multi-tensor dispatch binds one span
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
        // Gradients in the parameters' buffer: every range is in that one buffer.
        let shared = self.key.grads.is_none();
        let races = self.segments.iter().any(|&o| {
            let other = &segments[o];
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
                scale: std::array::from_fn(|k| segment.state_words.get(k).map_or(0, |w| w.1 as u32)),
            };
            words.extend(entry.words());
            first_group += groups;
        }
        words.extend(workgroup_map(&groups));
        words
    }
}

/// The low-bit state of an optimizer and the dispatches that update it.
#[derive(Debug)]
pub(crate) struct Engine<F> {
    pub(in crate::gpu) format: F,
    tensors: Vec<TensorState>,
    switches: Vec<Switches>,
    bound: Option<Bound>,
    /// One invocation per block (CPU adapters) instead of a workgroup.
    serial: bool,
    /// Global clipping: the kernels scale each gradient by the coefficient in the clip
    /// buffer, which group 0 of the scalars binds.
    clip: bool,
}

impl<F: Format> Engine<F> {
    /// Zeroed state (codes 0 under scale 0) for `params`, parameter i in group `groups[i]`,
    /// each group run by `algorithms[g]` (checked by the format's `check_options`); with
    /// `clip`, kernels that scale the gradients by the clip coefficient.
    pub(in crate::gpu) fn with_format(
        ctx: &GpuContext,
        format: F,
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
            let quantized = format.quantizes(param.len);
            let Some(chunk) = chunk_elements(&format, param.len, kinds.len() as u64, quantized, arena_cap)
            else {
                let (values, scale) = state_words(&format, param.len, quantized);
                let bytes = 4 * kinds.len() as u64 * (values + scale);
                return Err(Error::BadRange {
                    argument: format!("params[{i}]"),
                    problem: format!(
                        "its f32 state takes {bytes} bytes, more than the device's largest storage \
                         binding ({max_binding} bytes, max_storage_buffer_binding_size), and {}",
                        F::F32_TOO_LARGE
                    ),
                });
            };
            let mut chunks = Vec::new();
            for start in (0..param.len.max(1)).step_by(chunk as usize) {
                let len = (param.len - start).min(chunk);
                let (value_words, scale_words) = state_words(&format, len, quantized);
                let bytes = 4 * kinds.len() as u64 * (value_words + scale_words);
                if arenas.last().is_none_or(|&used| used + bytes > arena_cap) {
                    arenas.push(0);
                }
                let arena = arenas.len() - 1;
                let first = arenas[arena] / 4;
                arenas[arena] += bytes;
                let placements: Vec<Placement> = (0..kinds.len() as u64)
                    .map(|k| {
                        let at = first + k * (value_words + scale_words);
                        Placement { values: at, scale: at + value_words }
                    })
                    .collect();
                chunks.push((start, len, placements, arena));
            }
            layouts.push((param.len, group, quantized, kinds, chunks));
        }
        let label = format!("wgpu-optim {} state", F::NAME);
        ctx.catch(&format!("creating the {} state", F::NAME), || {
            let device = ctx.device();
            // Created zeroed: codes 0 under scale 0.
            let buffers: Vec<wgpu::Buffer> = arenas
                .iter()
                .map(|&bytes| {
                    device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some(&label),
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
            Engine {
                format,
                tensors,
                switches: algorithms.iter().map(|a| F::kernel_step(a, 1).switches()).collect(),
                bound: None,
                // A CPU adapter runs a workgroup barrier as a switch through every invocation:
                // there, one invocation owns a block and needs none, which PERF.md measures.
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

    /// Chooses who owns a block: one invocation (`serial`) or a workgroup, whatever the
    /// adapter, so that tests cover both on any adapter.
    #[cfg(test)]
    pub(crate) fn set_serial(&mut self, serial: bool) {
        self.serial = serial;
        self.bound = None;
    }

    /// The format's settings, to change in tests: the dispatches are bound again.
    #[cfg(test)]
    pub(crate) fn format_mut(&mut self) -> &mut F {
        self.bound = None;
        &mut self.format
    }

    /// Group `g` now runs `algorithm` (same state kinds): its pipelines change with its
    /// switches.
    pub(crate) fn set_algorithm(&mut self, g: usize, algorithm: &Algorithm) {
        let switches = F::kernel_step(algorithm, 1).switches();
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
        check_grads::<F>(params, grads)?;
        let limits = ctx.device().limits();
        let align = u64::from(limits.min_storage_buffer_offset_alignment);
        let uniform_align = u64::from(limits.min_uniform_buffer_offset_alignment);
        let max_binding = limits.max_storage_buffer_binding_size;
        let block = self.format.block_size();
        // Elements per piece: whole units whose f32 range fits a binding after alignment.
        let unit = self.format.piece_unit();
        let chunk = ((max_binding.saturating_sub(align)) / 4 / unit * unit).max(unit);
        let mut segments: Vec<Segment> = Vec::new();
        for (i, (param, grad)) in params.iter().zip(grads).enumerate() {
            let tensor = &self.tensors[i];
            let shared = grad.buffer == param.buffer;
            let quantized = tensor.quantized && !tensor.kinds.is_empty();
            let switches = self.switches[tensor.group];
            let variant = Variant {
                switches: F::tensor_switches(switches, quantized),
                kinds: tensor.kinds.clone(),
                quantized,
                grad_in_params: shared,
                serial: self.serial && quantized,
                clip: self.clip,
                block_size: block as u32,
                requantize: if quantized { self.format.requantize() } else { Requantize::Table },
                restart_non_finite: quantized && F::restarts_non_finite(&switches),
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
                        (placement.values + at / F::CODES_PER_WORD, placement.scale + at / block)
                    } else {
                        (placement.values + at, 0)
                    };
                }
                let (blocks, owners) = self.format.blocks(&key.variant, n);
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
            pipelines.push(F::pipeline(ctx, &dispatch.key.variant)?);
        }
        let slot = TABLE_BYTES.next_multiple_of(uniform_align);
        let mut contents = vec![0u8; pending.len() * slot as usize];
        for (dispatch, bytes) in pending.iter().zip(contents.chunks_exact_mut(slot as usize)) {
            let table = dispatch.table(&segments);
            bytes[..4 * table.len()].copy_from_slice(bytemuck::cast_slice(&table));
        }
        let device = ctx.device();
        let tables_label = format!("wgpu-optim {} segment tables", F::NAME);
        let step_label = format!("wgpu-optim {} step", F::NAME);
        let dispatches = ctx.catch(&format!("binding the {} step", F::NAME), || {
            let uniforms = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(&tables_label),
                contents: &contents,
                usage: wgpu::BufferUsages::UNIFORM,
            });
            let mut dispatches = Vec::with_capacity(pending.len());
            for (d, (dispatch, pipeline)) in pending.iter().zip(pipelines).enumerate() {
                let key = &dispatch.key;
                let at = d as u64 * slot;
                let mut entries = vec![
                    buffer(binding::TABLE, &uniforms, (at, at + TABLE_BYTES)),
                    buffer(binding::Q8_PARAMS, &key.params, dispatch.params),
                    buffer(binding::Q8_STATE, &key.state, (0, key.state.size())),
                ];
                if let Some(grad_buffer) = &key.grads {
                    entries.push(buffer(binding::Q8_GRADS, grad_buffer, dispatch.grads));
                }
                if let Some(tables) = self.format.code_tables().filter(|_| key.variant.quantized) {
                    entries.push(buffer(binding::Q8_CODE_TABLES, tables, (0, tables.size())));
                }
                let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some(&step_label),
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

    /// State `kind` of parameter `i` as a tensor, where it is f32.
    pub(crate) fn f32_state(&self, i: usize, kind: StateKind) -> Option<Tensor> {
        let tensor = self.tensors.get(i)?;
        let k = tensor.kinds.iter().position(|s| *s == kind)?;
        // f32 state is one chunk.
        let chunk = tensor.chunks.first().filter(|_| !tensor.quantized)?;
        Some(Tensor::new(&chunk.buffer, 4 * chunk.placements[k].values, tensor.len, DType::F32))
    }

    /// The words of state `k` of parameter `i`, chunk by chunk: its codes (or values), and
    /// its scales.
    fn views(&self, i: usize, k: usize) -> impl Iterator<Item = (Tensor, Tensor)> + '_ {
        let tensor = &self.tensors[i];
        tensor.chunks.iter().map(move |chunk| {
            let placement = chunk.placements[k];
            let (value_words, scale_words) = state_words(&self.format, chunk.len, tensor.quantized);
            let values = Tensor::new(&chunk.buffer, 4 * placement.values, value_words, DType::F32);
            (values, Tensor::new(&chunk.buffer, 4 * placement.scale, scale_words, DType::F32))
        })
    }

    /// Parameter `i`'s state of `kind`, read back (waits for the queue); `None` where there
    /// is no such state.
    pub(crate) fn read(&self, ctx: &GpuContext, i: usize, kind: StateKind) -> Result<Option<F::State>> {
        let Some(views) = self.readback_views(i, kind) else { return Ok(None) };
        let mut parts = Vec::with_capacity(views.len());
        for view in &views {
            parts.push(ctx.read_bytes(&view.both)?);
        }
        Ok(Some(F::to_state(self.decode(i, &views, &parts))))
    }

    /// [`Self::read`] without blocking (a browser's main thread).
    pub(crate) async fn read_async(
        &self,
        ctx: &GpuContext,
        i: usize,
        kind: StateKind,
    ) -> Result<Option<F::State>> {
        let Some(views) = self.readback_views(i, kind) else { return Ok(None) };
        let mut parts = Vec::with_capacity(views.len());
        for view in &views {
            parts.push(ctx.read_bytes_async(&view.both).await?);
        }
        Ok(Some(F::to_state(self.decode(i, &views, &parts))))
    }

    /// Parameter `i`'s state of `kind`, one readback per chunk; `None` where there is no
    /// such state.
    fn readback_views(&self, i: usize, kind: StateKind) -> Option<Vec<Readback>> {
        let tensor = self.tensors.get(i)?;
        let k = tensor.kinds.iter().position(|s| *s == kind)?;
        let views = self.views(i, k).zip(&tensor.chunks).map(|((values, scale), chunk)| {
            // A state's scale words follow its codes: one readback takes both.
            debug_assert_eq!(scale.offset, values.offset + 4 * values.len);
            let both = Tensor::new(&values.buffer, values.offset, values.len + scale.len, DType::F32);
            Readback { both, split: 4 * values.len as usize, len: chunk.len as usize }
        });
        Some(views.collect())
    }

    /// Parameter `i`'s state from the bytes of its [`Self::readback_views`], chunk by chunk:
    /// the codes' bytes are the packed codes as they lie in the words.
    fn decode(&self, i: usize, views: &[Readback], parts: &[Vec<u8>]) -> Stored<Vec<u8>, Vec<f32>> {
        let tensor = &self.tensors[i];
        let code_bytes = |len: usize| len * 4 / F::CODES_PER_WORD as usize;
        let mut codes = Vec::with_capacity(code_bytes(tensor.len as usize));
        let mut scale: Vec<f32> = Vec::with_capacity(tensor.len.div_ceil(self.format.block_size()) as usize);
        for (view, bytes) in views.iter().zip(parts) {
            let (value_bytes, scale_bytes) = bytes.split_at(view.split);
            if !tensor.quantized {
                // f32 state is one chunk.
                return Stored::F32(bytemuck::pod_collect_to_vec(value_bytes));
            }
            codes.extend_from_slice(&value_bytes[..code_bytes(view.len)]);
            scale.extend(bytemuck::pod_collect_to_vec::<u8, f32>(scale_bytes));
        }
        Stored::Codes { codes, scale }
    }

    /// Parameter `i` and the index of its state of `kind`: refused where the optimizer has
    /// no such parameter or state.
    fn position(&self, i: usize, kind: StateKind) -> Result<(&TensorState, usize)> {
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
        Ok((tensor, k))
    }

    /// Replaces parameter `i`'s state of `kind` (queued: lands before the next submitted
    /// step). Refused, with nothing written, where `state` is not stored as this tensor's is
    /// or has the wrong length.
    pub(crate) fn write(&self, ctx: &GpuContext, i: usize, kind: StateKind, state: &F::State) -> Result<()> {
        let (tensor, k) = self.position(i, kind)?;
        let argument = format!("{} {i} {kind:?}", F::STATE_ARGUMENT);
        let state = self.format.check_replacement(state, tensor.len as usize, &argument)?;
        let block = self.format.block_size() as usize;
        let code_bytes = |element: usize| element * 4 / F::CODES_PER_WORD as usize;
        for ((values, scale_view), chunk) in self.views(i, k).zip(&tensor.chunks) {
            let (start, end) = (chunk.start as usize, (chunk.start + chunk.len) as usize);
            match state {
                Stored::F32(v) => ctx.write_bytes(&values, bytemuck::cast_slice(&v[start..end]))?,
                Stored::Codes { codes, scale } => {
                    let codes = &codes[code_bytes(start)..code_bytes(end)];
                    // A chunk's last word may hold fewer codes than it has room for.
                    if codes.len() == 4 * values.len as usize {
                        ctx.write_bytes(&values, codes)?;
                    } else {
                        let mut words = codes.to_vec();
                        words.resize(4 * values.len as usize, 0);
                        ctx.write_bytes(&values, &words)?;
                    }
                    let first = start / block;
                    let scale = &scale[first..first + scale_view.len as usize];
                    if !scale.is_empty() {
                        ctx.write_bytes(&scale_view, bytemuck::cast_slice(scale))?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Refuses gradients that are not F32, not of their parameter's length, not bindable, or
/// that overlap their parameter.
fn check_grads<F: Format>(params: &[Tensor], grads: &[Tensor]) -> Result<()> {
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
                expected: format!("F32 with {}", F::OPTION),
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
    Ok(())
}

/// Binding `binding` of bytes `lo..hi` of `buffer`.
pub(in crate::gpu) fn buffer(
    binding: u32,
    buffer: &wgpu::Buffer,
    (lo, hi): (u64, u64),
) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry {
        binding,
        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer,
            offset: lo,
            size: wgpu::BufferSize::new(hi - lo),
        }),
    }
}

/// The pipeline of `variant` from its WGSL `source` (with `code_tables`, binding 8-bit's
/// code tables); the context's registry calls this once per variant.
pub(in crate::gpu) fn compile(
    ctx: &GpuContext,
    name: &str,
    variant: &Variant,
    source: &str,
    code_tables: bool,
) -> Result<CachedPipeline> {
    let overrides = variant.switches.overrides();
    let label = format!("wgpu-optim {name} {} {overrides:?}", variant.switches.family().name());
    use wgpu::BufferBindingType::{Storage, Uniform};
    let mut entries = vec![
        buffer_entry(binding::TABLE, Uniform, false, TABLE_BYTES),
        buffer_entry(binding::Q8_PARAMS, Storage { read_only: false }, false, 4),
        buffer_entry(binding::Q8_STATE, Storage { read_only: false }, false, 4),
    ];
    if !variant.grad_in_params {
        entries.push(buffer_entry(binding::Q8_GRADS, Storage { read_only: true }, false, 4));
    }
    if code_tables {
        entries.push(buffer_entry(binding::Q8_CODE_TABLES, Storage { read_only: true }, false, 4));
    }
    let group0 = ctx.inner.scalar_layouts.get(Scalars::Host, variant.clip);
    let constants: Vec<(&str, f64)> = overrides.iter().map(|o| o.constant()).collect();
    let (pipeline, segment_layout) = create(ctx, &label, source, group0, &entries, &constants)?;
    log::debug!("compiled {label}");
    Ok(CachedPipeline { pipeline, segment_layout })
}
