//! Capturable mode's device state: the step counter, the AMP flag, the unscale factor and
//! each group's learning rate, in one small buffer the trainer never has to touch per step.
//!
//! Layout: the [`DeviceHeader`] at 0, and group g's learning rate (f32) at
//! `256 * (g + 1)`, so that each can be bound on its own at any adapter's storage-offset
//! alignment.

use std::sync::Arc;

use crate::gpu::dispatch::Batch;
use crate::gpu::kernel::{advance_wgsl, binding, Program, Scalars, VariantKey};
use crate::gpu::plan::{plan, Arg, KernelArgs};
use crate::gpu::{GpuContext, TENSOR_USAGES};
use crate::step::device::DeviceHeader;
use crate::{DType, Error, Result, Tensor};

/// Spacing of the learning rates in the device state buffer (WebGPU's largest
/// `min_storage_buffer_offset_alignment`).
const LR_STRIDE: u64 = 256;

/// The device state and what records onto it.
pub(super) struct DeviceState {
    buffer: wgpu::Buffer,
    /// The device state read-write, for the advancing and unscaling kernels.
    state_group: wgpu::BindGroup,
    advance: wgpu::ComputePipeline,
    /// Unscale dispatches for the gradients they were built for.
    unscale: Option<(Vec<Tensor>, Batch)>,
    /// Whether `record_unscale` set the AMP flag for the step about to be recorded.
    unscaled: bool,
}

impl DeviceState {
    /// Step 0, no infinities found, inv_scale 1, and each group's learning rate.
    pub(super) fn new(ctx: &GpuContext, lrs: &[f64]) -> Result<Self> {
        let device = ctx.device();
        let mut contents = vec![0u8; (LR_STRIDE * (lrs.len() as u64 + 1)) as usize];
        contents[..DeviceHeader::BYTES as usize]
            .copy_from_slice(bytemuck::bytes_of(&DeviceHeader::default()));
        for (g, lr) in lrs.iter().enumerate() {
            let at = (LR_STRIDE * (g as u64 + 1)) as usize;
            contents[at..at + 4].copy_from_slice(&(*lr as f32).to_le_bytes());
        }
        let layout = ctx.inner.scalar_layouts.state();
        let advance = advance_pipeline(ctx)?;
        ctx.catch("creating the capturable device state", || {
            use wgpu::util::DeviceExt;
            let buffer = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("wgpu-optim device state"),
                contents: &contents,
                usage: TENSOR_USAGES,
            });
            let state_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("wgpu-optim device state"),
                layout,
                entries: &[wgpu::BindGroupEntry {
                    binding: binding::DEVICE_STATE_RW,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &buffer,
                        offset: 0,
                        size: wgpu::BufferSize::new(DeviceHeader::BYTES),
                    }),
                }],
            });
            DeviceState { buffer, state_group, advance: (*advance).clone(), unscale: None, unscaled: false }
        })
    }

    pub(super) fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }

    /// The byte offset of group `g`'s learning rate.
    pub(super) fn lr_offset(&self, g: usize) -> u64 {
        LR_STRIDE * (g as u64 + 1)
    }

    /// Group `g`'s learning rate as an f32 tensor of one element.
    pub(super) fn lr_tensor(&self, g: usize) -> Tensor {
        Tensor::new(&self.buffer, self.lr_offset(g), 1, DType::F32)
    }

    /// The step counter as a tensor of one u32 (read it with `read_bytes`).
    pub(super) fn step_bytes(&self) -> Tensor {
        Tensor::new(&self.buffer, DeviceHeader::STEP, 1, DType::F32)
    }

    /// The AMP flag as a tensor of one u32 (read it with `read_bytes`).
    pub(super) fn found_inf_bytes(&self) -> Tensor {
        Tensor::new(&self.buffer, DeviceHeader::FOUND_INF, 1, DType::F32)
    }

    /// Writes group `g`'s learning rate (lands at the next submit).
    pub(super) fn write_lr(&self, ctx: &GpuContext, g: usize, lr: f64) {
        ctx.queue().write_buffer(&self.buffer, self.lr_offset(g), &(lr as f32).to_le_bytes());
    }

    /// Writes the step counter (lands at the next submit).
    pub(super) fn write_step(&self, ctx: &GpuContext, step: u32) {
        ctx.queue().write_buffer(&self.buffer, DeviceHeader::STEP, &step.to_le_bytes());
    }

    /// Before a step's pass: a step without a preceding unscale must not be skipped by a
    /// flag left from an earlier step, so the flag is cleared.
    pub(super) fn prepare_step(&self, encoder: &mut wgpu::CommandEncoder) {
        if !self.unscaled {
            encoder.clear_buffer(&self.buffer, DeviceHeader::FOUND_INF, Some(4));
        }
    }

    /// The step after an unscale was recorded or submitted: the next step clears the flag
    /// again unless another unscale comes first.
    pub(super) fn stepped(&mut self) {
        self.unscaled = false;
    }

    /// The step's first dispatch: the counter advances unless AMP found an infinity.
    pub(super) fn record_advance(&self, pass: &mut wgpu::ComputePass<'_>) {
        pass.set_pipeline(&self.advance);
        pass.set_bind_group(binding::GROUP_SCALARS, &self.state_group, &[]);
        pass.dispatch_workgroups(1, 1, 1);
    }

    /// Records PyTorch's AMP unscale: `inv_scale` (an f32 tensor of one element, 4-byte
    /// aligned, with `COPY_SRC`) is copied into the device state, the flag is cleared, and
    /// every gradient is multiplied by it, the flag set where one is NaN or infinite.
    pub(super) fn record_unscale(
        &mut self,
        ctx: &GpuContext,
        encoder: &mut wgpu::CommandEncoder,
        grads: &[Tensor],
        inv_scale: &Tensor,
    ) -> Result<()> {
        check_inv_scale(inv_scale)?;
        if self.unscale.as_ref().is_none_or(|(bound, _)| bound != grads) {
            let mut items = Vec::with_capacity(grads.len());
            for (i, grad) in grads.iter().enumerate() {
                let arg = Arg::new(format!("grads[{i}]"), grad);
                let args = KernelArgs { inputs: vec![Some(arg.clone())], outputs: vec![Some(arg)] };
                let tensor_plan = plan(ctx, Program::Unscale, &args)?;
                let key = VariantKey::new(
                    Scalars::Unscale,
                    Program::Unscale,
                    DType::F32,
                    tensor_plan.layout.clone(),
                );
                items.push((key, tensor_plan));
            }
            self.unscale = Some((grads.to_vec(), Batch::build(ctx, &items, "unscale")?));
        }
        self.record_scale(encoder, inv_scale);
        if let Some((_, batch)) = &self.unscale {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("wgpu-optim unscale"),
                timestamp_writes: None,
            });
            batch.record(&mut pass, &self.state_group);
        }
        Ok(())
    }

    /// Records what precedes any unscale pass (`inv_scale` checked by [`check_inv_scale`]):
    /// the factor copied into the device state and the flag cleared, and notes that the
    /// next step follows an unscale.
    pub(super) fn record_scale(&mut self, encoder: &mut wgpu::CommandEncoder, inv_scale: &Tensor) {
        encoder.copy_buffer_to_buffer(
            &inv_scale.buffer,
            inv_scale.offset,
            &self.buffer,
            DeviceHeader::INV_SCALE,
            4,
        );
        encoder.clear_buffer(&self.buffer, DeviceHeader::FOUND_INF, Some(4));
        self.unscaled = true;
    }
}

