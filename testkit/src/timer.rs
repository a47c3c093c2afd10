//! Timing GPU work: timestamp queries around commands where the adapter has them, and wall
//! time from submit to completion everywhere.

use std::time::{Duration, Instant};

use wgpu_optim::{Error, GpuContext, ReadbackFailure, Result};

/// How long one timed submission took.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Between the two timestamps written around the commands (`None` without
    /// `TIMESTAMP_QUERY_INSIDE_ENCODERS`).
    pub gpu: Option<Duration>,
    /// From just before the submit until the device reported the work done.
    pub wall: Duration,
}

/// Times submissions with a reusable query set and readback buffers.
pub struct GpuTimer {
    ctx: GpuContext,
    queries: Option<(wgpu::QuerySet, wgpu::Buffer, wgpu::Buffer)>,
}

impl GpuTimer {
    /// A timer on `ctx`; timestamps are used where the device has
    /// `TIMESTAMP_QUERY | TIMESTAMP_QUERY_INSIDE_ENCODERS`.
    pub fn new(ctx: &GpuContext) -> Self {
        let wanted = wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS;
        let queries = ctx.has_feature(wanted).then(|| {
            let device = ctx.device();
            let set = device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("wgpu-optim timer"),
                ty: wgpu::QueryType::Timestamp,
                count: 2,
            });
            let resolve = device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("wgpu-optim timer resolve"),
                size: 2 * wgpu::QUERY_SIZE as u64,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            });
            let readback = device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("wgpu-optim timer readback"),
                size: 2 * wgpu::QUERY_SIZE as u64,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            (set, resolve, readback)
        });
        GpuTimer { ctx: ctx.clone(), queries }
    }

    /// Whether GPU timestamps are available.
    pub fn has_timestamps(&self) -> bool {
        self.queries.is_some()
    }

    /// Records `record` between two timestamps, submits, waits, and returns the timings.
    pub fn time(&mut self, record: impl FnOnce(&mut wgpu::CommandEncoder) -> Result<()>) -> Result<Timing> {
        let device = self.ctx.device();
        let mut encoder =
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("timed") });
        if let Some((set, _, _)) = &self.queries {
            encoder.write_timestamp(set, 0);
        }
        record(&mut encoder)?;
        if let Some((set, resolve, readback)) = &self.queries {
            encoder.write_timestamp(set, 1);
            encoder.resolve_query_set(set, 0..2, resolve, 0);
            encoder.copy_buffer_to_buffer(resolve, 0, readback, 0, resolve.size());
        }
        let start = Instant::now();
        let submission =
            catch(&self.ctx, "submitting timed work", || self.ctx.queue().submit([encoder.finish()]))?;
        device
            .poll(wgpu::PollType::Wait { submission_index: Some(submission), timeout: None })
            .map_err(|e| Error::Readback { cause: ReadbackFailure::Poll { message: e.to_string() } })?;
        let wall = start.elapsed();
        let gpu = match &self.queries {
            Some((_, _, readback)) => Some(read_timestamps(&self.ctx, readback)?),
            None => None,
        };
        Ok(Timing { gpu, wall })
    }
}

fn read_timestamps(ctx: &GpuContext, readback: &wgpu::Buffer) -> Result<Duration> {
    let (sender, receiver) = futures_intrusive::channel::shared::oneshot_channel();
    readback.slice(..).map_async(wgpu::MapMode::Read, move |result| {
        let _ = sender.send(result);
    });
    ctx.device()
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| Error::Readback { cause: ReadbackFailure::Poll { message: e.to_string() } })?;
    match pollster::block_on(receiver.receive()) {
        Some(Ok(())) => {}
        Some(Err(e)) => {
            return Err(Error::Readback { cause: ReadbackFailure::Map { message: e.to_string() } })
        }
        None => return Err(Error::Readback { cause: ReadbackFailure::CallbackNeverRan }),
    }
    let ticks: Vec<u64> = {
        let view = readback
            .get_mapped_range(..)
            .map_err(|e| Error::Readback { cause: ReadbackFailure::Map { message: e.to_string() } })?;
        bytemuck::pod_collect_to_vec(&view)
    };
    readback.unmap();
    let ns = ticks[1].wrapping_sub(ticks[0]) as f64 * f64::from(ctx.queue().get_timestamp_period());
    Ok(Duration::from_nanos(ns as u64))
}

/// Runs `f` inside validation and out-of-memory error scopes, as the crate does around its
/// own GPU work, and turns anything wgpu reports into [`Error::Gpu`] with wgpu's message.
pub(crate) fn catch<T>(ctx: &GpuContext, context: &str, f: impl FnOnce() -> T) -> Result<T> {
    ctx.check_alive()?;
    let device = ctx.device();
    let oom = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let value = f();
    let validation = pollster::block_on(validation.pop());
    let oom = pollster::block_on(oom.pop());
    match validation.or(oom) {
        Some(e) => Err(Error::Gpu { context: context.to_string(), message: e.to_string() }),
        // A loss during `f` makes its objects invalid without necessarily an error.
        None => ctx.check_alive().map(|()| value),
    }
}
