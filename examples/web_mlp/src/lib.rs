//! `train_mlp`'s spirals MLP trained in a web page on WebGPU: the example's own model
//! (`examples/train_mlp/model.rs` and `mlp.wgsl`, compiled here by path) records the forward
//! and backward passes, and wgpu-optim's fused AdamW step follows in the same command
//! encoder, one encoder and one submit per step, as natively.
//!
//! Nothing blocks the browser's thread: the shader compiler's verdict, the metrics and the
//! timestamps are awaited (the browser completes each from its event loop). The page plots
//! the loss and accuracy every `REPORT_EVERY` steps, and times the optimizer's part of each
//! step with WebGPU timestamp queries where the adapter has `timestamp-query` (wall time of
//! whole steps otherwise; the page says which). Every failure, no WebGPU or a lost device
//! included, ends as a [`PageError`] shown on the page.
//!
//! URL parameters: `steps` (default [`DEFAULT_STEPS`]), `seed` (default 0), and `lose=K`,
//! which destroys the device after step K (the check of the device-lost path).

#[allow(dead_code)]
#[path = "../../train_mlp/model.rs"]
mod model;
#[allow(dead_code)]
#[path = "../../train_mlp/spirals.rs"]
mod spirals;

mod page;

use std::fmt;
use std::sync::{Arc, Mutex};

use wasm_bindgen::prelude::*;
use wgpu_optim::{Adam, DType, GpuContext, Optimizer};

use model::{Metrics, Mlp};
use page::Page;
use spirals::Spirals;

/// Steps when the URL gives none.
pub const DEFAULT_STEPS: u32 = 300;

/// Steps between readbacks of the loss and accuracy (and of the timestamps).
pub const REPORT_EVERY: u32 = 10;

/// Three timestamps per step: start, before the optimizer, after the optimizer.
const MARKS: u32 = 3;

/// Why the page stopped before training ended.
#[derive(Debug)]
pub enum PageError {
    /// The browser has no `navigator.gpu`.
    NoWebGpu,
    /// `requestAdapter` gave no adapter.
    NoAdapter(String),
    /// The adapter refused the device.
    RequestDevice(String),
    /// The device was lost (destroyed, a driver reset, the GPU process gone).
    DeviceLost(String),
    /// WebGPU reported an error no one expected (validation, out of memory, internal).
    Gpu(String),
    /// Building or reading the model failed.
    Model(String),
    /// The crate refused the optimizer or a step.
    Optimizer(wgpu_optim::Error),
    /// The page lacks an element or a browser API this code uses.
    Page(String),
}

impl PageError {
    /// A stable name for the page's `data-error` attribute.
    pub fn kind(&self) -> &'static str {
        match self {
            PageError::NoWebGpu => "NoWebGpu",
            PageError::NoAdapter(_) => "NoAdapter",
            PageError::RequestDevice(_) => "RequestDevice",
            PageError::DeviceLost(_) => "DeviceLost",
            PageError::Gpu(_) => "Gpu",
            PageError::Model(_) => "Model",
            PageError::Optimizer(_) => "Optimizer",
            PageError::Page(_) => "Page",
        }
    }
}

impl fmt::Display for PageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PageError::NoWebGpu => write!(
                f,
                "this browser has no WebGPU (navigator.gpu is missing): use a recent Chrome, Edge or \
                 Firefox, or start Chromium with --enable-unsafe-webgpu"
            ),
            PageError::NoAdapter(e) => write!(f, "WebGPU gave no adapter ({e}); is the GPU blocklisted?"),
            PageError::RequestDevice(e) => write!(f, "the WebGPU adapter refused a device: {e}"),
            PageError::DeviceLost(e) => write!(f, "the WebGPU device was lost ({e}); reload the page"),
            PageError::Gpu(e) => write!(f, "WebGPU error: {e}"),
            PageError::Model(e) => write!(f, "the model failed: {e}"),
            PageError::Optimizer(e) => write!(f, "wgpu-optim: {e}"),
            PageError::Page(e) => write!(f, "the page: {e}"),
        }
    }
}

impl std::error::Error for PageError {}