/// Checks a tensor [`Optimizer::record_unscale`](crate::Optimizer::record_unscale)
/// would take as AMP's `inv_scale`: an f32 tensor of one element, 4-byte aligned (the copy
/// into the device state needs it), whose buffer can be copied from. For a front end that
/// checks a caller's tensor before anything is recorded.
pub fn check_inv_scale(inv_scale: &Tensor) -> Result<()> {
    if inv_scale.dtype != DType::F32 || inv_scale.len != 1 {
        return Err(Error::DTypeMismatch {
            argument: "inv_scale".into(),
            got: inv_scale.dtype,
            expected: format!("an F32 tensor of one element (got {} elements)", inv_scale.len),
        });
    }
    // An f32 element's offset is a multiple of 4, which the copy needs.
    crate::gpu::plan::check_range(&Arg::new("inv_scale", inv_scale))?;
    crate::gpu::transfer::check_readable(&Arg::new("inv_scale", inv_scale))
}

/// The pass that advances the device's step count, from the context's pipeline registry.
fn advance_pipeline(ctx: &GpuContext) -> Result<Arc<wgpu::ComputePipeline>> {
    ctx.inner.pipelines.get_pass("advance step", || {
        let device = ctx.device();
        let layout = ctx.inner.scalar_layouts.state();
        ctx.catch("creating the capturable device state", || {
            let source = advance_wgsl();
            let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some("wgpu-optim advance step"),
                source: wgpu::ShaderSource::Wgsl(source.into()),
            });
            let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some("wgpu-optim advance step"),
                bind_group_layouts: &[Some(layout)],
                immediate_size: 0,
            });
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("wgpu-optim advance step"),
                layout: Some(&pipeline_layout),
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            })
        })
    })
}
