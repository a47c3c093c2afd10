//! Recording: bind groups built once per plan, the hyperparameter uniforms, and one
//! compute pass that dispatches every segment of every tensor.

use std::sync::Arc;

use wgpu::util::DeviceExt;

use crate::gpu::compile::CachedPipeline;
use crate::gpu::kernel::{binding, Scalars, VariantKey, TABLE_BYTES};
use crate::gpu::plan::TensorPlan;
use crate::gpu::table;
use crate::gpu::GpuContext;
use crate::step::clip::ClipHeader;
use crate::step::device::DeviceHeader;
use crate::step::UNIFORM_SLOT_BYTES;
use crate::Result;

/// One dispatch: its pipeline, its bind group and its workgroup count.
#[derive(Debug)]
struct Dispatch {
    pipeline: Arc<CachedPipeline>,
    bind_group: wgpu::BindGroup,
    workgroups: u32,
}

/// Prepared updates of several tensors: a few multi-tensor dispatches ([`table`]) whose
/// tables share one uniform buffer.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    dispatches: Vec<Dispatch>,
    /// The tensor ordinal of each workgroup of all dispatches together, in slot order
    /// (LAMB's passes find their tensor's norms by it).
    owners: Vec<u32>,
}

impl Batch {
    /// Compiles (or finds) each variant and builds every bind group. This is the only place
    /// a step's GPU objects are created; recording a prepared batch creates none.
    pub(crate) fn build(ctx: &GpuContext, items: &[(VariantKey, TensorPlan)], label: &str) -> Result<Batch> {
        let device = ctx.device();
        let limits = device.limits();
        let max_binding = limits.max_storage_buffer_binding_size.min(u64::from(u32::MAX));
        let planned = table::assemble(items, max_binding, ctx.report().device_type);
        if planned.is_empty() {
            return Ok(Batch::default());
        }
        // Each table starts at an aligned offset after the previous one; a binding covers
        // the fixed table size, so bindings of consecutive tables overlap (read-only).
        let align = u64::from(limits.min_uniform_buffer_offset_alignment).max(16);
        let mut contents: Vec<u8> = Vec::new();
        let mut offsets = Vec::with_capacity(planned.len());
        let mut first_workgroup = 0;
        for (dispatch, segments) in &planned {
            let at = (contents.len() as u64).next_multiple_of(align);
            contents.resize(at as usize, 0);
            offsets.push(at);
            contents.extend_from_slice(bytemuck::cast_slice(&dispatch.table(segments, first_workgroup)));
            first_workgroup += dispatch.workgroups().clamp(1, limits.max_compute_workgroups_per_dimension);
        }
        contents.resize((offsets[offsets.len() - 1] + TABLE_BYTES) as usize, 0);
        let pipelines =
            planned.iter().map(|(d, _)| ctx.inner.pipelines.get(ctx, &d.key)).collect::<Result<Vec<_>>>()?;
        let max_groups = limits.max_compute_workgroups_per_dimension;
        let owners: Vec<u32> = planned.iter().flat_map(|(d, _)| d.owners()).collect();
        ctx.catch(&format!("creating the bind groups of {label}"), || {
            let tables = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: &contents,
                usage: wgpu::BufferUsages::UNIFORM,
            });
            let dispatches = planned
                .iter()
                .zip(pipelines)
                .zip(offsets)
                .map(|(((dispatch, _), pipeline), offset)| {
                    let mut entries = vec![wgpu::BindGroupEntry {
                        binding: binding::TABLE,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: &tables,
                            offset,
                            size: wgpu::BufferSize::new(TABLE_BYTES),
                        }),
                    }];
                    for (b, span) in dispatch.spans.iter().enumerate() {
                        entries.push(wgpu::BindGroupEntry {
                            binding: binding::TENSORS + b as u32,
                            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                                buffer: &span.buffer,
                                offset: span.offset,
                                size: wgpu::BufferSize::new(span.end - span.offset),
                            }),
                        });
                    }
                    let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: Some(label),
                        layout: &pipeline.segment_layout,
                        entries: &entries,
                    });
                    Dispatch { pipeline, bind_group, workgroups: dispatch.workgroups().clamp(1, max_groups) }
                })
                .collect();
            Batch { dispatches, owners }
        })
    }

    /// Workgroups of all dispatches together (the gradient-norm pass writes one partial each).
    pub(crate) fn workgroups(&self) -> u32 {
        self.dispatches.iter().map(|d| d.workgroups).sum()
    }

    /// The tensor ordinal of each workgroup (slot) of the batch.
    pub(crate) fn owners(&self) -> &[u32] {
        &self.owners
    }

    /// Records every dispatch of the batch into `pass` with `scalars` as group 0.
    pub(crate) fn record(&self, pass: &mut wgpu::ComputePass<'_>, scalars: &wgpu::BindGroup) {
        pass.set_bind_group(binding::GROUP_SCALARS, scalars, &[]);
        let mut current: Option<&Arc<CachedPipeline>> = None;
        for dispatch in &self.dispatches {
            if current.is_none_or(|c| !Arc::ptr_eq(c, &dispatch.pipeline)) {
                pass.set_pipeline(&dispatch.pipeline.pipeline);
                current = Some(&dispatch.pipeline);
            }
            pass.set_bind_group(binding::GROUP_TABLE, &dispatch.bind_group, &[]);
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
    /// group also holds the device's step counter and its slot's learning rate (capturable
    /// mode); with `clip` and host scalars, the clip buffer ([`ClipHeader`] at offset 0).
    pub(crate) fn new(
        ctx: &GpuContext,
        initial: &[u8],
        label: &str,
        device: Option<DeviceScalars<'_>>,
        clip: Option<&wgpu::Buffer>,
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
                    let mut entries =
                        vec![range(binding::HYPER, &buffer, slot * UNIFORM_SLOT_BYTES, UNIFORM_SLOT_BYTES)];
                    let scalars = match &device {
                        None => Scalars::Host,
                        Some(d) => {
                            entries.push(range(binding::DEVICE_STATE, d.state, 0, DeviceHeader::BYTES));
                            entries.push(range(binding::DEVICE_LR, d.state, d.lr_offsets[slot as usize], 4));
                            Scalars::Device
                        }
                    };
                    // Capturable kernels read the coefficient from the device state.
                    if let (Scalars::Host, Some(clip)) = (scalars, clip) {
                        entries.push(range(binding::CLIP, clip, 0, ClipHeader::BYTES));
                    }
                    wgpu_device.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: Some(label),
                        layout: ctx.inner.scalar_layouts.get(scalars, clip.is_some()),
                        entries: &entries,
                    })
                })
                .collect();
            let belt = wgpu::util::StagingBelt::new(wgpu_device.clone(), initial.len().max(4) as u64);
            Uniforms { buffer, bind_groups, belt }
        })
    }

    /// The buffer of every slot (slot g at `g * UNIFORM_SLOT_BYTES`), for passes that bind a
    /// group's slot in layouts of their own (LAMB's and Adafactor's).
    pub(crate) fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }

    /// Records, into `encoder`, a copy of `bytes` (a whole number of slots) over the uniforms:
    /// dispatches recorded after it in `encoder` read the new values, those before it the old.
    ///
    /// A staging buffer that cannot be mapped is [`Error::DeviceLost`](crate::Error): the belt
    /// takes a buffer back even when its remapping failed, which happens when the device is
    /// lost, and a browser reports the loss itself only later (`StagingBelt::write_buffer`
    /// would panic here).
    pub(crate) fn record_write(&mut self, encoder: &mut wgpu::CommandEncoder, bytes: &[u8]) -> Result<()> {
        let Some(size) = wgpu::BufferSize::new(bytes.len() as u64) else { return Ok(()) };
        let alignment = const { wgpu::BufferSize::new(wgpu::COPY_BUFFER_ALIGNMENT).unwrap() };
        let staging = self.belt.allocate(size, alignment);
        let mapped = staging.get_mapped_range_mut().map(|mut view| view.copy_from_slice(bytes));
        if let Err(e) = mapped {
            // A browser's message continues with a JavaScript stack trace.
            let e = e.to_string();
            let e = e.lines().next().unwrap_or_default();
            return Err(crate::Error::DeviceLost {
                reason: format!("a staging buffer of the hyperparameters could not be mapped: {e}"),
            });
        }
        encoder.copy_buffer_to_buffer(staging.buffer(), staging.offset(), &self.buffer, 0, size.get());
        // Mapped staging cannot be submitted: close it now, and take it back for reuse once
        // the caller's submission has run.
        self.belt.finish_and_recall_on_submit(encoder);
        Ok(())
    }
}
