//! Recording: bind groups built once per plan, the hyperparameter uniforms, and one
//! compute pass that dispatches every segment of every tensor.

use std::sync::Arc;

use wgpu::util::DeviceExt;

use crate::gpu::kernel::{Scalars, VariantKey, MAX_WORKGROUPS, WORKGROUP_SIZE};
use crate::gpu::pipeline::CachedPipeline;
use crate::gpu::plan::{SegmentPlan, TensorPlan};
use crate::gpu::GpuContext;
use crate::step::device::DeviceHeader;
use crate::step::UNIFORM_SLOT_BYTES;
use crate::Result;

/// Bytes per segment uniform slot (`n` and one base per binding, padded to the alignment).
const SEGMENT_SLOT_BYTES: u64 = 256;

/// One dispatch: its pipeline, its bind group and its workgroup count.
#[derive(Debug)]
struct Dispatch {
    pipeline: Arc<CachedPipeline>,
    bind_group: wgpu::BindGroup,
    workgroups: u32,
}

/// Prepared updates of several tensors with one shared segment-uniform buffer.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    dispatches: Vec<Dispatch>,
}

/// A dispatch before its GPU objects exist.
struct Planned<'a> {
    key: VariantKey,
    segment: &'a SegmentPlan,
    /// The segment uniform: `n`, the pair fields, then each binding's base.
    meta: Vec<u32>,
    workgroups: u32,
}

/// The dispatches of one segment: one, or one per phase in pair mode.
fn plan_dispatches<'a>(key: &VariantKey, segment: &'a SegmentPlan, out: &mut Vec<Planned<'a>>) {
    let bases = segment.ranges.iter().map(|r| r.base);
    let key = key.with_width(segment.width);
    if key.layout.pairs() {
        let pairs = (segment.len + segment.pair_shift).div_ceil(2);
        for phase in 0..segment.phases {
            let header = [segment.len, segment.pair_shift, phase, segment.phases];
            out.push(Planned {
                key: key.clone(),
                segment,
                meta: header.into_iter().chain(bases.clone()).collect(),
                workgroups: pairs.div_ceil(segment.phases).div_ceil(WORKGROUP_SIZE),
            });
        }
    } else {
        out.push(Planned {
            key,
            segment,
            meta: [segment.len, 0, 0, 1].into_iter().chain(bases).collect(),
            workgroups: segment.len.div_ceil(WORKGROUP_SIZE),
        });
    }
}

impl Batch {
    /// Compiles (or finds) each variant and builds every bind group. This is the only place
    /// a step's GPU objects are created; recording a prepared batch creates none.
    pub(crate) fn build(ctx: &GpuContext, items: &[(VariantKey, TensorPlan)], label: &str) -> Result<Batch> {
        let mut planned = Vec::new();
        for (key, plan) in items {
            for segment in &plan.segments {
                plan_dispatches(key, segment, &mut planned);
            }
        }
        if planned.is_empty() {
            return Ok(Batch::default());
        }
        let mut contents = vec![0u8; planned.len() * SEGMENT_SLOT_BYTES as usize];
        for (slot, p) in contents.chunks_exact_mut(SEGMENT_SLOT_BYTES as usize).zip(&planned) {
            slot[..4 * p.meta.len()].copy_from_slice(bytemuck::cast_slice(&p.meta));
        }
        let pipelines =
            planned.iter().map(|p| ctx.inner.pipelines.get(ctx, &p.key)).collect::<Result<Vec<_>>>()?;
        let device = ctx.device();
        let max_groups = device.limits().max_compute_workgroups_per_dimension;
        ctx.catch(&format!("creating the bind groups of {label}"), || {
            let segment_uniform = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: &contents,
                usage: wgpu::BufferUsages::UNIFORM,
            });
            let dispatches = planned
                .iter()
                .zip(pipelines)
                .enumerate()
                .map(|(slot, (p, pipeline))| {
                    let mut entries = vec![wgpu::BindGroupEntry {
                        binding: 0,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: &segment_uniform,
                            offset: slot as u64 * SEGMENT_SLOT_BYTES,
                            size: wgpu::BufferSize::new(SEGMENT_SLOT_BYTES),
                        }),
                    }];
                    for (b, range) in p.segment.ranges.iter().enumerate() {
                        entries.push(wgpu::BindGroupEntry {
                            binding: b as u32 + 1,
                            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                                buffer: &range.buffer,
                                offset: range.offset,
                                size: wgpu::BufferSize::new(range.size),
                            }),
                        });
                    }
                    let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: Some(label),
                        layout: &pipeline.segment_layout,
                        entries: &entries,
                    });
                    Dispatch {
                        pipeline,
                        bind_group,
                        workgroups: p.workgroups.clamp(1, max_groups.min(MAX_WORKGROUPS)),
                    }
                })
                .collect();
            Batch { dispatches }
        })
    }

    /// Records every dispatch of the batch into `pass` with `scalars` as group 0.
    pub(crate) fn record(&self, pass: &mut wgpu::ComputePass<'_>, scalars: &wgpu::BindGroup) {
        pass.set_bind_group(0, scalars, &[]);
        let mut current: Option<&Arc<CachedPipeline>> = None;
        for dispatch in &self.dispatches {
            if current.is_none_or(|c| !Arc::ptr_eq(c, &dispatch.pipeline)) {
                pass.set_pipeline(&dispatch.pipeline.pipeline);
                current = Some(&dispatch.pipeline);
            }
            pass.set_bind_group(1, &dispatch.bind_group, &[]);
            pass.dispatch_workgroups(dispatch.workgroups, 1, 1);
        }
    }
}

