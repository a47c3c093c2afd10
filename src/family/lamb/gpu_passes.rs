//! LAMB on the GPU optimizer: per LAMB group, the moments pass, the combine pass and the
//! apply pass (`family::lamb::shader` has the shader side), recorded into the step's compute pass after
//! the other groups' updates. Nothing is read back: the trust ratios go from the combine
//! pass to the apply pass through the group's index buffer, where `Optimizer::lamb_norms`
//! finds the last step's norms.

use std::any::Any;
use std::sync::Arc;

use crate::family::lamb::shader::{self, combine_wgsl, layout_entries, IndexLayout, INDEX, PARTIALS};
use crate::gpu::dispatch::{Batch, Uniforms};
use crate::gpu::kernel::{binding, Program, Scalars, VariantKey, WORKGROUP_SIZE};
use crate::gpu::plan::{math_dtype, plan, KernelArgs, TensorPlan};
use crate::gpu::GpuContext;
use crate::optimizer::passes::{GroupPasses, PassView};
use crate::optimizer::{Group, ParamGroup, BOUND_GRADIENT_SETS};
use super::contract::LambSwitches;
use crate::step::{Family, KernelStep, Switches, UNIFORM_SLOT_BYTES};
use crate::{Algorithm, DType, Error, Optimizer, Result, Tensor};

/// One LAMB group's passes over one set of gradients.
pub(crate) struct LambBound {
    /// The group's first parameter and its parameter count.
    first: usize,
    len: usize,
    moments: Batch,
    apply: Batch,
    /// Group 0 of the moments and apply passes.
    passes_group: wgpu::BindGroup,
    combine_group: wgpu::BindGroup,
    combine: wgpu::ComputePipeline,
    /// [`IndexLayout`]: the apply pass's owners, the slot lists, the norms.
    index: wgpu::Buffer,
    layout: IndexLayout,
    /// One `vec2<f32>` per moments workgroup: its sums of `p^2` and `s^2`.
    partials: wgpu::Buffer,
    /// The parameter (optimizer index) of each moments workgroup, in slot order.
    slot_owners: Vec<u32>,
}

/// Refuses what a LAMB group's passes do not run: f64 parameters (the passes sum in f32 and
/// the combine pass reads an f32 uniform). The options LAMB refuses are its
/// `FamilyConfig::check_options` (`family::lamb::config`).
pub(crate) fn check_group(group: &ParamGroup) -> Result<()> {
    if let Some(p) = group.params.iter().find(|p| p.dtype == DType::F64) {
        return Err(Error::DTypeMismatch {
            argument: "params".into(),
            got: p.dtype,
            expected: "F32, F16 or BF16 for LAMB (its norms are summed in f32)".into(),
        });
    }
    Ok(())
}

/// LAMB's part of the GPU optimizer: the passes of its groups for the most recent gradient
/// sets, most recent first, each with the groups they were bound for (a group may change
/// between Adam and LAMB, which share their states).
#[derive(Default)]
pub(crate) struct LambPasses {
    bound: Vec<(Vec<Tensor>, Vec<usize>, Vec<LambBound>)>,
    /// A sharded step's first half: `record_after` records the moments pass alone, and
    /// the tensors' sums are combined across ranks before [`Self::record_finish`].
    pub(crate) split: bool,
}

/// The passes of an optimizer over `groups` with a LAMB group; `None` without one.
pub(crate) fn build(
    _: &GpuContext,
    groups: &[Group],
    _: &[Tensor],
    _: &[Vec<usize>],
) -> Result<Option<Box<dyn GroupPasses>>> {
    let lamb = groups.iter().any(|g| matches!(g.algorithm, Algorithm::Lamb(_)));
    Ok(lamb.then(|| Box::<LambPasses>::default() as Box<dyn GroupPasses>))
}

impl LambPasses {
    /// Tensor `i`'s norms at the last step (`Optimizer::lamb_norms`).
    pub(crate) fn norms(&self, i: usize) -> Option<Tensor> {
        let (_, _, groups) = self.bound.first()?;
        let bound = groups.iter().find(|b| (b.first..b.first + b.len).contains(&i))?;
        let offset = 4 * u64::from(bound.layout.norms + 4 * (i - bound.first) as u32);
        Some(Tensor::new(&bound.index, offset, 3, DType::F32))
    }
}

