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

mod bind;
pub(in crate::gpu) mod layout;
mod state_io;
pub(in crate::gpu) mod wgsl;

use std::sync::Arc;

use crate::gpu::compile::{buffer_entry, create, CachedPipeline};
use crate::gpu::kernel::{binding, Scalars, TABLE_BYTES};
use crate::gpu::GpuContext;
use crate::step::{KernelStep, Switches};
use crate::{Algorithm, Error, Result, StateKind, Tensor};
use bind::Bound;

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

/// How an 8-bit kernel finds the nearest code of a value (`gpu::q8::shader` explains both,
/// and chooses one per adapter): both ways give the same code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Requantize {
    /// One load from the value's bucket of a code table (`crate::q8::lut::CodeTable`).
    Table,
    /// Arithmetic on the value (`crate::q8::arith`), a table load for values near a switch.
    Arithmetic,
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
/// the whole tensor where it fits (f32 state is never cut: the optimizer keeps it as one
/// tensor beside its dense states). `None` where not even one block (or the f32 state) fits.
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

/// A state as stored, whichever the format: what the formats' own state types wrap.
pub(crate) enum Stored<C, S> {
    /// Packed codes (`CODES_PER_WORD / 4` to a byte) and one scale per block.
    Codes { codes: C, scale: S },
    /// f32 values.
    F32(S),
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
