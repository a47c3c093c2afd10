//! The device and queue the crate records on, what the adapter offered, and the
//! pipeline cache shared by every optimizer and operator built on the context.

use std::sync::Arc;

use crate::gpu::pipeline::{PipelineCache, ScalarLayouts};
use crate::{Error, Result};

/// Optional features the crate uses when the adapter has them.
const WANTED_FEATURES: wgpu::Features = wgpu::Features::SHADER_F16
    .union(wgpu::Features::SHADER_F64)
    .union(wgpu::Features::TIMESTAMP_QUERY)
    .union(wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS);

/// What the context runs on, for logs and benchmark headers.
#[derive(Clone, Debug)]
pub struct ContextReport {
    /// The adapter's name, e.g. `llvmpipe (LLVM 15.0.6, 256 bits)`.
    pub adapter_name: String,
    /// The backend wgpu chose.
    pub backend: wgpu::Backend,
    /// Discrete, integrated, CPU, ...
    pub device_type: wgpu::DeviceType,
    /// Driver name and version.
    pub driver: String,
    /// The features the device was created with.
    pub features: wgpu::Features,
    /// The largest storage binding, in bytes; bigger tensors are split into chunks.
    pub max_storage_buffer_binding_size: u64,
    /// The largest buffer the device can create, in bytes.
    pub max_buffer_size: u64,
}

impl std::fmt::Display for ContextReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names = Vec::new();
        for (flag, name) in [
            (wgpu::Features::SHADER_F16, "SHADER_F16"),
            (wgpu::Features::SHADER_F64, "SHADER_F64"),
            (wgpu::Features::TIMESTAMP_QUERY, "TIMESTAMP_QUERY"),
        ] {
            if self.features.contains(flag) {
                names.push(name);
            }
        }
        write!(
            f,
            "{} ({:?}, {:?}, driver {}); features [{}]; max_storage_buffer_binding_size {} MiB",
            self.adapter_name,
            self.backend,
            self.device_type,
            self.driver,
            names.join(", "),
            self.max_storage_buffer_binding_size >> 20
        )
    }
}

pub(crate) struct ContextInner {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) report: ContextReport,
    pub(crate) pipelines: PipelineCache,
    /// Group 0 of every pipeline, by where its scalars come from.
    pub(crate) scalar_layouts: ScalarLayouts,
    /// Why the device was lost, once it is (headless contexts watch for it).
    pub(crate) lost: Arc<std::sync::Mutex<Option<String>>>,
}

/// A device and queue plus the crate's compiled-pipeline cache. Cheap to clone (an `Arc`).
#[derive(Clone)]
pub struct GpuContext {
    pub(crate) inner: Arc<ContextInner>,
    /// `Some(true)`: f16 as pairs in `u32` even where the device has `SHADER_F16`;
    /// `Some(false)`: native wherever the device has it; `None`: the faster for the device.
    packed_f16: Option<bool>,
}

impl std::fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuContext").field("report", &self.inner.report).finish()
    }
}

impl GpuContext {
    /// The adapter [`Self::headless`] opens its device on, from `instance`: the one
    /// `WGPU_ADAPTER_NAME` names (a case-insensitive substring; a name that matches nothing
    /// is [`Error::NoAdapter`] listing the adapters there are), otherwise wgpu's default for
    /// `WGPU_POWER_PREF`. For a caller that opens the device itself (another framework's
    /// runtime sharing it) and should pick the adapter the tests and examples pick.
    pub async fn choose_adapter(instance: &wgpu::Instance) -> Result<wgpu::Adapter> {
        choose_adapter(instance).await
    }

