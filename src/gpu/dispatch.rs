//! Recording: bind groups built once per plan, a ring of hyperparameter slots, and one
//! compute pass that dispatches every segment of every tensor.

use std::sync::Arc;

use wgpu::util::DeviceExt;

use crate::gpu::kernel::{Scalars, VariantKey, MAX_WORKGROUPS, WORKGROUP_SIZE};
use crate::gpu::pipeline::CachedPipeline;
use crate::gpu::plan::{SegmentPlan, TensorPlan};
use crate::gpu::step::{KernelStep, HYPER_SLOT_BYTES};
use crate::gpu::GpuContext;
use crate::{DType, Result};

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

    /// Records every dispatch of the batch into `pass` with `scalars` (and its dynamic
    /// offsets) as group 0.
    pub(crate) fn record(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        scalars: &wgpu::BindGroup,
        offsets: &[u32],
    ) {
        pass.set_bind_group(0, scalars, offsets);
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

/// Uniform slots for hyperparameters, used round-robin. `queue.write_buffer` lands at the
/// next submit, so each step recorded before a submit needs a slot of its own: up to
/// `slots` steps may be recorded between two submits.
#[derive(Debug)]
pub(crate) struct HyperRing {
    buffer: wgpu::Buffer,
    /// Group 0 for the ring's kernels.
    pub(crate) bind_group: wgpu::BindGroup,
    slots: u32,
    next: u32,
    /// The dynamic offset of the slot written last.
    current: u32,
}

/// Where capturable kernels find the device's scalars.
pub(crate) struct DeviceScalars<'a> {
    /// The device state (`step`, `found_inf`, `inv_scale`) at offset 0.
    pub(crate) state: &'a wgpu::Buffer,
    /// The byte offset of this group's learning rate in `state`.
    pub(crate) lr_offset: u64,
}

/// Bytes of the device state's header (`step`, `found_inf`, `inv_scale`, padding).
pub(crate) const DEVICE_STATE_BYTES: u64 = 16;

impl HyperRing {
    /// A ring of `slots` slots; with `device`, its bind group also holds the device's step
    /// counter and learning rate (capturable mode).
    pub(crate) fn new(
        ctx: &GpuContext,
        slots: u32,
        label: &str,
        device: Option<DeviceScalars<'_>>,
    ) -> Result<Self> {
        let wgpu_device = ctx.device();
        ctx.catch(&format!("creating the hyperparameter ring of {label}"), || {
            let buffer = wgpu_device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: HYPER_SLOT_BYTES * u64::from(slots),
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
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
            let mut entries = vec![range(0, &buffer, 0, HYPER_SLOT_BYTES)];
            let scalars = match &device {
                None => Scalars::Host,
                Some(d) => {
                    entries.push(range(1, d.state, 0, DEVICE_STATE_BYTES));
                    entries.push(range(2, d.state, d.lr_offset, 4));
                    Scalars::Device
                }
            };
            let bind_group = wgpu_device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(label),
                layout: ctx.inner.scalar_layouts.get(scalars),
                entries: &entries,
            });
            HyperRing { buffer, bind_group, slots, next: 0, current: 0 }
        })
    }

    /// Stages `step`'s hyperparameters in the next slot and returns its dynamic offset.
    pub(crate) fn push(&mut self, queue: &wgpu::Queue, step: &KernelStep, math: DType) -> u32 {
        let offset = self.next * HYPER_SLOT_BYTES as u32;
        queue.write_buffer(&self.buffer, u64::from(offset), &step.hyper_bytes(math));
        self.next = (self.next + 1) % self.slots;
        self.current = offset;
        offset
    }

    /// The dynamic offset of the slot written last.
    pub(crate) fn current(&self) -> u32 {
        self.current
    }

    /// Stages the uniforms of consecutive slots from `first` in one upload (`bytes` is a
    /// whole number of slots), and returns the dynamic offset of `first`.
    pub(crate) fn write_slots(&mut self, queue: &wgpu::Queue, first: u32, bytes: &[u8]) -> u32 {
        debug_assert!(u64::from(first) * HYPER_SLOT_BYTES + bytes.len() as u64 <= self.buffer.size());
        let offset = first * HYPER_SLOT_BYTES as u32;
        queue.write_buffer(&self.buffer, u64::from(offset), bytes);
        self.current = offset;
        offset
    }

    /// The dynamic offset of slot `slot`.
    pub(crate) fn offset_of(slot: u32) -> u32 {
        slot * HYPER_SLOT_BYTES as u32
    }
}
