//! Blockwise 8-bit state on the GPU ([`crate::q8`]): each parameter's state in a buffer of
//! its own (per state: the codes, four to a word, then one absmax per block; or f32 values
//! below `min_8bit_size`), and one dispatch per tensor (per chunk of a tensor larger than
//! a storage binding) of the kernel [`shader::compose`] writes.

mod shader;

use std::collections::HashMap;
use std::sync::Arc;

use wgpu::util::DeviceExt;

use crate::gpu::kernel::Scalars;
use crate::gpu::pipeline::{buffer_entry, create};
use crate::gpu::plan::{check_range, Arg};
use crate::gpu::GpuContext;
use crate::q8::{blocks, check_replacement, Q8States, StoredState, BLOCK_SIZE};
use crate::step::{Switches, UNIFORM_SLOT_BYTES};
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
}

#[derive(Debug)]
struct Pipeline {
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
    serial: bool,
}

/// Where one state of one tensor lies in its tensor's state buffer, in words.
#[derive(Clone, Copy, Debug)]
struct Placement {
    values: u64,
    absmax: u64,
}

/// One parameter's state.
#[derive(Debug)]
struct TensorState {
    len: u64,
    group: usize,
    quantized: bool,
    kinds: Vec<StateKind>,
    placements: Vec<Placement>,
    buffer: wgpu::Buffer,
}

impl TensorState {
    /// Words of state `k`'s codes (or values).
    fn value_words(&self) -> u64 {
        if self.quantized {
            self.len.div_ceil(4)
        } else {
            self.len
        }
    }
}

/// One dispatch: a tensor, or a chunk of one.
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

/// One dispatch before its bind group: a tensor, or a chunk of one.
struct Segment {
    /// The uniform's fields, in [`shader::SEGMENT_FIELDS`] order.
    fields: [u32; 8],
    /// The parameter's index.
    param: usize,
    /// Bytes of the parameters' binding (holding the gradients too when they share it).
    param_range: (u64, u64),
    /// Bytes of the gradients' binding, when they have one.
    grad_range: Option<(u64, u64)>,
}

/// Bytes of a segment's uniform.
const SEGMENT_BYTES: u64 = 4 * shader::SEGMENT_FIELDS.len() as u64;

/// The most workgroups one dispatch launches; each strides over further blocks.
const MAX_WORKGROUPS: u64 = 4096;

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
}