    /// Opens a device without a window, choosing the adapter the way wgpu applications do:
    /// `WGPU_BACKEND` restricts the backends, `WGPU_ADAPTER_NAME` picks an adapter by name
    /// substring, `WGPU_POWER_PREF` sets the preference; otherwise wgpu's default adapter.
    ///
    /// The device gets the adapter's own limits and whichever of `SHADER_F16`,
    /// `SHADER_F64` and `TIMESTAMP_QUERY` the adapter has.
    pub async fn headless() -> Result<Self> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = choose_adapter(&instance).await?;
        let features = adapter.features() & WANTED_FEATURES;
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("wgpu-optim"),
                required_features: features,
                required_limits: adapter.limits(),
                ..Default::default()
            })
            .await
            .map_err(|e| Error::RequestDevice { message: e.to_string() })?;
        let ctx = Self::from_device(device, queue);
        // The device is ours: watch for its loss, and log (rather than panic on) any error
        // that escapes the crate's error scopes.
        let lost = ctx.inner.lost.clone();
        ctx.inner.device.set_device_lost_callback(move |reason, message| {
            log::error!("wgpu-optim: device lost ({reason:?}): {message}");
            if let Ok(mut slot) = lost.lock() {
                *slot = Some(format!("{reason:?}: {message}"));
            }
        });
        ctx.inner
            .device
            .on_uncaptured_error(Arc::new(|error| log::error!("wgpu-optim: uncaptured wgpu error: {error}")));
        Ok(ctx)
    }

    /// Blocking form of [`GpuContext::headless`], for tests, examples and benchmarks.
    pub fn headless_blocking() -> Result<Self> {
        pollster::block_on(Self::headless())
    }

    /// Wraps a trainer's existing device and queue. The crate uses whatever features and
    /// limits the device was created with and never changes its error handler or its
    /// device-lost callback (the trainer keeps both; call [`Self::mark_lost`] from the
    /// callback to make the crate's calls return [`Error::DeviceLost`]). The adapter's name
    /// and driver for [`Self::report`] come from the device.
    pub fn from_device(device: wgpu::Device, queue: wgpu::Queue) -> Self {
        let limits = device.limits();
        let adapter = device.adapter_info();
        let report = ContextReport {
            adapter_name: adapter.name.clone(),
            backend: adapter.backend,
            device_type: adapter.device_type,
            driver: format!("{} {}", adapter.driver, adapter.driver_info).trim().to_string(),
            features: device.features(),
            max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size,
            max_buffer_size: limits.max_buffer_size,
        };
        log::info!("wgpu-optim on {report}");
        GpuContext {
            inner: Arc::new(ContextInner {
                scalar_layouts: ScalarLayouts::new(&device),
                lost: Arc::default(),
                device,
                queue,
                report,
                pipelines: PipelineCache::default(),
            }),
            packed_f16: None,
        }
    }

    /// The device.
    pub fn device(&self) -> &wgpu::Device {
        &self.inner.device
    }

    /// The queue.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.inner.queue
    }

    /// What the context runs on.
    pub fn report(&self) -> &ContextReport {
        &self.inner.report
    }

    /// Whether the device was created with `feature`.
    pub fn has_feature(&self, feature: wgpu::Features) -> bool {
        self.inner.report.features.contains(feature)
    }

    /// The same device and pipeline cache, with the kernels reading and writing f16 tensors
    /// as pairs of halves in `u32` words when `packed` is true, or as native `array<f16>`
    /// wherever the device has `SHADER_F16` when it is false. The buffers' bytes and the
    /// results are identical either way; only the kernels, and so their speed, differ.
    ///
    /// Why a trainer calls it: the default ([`Self::native_f16`]) is a guess from the
    /// adapter's type. Where an adapter ranks the two otherwise, measure both
    /// (`cargo bench --bench step -- f16`) and pick the faster one here.
    ///
    /// ```no_run
    /// # fn main() -> wgpu_optim::Result<()> {
    /// let ctx = wgpu_optim::GpuContext::headless_blocking()?.with_packed_f16(true);
    /// assert!(!ctx.native_f16());
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_packed_f16(&self, packed: bool) -> GpuContext {
        GpuContext { inner: self.inner.clone(), packed_f16: Some(packed) }
    }

    /// Whether f16 tensors use native `f16` arrays. By default they do where the device has
    /// `SHADER_F16`, except on CPU adapters (lavapipe, SwiftShader, WARP): those convert
    /// each native half in software, which makes native f16 slower than packed pairs there
    /// (PERF.md). [`Self::with_packed_f16`] overrides the choice.
    pub fn native_f16(&self) -> bool {
        let has = self.has_feature(wgpu::Features::SHADER_F16);
        match self.packed_f16 {
            Some(packed) => has && !packed,
            None => has && self.inner.report.device_type != wgpu::DeviceType::Cpu,
        }
    }

    /// How many distinct pipelines have been compiled so far (each variant once), for the
    /// crate's own tests (integration tests count the device's pipelines with wgpu's
    /// counters).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn compiled_pipelines(&self) -> usize {
        self.inner.pipelines.len()
    }

    /// Records that the device was lost; every later call of the crate on this context
    /// returns [`Error::DeviceLost`] with `reason`.
    pub fn mark_lost(&self, reason: impl Into<String>) {
        if let Ok(mut slot) = self.inner.lost.lock() {
            *slot = Some(reason.into());
        }
    }

    /// `Err(DeviceLost)` once the device is lost. The crate's own calls check it; a trainer
    /// checks it before work of its own on the device.
    pub fn check_alive(&self) -> Result<()> {
        match self.inner.lost.lock().ok().and_then(|slot| slot.clone()) {
            Some(reason) => Err(Error::DeviceLost { reason }),
            None => Ok(()),
        }
    }

    /// Runs `f` inside validation, out-of-memory and internal error scopes and turns
    /// anything wgpu reports into [`Error::Gpu`] with wgpu's message verbatim. Internal
    /// errors are a driver failing to compile a shader that validated; uncaught, they would
    /// reach the trainer's uncaptured-error handler, whose default panics.
    ///
    /// Popping a scope waits for the device, which a browser's main thread cannot do: in
    /// wasm32 builds no scope is pushed, and wgpu's errors reach the device's
    /// uncaptured-error handler instead.
    pub fn catch<T>(&self, context: &str, f: impl FnOnce() -> T) -> Result<T> {
        self.check_alive()?;
        if cfg!(target_arch = "wasm32") {
            let value = f();
            return self.check_alive().map(|()| value);
        }
        let device = &self.inner.device;
        let oom = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let internal = device.push_error_scope(wgpu::ErrorFilter::Internal);
        let value = f();
        // Scopes pop in the reverse order of their pushes.
        let internal = pollster::block_on(internal.pop());
        let validation = pollster::block_on(validation.pop());
        let oom = pollster::block_on(oom.pop());
        match validation.or(internal).or(oom) {
            Some(e) => Err(Error::Gpu { context: context.to_string(), message: e.to_string() }),
            // A loss during `f` makes its objects invalid without necessarily an error.
            None => self.check_alive().map(|()| value),
        }
    }
}

