//! Adafactor's passes on the device (`src/family/adafactor/adafactor.wgsl`): one bind group per tensor and
//! set of gradients, the dispatches of a step recorded into the trainer's compute pass,
//! nothing read back.
//!
//! Each tensor's step: a factored tensor (2 or more dimensions) runs `rows`, `cols`, `psum`,
//! `denoms`, `usum`, `finalize`, `apply`; a vector `psum`, `vector`, `finalize`, `apply`.
//! wgpu orders the dispatches of a pass (each reads what the previous wrote). The states
//! (`row_var`, `col_var`, `variance`, f32) live in one buffer of the engine, the per-tensor
//! scratch (each matrix's clamped row mean, the partial sums, the step's scale) in another.

use std::any::Any;
use std::sync::Arc;

use crate::gpu::GpuContext;
use crate::optimizer::passes::{GroupPasses, PassView};
use crate::optimizer::{Group, ParamGroup};
use crate::step::fields::shader_struct;
use super::contract::AdafactorUniform;
use crate::{Algorithm, DType, Error, OptimizerOptions, Result, StateKind, Tensor, TENSOR_USAGES};

/// The shader's workgroup size (`WG` in `src/family/adafactor/adafactor.wgsl`).
const WG: u64 = 64;
/// At most this many workgroups take a tensor's partial sums: a fixed partition, set by the
/// tensor's length alone, so the sums round alike on every device.
const MAX_PARTS: u64 = 256;
/// Elements per invocation of a partial sum, before another workgroup is added.
const PER_INVOCATION: u64 = 16;

shader_struct! {
    /// Where one tensor of an Adafactor step lives, and its shape: `info` in
    /// `src/family/adafactor/adafactor.wgsl`, one per tensor and set of gradients.
    #[derive(Default)]
    Info {
        /// Elements.
        n: u32,
        /// Matrices (the product of the leading dimensions); 0 for a vector.
        batches: u32,
        /// The second-last dimension; 0 for a vector.
        rows: u32,
        /// The last dimension; 0 for a vector.
        cols: u32,
        /// The parameter's first element within its binding.
        p_shift: u32,
        /// The gradient's first element within its binding (the parameter's, where
        /// `grad_in_param` is 1).
        g_shift: u32,
        /// The parameter's storage: 0 f32, 1 f16, 2 bf16.
        p_dtype: u32,
        /// The gradient's storage, as `p_dtype`.
        g_dtype: u32,
        /// `row_var` (or `variance`): its first f32 in the state buffer.
        state_a: u32,
        /// `col_var`: its first f32 in the state buffer.
        state_b: u32,
        /// The tensor's scratch: `[denoms: batches][p parts: parts][u parts: parts][scale]`.
        scratch_base: u32,
        /// Workgroups of the partial sums.
        parts: u32,
        /// 1 where the gradient lies in the parameter's buffer (one binding for both).
        grad_in_param: u32,
        /// 1 for a tensor of 2 or more dimensions.
        factored: u32,
        /// The group's first parameter's machine epsilon (`eps1 = None`).
        machine_eps: f32,
        /// Pads the struct to whole rows; always 0.
        reserved: u32,
    }
}

/// One Adafactor tensor: which parameter, which group's uniform, where its states are.
#[derive(Debug)]
struct Item {
    param: usize,
    group: usize,
    n: u64,
    /// `(batches, rows, cols)`, or `None` for a vector.
    dims: Option<(u32, u32, u32)>,
    state_a: u32,
    state_b: u32,
    scratch_base: u32,
    parts: u32,
    machine_eps: f32,
    /// The parameter's storage (f32 matrices take the row-wise apply pass).
    dtype: DType,
    /// `row_var` and `col_var`, or `variance`, as tensors of the state buffer.
    states: Vec<(StateKind, Tensor)>,
}

struct Pipelines {
    layout: wgpu::BindGroupLayout,
    rows: wgpu::ComputePipeline,
    cols: wgpu::ComputePipeline,
    denoms: wgpu::ComputePipeline,
    psum: wgpu::ComputePipeline,
    vector: wgpu::ComputePipeline,
    usum: wgpu::ComputePipeline,
    finalize: wgpu::ComputePipeline,
    apply: wgpu::ComputePipeline,
    apply_rows: wgpu::ComputePipeline,
}