impl Q8Engine {
    /// Zeroed state for `params`, parameter i in group `groups[i]`, each group run by
    /// `algorithms[g]` (checked by [`crate::q8::check_options`]).
    pub(crate) fn new(
        ctx: &GpuContext,
        config: Q8States,
        params: &[Tensor],
        groups: &[usize],
        algorithms: &[Algorithm],
    ) -> Result<Self> {
        let max_binding = ctx.device().limits().max_storage_buffer_binding_size;
        let mut tensors = Vec::with_capacity(params.len());
        let mut layouts = Vec::with_capacity(params.len());
        for (i, (param, &group)) in params.iter().zip(groups).enumerate() {
            let kinds = algorithms[group].state_kinds().to_vec();
            let quantized = config.quantizes(param.len);
            let value_words = if quantized { param.len.div_ceil(4) } else { param.len };
            let absmax_words = if quantized { blocks(param.len as usize) as u64 } else { 0 };
            let placements: Vec<Placement> = (0..kinds.len() as u64)
                .map(|k| {
                    let at = k * (value_words + absmax_words);
                    Placement { values: at, absmax: at + value_words }
                })
                .collect();
            let bytes = (4 * kinds.len() as u64 * (value_words + absmax_words)).max(4);
            if bytes > max_binding {
                return Err(Error::BadRange {
                    argument: format!("params[{i}]"),
                    problem: format!(
                        "its state takes {bytes} bytes, more than the device's largest storage binding \
                         ({max_binding} bytes, max_storage_buffer_binding_size)"
                    ),
                });
            }
            layouts.push((param.len, group, quantized, kinds, placements, bytes));
        }
        let tables_words = shader::tables_words();
        ctx.catch("creating the 8-bit state", || {
            let device = ctx.device();
            for (len, group, quantized, kinds, placements, bytes) in layouts {
                let buffer = device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("wgpu-optim 8-bit state"),
                    size: bytes,
                    usage: wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_SRC
                        | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                tensors.push(TensorState { len, group, quantized, kinds, placements, buffer });
            }
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
            }
        })
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
        let uniform_align = u64::from(limits.min_uniform_buffer_offset_alignment).max(UNIFORM_SLOT_BYTES);
        let max_binding = limits.max_storage_buffer_binding_size;
        // Elements per chunk: whole blocks whose f32 range fits a binding after alignment.
        let chunk =
            ((max_binding.saturating_sub(align)) / 4 / BLOCK_SIZE as u64 * BLOCK_SIZE as u64).max(256);
        let mut segments: Vec<Segment> = Vec::new();
        for (i, (param, grad)) in params.iter().zip(grads).enumerate() {
            let tensor = &self.tensors[i];
            let shared = grad.buffer == param.buffer;
            for start in (0..param.len).step_by(chunk as usize) {
                let n = (param.len - start).min(chunk);
                // A range's aligned first byte, its end, and its first element past that byte.
                let range = |t: &Tensor| {
                    let first = t.offset + 4 * start;
                    let aligned = first / align * align;
                    (aligned, first + 4 * n, (first - aligned) / 4)
                };
                let (p, g) = (range(param), range(grad));
                let (param_range, grad_range) = if shared {
                    ((p.0.min(g.0), p.1.max(g.1)), None)
                } else {
                    ((p.0, p.1), Some((g.0, g.1)))
                };
                if shared && param_range.1 - param_range.0 > max_binding {
                    return Err(Error::BadRange {
                        argument: format!("grads[{i}]"),
                        problem: format!(
                            "it shares a buffer with params[{i}] too far apart to bind both at once \
                             ({} bytes, more than max_storage_buffer_binding_size {max_binding}): \
                             put gradients in a buffer of their own",
                            param_range.1 - param_range.0
                        ),
                    });
                }
                let grad_base = if shared { (g.0 - param_range.0) / 4 + g.2 } else { g.2 };
                let param_base = (p.0 - param_range.0) / 4 + p.2;
                let mut fields =
                    [n as u32, blocks(n as usize) as u32, param_base as u32, grad_base as u32, 0, 0, 0, 0];
                for (k, placement) in tensor.placements.iter().enumerate() {
                    let (values, absmax) = if tensor.quantized {
                        (placement.values + start / 4, placement.absmax + start / BLOCK_SIZE as u64)
                    } else {
                        (placement.values + start, 0)
                    };
                    fields[4 + 2 * k] = values as u32;
                    fields[5 + 2 * k] = absmax as u32;
                }
                segments.push(Segment { fields, param: i, param_range, grad_range });
            }
        }
        let mut dispatches = Vec::with_capacity(segments.len());
        let mut pipelines = Vec::with_capacity(segments.len());
        for segment in &segments {
            let tensor = &self.tensors[segment.param];
            let quantized = tensor.quantized && !tensor.kinds.is_empty();
            let variant = Variant {
                switches: self.switches[tensor.group],
                kinds: tensor.kinds.clone(),
                quantized,
                grad_in_params: segment.grad_range.is_none(),
                serial: self.serial && quantized,
            };
            pipelines.push(self.pipeline(ctx, &variant)?);
        }
        let mut contents = vec![0u8; segments.len() * uniform_align as usize];
        for (segment, slot) in segments.iter().zip(contents.chunks_exact_mut(uniform_align as usize)) {
            slot[..SEGMENT_BYTES as usize].copy_from_slice(bytemuck::cast_slice(&segment.fields));
        }
        let device = ctx.device();
        ctx.catch("binding the 8-bit step", || {
            let uniforms = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("wgpu-optim 8-bit segments"),
                contents: &contents,
                usage: wgpu::BufferUsages::UNIFORM,
            });
            for (s, (segment, pipeline)) in segments.iter().zip(pipelines).enumerate() {
                let tensor = &self.tensors[segment.param];
                let at = s as u64 * uniform_align;
                let mut entries = vec![
                    buffer(0, &uniforms, (at, at + SEGMENT_BYTES)),
                    buffer(1, &params[segment.param].buffer, segment.param_range),
                    buffer(3, &tensor.buffer, (0, tensor.buffer.size())),
                ];
                if let Some(grad_range) = segment.grad_range {
                    entries.push(buffer(2, &grads[segment.param].buffer, grad_range));
                }
                if tensor.quantized && !tensor.kinds.is_empty() {
                    entries.push(buffer(4, &self.tables, (0, self.tables.size())));
                }
                let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some("wgpu-optim 8-bit step"),
                    layout: &pipeline.layout,
                    entries: &entries,
                });
                let blocks = u64::from(segment.fields[1]);
                let owners =
                    if pipeline.serial { blocks.div_ceil(u64::from(shader::WORKGROUP)) } else { blocks };
                let workgroups = owners.min(MAX_WORKGROUPS) as u32;
                dispatches.push(Dispatch { pipeline, bind_group, workgroups, group: tensor.group });
            }
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
        (!tensor.quantized)
            .then(|| Tensor::new(&tensor.buffer, 4 * tensor.placements[k].values, tensor.len, DType::F32))
    }

    /// The words of state `k` of parameter `i`: its values (codes), and its absmax.
    fn views(&self, i: usize, k: usize) -> (Tensor, Tensor) {
        let tensor = &self.tensors[i];
        let placement = tensor.placements[k];
        let values = Tensor::new(&tensor.buffer, 4 * placement.values, tensor.value_words(), DType::F32);
        let absmax_words = if tensor.quantized { blocks(tensor.len as usize) as u64 } else { 0 };
        (values, Tensor::new(&tensor.buffer, 4 * placement.absmax, absmax_words, DType::F32))
    }

    /// The 8-bit settings (only checkpoints read them).
    #[cfg_attr(not(feature = "checkpoint"), allow(dead_code))]
    pub(crate) fn config(&self) -> Q8States {
        self.config
    }

    /// Parameter `i`'s state of `kind`, read back (waits for the queue).
    pub(crate) fn read(&self, ctx: &GpuContext, i: usize, kind: StateKind) -> Result<Option<StoredState>> {
        let Some(tensor) = self.tensors.get(i) else { return Ok(None) };
        let Some(k) = tensor.kinds.iter().position(|s| *s == kind) else { return Ok(None) };
        let (values, absmax) = self.views(i, k);
        let bytes = ctx.read_bytes(&values)?;
        if !tensor.quantized {
            return Ok(Some(StoredState::F32(bytemuck::pod_collect_to_vec(&bytes))));
        }
        let codes = bytes[..tensor.len as usize].to_vec();
        let absmax = if absmax.len == 0 {
            Vec::new()
        } else {
            bytemuck::pod_collect_to_vec(&ctx.read_bytes(&absmax)?)
        };
        Ok(Some(StoredState::Q8 { codes, absmax }))
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
        let (values, absmax_view) = self.views(i, k);
        match state {
            StoredState::F32(v) => ctx.write_bytes(&values, bytemuck::cast_slice(v)),
            StoredState::Q8 { codes, absmax } => {
                let mut words = codes.clone();
                words.resize(4 * values.len as usize, 0);
                ctx.write_bytes(&values, &words)?;
                if absmax.is_empty() {
                    return Ok(());
                }
                ctx.write_bytes(&absmax_view, bytemuck::cast_slice(absmax))
            }
        }
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
    );
    let overrides = variant.switches.overrides();
    let label = format!("wgpu-optim 8-bit {} {overrides:?}", variant.switches.family().name());
    use wgpu::BufferBindingType::{Storage, Uniform};
    let mut entries = vec![
        buffer_entry(0, Uniform, false, SEGMENT_BYTES),
        buffer_entry(1, Storage { read_only: false }, false, 4),
        buffer_entry(3, Storage { read_only: false }, false, 4),
    ];
    if !variant.grad_in_params {
        entries.push(buffer_entry(2, Storage { read_only: true }, false, 4));
    }
    if variant.quantized {
        entries.push(buffer_entry(4, Storage { read_only: true }, false, 4));
    }
    let group0 = ctx.inner.scalar_layouts.get(Scalars::Host, false);
    let constants: Vec<(&str, f64)> = overrides.iter().map(|o| o.constant()).collect();
    let (pipeline, layout) = create(ctx, &label, &source, group0, &entries, &constants)?;
    Ok(Pipeline { pipeline, layout, serial: variant.serial })
}

#[cfg(test)]
mod tests {
    use crate::oracle::{bnb_adam8bit_step, BnbAdam};
    use crate::q8::{Q8States, StoredState};
    use crate::{Adam, GpuContext, Optimizer, OptimizerOptions, StateKind};

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
            let p = ctx.upload("param", &param, crate::DType::F32);
            let g = ctx.zeros("grad", n as u64, crate::DType::F32);
            let options = OptimizerOptions { q8_states: Some(Q8States::default()), ..Default::default() };
            let mut opt = Optimizer::with_options(&ctx, adam, std::slice::from_ref(&p), options)
                .unwrap_or_else(|e| panic!("{e}"));
            if let Some(engine) = opt.q8_engine_mut() {
                engine.set_serial(serial);
            }
            for grad in &grads {
                ctx.write(&g, grad).unwrap_or_else(|e| panic!("{e}"));
                opt.step(std::slice::from_ref(&g)).unwrap_or_else(|e| panic!("{e}"));
            }
            let got = ctx.read(&p).unwrap_or_else(|e| panic!("{e}"));
            let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(worst < 1e-4, "serial {serial}: parameters {worst} from the oracle's");
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
}