/// The passes of LAMB group `g` over `grads` (already checked).
fn bind_group(view: &PassView<'_>, g: usize, grads: &[Tensor]) -> Result<LambBound> {
    let group = &view.groups[g];
    let (algorithm, first, len) = (group.algorithm, group.first, group.len);
    if view.math == DType::F64 {
        return Err(Error::DTypeMismatch {
            argument: "params".into(),
            got: DType::F64,
            expected: "F32, F16 or BF16 for LAMB (its norms are summed in f32)".into(),
        });
    }
    let items = |apply: bool| -> Result<Vec<_>> {
        let program = Program::Update(Switches::Lamb(LambSwitches { apply }));
        (first..first + len)
            .map(|i| {
                view.optimizer.batch_item(Scalars::Passes(&shader::PASSES), program, &algorithm, i, &grads[i])
            })
            .collect()
    };
    let uniform = (view.uniforms.buffer(), g as u64 * UNIFORM_SLOT_BYTES);
    bind_passes(view.ctx, [items(false)?, items(true)?], first, uniform)
}

impl GroupPasses for LambPasses {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn family(&self) -> Family {
        Family::Lamb
    }

    /// Makes the passes of `grads` the first kept, building them unless kept.
    fn bind(&mut self, view: &PassView<'_>, grads: &[Tensor]) -> Result<()> {
        // Compared without collecting: a step with kept passes allocates nothing.
        let lamb_groups =
            || (0..view.groups.len()).filter(|&g| matches!(view.groups[g].algorithm, Algorithm::Lamb(_)));
        let kept =
            |(set, g, _): &(Vec<Tensor>, Vec<usize>, _)| set == grads && g.iter().copied().eq(lamb_groups());
        if let Some(k) = self.bound.iter().position(kept) {
            let hit = self.bound.remove(k);
            self.bound.insert(0, hit);
            return Ok(());
        }
        let groups: Vec<usize> = lamb_groups().collect();
        let bound = groups.iter().map(|&g| bind_group(view, g, grads)).collect::<Result<Vec<_>>>()?;
        self.bound.truncate(BOUND_GRADIENT_SETS - 1);
        self.bound.insert(0, (grads.to_vec(), groups, bound));
        Ok(())
    }

    /// After the other groups' updates.
    fn record_after(&self, pass: &mut wgpu::ComputePass<'_>, _: &GpuContext) {
        if let Some((_, _, bound)) = self.bound.first() {
            match self.split {
                true => bound.iter().for_each(|b| b.moments.record(pass, &b.passes_group)),
                false => record(pass, bound),
            }
        }
    }

    /// The moments and apply passes bind the groups' tensors themselves.
    fn runs_group(&self, _: usize, algorithm: &Algorithm) -> bool {
        matches!(algorithm, Algorithm::Lamb(_))
    }
}

/// The three passes over the tensors of `items` (the moments pass's, then the apply pass's;
/// their plans' ordinals count from `first`), whose uniform is the slot at `uniform`'s
/// offset of its buffer.
pub(crate) fn bind_passes(
    ctx: &GpuContext,
    items: [Vec<(VariantKey, TensorPlan)>; 2],
    first: usize,
    uniform: (&wgpu::Buffer, u64),
) -> Result<LambBound> {
    let [moment_items, apply_items] = items;
    let len = moment_items.len();
    let moments = Batch::build(ctx, &moment_items, "LAMB moments")?;
    let apply = Batch::build(ctx, &apply_items, "LAMB apply")?;
    // Ordinals are the optimizer's parameter indices; the index counts from the group's.
    let local = |owners: &[u32]| owners.iter().map(|&o| o - first as u32).collect::<Vec<_>>();
    let (layout, words) = IndexLayout::build(len as u32, &local(moments.owners()), &local(apply.owners()));
    let device = ctx.device();
    let passes_layout = ctx.inner.scalar_layouts.get(Scalars::Passes(&shader::PASSES), false);
    let compiled = combine_pipeline(ctx)?;
    let (combine_layout, combine) = (&compiled.0, &compiled.1);
    ctx.catch("creating the LAMB passes", || {
        use wgpu::util::DeviceExt;
        let index = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("wgpu-optim LAMB index"),
            contents: bytemuck::cast_slice(&words),
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        });
        // Zeroed at creation: a group without elements leaves its one slot at 0.
        let partials = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgpu-optim LAMB partial sums"),
            size: 8 * u64::from(moments.workgroups().max(1)),
            // Copies both ways: a sharded step reads the sums and writes every rank's.
            usage: crate::gpu::TENSOR_USAGES,
            mapped_at_creation: false,
        });
        let hyper = wgpu::BindGroupEntry {
            binding: binding::HYPER,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: uniform.0,
                offset: uniform.1,
                size: wgpu::BufferSize::new(UNIFORM_SLOT_BYTES),
            }),
        };
        let entries = [
            hyper,
            wgpu::BindGroupEntry { binding: PARTIALS, resource: partials.as_entire_binding() },
            wgpu::BindGroupEntry { binding: INDEX, resource: index.as_entire_binding() },
        ];
        let passes_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("wgpu-optim LAMB passes"),
            layout: passes_layout,
            entries: &entries,
        });
        let combine_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("wgpu-optim LAMB combine"),
            layout: combine_layout,
            entries: &entries,
        });
        let combine = combine.clone();
        let slot_owners = moments.owners().to_vec();
        LambBound {
            first,
            len,
            moments,
            apply,
            passes_group,
            combine_group,
            combine,
            index,
            layout,
            partials,
            slot_owners,
        }
    })
}

