//! LAMB on the GPU optimizer: per LAMB group, the moments pass, the combine pass and the
//! apply pass (`gpu::lamb` has the shader side), recorded into the step's compute pass after
//! the other groups' updates. Nothing is read back: the trust ratios go from the combine
//! pass to the apply pass through the group's index buffer, where [`Optimizer::lamb_norms`]
//! finds the last step's norms.

use super::{Optimizer, OptimizerOptions, ParamGroup};
use crate::gpu::dispatch::Batch;
use crate::gpu::kernel::{binding, Program, Scalars, WORKGROUP_SIZE};
use crate::gpu::lamb::{combine_wgsl, layout_entries, IndexLayout, INDEX, PARTIALS};
use crate::step::{LambSwitches, Switches, UNIFORM_SLOT_BYTES};
use crate::{Algorithm, DType, Error, Result, Tensor};

/// One LAMB group's passes over one set of gradients.
pub(super) struct LambBound {
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
}

/// Refuses what LAMB groups do not implement: capturable mode, clipping and stochastic
/// rounding (`algo::lamb::check_options`), and f64 parameters (the passes sum in f32 and
/// the combine pass reads an f32 uniform).
pub(super) fn check_options(groups: &[ParamGroup], options: &OptimizerOptions) -> Result<()> {
    for group in groups {
        let clipped = options.grad_clip.is_some();
        crate::algo::check_lamb_options(&group.algorithm, options.capturable, clipped, options.rounding)?;
        let lamb = matches!(group.algorithm, Algorithm::Lamb(_));
        if let Some(p) = group.params.iter().find(|p| lamb && p.dtype == DType::F64) {
            return Err(Error::DTypeMismatch {
                argument: "params".into(),
                got: p.dtype,
                expected: "F32, F16 or BF16 for LAMB (its norms are summed in f32)".into(),
            });
        }
    }
    Ok(())
}

impl Optimizer {
    /// The passes of every LAMB group over `grads` (already checked).
    pub(super) fn bind_lamb(&self, grads: &[Tensor]) -> Result<Vec<LambBound>> {
        let mut bound = Vec::new();
        for (g, group) in self.groups.iter().enumerate() {
            if matches!(group.algorithm, Algorithm::Lamb(_)) {
                bound.push(self.bind_lamb_group(g, group.first, group.len, grads)?);
            }
        }
        Ok(bound)
    }

    fn bind_lamb_group(&self, g: usize, first: usize, len: usize, grads: &[Tensor]) -> Result<LambBound> {
        let algorithm = self.groups[g].algorithm;
        if self.math == DType::F64 {
            return Err(Error::DTypeMismatch {
                argument: "params".into(),
                got: DType::F64,
                expected: "F32, F16 or BF16 for LAMB (its norms are summed in f32)".into(),
            });
        }
        let batch = |apply: bool, label: &str| -> Result<Batch> {
            let program = Program::Update(Switches::Lamb(LambSwitches { apply }));
            let items = (first..first + len)
                .map(|i| self.batch_item(Scalars::Lamb, program, &algorithm, i, &grads[i]))
                .collect::<Result<Vec<_>>>()?;
            Batch::build(&self.ctx, &items, label)
        };
        let moments = batch(false, "LAMB moments")?;
        let apply = batch(true, "LAMB apply")?;
        // Ordinals are the optimizer's parameter indices; the index counts from the group's.
        let local = |owners: &[u32]| owners.iter().map(|&o| o - first as u32).collect::<Vec<_>>();
        let (layout, words) =
            IndexLayout::build(len as u32, &local(moments.owners()), &local(apply.owners()));
        let ctx = &self.ctx;
        let device = ctx.device();
        let passes_layout = ctx.inner.scalar_layouts.get(Scalars::Lamb, false);
        let source = combine_wgsl();
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
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            });
            let hyper = wgpu::BindGroupEntry {
                binding: binding::HYPER,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: self.uniforms.buffer(),
                    offset: g as u64 * UNIFORM_SLOT_BYTES,
                    size: wgpu::BufferSize::new(UNIFORM_SLOT_BYTES),
                }),
            };
            let entries = [
                hyper.clone(),
                wgpu::BindGroupEntry { binding: PARTIALS, resource: partials.as_entire_binding() },
                wgpu::BindGroupEntry { binding: INDEX, resource: index.as_entire_binding() },
            ];
            let passes_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("wgpu-optim LAMB passes"),
                layout: passes_layout,
                entries: &entries,
            });
            let combine_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some("wgpu-optim LAMB combine"),
                entries: &layout_entries(true),
            });
            let combine_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("wgpu-optim LAMB combine"),
                layout: &combine_layout,
                entries: &entries,
            });
            let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some("wgpu-optim LAMB combine"),
                source: wgpu::ShaderSource::Wgsl(source.into()),
            });
            let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some("wgpu-optim LAMB combine"),
                bind_group_layouts: &[Some(&combine_layout)],
                immediate_size: 0,
            });
            let combine = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("wgpu-optim LAMB combine"),
                layout: Some(&pipeline_layout),
                module: &module,
                entry_point: Some("main"),
                compilation_options: wgpu::PipelineCompilationOptions::default(),
                cache: None,
            });
            LambBound { first, len, moments, apply, passes_group, combine_group, combine, index, layout }
        })
    }

    /// Tensor `i`'s norms at the last step, on the device: three f32 (`weight_norm`,
    /// `adam_norm`, `trust_ratio`, as torch-optimizer keeps them in its state) to read with
    /// [`GpuContext::read`](crate::GpuContext::read); the values change with every recorded step, and before the
    /// first they are 0. `None` where tensor `i` is not in a LAMB group, or before the
    /// optimizer has bound a step.
    pub fn lamb_norms(&self, i: usize) -> Option<Tensor> {
        let bound = self.bound.first()?.lamb.iter().find(|b| (b.first..b.first + b.len).contains(&i))?;
        let offset = 4 * u64::from(bound.layout.norms + 4 * (i - bound.first) as u32);
        Some(Tensor::new(&bound.index, offset, 3, DType::F32))
    }
}

/// Records every LAMB group's three passes into `pass`: each pass reads what the one before
/// it wrote (a compute pass orders its dispatches' storage accesses).
pub(super) fn record(pass: &mut wgpu::ComputePass<'_>, bound: &[LambBound]) {
    for b in bound {
        b.moments.record(pass, &b.passes_group);
        pass.set_pipeline(&b.combine);
        pass.set_bind_group(binding::GROUP_SCALARS, &b.combine_group, &[]);
        pass.dispatch_workgroups(b.layout.tensors.div_ceil(WORKGROUP_SIZE).max(1), 1, 1);
        b.apply.record(pass, &b.passes_group);
    }
}