/// The bind groups of one set of gradients.
struct BoundSet {
    grads: Vec<Tensor>,
    /// One per item; none for an empty tensor, which is not updated (as every family skips
    /// one) and whose empty range a bind group would refuse.
    groups: Vec<Option<wgpu::BindGroup>>,
}

/// Gradient sets whose bind groups are kept (as the optimizer's own).
const BOUND_SETS: usize = 4;

/// Adafactor's passes for the Adafactor groups of one optimizer.
pub(crate) struct AdafactorEngine {
    items: Vec<Item>,
    pipelines: Arc<Pipelines>,
    state: wgpu::Buffer,
    scratch: wgpu::Buffer,
    /// Bound as the gradient where a gradient lies in its parameter's buffer.
    dummy: wgpu::Buffer,
    bound: Vec<BoundSet>,
}

impl std::fmt::Debug for AdafactorEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdafactorEngine").field("items", &self.items.len()).finish()
    }
}

fn range(binding: u32, buffer: &wgpu::Buffer, offset: u64, size: u64) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry {
        binding,
        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer,
            offset,
            size: wgpu::BufferSize::new(size),
        }),
    }
}

fn dtype_code(dtype: DType) -> u32 {
    match dtype {
        DType::F16 => 1,
        DType::BF16 => 2,
        _ => 0,
    }
}

/// Workgroups `(x, y)` for `invocations` in a grid within the per-dimension limit.
fn grid(invocations: u64, max: u32) -> (u32, u32) {
    let groups = invocations.div_ceil(WG).max(1);
    let x = groups.min(u64::from(max));
    (x as u32, groups.div_ceil(x) as u32)
}

