//! The trainer's GPU plumbing: opening its own device, and timing the parts of a step with
//! timestamps written into the step's own command encoder.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::model::BoxError;

/// Timestamps between the passes of an encoder need both features.
const TIMESTAMPS: wgpu::Features =
    wgpu::Features::TIMESTAMP_QUERY.union(wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS);

/// The trainer's device, as a trainer that owns its GPU opens it.
pub struct Gpu {
    /// The device everything runs on, the crate's optimizer included.
    pub device: wgpu::Device,
    /// Its queue: one submit per training step.
    pub queue: wgpu::Queue,
    /// The adapter's name, backend and driver, for the log.
    pub info: wgpu::AdapterInfo,
}

impl Gpu {
    /// Opens the adapter wgpu applications conventionally pick (`WGPU_BACKEND` restricts
    /// the backends, `WGPU_ADAPTER_NAME` chooses by name), with the adapter's own limits and
    /// `SHADER_F16` and the timestamp features where it has them.
    pub fn open() -> Result<Self, BoxError> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        check_adapter_name(&instance)?;
        let adapter = pollster::block_on(wgpu::util::initialize_adapter_from_env_or_default(&instance, None))
            .map_err(|e| {
                format!(
                    "no GPU adapter ({e}). On a headless Linux machine install the Vulkan software \
                     driver: `apt-get install -y mesa-vulkan-drivers libvulkan1`"
                )
            })?;
        let has = adapter.features();
        let mut wanted = wgpu::Features::SHADER_F16 & has;
        if has.contains(TIMESTAMPS) {
            wanted |= TIMESTAMPS;
        }
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("train_mlp"),
            required_features: wanted,
            required_limits: adapter.limits(),
            ..Default::default()
        }))?;
        Ok(Gpu { device, queue, info: adapter.get_info() })
    }

    /// The adapter and the optional features this trainer uses, for the log.
    pub fn describe(&self) -> String {
        let yes_no = |feature| if self.device.features().contains(feature) { "yes" } else { "no" };
        format!(
            "adapter: {} ({:?}, {:?}); SHADER_F16: {}, timestamps inside encoders: {}",
            self.info.name,
            self.info.backend,
            self.info.device_type,
            yes_no(wgpu::Features::SHADER_F16),
            yes_no(TIMESTAMPS)
        )
    }

    /// Whether the device can store f16 (`SHADER_F16`).
    pub fn has_f16(&self) -> bool {
        self.device.features().contains(wgpu::Features::SHADER_F16)
    }
}

/// wgpu's `initialize_adapter_from_env` panics when `WGPU_ADAPTER_NAME` matches no adapter;
/// this refuses such a name first, with the names that would match.
fn check_adapter_name(instance: &wgpu::Instance) -> Result<(), BoxError> {
    let Ok(wanted) = std::env::var("WGPU_ADAPTER_NAME") else { return Ok(()) };
    // The instance already holds only the backends WGPU_BACKEND allows.
    let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
    let names: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
    if names.iter().any(|name| name.to_lowercase().contains(&wanted.to_lowercase())) {
        Ok(())
    } else {
        Err(format!("WGPU_ADAPTER_NAME={wanted} matches none of the adapters [{}]", names.join(", ")).into())
    }
}

/// Steps whose timestamps are resolved and read back together: one readback (a wait for
/// the GPU) per batch instead of one per step.
const BATCH: u32 = 128;

/// Three timestamps per step: start, before the optimizer, after the optimizer.
const MARKS: u32 = 3;

/// Accumulated time of the two parts of the steps measured so far.
#[derive(Clone, Copy, Debug, Default)]
pub struct Split {
    /// Forward and backward passes (and the metrics copies on reporting steps).
    pub model: Duration,
    /// The optimizer's compute pass.
    pub optimizer: Duration,
    /// Steps included.
    pub steps: u64,
}

/// Where the times come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Timestamps written by the GPU around the optimizer's part of each step.
    GpuTimestamps,
    /// Host time spent recording each part (no `TIMESTAMP_QUERY_INSIDE_ENCODERS`).
    HostRecording,
}

/// The query set and buffers of GPU timing, created once.
struct Queries {
    set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    readback: wgpu::Buffer,
    /// Nanoseconds per tick.
    period: f64,
    /// Steps written into the query set since the last resolve.
    written: u32,
    /// Steps resolved into `readback` by the last submitted encoder, not yet read.
    resolved: u32,
}

/// Splits each step's time between the model and the optimizer.
pub struct StepClock {
    queries: Option<Queries>,
    split: Split,
    /// Host fallback: when the current part began.
    mark: Instant,
}