impl From<wgpu_optim::Error> for PageError {
    fn from(e: wgpu_optim::Error) -> Self {
        match e {
            wgpu_optim::Error::DeviceLost { reason } => PageError::DeviceLost(reason),
            other => PageError::Optimizer(other),
        }
    }
}

/// The page's entry point, called by `index.html` once the module is loaded. It never
/// rejects: every error is shown on the page.
#[wasm_bindgen]
pub async fn start() {
    let page = match Page::find() {
        Ok(page) => page,
        Err(e) => {
            web_sys::console::error_1(&e.to_string().into());
            return;
        }
    };
    page.install_panic_hook();
    let settings = Settings::from_url();
    if let Err(e) = train(&page, &settings).await {
        page.show_error(&e);
    }
}

/// What the URL asks for.
struct Settings {
    steps: u32,
    seed: u64,
    /// Destroy the device after this step.
    lose_after: Option<u32>,
}

impl Settings {
    fn from_url() -> Self {
        let params = web_sys::window()
            .and_then(|w| w.location().search().ok())
            .and_then(|search| web_sys::UrlSearchParams::new_with_str(&search).ok());
        let get = |name: &str| params.as_ref().and_then(|p| p.get(name));
        Settings {
            steps: get("steps").and_then(|s| s.parse().ok()).filter(|&s| s > 0).unwrap_or(DEFAULT_STEPS),
            seed: get("seed").and_then(|s| s.parse().ok()).unwrap_or(0),
            lose_after: get("lose").and_then(|s| s.parse().ok()),
        }
    }
}

/// The device with what watches it: its loss and any error that escapes.
struct Gpu {
    device: wgpu::Device,
    queue: wgpu::Queue,
    adapter: String,
    lost: Arc<Mutex<Option<String>>>,
    uncaptured: Arc<Mutex<Option<String>>>,
}

impl Gpu {
    async fn open() -> Result<Self, PageError> {
        let window = web_sys::window().ok_or(PageError::Page("no window".into()))?;
        let navigator = window.navigator();
        if !js_sys::Reflect::has(&navigator, &"gpu".into()).unwrap_or(false) {
            return Err(PageError::NoWebGpu);
        }
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends: wgpu::Backends::BROWSER_WEBGPU,
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions::default())
            .await
            .map_err(|e| PageError::NoAdapter(e.to_string()))?;
        let features = adapter.features() & wgpu::Features::TIMESTAMP_QUERY;
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("web_mlp"),
                required_features: features,
                required_limits: adapter.limits(),
                ..Default::default()
            })
            .await
            .map_err(|e| PageError::RequestDevice(e.to_string()))?;
        let info = adapter.get_info();
        // Browsers give the name only with developer features on; else its vendor and type.
        let adapter = match info.name.is_empty() {
            false => info.name.clone(),
            true => format!("vendor {:#x} ({:?})", info.vendor, info.device_type),
        };
        let lost = Arc::new(Mutex::new(None));
        let uncaptured = Arc::new(Mutex::new(None));
        let slot = lost.clone();
        device.set_device_lost_callback(move |reason, message| {
            if let Ok(mut slot) = slot.lock() {
                *slot = Some(format!("{reason:?}: {message}"));
            }
        });
        let slot = uncaptured.clone();
        // wgpu's default handler panics; this one keeps the first error for the page.
        device.on_uncaptured_error(Arc::new(move |error| {
            if let Ok(mut slot) = slot.lock() {
                slot.get_or_insert_with(|| error.to_string());
            }
        }));
        Ok(Gpu { device, queue, adapter, lost, uncaptured })
    }

    fn has_timestamps(&self) -> bool {
        self.device.features().contains(wgpu::Features::TIMESTAMP_QUERY)
    }

    /// The loss or an escaped error, if either happened.
    fn check(&self) -> Result<(), PageError> {
        if let Some(reason) = self.lost.lock().ok().and_then(|slot| slot.clone()) {
            return Err(PageError::DeviceLost(reason));
        }
        if let Some(error) = self.uncaptured.lock().ok().and_then(|slot| slot.clone()) {
            return Err(PageError::Gpu(error));
        }
        Ok(())
    }

    /// A failed readback: the device's loss explains it when it was lost (the browser may
    /// report the loss a little after the failed mapping, so this waits for it briefly).
    async fn explain(&self, error: model::BoxError) -> PageError {
        for _ in 0..10 {
            if let Err(e) = self.check() {
                return e;
            }
            sleep_ms(20).await;
        }
        PageError::Model(error.to_string())
    }

    /// A refused step: when the crate saw the device's loss before the browser reported it,
    /// the browser's reason replaces the crate's once it comes.
    async fn explain_optimizer(&self, error: wgpu_optim::Error) -> PageError {
        if matches!(error, wgpu_optim::Error::DeviceLost { .. }) {
            for _ in 0..10 {
                if let Err(e @ PageError::DeviceLost(_)) = self.check() {
                    return e;
                }
                sleep_ms(20).await;
            }
        }
        error.into()
    }
}