impl AdafactorEngine {
    /// The engine for `members`: each Adafactor parameter's index, group, dtype of its
    /// group's first parameter and shape. `None` without any.
    pub(crate) fn new(
        ctx: &GpuContext,
        members: &[(usize, usize, DType, Vec<usize>)],
        params: &[Tensor],
    ) -> Result<Option<Self>> {
        if members.is_empty() {
            return Ok(None);
        }
        let mut items = Vec::with_capacity(members.len());
        let (mut state_len, mut scratch_len) = (0u64, 0u64);
        for (param, group, first_dtype, shape) in members {
            let n = params[*param].len;
            let dims = crate::algo::factored_dims(shape);
            let (a, b, batches) = match dims {
                Some((batches, rows, cols)) => {
                    ((batches * rows) as u64, (batches * cols) as u64, batches as u64)
                }
                None => (n, 0, 0),
            };
            let parts = n.div_ceil(WG * PER_INVOCATION).clamp(1, MAX_PARTS);
            let too_big = |what: &str| Error::BadValue {
                argument: format!("params[{param}]"),
                problem: format!("Adafactor's {what} exceeds 2^32 elements"),
            };
            let state_a = u32::try_from(state_len).map_err(|_| too_big("state"))?;
            let state_b = u32::try_from(state_len + a).map_err(|_| too_big("state"))?;
            let scratch_base = u32::try_from(scratch_len).map_err(|_| too_big("scratch"))?;
            u32::try_from(n).map_err(|_| too_big("tensor"))?;
            state_len += a + b;
            scratch_len += batches + 2 * parts + 1;
            let dims = dims.map(|(b, r, c)| (b as u32, r as u32, c as u32));
            items.push(Item {
                param: *param,
                group: *group,
                n,
                dims,
                state_a,
                state_b,
                scratch_base,
                parts: parts as u32,
                machine_eps: crate::algo::machine_epsilon(*first_dtype) as f32,
                dtype: params[*param].dtype,
                states: Vec::new(),
            });
        }
        let device = ctx.device();
        let pipelines = pipelines(ctx)?;
        let (state, scratch, dummy) = ctx.catch("creating Adafactor's state", || {
            let buffer = |label: &str, len: u64| {
                device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(label),
                    size: 4 * len.max(1),
                    usage: TENSOR_USAGES,
                    mapped_at_creation: false,
                })
            };
            // Created zeroed: the states start at 0, as torch's.
            (
                buffer("wgpu-optim adafactor state", state_len),
                buffer("wgpu-optim adafactor scratch", scratch_len),
                buffer("wgpu-optim adafactor none", 1),
            )
        })?;
        for item in &mut items {
            let at = |index: u32, len: u64| Tensor::new(&state, 4 * u64::from(index), len, DType::F32);
            item.states = match item.dims {
                Some((b, r, c)) => vec![
                    (StateKind::RowVar, at(item.state_a, u64::from(b * r))),
                    (StateKind::ColVar, at(item.state_b, u64::from(b * c))),
                ],
                None => vec![(StateKind::Variance, at(item.state_a, item.n))],
            };
        }
        Ok(Some(AdafactorEngine { items, pipelines, state, scratch, dummy, bound: Vec::new() }))
    }

    /// Parameter `index`'s state of `kind`, if it is an Adafactor tensor that keeps one.
    pub(crate) fn state(&self, index: usize, kind: StateKind) -> Option<&Tensor> {
        let item = self.items.iter().find(|i| i.param == index)?;
        item.states.iter().find(|(k, _)| *k == kind).map(|(_, t)| t)
    }

    /// Every Adafactor parameter's states: `(parameter, kind, tensor)`.
    pub(crate) fn states(&self) -> impl Iterator<Item = (usize, StateKind, &Tensor)> {
        self.items.iter().flat_map(|item| item.states.iter().map(|(kind, t)| (item.param, *kind, t)))
    }

    /// Parameter `index`'s state `k` in `adafactor_state_kinds` order.
    #[cfg_attr(not(feature = "checkpoint"), allow(dead_code))]
    pub(crate) fn state_at(&self, index: usize, k: usize) -> Option<&Tensor> {
        let item = self.items.iter().find(|i| i.param == index)?;
        item.states.get(k).map(|(_, t)| t)
    }

    /// Makes the bind groups of `grads` the first kept set, building them unless kept.
    /// `hyper` is the optimizer's uniform buffer (group g's values at slot g).
    pub(crate) fn bind(
        &mut self,
        ctx: &GpuContext,
        params: &[Tensor],
        grads: &[Tensor],
        hyper: &wgpu::Buffer,
    ) -> Result<()> {
        if let Some(k) = self.bound.iter().position(|b| b.grads == grads) {
            let hit = self.bound.remove(k);
            self.bound.insert(0, hit);
            return Ok(());
        }
        let device = ctx.device();
        let limits = device.limits();
        let storage_align = u64::from(limits.min_storage_buffer_offset_alignment);
        let uniform_align = u64::from(limits.min_uniform_buffer_offset_alignment).max(64);
        let mut infos = vec![0u8; (uniform_align * self.items.len() as u64) as usize];
        // (binding offset, size) of each item's parameter binding, and its gradient's.
        let mut ranges = Vec::with_capacity(self.items.len());
        for (k, item) in self.items.iter().enumerate() {
            let (p, g) = (&params[item.param], &grads[item.param]);
            let end = |t: &Tensor| (t.offset + t.len * t.dtype.size()).next_multiple_of(4);
            let shared = p.buffer == g.buffer;
            let p_at = if shared { p.offset.min(g.offset) } else { p.offset } / storage_align * storage_align;
            let p_end = if shared { end(p).max(end(g)) } else { end(p) };
            let g_at = if shared { p_at } else { g.offset / storage_align * storage_align };
            let g_end = if shared { p_end } else { end(g) };
            let (batches, rows, cols) = item.dims.unwrap_or((0, 0, 0));
            let info = Info {
                n: item.n as u32,
                batches,
                rows,
                cols,
                p_shift: ((p.offset - p_at) / p.dtype.size()) as u32,
                g_shift: ((g.offset - g_at) / g.dtype.size()) as u32,
                p_dtype: dtype_code(p.dtype),
                g_dtype: dtype_code(g.dtype),
                state_a: item.state_a,
                state_b: item.state_b,
                scratch_base: item.scratch_base,
                parts: item.parts,
                grad_in_param: u32::from(shared),
                factored: u32::from(item.dims.is_some()),
                machine_eps: item.machine_eps,
                reserved: 0,
            };
            let at = (uniform_align * k as u64) as usize;
            infos[at..at + size_of::<Info>()].copy_from_slice(bytemuck::bytes_of(&info));
            ranges.push(((p_at, p_end - p_at), (!shared).then_some((g_at, g_end - g_at))));
        }
        let layout = &self.pipelines.layout;
        let set = ctx.catch("creating Adafactor's bind groups", || {
            use wgpu::util::DeviceExt;
            let info_buffer = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("wgpu-optim adafactor tensors"),
                contents: &infos,
                usage: wgpu::BufferUsages::UNIFORM,
            });
            let hyper_bytes = size_of::<AdafactorUniform>() as u64;
            let groups = self
                .items
                .iter()
                .zip(&ranges)
                .enumerate()
                .map(|(k, (item, ((p_at, p_size), g_range)))| {
                    if item.n == 0 {
                        return None;
                    }
                    let (p, g) = (&params[item.param], &grads[item.param]);
                    let slot = item.group as u64 * crate::step::UNIFORM_SLOT_BYTES;
                    let grad_entry = match g_range {
                        Some((at, size)) => range(GRADS, &g.buffer, *at, *size),
                        None => range(GRADS, &self.dummy, 0, 4),
                    };
                    Some(device.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: Some("wgpu-optim adafactor"),
                        layout,
                        entries: &[
                            range(HYPER, hyper, slot, hyper_bytes),
                            range(INFO, &info_buffer, uniform_align * k as u64, size_of::<Info>() as u64),
                            range(PARAMS, &p.buffer, *p_at, *p_size),
                            grad_entry,
                            range(STATE, &self.state, 0, self.state.size()),
                            range(SCRATCH, &self.scratch, 0, self.scratch.size()),
                        ],
                    }))
                })
                .collect();
            BoundSet { grads: grads.to_vec(), groups }
        })?;
        self.bound.truncate(BOUND_SETS - 1);
        self.bound.insert(0, set);
        Ok(())
    }

    /// Records a step of every Adafactor tensor with the first kept set of gradients
    /// ([`Self::bind`]) into `pass`.
    pub(crate) fn record(&self, pass: &mut wgpu::ComputePass<'_>, max_groups: u32) {
        let Some(set) = self.bound.first() else { return };
        let p = &self.pipelines;
        for (item, group) in self.items.iter().zip(&set.groups) {
            let Some(group) = group else { continue };
            pass.set_bind_group(0, group, &[]);
            let mut run = |pipeline: &wgpu::ComputePipeline, (x, y): (u32, u32)| {
                pass.set_pipeline(pipeline);
                pass.dispatch_workgroups(x, y, 1);
            };
            let parts = (item.parts, 1);
            match item.dims {
                Some((b, r, c)) => {
                    let (b, r, c) = (u64::from(b), u64::from(r), u64::from(c));
                    run(&p.rows, grid(b * r, max_groups));
                    run(&p.cols, grid(b * c, max_groups));
                    run(&p.psum, parts);
                    run(&p.denoms, grid(b, max_groups));
                    run(&p.usum, parts);
                }
                None => {
                    run(&p.psum, parts);
                    run(&p.vector, parts);
                }
            }
            run(&p.finalize, (1, 1));
            // An invocation per element (f32) or per word (16-bit: never more words than elements).
            match item.dims {
                // Columns within one grid row of workgroups.
                Some((b, r, c))
                    if item.dtype == DType::F32 && u64::from(c).div_ceil(WG) <= u64::from(max_groups) =>
                {
                    let rows = (u64::from(b) * u64::from(r)).clamp(1, u64::from(max_groups));
                    run(&p.apply_rows, (grid(u64::from(c), max_groups).0, rows as u32));
                }
                _ => run(&p.apply, grid(item.n, max_groups)),
            }
        }
    }
}

