//! Global gradient clipping on the device: a multi-tensor pass writes one partial norm per
//! workgroup (`shaders/grad_norm.wgsl`), one workgroup combines them into the norm and the
//! coefficient (`shaders/clip_finalize.wgsl`), and the update kernels multiply each gradient
//! by that coefficient as they load it. Two dispatches per gradient dtype, whatever the
//! number of tensors; nothing is read back, and no gradient is rewritten.

use std::sync::Arc;

use crate::gpu::dispatch::Batch;
use crate::gpu::kernel::{binding, clip_finalize_wgsl, Program, Scalars, VariantKey};
use crate::gpu::plan::{plan, Arg, KernelArgs};
use crate::gpu::{GpuContext, TENSOR_USAGES};
use crate::step::clip::{ClipHeader, FusedClip, NormType};
use crate::step::device::DeviceHeader;
use crate::{DType, Result, Tensor};

/// The clip buffer and the finalize pipeline, one per optimizer.
pub(super) struct ClipPass {
    clip: FusedClip,
    /// [`ClipHeader`]: the last norm and coefficient, and `max_norm`.
    buffer: wgpu::Buffer,
    finalize: wgpu::ComputePipeline,
    /// Capturable mode's device state, into which the finalize pass also writes the
    /// coefficient ([`DeviceHeader::clip_coefficient`]).
    device_state: Option<wgpu::Buffer>,
}

fn entry(binding: u32, buffer: &wgpu::Buffer) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry { binding, resource: buffer.as_entire_binding() }
}

/// The device state's header, which is all the kernels bind of it.
fn header_entry(binding: u32, state: &wgpu::Buffer) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry {
        binding,
        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: state,
            offset: 0,
            size: wgpu::BufferSize::new(DeviceHeader::BYTES),
        }),
    }
}

/// The norm pass over one set of gradient tensors.
pub(super) struct BoundNorm {
    batch: Batch,
    /// One f32 per workgroup of `batch`.
    norm_group: wgpu::BindGroup,
    finalize_group: wgpu::BindGroup,
}

impl BoundNorm {
    /// Records the pass that writes the partial norms (unscaling too, if bound so).
    pub(super) fn record_partials(&self, pass: &mut wgpu::ComputePass<'_>) {
        self.batch.record(pass, &self.norm_group);
    }
}