/// Lets the browser's event loop run for `ms` milliseconds.
async fn sleep_ms(ms: i32) {
    let promise = js_sys::Promise::new(&mut |resolve, _| {
        if let Some(window) = web_sys::window() {
            let _ = window.set_timeout_with_callback_and_timeout_and_arguments_0(&resolve, ms);
        }
    });
    let _ = wasm_bindgen_futures::JsFuture::from(promise).await;
}

/// Milliseconds since the page loaded.
fn now_ms() -> f64 {
    web_sys::window().and_then(|w| w.performance()).map(|p| p.now()).unwrap_or(0.0)
}

/// The training curve so far and the step times.
pub(crate) struct Progress {
    /// `(step, metrics)`: the forward pass of each reported step, before its update.
    pub points: Vec<(u32, Metrics)>,
    pub steps: u32,
    /// Sum of the optimizer's GPU time over `timed` steps, in ns (timestamps only).
    pub optimizer_ns: f64,
    /// Sum of the forward and backward passes' GPU time, in ns (timestamps only).
    pub model_ns: f64,
    pub timed: u32,
    /// Whether the times come from timestamp queries.
    pub timestamps: bool,
    /// Wall time of the training loop so far, in ms, and its steps.
    pub wall_ms: f64,
    pub wall_steps: u32,
    pub adapter: String,
}

/// Timestamp queries around the optimizer's part of each step, resolved at each report.
struct Clock {
    set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    readback: wgpu::Buffer,
    /// Steps written since the last resolve.
    written: u32,
    /// Steps in the last resolve.
    resolved: u32,
}

impl Clock {
    fn new(device: &wgpu::Device) -> Self {
        let count = REPORT_EVERY * MARKS;
        let bytes = u64::from(count) * u64::from(wgpu::QUERY_SIZE);
        let buffer = |label: &str, usage| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes,
                usage,
                mapped_at_creation: false,
            })
        };
        Clock {
            set: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("web_mlp step timestamps"),
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
            written: 0,
            resolved: 0,
        }
    }

    /// Writes timestamp `mark` of this step: WebGPU writes timestamps only at the start or end
    /// of a pass, so each is an empty compute pass's start.
    fn mark(&mut self, encoder: &mut wgpu::CommandEncoder, mark: u32) {
        let writes = wgpu::ComputePassTimestampWrites {
            query_set: &self.set,
            beginning_of_pass_write_index: Some(self.written * MARKS + mark),
            end_of_pass_write_index: None,
        };
        drop(encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("timestamp"),
            timestamp_writes: Some(writes),
        }));
        if mark + 1 == MARKS {
            self.written += 1;
        }
    }

    fn resolve(&mut self, encoder: &mut wgpu::CommandEncoder) {
        let count = self.written * MARKS;
        encoder.resolve_query_set(&self.set, 0..count, &self.resolve, 0);
        let bytes = u64::from(count) * u64::from(wgpu::QUERY_SIZE);
        encoder.copy_buffer_to_buffer(&self.resolve, 0, &self.readback, 0, bytes);
        self.resolved = self.written;
        self.written = 0;
    }

    /// Adds the resolved steps' times (ns; WebGPU's timestamps are nanoseconds) to `progress`.
    async fn collect(&mut self, progress: &mut Progress) -> Result<(), model::BoxError> {
        if self.resolved == 0 {
            return Ok(());
        }
        let bytes = u64::from(self.resolved * MARKS) * u64::from(wgpu::QUERY_SIZE);
        let (sender, receiver) = futures_intrusive::channel::shared::oneshot_channel();
        self.readback.map_async(wgpu::MapMode::Read, ..bytes, move |result| {
            sender.send(result).ok();
        });
        match receiver.receive().await {
            Some(result) => result?,
            None => return Err("the timestamp readback was dropped".into()),
        }
        let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&self.readback.get_mapped_range(..bytes)?);
        self.readback.unmap();
        for step in ticks.chunks_exact(MARKS as usize) {
            // A later timestamp below an earlier one (allowed by the spec) counts as zero.
            progress.model_ns += step[1].saturating_sub(step[0]) as f64;
            progress.optimizer_ns += step[2].saturating_sub(step[1]) as f64;
            progress.timed += 1;
        }
        self.resolved = 0;
        Ok(())
    }
}