/// The combine pass's pipeline and its group 0 layout: compiled once per context.
fn combine_pipeline(ctx: &GpuContext) -> Result<Arc<(wgpu::BindGroupLayout, wgpu::ComputePipeline)>> {
    ctx.inner.pipelines.get_pass("lamb combine", || compile_combine(ctx))
}

/// [`combine_pipeline`], compiled.
fn compile_combine(ctx: &GpuContext) -> Result<(wgpu::BindGroupLayout, wgpu::ComputePipeline)> {
    let device = ctx.device();
    let source = combine_wgsl();
    let compiled = ctx.catch("compiling the LAMB combine pass", || {
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("wgpu-optim LAMB combine"),
            entries: &layout_entries(true),
        });
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("wgpu-optim LAMB combine"),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("wgpu-optim LAMB combine"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("wgpu-optim LAMB combine"),
            layout: Some(&pipeline_layout),
            module: &module,
            entry_point: Some("main"),
            compilation_options: wgpu::PipelineCompilationOptions::default(),
            cache: None,
        });
        (layout, pipeline)
    })?;
    Ok(compiled)
}

/// The stateless update (`ops::update`) of LAMB: the calls' tensors in one set of passes,
/// each call one tensor with its own norms, recorded as one compute pass with a uniform of
/// its own.
pub(crate) fn record_stateless(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    step: &KernelStep,
    calls: &[KernelArgs],
) -> Result<()> {
    ctx.check_alive()?;
    let KernelStep::Lamb(_, uniform) = step else { return Ok(()) };
    // The moments pass reads the new moments back, and the apply pass reads them, from the
    // state's input slots: both must be the outputs (inputs: param, grad, exp_avg,
    // exp_avg_sq; outputs: param, exp_avg, exp_avg_sq).
    for args in calls {
        for (input, output) in [(2, 1), (3, 2)] {
            let (Some(Some(i)), Some(Some(o))) = (args.inputs.get(input), args.outputs.get(output)) else {
                continue;
            };
            if i.tensor != o.tensor {
                return Err(Error::ConflictingOptions {
                    first: "state_out",
                    second: "algorithm",
                    reason: "LAMB's second pass reads the moments its first pass wrote: update its \
                             state in place (the parameters may go out of place)",
                });
            }
        }
    }
    let items = |apply: bool| -> Result<Vec<(VariantKey, TensorPlan)>> {
        let program = Program::Update(Switches::Lamb(LambSwitches { apply }));
        let mut items = Vec::with_capacity(calls.len());
        for (i, args) in calls.iter().enumerate() {
            let mut tensor_plan = plan(ctx, program, args)?;
            let dtype = math_dtype(args);
            if dtype == DType::F64 {
                return Err(Error::DTypeMismatch {
                    argument: format!("lamb tensor {i}"),
                    got: dtype,
                    expected: "F32, F16 or BF16 for LAMB (its norms are summed in f32)".into(),
                });
            }
            tensor_plan.ordinal = i as u32;
            items.push((
                VariantKey::new(
                    Scalars::Passes(&shader::PASSES),
                    program,
                    DType::F32,
                    tensor_plan.layout.clone(),
                ),
                tensor_plan,
            ));
        }
        Ok(items)
    };
    let items = [items(false)?, items(true)?];
    let mut bytes = [0u8; UNIFORM_SLOT_BYTES as usize];
    KernelStep::Lamb(LambSwitches { apply: false }, *uniform).write_uniform(DType::F32, &mut bytes);
    let uniforms = Uniforms::new(ctx, &bytes, "LAMB", None, None)?;
    let bound = bind_passes(ctx, items, 0, (uniforms.buffer(), 0))?;
    let mut pass = encoder
        .begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("LAMB"), timestamp_writes: None });
    record(&mut pass, std::slice::from_ref(&bound));
    Ok(())
}