impl ClipPass {
    /// The pass for `clip`; with `device_state`, capturable mode's, whose update kernels
    /// read the coefficient there.
    pub(super) fn new(
        ctx: &GpuContext,
        clip: FusedClip,
        device_state: Option<&wgpu::Buffer>,
    ) -> Result<Self> {
        clip.clip.validate()?;
        let device = ctx.device();
        let header = ClipHeader {
            total_norm: 0.0,
            coefficient: 1.0,
            max_norm: clip.clip.max_norm as f32,
            reserved: 0,
        };
        let inf = clip.clip.norm_type == NormType::Inf;
        let finalize = finalize_pipeline(ctx, device_state.is_some(), inf, clip.eps as f32)?;
        ctx.catch("creating the gradient clipping pass", || {
            use wgpu::util::DeviceExt;
            let buffer = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("wgpu-optim clip state"),
                contents: bytemuck::bytes_of(&header),
                usage: TENSOR_USAGES,
            });
            ClipPass { clip, buffer, finalize: (*finalize).clone(), device_state: device_state.cloned() }
        })
    }

    /// The clipping it runs.
    pub(super) fn clip(&self) -> FusedClip {
        self.clip
    }

    /// The clip buffer, which the update kernels' group 0 binds.
    pub(super) fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }

    /// The last step's global norm as an f32 tensor of one element.
    pub(super) fn total_norm(&self) -> Tensor {
        Tensor::new(&self.buffer, ClipHeader::TOTAL_NORM, 1, DType::F32)
    }

    /// The norm pass over `grads` (already checked against the parameters). With
    /// `unscale_into`, capturable mode's device state, it is AMP's unscale pass as well: each
    /// gradient is unscaled in place and its norm taken after unscaling, in one read.
    pub(super) fn bind(
        &self,
        ctx: &GpuContext,
        grads: &[Tensor],
        unscale_into: Option<&wgpu::Buffer>,
    ) -> Result<BoundNorm> {
        let (program, scalars) = match unscale_into {
            Some(_) => (Program::UnscaleNorm(self.clip.clip.norm_type), Scalars::UnscaleNorm),
            None => (Program::GradNorm(self.clip.clip.norm_type), Scalars::Norm),
        };
        let mut items = Vec::with_capacity(grads.len());
        for (i, grad) in grads.iter().enumerate() {
            let arg = Arg::new(format!("grads[{i}]"), grad);
            let outputs = if unscale_into.is_some() { vec![Some(arg.clone())] } else { vec![] };
            let args = KernelArgs { inputs: vec![Some(arg)], outputs };
            let tensor_plan = plan(ctx, program, &args)?;
            let key = VariantKey::new(scalars, program, DType::F32, tensor_plan.layout.clone());
            items.push((key, tensor_plan));
        }
        let batch = Batch::build(ctx, &items, "gradient norm")?;
        let slots = u64::from(batch.workgroups().max(1));
        let device = ctx.device();
        let layouts = &ctx.inner.scalar_layouts;
        ctx.catch("creating the gradient norm partials", || {
            // Zeroed at creation: an empty gradient set leaves its one slot at 0.
            let partials = device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("wgpu-optim gradient norm partials"),
                size: 4 * slots,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            });
            let norm_entries = match unscale_into {
                Some(state) => vec![
                    header_entry(binding::DEVICE_STATE_RW, state),
                    entry(binding::UNSCALE_NORM_PARTIALS, &partials),
                ],
                None => vec![entry(binding::NORM_PARTIALS, &partials)],
            };
            let norm_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("wgpu-optim gradient norm"),
                layout: layouts.get(scalars, false),
                entries: &norm_entries,
            });
            let mut entries = vec![
                entry(binding::FINALIZE_PARTIALS, &partials),
                entry(binding::FINALIZE_CLIP, &self.buffer),
            ];
            if let Some(state) = &self.device_state {
                entries.push(header_entry(binding::FINALIZE_DEVICE_STATE, state));
            }
            let finalize_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("wgpu-optim clip finalize"),
                layout: layouts.finalize(self.device_state.is_some()),
                entries: &entries,
            });
            BoundNorm { batch, norm_group, finalize_group }
        })
    }

    /// Records the norm pass and the finalize pass; the update dispatches recorded after
    /// them in `pass` read the new coefficient.
    pub(super) fn record(&self, pass: &mut wgpu::ComputePass<'_>, bound: &BoundNorm) {
        bound.record_partials(pass);
        self.record_finalize(pass, bound);
    }

    /// Records the finalize pass alone, over partials `bound` wrote earlier (the unscale
    /// pass that takes norms).
    pub(super) fn record_finalize(&self, pass: &mut wgpu::ComputePass<'_>, bound: &BoundNorm) {
        pass.set_pipeline(&self.finalize);
        pass.set_bind_group(binding::GROUP_SCALARS, &bound.finalize_group, &[]);
        pass.dispatch_workgroups(1, 1, 1);
    }
}

/// The finalize pass's pipeline (capturable mode's reads the device state; `inf`: the norm
/// is the largest magnitude; `eps`: what it adds to the norm), from the context's pipeline
/// registry, one per eps.
fn finalize_pipeline(
    ctx: &GpuContext,
    capturable: bool,
    inf: bool,
    eps: f32,
) -> Result<Arc<wgpu::ComputePipeline>> {
    let name = match (capturable, inf) {
        (false, false) => "clip finalize",
        (false, true) => "clip finalize inf",
        (true, false) => "clip finalize capturable",
        (true, true) => "clip finalize capturable inf",
    };
    ctx.inner.pipelines.get_pass_with(name, u64::from(eps.to_bits()), || {
        let device = ctx.device();
        let layout = ctx.inner.scalar_layouts.finalize(capturable);
        ctx.catch("creating the gradient clipping pass", || {
            let source = clip_finalize_wgsl(capturable);
            let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some("wgpu-optim clip finalize"),
                source: wgpu::ShaderSource::Wgsl(source.into()),
            });
            let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some("wgpu-optim clip finalize"),
                bind_group_layouts: &[Some(layout)],
                immediate_size: 0,
            });
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("wgpu-optim clip finalize"),
                layout: Some(&pipeline_layout),
                module: &module,
                entry_point: Some("main"),
                compilation_options: wgpu::PipelineCompilationOptions {
                    // An f32 given exactly, so the shader adds the very f32 the CPU backend adds.
                    constants: &[("NORM_INF", f64::from(u8::from(inf))), ("CLIP_EPS", f64::from(eps))],
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            })
        })
    })
}
