//! Binding a step: the tensors cut into segments, the segments packed into dispatches
//! (one variant over one set of buffers, each with its table), and their recording.

use std::sync::Arc;

use wgpu::util::DeviceExt;

use super::{buffer, layout, Engine, Format, Requantize, Variant};
use crate::gpu::compile::CachedPipeline;
use crate::gpu::kernel::TableHead;
use crate::gpu::kernel::{binding, TABLE_BYTES};
use crate::gpu::packing::{cover, overlap, pack_greedy};
use crate::gpu::plan::{check_range, Arg};
use crate::gpu::table::{share_workgroups, table_fits, workgroup_map};
use crate::gpu::GpuContext;
use crate::{DType, Error, Result, Tensor};

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
pub(super) struct Bound {
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

impl<F: Format> Engine<F> {
    /// Dispatches the bound step records.
    #[cfg(test)]
    pub(crate) fn dispatch_count(&self) -> usize {
        self.bound.as_ref().map_or(0, |b| b.dispatches.len())
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
