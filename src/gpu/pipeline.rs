//! Compiled pipelines, one per variant, created once and shared by every caller of a context.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::gpu::kernel::{compose, Scalars, Storage, VariantKey, CLIP_BINDING, TABLE_BYTES};
use crate::gpu::GpuContext;
use crate::step::clip::ClipHeader;
use crate::step::device::DeviceHeader;
use crate::step::UNIFORM_SLOT_BYTES;
use crate::{DType, Error, Result};

/// A compiled variant and the layout its per-segment bind groups must follow.
#[derive(Debug)]
pub(crate) struct CachedPipeline {
    pub(crate) pipeline: wgpu::ComputePipeline,
    pub(crate) segment_layout: wgpu::BindGroupLayout,
}

/// Pipelines by variant. Insertion is double-checked so two threads asking for the same
/// variant at once compile it at most twice and share one result.
#[derive(Default)]
pub(crate) struct PipelineCache {
    map: Mutex<HashMap<VariantKey, Arc<CachedPipeline>>>,
}

impl PipelineCache {
    pub(crate) fn len(&self) -> usize {
        self.map.lock().map(|m| m.len()).unwrap_or(0)
    }

    pub(crate) fn get(&self, ctx: &GpuContext, key: &VariantKey) -> Result<Arc<CachedPipeline>> {
        if let Some(hit) = self.lock().get(key) {
            return Ok(hit.clone());
        }
        let compiled = Arc::new(compile(ctx, key)?);
        Ok(self.lock().entry(key.clone()).or_insert(compiled).clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<VariantKey, Arc<CachedPipeline>>> {
        // A panic while holding the lock cannot leave the map inconsistent (inserts are
        // single calls), so a poisoned lock is still usable.
        self.map.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The layouts of group 0, one per [`Scalars`] kind.
#[derive(Debug)]
pub(crate) struct ScalarLayouts {
    host: wgpu::BindGroupLayout,
    device: wgpu::BindGroupLayout,
    /// `host` and `device` with the clip buffer at [`CLIP_BINDING`].
    host_clipped: wgpu::BindGroupLayout,
    device_clipped: wgpu::BindGroupLayout,
    state: wgpu::BindGroupLayout,
    /// Gradient norms' partials (written), at 0.
    norm: wgpu::BindGroupLayout,
    /// The clip finalize pass: the partials (read) at 0, the clip buffer (written) at 1.
    finalize: wgpu::BindGroupLayout,
}

/// A compute-visible buffer entry. `min_size` is the least the shader reads, so wgpu checks
/// each binding's size once, when its bind group is created, not at every dispatch.
fn buffer_entry(
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

impl ScalarLayouts {
    pub(crate) fn new(device: &wgpu::Device) -> Self {
        use wgpu::BufferBindingType::{Storage, Uniform};
        let layout = |label: &str, entries: &[wgpu::BindGroupLayoutEntry]| {
            device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: Some(label), entries })
        };
        let hyper = buffer_entry(0, Uniform, false, UNIFORM_SLOT_BYTES);
        let state =
            |binding, read_only| buffer_entry(binding, Storage { read_only }, false, DeviceHeader::BYTES);
        // The device state, and the group's learning rate (one f32).
        let device_entries = [hyper, state(1, true), buffer_entry(2, Storage { read_only: true }, false, 4)];
        let clip =
            |binding, read_only| buffer_entry(binding, Storage { read_only }, false, ClipHeader::BYTES);
        let partials = |read_only| buffer_entry(0, Storage { read_only }, false, 4);
        let mut device_clipped = device_entries.to_vec();
        device_clipped.push(clip(CLIP_BINDING, true));
        ScalarLayouts {
            host: layout("wgpu-optim hyperparameters", &[hyper]),
            device: layout("wgpu-optim capturable scalars", &device_entries),
            host_clipped: layout("wgpu-optim hyperparameters, clipped", &[hyper, clip(CLIP_BINDING, true)]),
            device_clipped: layout("wgpu-optim capturable scalars, clipped", &device_clipped),
            state: layout("wgpu-optim device state", &[state(0, false)]),
            norm: layout("wgpu-optim gradient norm partials", &[partials(false)]),
            finalize: layout("wgpu-optim clip finalize", &[partials(true), clip(1, false)]),
        }
    }

    /// Group 0 of a kernel whose scalars come from `scalars`, with the clip buffer when
    /// `clip` (update kernels only).
    pub(crate) fn get(&self, scalars: Scalars, clip: bool) -> &wgpu::BindGroupLayout {
        match (scalars, clip) {
            (Scalars::Host, false) => &self.host,
            (Scalars::Device, false) => &self.device,
            (Scalars::Host, true) => &self.host_clipped,
            (Scalars::Device, true) => &self.device_clipped,
            (Scalars::Unscale, _) => &self.state,
            (Scalars::Norm, _) => &self.norm,
        }
    }

    /// The layout of the clip finalize pass.
    pub(crate) fn finalize(&self) -> &wgpu::BindGroupLayout {
        &self.finalize
    }

    /// The layout of the step-advancing kernel: the device state, read-write.
    pub(crate) fn state(&self) -> &wgpu::BindGroupLayout {
        &self.state
    }
}

fn compile(ctx: &GpuContext, key: &VariantKey) -> Result<CachedPipeline> {
    let uses_f64 =
        key.math == DType::F64 || key.layout.bindings.iter().any(|b| b.storage.dtype() == DType::F64);
    if uses_f64 && !ctx.has_feature(wgpu::Features::SHADER_F64) {
        return Err(Error::MissingFeature {
            what: format!("the {} kernel in f64", key.program.name()),
            feature: "SHADER_F64",
        });
    }
    let device = ctx.device();
    let overrides = key.program.overrides();
    let label = format!("wgpu-optim {} {:?} {:?}", key.program.name(), key.math, overrides);
    let source = compose(key);
    // The dispatch's table of segments (see `gpu::table`).
    let mut entries = vec![buffer_entry(0, wgpu::BufferBindingType::Uniform, false, TABLE_BYTES)];
    for (b, desc) in key.layout.bindings.iter().enumerate() {
        // One element of the array (a vec4, or two words of halves, in vector variants);
        // storage bindings are whole words.
        let element = match desc.storage {
            Storage::Native(dtype) => dtype.size() * u64::from(key.width),
            Storage::Packed(_) => 2 * u64::from(key.width),
        };
        let ty = wgpu::BufferBindingType::Storage { read_only: !desc.read_write };
        entries.push(buffer_entry(b as u32 + 1, ty, false, element.next_multiple_of(4)));
    }
    let result = ctx.catch(&format!("compiling {label}"), || {
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(&label),
            source: wgpu::ShaderSource::Wgsl(source.as_str().into()),
        });
        let segment_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some(&label),
            entries: &entries,
        });
        let layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(&label),
            bind_group_layouts: &[
                Some(ctx.inner.scalar_layouts.get(key.scalars, key.clip)),
                Some(&segment_layout),
            ],
            immediate_size: 0,
        });
        let constants: Vec<(&str, f64)> = overrides.iter().map(|o| o.constant()).collect();
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&label),
            layout: Some(&layout),
            module: &module,
            entry_point: Some("main"),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &constants,
                zero_initialize_workgroup_memory: false,
            },
            cache: None,
        });
        CachedPipeline { pipeline, segment_layout }
    });
    if result.is_err() {
        log::error!("generated WGSL of {label}:\n{source}");
    } else {
        log::debug!("compiled {label}");
    }
    result
}
