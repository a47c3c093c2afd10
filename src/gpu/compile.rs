//! A compute pipeline from WGSL: its shader module, its two bind group layouts and the
//! pipeline, and the buffer entries of those layouts. Every compiled kernel goes through here,
//! whichever registry key selects it (`gpu::pipeline`).

use crate::gpu::GpuContext;
use crate::Result;

/// A compiled variant and the layout its per-segment bind groups must follow.
#[derive(Debug)]
pub(crate) struct CachedPipeline {
    pub(crate) pipeline: wgpu::ComputePipeline,
    pub(crate) segment_layout: wgpu::BindGroupLayout,
}

/// A compute-visible buffer entry. `min_size` is the least the shader reads, so wgpu checks
/// each binding's size once, when its bind group is created, not at every dispatch.
pub(crate) fn buffer_entry(
    binding: u32,
    ty: wgpu::BufferBindingType,
    has_dynamic_offset: bool,
    min_size: u64,
) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty,
            has_dynamic_offset,
            min_binding_size: wgpu::BufferSize::new(min_size),
        },
        count: None,
    }
}

/// A compute pipeline of `source` (entry point `main`, override `constants`) whose group 0
/// is `group0` and whose group 1 has `entries`, returned with group 1's layout. The shader
/// is logged when wgpu refuses it.
pub(crate) fn create(
    ctx: &GpuContext,
    label: &str,
    source: &str,
    group0: &wgpu::BindGroupLayout,
    entries: &[wgpu::BindGroupLayoutEntry],
    constants: &[(&str, f64)],
) -> Result<(wgpu::ComputePipeline, wgpu::BindGroupLayout)> {
    let device = ctx.device();
    let result = ctx.catch(&format!("compiling {label}"), || {
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(label),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
        let layout =
            device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: Some(label), entries });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(label),
            bind_group_layouts: &[Some(group0), Some(&layout)],
            immediate_size: 0,
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(label),
            layout: Some(&pipeline_layout),
            module: &module,
            entry_point: Some("main"),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants,
                zero_initialize_workgroup_memory: false,
            },
            cache: None,
        });
        (pipeline, layout)
    });
    if result.is_err() {
        log::error!("generated WGSL of {label}:\n{source}");
    }
    result
}