/// The passes' bindings (group 0), declared in WGSL as `BINDING_<NAME>`.
const BINDINGS: [(&str, u32); 6] =
    [("HYPER", 0), ("INFO", 1), ("PARAMS", 2), ("GRADS", 3), ("STATE", 4), ("SCRATCH", 5)];
const HYPER: u32 = BINDINGS[0].1;
const INFO: u32 = BINDINGS[1].1;
const PARAMS: u32 = BINDINGS[2].1;
const GRADS: u32 = BINDINGS[3].1;
const STATE: u32 = BINDINGS[4].1;
const SCRATCH: u32 = BINDINGS[5].1;

/// The passes' WGSL: the generated structs and binding numbers, then
/// `shaders/convert.wgsl`, `shaders/nan_bits.wgsl` and `src/family/adafactor/adafactor.wgsl`.
fn source() -> String {
    let bindings: String =
        BINDINGS.iter().map(|(name, b)| format!("const BINDING_{name}: u32 = {b}u;\n")).collect();
    format!(
        "alias S = f32;\nalias R = f32;\nalias NanBits = u32;\nalias NanMask = bool;\nconst WG: u32 = {WG}u;\n\
         {bindings}{}\n{}\n{}\n{}\n{}",
        AdafactorUniform::wgsl("Hyper"),
        Info::wgsl(),
        include_str!("../../../shaders/convert.wgsl"),
        include_str!("../../../shaders/nan_bits.wgsl"),
        crate::family::adafactor::PASSES_WGSL
    )
}