/// `WGPU_ADAPTER_NAME` (a case-insensitive substring) picks an adapter, as wgpu's
/// `initialize_adapter_from_env` does, but a name that matches nothing is an error listing
/// the adapters there are, not a panic; otherwise wgpu's default adapter for
/// `WGPU_POWER_PREF`.
pub(crate) async fn choose_adapter(instance: &wgpu::Instance) -> Result<wgpu::Adapter> {
    if let Ok(wanted) = std::env::var("WGPU_ADAPTER_NAME") {
        let adapters = instance.enumerate_adapters(wgpu::Backends::all()).await;
        let names: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
        let found =
            adapters.into_iter().find(|a| a.get_info().name.to_lowercase().contains(&wanted.to_lowercase()));
        return found.ok_or_else(|| Error::NoAdapter {
            reason: format!("WGPU_ADAPTER_NAME={wanted:?} matches none of the adapters {names:?}"),
        });
    }
    instance
        .request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::from_env().unwrap_or_default(),
            ..Default::default()
        })
        .await
        .map_err(|e| Error::NoAdapter { reason: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_error_displays_on_one_line_and_in_full_with_the_alternate_flag() {
        let ctx = GpuContext::headless_blocking().unwrap_or_else(|e| panic!("{e}"));
        let source = "@compute @workgroup_size(1)\nfn main() {\n    let x: u32 = 1.5;\n}\n";
        let err = ctx
            .catch("compiling a bad shader", || {
                ctx.device().create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some("bad"),
                    source: wgpu::ShaderSource::Wgsl(source.into()),
                })
            })
            .expect_err("a shader assigning a float to a u32 compiled");
        let Error::Gpu { message, .. } = &err else { panic!("{err:?}") };
        let line = err.to_string();
        assert!(!line.contains('\n'), "{line}");
        assert!(line.starts_with("wgpu error while compiling a bad shader: Validation Error: "), "{line}");
        assert!(line.contains("create_shader_module") && line.contains("'bad'"), "{line}");
        // The full message, snippet of the WGSL included, under {:#}.
        let full = format!("{err:#}");
        assert!(full.contains(message.as_str()) && full.contains("let x: u32 = 1.5"), "{full}");
    }

    #[test]
    fn the_async_readback_returns_the_blocking_ones_bytes() {
        let ctx = GpuContext::headless_blocking().unwrap_or_else(|e| panic!("{e}"));
        let values: Vec<f32> = (0..37).map(|i| i as f32 * 0.25 - 3.0).collect();
        let tensor = ctx.upload_f32("values", &values);
        // An unaligned f16 view inside the same buffer: the word-rounding path too.
        let inner = crate::Tensor::new(&tensor.buffer, 6, 5, crate::DType::F16);
        for t in [&tensor, &inner] {
            let blocking = ctx.read_bytes(t).unwrap();
            let awaited = pollster::block_on(ctx.read_bytes_async(t)).unwrap();
            assert_eq!(awaited, blocking);
        }
        assert_eq!(ctx.read_bytes(&tensor).unwrap(), bytemuck::cast_slice::<f32, u8>(&values));
    }
}