impl StepClock {
    /// GPU timestamps where the device has them, host recording time otherwise.
    pub fn new(device: &wgpu::Device, queue: &wgpu::Queue) -> Self {
        let queries = device.features().contains(TIMESTAMPS).then(|| Queries::new(device, queue));
        StepClock { queries, ..StepClock::host() }
    }

    /// Host recording time only, what devices without the timestamp features get.
    pub fn host() -> Self {
        StepClock { queries: None, split: Split::default(), mark: Instant::now() }
    }

    /// Where the times come from.
    pub fn source(&self) -> Source {
        match self.queries {
            Some(_) => Source::GpuTimestamps,
            None => Source::HostRecording,
        }
    }

    /// Call first thing in a step's encoder.
    pub fn begin(&mut self, encoder: &mut wgpu::CommandEncoder) {
        match &mut self.queries {
            Some(q) => encoder.write_timestamp(&q.set, q.written * MARKS),
            None => self.mark = Instant::now(),
        }
    }

    /// Call after the model's passes, just before the optimizer records its step.
    pub fn before_optimizer(&mut self, encoder: &mut wgpu::CommandEncoder) {
        match &mut self.queries {
            Some(q) => encoder.write_timestamp(&q.set, q.written * MARKS + 1),
            None => {
                self.split.model += self.mark.elapsed();
                self.mark = Instant::now();
            }
        }
    }

    /// Call after the optimizer's step. When the batch is full, or `last` says no step
    /// follows, the timestamps are resolved into this encoder; [`StepClock::collect`] reads
    /// them after its submit.
    pub fn after_optimizer(&mut self, encoder: &mut wgpu::CommandEncoder, last: bool) {
        match &mut self.queries {
            Some(q) => {
                encoder.write_timestamp(&q.set, q.written * MARKS + 2);
                q.written += 1;
                if q.written == BATCH || last {
                    let count = q.written * MARKS;
                    encoder.resolve_query_set(&q.set, 0..count, &q.resolve, 0);
                    let bytes = u64::from(count) * u64::from(wgpu::QUERY_SIZE);
                    encoder.copy_buffer_to_buffer(&q.resolve, 0, &q.readback, 0, bytes);
                    q.resolved = q.written;
                    q.written = 0;
                }
            }
            None => {
                self.split.optimizer += self.mark.elapsed();
                self.split.steps += 1;
            }
        }
    }

    /// Call after each submit: reads a resolved batch back (waiting for the GPU), if the
    /// submitted encoder resolved one.
    pub fn collect(&mut self, device: &wgpu::Device) -> Result<(), BoxError> {
        let Some(q) = &mut self.queries else { return Ok(()) };
        if q.resolved == 0 {
            return Ok(());
        }
        let ticks = q.read(device)?;
        for step in ticks.chunks_exact(MARKS as usize) {
            let ns =
                |from: u64, to: u64| Duration::from_nanos((to.wrapping_sub(from) as f64 * q.period) as u64);
            self.split.model += ns(step[0], step[1]);
            self.split.optimizer += ns(step[1], step[2]);
            self.split.steps += 1;
        }
        q.resolved = 0;
        Ok(())
    }

    /// The times accumulated so far.
    pub fn split(&self) -> Split {
        self.split
    }
}

impl Queries {
    fn new(device: &wgpu::Device, queue: &wgpu::Queue) -> Self {
        let count = BATCH * MARKS;
        let bytes = u64::from(count) * u64::from(wgpu::QUERY_SIZE);
        let buffer = |label: &str, usage: wgpu::BufferUsages| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes,
                usage,
                mapped_at_creation: false,
            })
        };
        Queries {
            set: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("train_mlp step timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count,
            }),
            resolve: buffer(
                "timestamps resolve",
                wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            ),
            readback: buffer(
                "timestamps readback",
                wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            ),
            period: f64::from(queue.get_timestamp_period()),
            written: 0,
            resolved: 0,
        }
    }

    /// The resolved ticks of the last batch, `MARKS` per step.
    fn read(&self, device: &wgpu::Device) -> Result<Vec<u64>, BoxError> {
        let bytes = u64::from(self.resolved * MARKS) * u64::from(wgpu::QUERY_SIZE);
        let (sender, receiver) = mpsc::channel();
        self.readback.map_async(wgpu::MapMode::Read, ..bytes, move |result| {
            let _ = sender.send(result);
        });
        device.poll(wgpu::PollType::wait_indefinitely())?;
        receiver.recv()??;
        let ticks = bytemuck::pod_collect_to_vec(&self.readback.get_mapped_range(..bytes)?);
        self.readback.unmap();
        Ok(ticks)
    }
}