/// Adafactor's pipelines, from the context's registry (compiled once per context).
fn pipelines(ctx: &GpuContext) -> Result<Arc<Pipelines>> {
    ctx.inner.pipelines.get_pass("adafactor", || compile_pipelines(ctx))
}

/// [`pipelines`], compiled.
fn compile_pipelines(ctx: &GpuContext) -> Result<Pipelines> {
    let device = ctx.device();
    let source = source();
    ctx.catch("compiling Adafactor's passes", || {
        let buffer = |binding: u32, ty: wgpu::BufferBindingType| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer { ty, has_dynamic_offset: false, min_binding_size: None },
            count: None,
        };
        let storage = |read_only| wgpu::BufferBindingType::Storage { read_only };
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("wgpu-optim adafactor"),
            entries: &[
                buffer(HYPER, wgpu::BufferBindingType::Uniform),
                buffer(INFO, wgpu::BufferBindingType::Uniform),
                buffer(PARAMS, storage(false)),
                buffer(GRADS, storage(true)),
                buffer(STATE, storage(false)),
                buffer(SCRATCH, storage(false)),
            ],
        });
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("wgpu-optim adafactor"),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("wgpu-optim adafactor"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let entry = |name: &str| {
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(name),
                layout: Some(&pipeline_layout),
                module: &module,
                entry_point: Some(name),
                compilation_options: wgpu::PipelineCompilationOptions::default(),
                cache: None,
            })
        };
        Pipelines {
            rows: entry("rows"),
            cols: entry("cols"),
            denoms: entry("denoms"),
            psum: entry("psum"),
            vector: entry("vector_pass"),
            usum: entry("usum"),
            finalize: entry("finalize"),
            apply: entry("apply"),
            apply_rows: entry("apply_rows"),
            layout,
        }
    })
}

/// Adafactor's part of the GPU optimizer: its groups, and the engine over their parameters
/// (none where they have none).
pub(crate) struct AdafactorPasses {
    groups: Vec<usize>,
    engine: Option<AdafactorEngine>,
}

/// Refuses, before anything is created, what an Adafactor group cannot run: missing
/// shapes, f64 parameters (`first`: the index of its first parameter). The options its
/// passes do not implement are its `FamilyConfig::check_options`.
pub(crate) fn check_group(group: &ParamGroup, first: usize, options: &OptimizerOptions) -> Result<()> {
    super::config::check_shapes_given(&options.param_shapes)?;
    if let Some(j) = group.params.iter().position(|p| p.dtype == DType::F64) {
        return Err(Error::DTypeMismatch {
            argument: format!("params[{}]", first + j),
            got: DType::F64,
            expected: "F32, F16 or BF16 for Adafactor (its passes compute in f32)".into(),
        });
    }
    Ok(())
}

