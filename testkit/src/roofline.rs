//! The adapter's streaming bandwidth: a plain copy shader with the access shape of an
//! optimizer update (`reads` arrays read, `writes` of them written back in place, `vec4`
//! accesses, a grid-stride loop), so "fraction of roofline" compares like with like.
//!
//! In place matters: an update writes the parameter and state where it read them, while a
//! copy into separate output arrays makes a CPU adapter (lavapipe) read each output line
//! before writing it, 10 line transfers per element against the update's 7, and the
//! update read as 128-143 % of such a roofline.

use std::cell::Cell;
use std::fmt::Write;
use std::time::Duration;

use wgpu_optim::{DType, Error, GpuContext, Result};

use crate::timer::{catch, GpuTimer};

/// A copy kernel over `elements` f32 elements per array, ready to time.
pub struct CopyRoofline {
    pipeline: wgpu::ComputePipeline,
    bind_group: wgpu::BindGroup,
    /// Workgroup counts that successive passes take in turn (see [`CopyRoofline::new`]).
    shapes: Vec<u32>,
    /// Passes recorded so far.
    passes: Cell<usize>,
    /// Bytes read plus bytes written by one dispatch.
    pub bytes: u64,
}

const WG: u32 = 256;

/// The crate's cap on workgroups per dispatch (a grid-stride loop covers the rest), so the
/// copy is launched the way the optimizer kernels are. The crate keeps its own private;
/// this copy must follow it.
const MAX_WORKGROUPS: u32 = 4096;

impl CopyRoofline {
    /// Buffers of `elements` f32 each (rounded up to a multiple of 4), `reads` of them:
    /// each is read once, and the first `writes` are written once, in place.
    ///
    /// Launched as the crate's update kernels are: one `vec4` per invocation up to the
    /// workgroup cap. On CPU adapters, where the update kernels take four accesses per
    /// invocation, passes alternate between one and four, so the fastest pass is the faster
    /// shape's (at 200 x 4096 elements four were faster; at 4096 elements, one workgroup,
    /// one was).
    pub fn new(ctx: &GpuContext, elements: u64, reads: u32, writes: u32) -> Result<Self> {
        if reads == 0 || writes == 0 || writes > reads {
            return Err(Error::BadRange {
                argument: "reads, writes".into(),
                problem: format!("{reads} reads and {writes} writes; expected 1 <= writes <= reads"),
            });
        }
        let vectors = elements.div_ceil(4);
        let device = ctx.device();
        let mut source = String::new();
        for k in 0..reads {
            let access = if k < writes { "read_write" } else { "read" };
            let _ =
                writeln!(source, "@group(0) @binding({k}) var<storage, {access}> a{k}: array<vec4<f32>>;");
        }
        let _ = writeln!(source, "override N: u32;\n@compute @workgroup_size({WG})");
        source.push_str(
            "fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {\n",
        );
        let _ = writeln!(source, "    for (var i = gid.x; i < N; i += groups.x * {WG}u) {{");
        // Read-only arrays are summed into the first written one, so every read is used; each
        // written array is scaled, so every store changes what it stores.
        let extra: String = (writes..reads).map(|k| format!(" + a{k}[i]")).collect();
        for k in 0..writes {
            let sum = if k == 0 { extra.as_str() } else { "" };
            let _ = writeln!(source, "        a{k}[i] = a{k}[i] * 0.999{sum};");
        }
        source.push_str("    }\n}\n");
        let buffers: Vec<wgpu::Buffer> =
            (0..reads).map(|_| ctx.zeros("roofline", vectors * 4, DType::F32).buffer).collect();
        let layout_entries: Vec<wgpu::BindGroupLayoutEntry> = (0..reads)
            .map(|k| wgpu::BindGroupLayoutEntry {
                binding: k,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage { read_only: k >= writes },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            })
            .collect();
        let max_groups = device.limits().max_compute_workgroups_per_dimension;
        let accesses: &[u64] = if ctx.report().device_type == wgpu::DeviceType::Cpu { &[1, 4] } else { &[1] };
        let mut shapes: Vec<u32> = accesses
            .iter()
            .map(|a| (vectors.div_ceil(u64::from(WG) * a) as u32).clamp(1, max_groups.min(MAX_WORKGROUPS)))
            .collect();
        shapes.dedup();
        catch(ctx, "building the copy roofline", || {
            let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some("roofline copy"),
                source: wgpu::ShaderSource::Wgsl(source.into()),
            });
            let bind_group_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: None,
                entries: &layout_entries,
            });
            let layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: None,
                bind_group_layouts: &[Some(&bind_group_layout)],
                immediate_size: 0,
            });
            let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("roofline copy"),
                layout: Some(&layout),
                module: &module,
                entry_point: Some("main"),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &[("N", vectors as f64)],
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            });
            let entries: Vec<wgpu::BindGroupEntry> = buffers
                .iter()
                .enumerate()
                .map(|(k, b)| wgpu::BindGroupEntry { binding: k as u32, resource: b.as_entire_binding() })
                .collect();
            let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &bind_group_layout,
                entries: &entries,
            });
            CopyRoofline {
                pipeline,
                bind_group,
                shapes,
                passes: Cell::new(0),
                bytes: vectors * 16 * u64::from(reads + writes),
            }
        })
    }

    /// Records one copy.
    pub fn record(&self, encoder: &mut wgpu::CommandEncoder) {
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("roofline"),
            timestamp_writes: None,
        });
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        let k = self.passes.get();
        self.passes.set(k + 1);
        pass.dispatch_workgroups(self.shapes[k % self.shapes.len()], 1, 1);
    }

    /// The median time of `reps` copies (GPU timestamps where available, else wall time).
    pub fn median_time(&self, timer: &mut GpuTimer, reps: usize) -> Result<Duration> {
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps.max(1) {
            let t = timer.time(|encoder| {
                self.record(encoder);
                Ok(())
            })?;
            times.push(t.gpu.unwrap_or(t.wall));
        }
        times.sort();
        Ok(times[times.len() / 2])
    }
}