async fn train(page: &Page, settings: &Settings) -> Result<(), PageError> {
    page.set_status("opening WebGPU…");
    let gpu = Gpu::open().await?;
    let data = Spirals::generate(settings.seed);
    let model = Mlp::new_async(&gpu.device, &gpu.queue, &data, DType::F32, settings.seed)
        .await
        .map_err(|e| PageError::Model(e.to_string()))?;
    gpu.check()?;
    // The crate borrows the page's device; each step first checks the page's loss flag.
    let ctx = GpuContext::from_device(gpu.device.clone(), gpu.queue.clone());
    let mut optimizer = Optimizer::builder().build(&ctx, Adam::adamw(), &model.param_tensors())?;
    let grads = model.grad_tensors();
    let mut clock = gpu.has_timestamps().then(|| Clock::new(&gpu.device));
    let mut progress = Progress {
        points: Vec::new(),
        steps: settings.steps,
        optimizer_ns: 0.0,
        model_ns: 0.0,
        timed: 0,
        timestamps: clock.is_some(),
        wall_ms: 0.0,
        wall_steps: 0,
        adapter: gpu.adapter.clone(),
    };
    let initial = match model.evaluate_async().await {
        Ok(metrics) => metrics,
        Err(e) => return Err(gpu.explain(e).await),
    };
    progress.points.push((0, initial));
    page.draw(&progress);
    let started = now_ms();
    for step in 1..=settings.steps {
        if settings.lose_after == Some(step - 1) {
            gpu.device.destroy();
        }
        gpu.check()?;
        let report = step % REPORT_EVERY == 0 || step == settings.steps;
        let mut encoder =
            gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("train step") });
        if let Some(clock) = &mut clock {
            clock.mark(&mut encoder, 0);
        }
        model.record_forward(&mut encoder);
        model.record_backward(&mut encoder);
        if report {
            model.record_metrics_copy(&mut encoder);
        }
        if let Some(clock) = &mut clock {
            clock.mark(&mut encoder, 1);
        }
        if let Err(e) = optimizer.record_step(&mut encoder, &grads) {
            return Err(gpu.explain_optimizer(e).await);
        }
        if let Some(clock) = &mut clock {
            clock.mark(&mut encoder, 2);
            if report {
                clock.resolve(&mut encoder);
            }
        }
        gpu.queue.submit([encoder.finish()]);
        if report {
            let metrics = match model.read_metrics_async().await {
                Ok(metrics) => metrics,
                Err(e) => return Err(gpu.explain(e).await),
            };
            if let Some(clock) = &mut clock {
                if let Err(e) = clock.collect(&mut progress).await {
                    return Err(gpu.explain(e).await);
                }
            }
            gpu.check()?;
            progress.points.push((step, metrics));
            progress.wall_ms = now_ms() - started;
            progress.wall_steps = step;
            page.draw(&progress);
        }
    }
    let last = match model.evaluate_async().await {
        Ok(metrics) => metrics,
        Err(e) => return Err(gpu.explain(e).await),
    };
    gpu.check()?;
    page.finish(&progress, last);
    Ok(())
}