impl LambPasses {
    /// After a split step's first half: each LAMB parameter's sums of `p^2` and `s^2`
    /// (summed over its moments slots in slot order, in f64), read back from the device.
    pub(crate) fn sums(&self, ctx: &GpuContext) -> Result<Vec<(usize, [f64; 2])>> {
        let Some((_, _, bound)) = self.bound.first() else { return Ok(Vec::new()) };
        let views: Vec<Tensor> =
            bound.iter().map(|b| Tensor::new(&b.partials, 0, 2 * b.slot_owners.len() as u64, DType::F32)).collect();
        let read = ctx.read_bytes_many(&views)?;
        let mut sums = Vec::with_capacity(bound.iter().map(|b| b.len).sum());
        for (b, bytes) in bound.iter().zip(read) {
            let values: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes);
            let mut group = vec![[0f64; 2]; b.len];
            for (slot, &owner) in b.slot_owners.iter().enumerate() {
                let pair = &mut group[owner as usize - b.first];
                pair[0] += f64::from(values[2 * slot]);
                pair[1] += f64::from(values[2 * slot + 1]);
            }
            sums.extend(group.into_iter().enumerate().map(|(i, pair)| (b.first + i, pair)));
        }
        Ok(sums)
    }

    /// Writes `totals` (each parameter's sums over every rank's pieces of its tensor, in
    /// the order [`Self::sums`] gave them) into the partials, each in its parameter's first
    /// slot and 0 in the others, so that the combine pass, which adds a parameter's slots,
    /// finds them; lands at the next submit.
    pub(crate) fn write_totals(&self, ctx: &GpuContext, totals: &[(usize, [f64; 2])]) {
        let Some((_, _, bound)) = self.bound.first() else { return };
        let mut totals = totals.iter();
        for b in bound {
            let group: Vec<[f64; 2]> = totals.by_ref().take(b.len).map(|(_, pair)| *pair).collect();
            let mut first_slot = vec![true; b.len];
            let mut values = vec![0f32; 2 * b.slot_owners.len()];
            for (slot, &owner) in b.slot_owners.iter().enumerate() {
                let i = owner as usize - b.first;
                if let (true, Some([p, s])) = (std::mem::take(&mut first_slot[i]), group.get(i)) {
                    (values[2 * slot], values[2 * slot + 1]) = (*p as f32, *s as f32);
                }
            }
            ctx.queue().write_buffer(&b.partials, 0, bytemuck::cast_slice(&values));
        }
    }

    /// After the totals: every LAMB group's combine and apply passes.
    pub(crate) fn record_finish(&self, pass: &mut wgpu::ComputePass<'_>) {
        let Some((_, _, bound)) = self.bound.first() else { return };
        for b in bound {
            pass.set_pipeline(&b.combine);
            pass.set_bind_group(binding::GROUP_SCALARS, &b.combine_group, &[]);
            pass.dispatch_workgroups(b.layout.tensors.div_ceil(WORKGROUP_SIZE).max(1), 1, 1);
            b.apply.record(pass, &b.passes_group);
        }
    }
}

/// Records every LAMB group's three passes into `pass`: each pass reads what the one before
/// it wrote (a compute pass orders its dispatches' storage accesses).
fn record(pass: &mut wgpu::ComputePass<'_>, bound: &[LambBound]) {
    for b in bound {
        b.moments.record(pass, &b.passes_group);
        pass.set_pipeline(&b.combine);
        pass.set_bind_group(binding::GROUP_SCALARS, &b.combine_group, &[]);
        pass.dispatch_workgroups(b.layout.tensors.div_ceil(WORKGROUP_SIZE).max(1), 1, 1);
        b.apply.record(pass, &b.passes_group);
    }
}

impl Optimizer {
    /// Tensor `i`'s norms at the last step, on the device: three f32 (`weight_norm`,
    /// `adam_norm`, `trust_ratio`, as torch-optimizer keeps them in its state) to read with
    /// [`GpuContext::read`](crate::GpuContext::read); the values change with every recorded
    /// step, and before the first they are 0. `None` where tensor `i` is not in a LAMB group,
    /// or before the optimizer has bound a step.
    pub fn lamb_norms(&self, i: usize) -> Option<Tensor> {
        self.passes_of::<LambPasses>()?.norms(i)
    }
}