/// The passes of the Adafactor groups among `groups`; `None` without such a group.
pub(crate) fn build(
    ctx: &GpuContext,
    groups: &[Group],
    params: &[Tensor],
    shapes: &[Vec<usize>],
) -> Result<Option<Box<dyn GroupPasses>>> {
    let ours: Vec<usize> =
        (0..groups.len()).filter(|&g| matches!(groups[g].algorithm, Algorithm::Adafactor(_))).collect();
    if ours.is_empty() {
        return Ok(None);
    }
    let mut members = Vec::new();
    for &g in &ours {
        let group = &groups[g];
        if group.len == 0 {
            continue;
        }
        // torch's `eps1 = None` is the dtype of the group's first parameter.
        let first_dtype = params[group.first].dtype;
        let range = group.first..group.first + group.len;
        for (i, shape) in range.clone().zip(&shapes[range]) {
            members.push((i, g, first_dtype, shape.clone()));
        }
    }
    let engine = AdafactorEngine::new(ctx, &members, params)?;
    Ok(Some(Box::new(AdafactorPasses { groups: ours, engine })))
}

impl GroupPasses for AdafactorPasses {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn family(&self) -> crate::step::Family {
        crate::step::Family::Adafactor
    }

    fn bind(&mut self, view: &PassView<'_>, grads: &[Tensor]) -> Result<()> {
        match &mut self.engine {
            Some(engine) => engine.bind(view.ctx, view.params, grads, view.uniforms.buffer()),
            None => Ok(()),
        }
    }

    /// After the other groups' updates.
    fn record_after(&self, pass: &mut wgpu::ComputePass<'_>, ctx: &GpuContext) {
        if let Some(engine) = &self.engine {
            engine.record(pass, ctx.device().limits().max_compute_workgroups_per_dimension);
        }
    }

    fn runs_group(&self, g: usize, _: &Algorithm) -> bool {
        self.groups.contains(&g)
    }

    fn checks_gradients(&self, g: usize) -> bool {
        self.groups.contains(&g)
    }

    fn state(&self, index: usize, kind: StateKind) -> Option<&Tensor> {
        self.engine.as_ref()?.state(index, kind)
    }

    /// The states live in the engine's buffer, not in the optimizer's `state`.
    fn states(&self) -> Vec<(usize, StateKind, &Tensor)> {
        self.engine.iter().flat_map(AdafactorEngine::states).collect()
    }

    /// All F32.
    #[cfg(feature = "checkpoint")]
    fn checkpoint_states(&self, i: usize, shape: &[usize]) -> Option<Vec<(StateKind, DType)>> {
        self.engine.as_ref()?.state_at(i, 0)?;
        Some(crate::adafactor_state_kinds(shape).iter().map(|kind| (*kind, DType::F32)).collect())
    }

    #[cfg(feature = "checkpoint")]
    fn checkpoint_tensor(&self, param: usize, k: usize) -> Option<&Tensor> {
        self.engine.as_ref()?.state_at(param, k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::kernel::tests::members;

    #[test]
    fn the_passes_parse_and_their_structs_lie_where_rust_puts_them() {
        let module = naga::front::wgsl::parse_str(&source()).unwrap_or_else(|e| panic!("{e}"));
        let expected = |fields: &[&str], offsets: &[usize]| -> Vec<(String, u32)> {
            fields.iter().zip(offsets).map(|(f, o)| (f.to_string(), *o as u32)).collect()
        };
        assert_eq!(members(&module, "Info"), expected(Info::FIELDS, Info::OFFSETS));
        assert_eq!(members(&module, "Hyper"), expected(AdafactorUniform::FIELDS, AdafactorUniform::OFFSETS));
        let entries: Vec<&str> = module.entry_points.iter().map(|e| e.name.as_str()).collect();
        for name in
            ["rows", "cols", "denoms", "psum", "vector_pass", "usum", "finalize", "apply", "apply_rows"]
        {
            assert!(entries.contains(&name), "{name} in {entries:?}");
        }
    }
}
