//! One wgpu device and queue for Burn and this crate, made from either side.

use burn::tensor::wgpu::WgpuSetup;
use burn::tensor::Device;

use wgpu_optim::{BurnFailure, Error, GpuContext, Result};

/// A Burn device and a [`GpuContext`] on the same wgpu device and queue.
///
/// Everything in [`crate`] takes one: a tensor is accepted only on [`Self::device`],
/// whose buffers this crate can bind. Cheap to clone.
#[derive(Clone, Debug)]
pub struct SharedDevice {
    context: GpuContext,
    device: Device,
}

impl SharedDevice {
    /// Lets Burn acquire its default wgpu device (as `Device::wgpu_options().init()` does)
    /// and wraps the exact handles Burn uses. Burn creates the device with the adapter's
    /// features and limits. Fails where Burn's wgpu runtime is already initialized (Burn
    /// hands out its handles only when it creates them).
    pub fn init() -> Result<Self> {
        let (device, setup) = Device::wgpu_options().init_with_setup().map_err(|e| Error::Burn {
            cause: BurnFailure::Device,
            detail: format!("Burn could not initialize its wgpu runtime: {e}"),
        })?;
        Ok(SharedDevice { context: GpuContext::from_device(setup.device, setup.queue), device })
    }

    /// Opens a device for both, chosen as [`GpuContext::headless`] chooses one
    /// (`WGPU_BACKEND`, `WGPU_ADAPTER_NAME`, `WGPU_POWER_PREF`), and registers it with Burn.
    /// The device gets all of the adapter's features (but `MAPPABLE_PRIMARY_BUFFERS`, which
    /// slows every buffer on discrete GPUs) and the adapter's limits: Burn's runtime
    /// describes the device from the adapter, so it must have what the adapter has.
    pub async fn headless() -> Result<Self> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = GpuContext::choose_adapter(&instance).await?;
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("wgpu-optim + Burn"),
                required_features: burn_features(&adapter),
                required_limits: adapter.limits(),
                ..Default::default()
            })
            .await
            .map_err(|e| Error::RequestDevice { message: e.to_string() })?;
        Self::from_context(GpuContext::from_device(device, queue), instance, adapter)
    }

    /// Blocking form of [`Self::headless`].
    pub fn headless_blocking() -> Result<Self> {
        pollster::block_on(Self::headless())
    }

    /// Registers a context's device and queue with Burn. `instance` and `adapter` are the
    /// ones the device came from. Refused ([`Error::Burn`]) where the device lacks one of
    /// the adapter's features or limits: Burn's runtime would then compile kernels the
    /// device rejects. Each call registers a new Burn runtime; call it once per device
    /// and clone the result.
    pub fn from_context(
        context: GpuContext,
        instance: wgpu::Instance,
        adapter: wgpu::Adapter,
    ) -> Result<Self> {
        let missing = burn_features(&adapter) - context.device().features();
        if !missing.is_empty() {
            return Err(Error::Burn {
                cause: BurnFailure::Device,
                detail: format!(
                    "the device lacks the adapter's features {missing:?}; Burn describes the device \
                 from its adapter, so create it with `adapter.features()` (less \
                 MAPPABLE_PRIMARY_BUFFERS) and `adapter.limits()`"
                ),
            });
        }
        if context.device().limits() != adapter.limits() {
            return Err(Error::Burn {
                cause: BurnFailure::Device,
                detail: "the device was not created with the adapter's limits; Burn describes the device \
                 from its adapter, so create it with `required_limits: adapter.limits()`"
                    .into(),
            });
        }
        let backend = adapter.get_info().backend;
        let setup = WgpuSetup {
            instance,
            adapter,
            device: context.device().clone(),
            queue: context.queue().clone(),
            backend,
        };
        let device = Device::wgpu_options().setup(setup).init().map_err(|e| Error::Burn {
            cause: BurnFailure::Device,
            detail: format!("Burn refused the device: {e}"),
        })?;
        Ok(SharedDevice { context, device })
    }

    /// This crate's side: the context every optimizer here records on.
    pub fn context(&self) -> &GpuContext {
        &self.context
    }

    /// Burn's side: the device to create modules and tensors on.
    pub fn device(&self) -> &Device {
        &self.device
    }
}

/// The features Burn's runtime assumes a device has: the adapter's.
fn burn_features(adapter: &wgpu::Adapter) -> wgpu::Features {
    adapter.features() - wgpu::Features::MAPPABLE_PRIMARY_BUFFERS
}