/// Hyperparameter uniforms, one slot of [`UNIFORM_SLOT_BYTES`] per parameter group, each
/// with the bind group (group 0) its group's kernels use.
///
/// An optimizer rewrites them by recording a copy into the step's own command encoder
/// ([`Self::record_write`]), so the values land in command order: a trainer may record any
/// number of steps before one submit and each step reads its own values. (`queue.write_buffer`
/// would land all writes at the next submit, before every recorded step.)
#[derive(Debug)]
pub(crate) struct Uniforms {
    buffer: wgpu::Buffer,
    /// Group 0 of slot `g`'s kernels.
    pub(crate) bind_groups: Vec<wgpu::BindGroup>,
    /// Staging for [`Self::record_write`]: small mapped buffers, reused once a submission
    /// that copied from them has run.
    belt: wgpu::util::StagingBelt,
}

/// Where capturable kernels find the device's scalars.
pub(crate) struct DeviceScalars<'a> {
    /// The device state ([`DeviceHeader`]) at offset 0.
    pub(crate) state: &'a wgpu::Buffer,
    /// The byte offset of each slot's learning rate in `state`.
    pub(crate) lr_offsets: Vec<u64>,
}

impl Uniforms {
    /// `slots` uniforms holding `initial` (a whole number of slots); with `device`, each bind
    /// group also holds the device's step counter and its slot's learning rate (capturable mode).
    pub(crate) fn new(
        ctx: &GpuContext,
        initial: &[u8],
        label: &str,
        device: Option<DeviceScalars<'_>>,
    ) -> Result<Self> {
        let wgpu_device = ctx.device();
        let slots = initial.len() as u64 / UNIFORM_SLOT_BYTES;
        ctx.catch(&format!("creating the hyperparameter uniforms of {label}"), || {
            let buffer = wgpu_device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: initial,
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            });
            fn range(
                binding: u32,
                buffer: &wgpu::Buffer,
                offset: u64,
                size: u64,
            ) -> wgpu::BindGroupEntry<'_> {
                wgpu::BindGroupEntry {
                    binding,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer,
                        offset,
                        size: wgpu::BufferSize::new(size),
                    }),
                }
            }
            let bind_groups = (0..slots)
                .map(|slot| {
                    let mut entries = vec![range(0, &buffer, slot * UNIFORM_SLOT_BYTES, UNIFORM_SLOT_BYTES)];
                    let scalars = match &device {
                        None => Scalars::Host,
                        Some(d) => {
                            entries.push(range(1, d.state, 0, DeviceHeader::BYTES));
                            entries.push(range(2, d.state, d.lr_offsets[slot as usize], 4));
                            Scalars::Device
                        }
                    };
                    wgpu_device.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: Some(label),
                        layout: ctx.inner.scalar_layouts.get(scalars),
                        entries: &entries,
                    })
                })
                .collect();
            let belt = wgpu::util::StagingBelt::new(wgpu_device.clone(), initial.len().max(4) as u64);
            Uniforms { buffer, bind_groups, belt }
        })
    }

    /// Records, into `encoder`, a copy of `bytes` (a whole number of slots) over the uniforms:
    /// dispatches recorded after it in `encoder` read the new values, those before it the old.
    pub(crate) fn record_write(&mut self, encoder: &mut wgpu::CommandEncoder, bytes: &[u8]) {
        let Some(size) = wgpu::BufferSize::new(bytes.len() as u64) else { return };
        self.belt.write_buffer(encoder, &self.buffer, 0, size).copy_from_slice(bytes);
        // Mapped staging cannot be submitted: close it now, and take it back for reuse once
        // the caller's submission has run.
        self.belt.finish_and_recall_on_submit(encoder);
    }
}
