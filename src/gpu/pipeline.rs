//! Compiled pipelines, one per variant, created once and shared by every caller of a
//! context: the registry of every kernel the crate compiles, multi-tensor and 8-bit alike,
//! and of the fixed passes of the families that are not elementwise.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::gpu::blockwise;
use crate::gpu::compile::{buffer_entry, create, CachedPipeline};
use crate::gpu::kernel::{binding, compose, Scalars, Storage, VariantKey, TABLE_BYTES};
use crate::gpu::GpuContext;
use crate::step::clip::ClipHeader;
use crate::step::device::DeviceHeader;
use crate::step::UNIFORM_SLOT_BYTES;
use crate::{DType, Error, Result};

/// What selects one compiled pipeline, whichever kind of kernel it is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum PipelineKey {
    /// A multi-tensor kernel (`gpu::kernel`).
    Table(VariantKey),
    /// An 8-bit-state step (`gpu::q8`).
    Q8(blockwise::Variant),
    /// A 4-bit-state step (`gpu::q4`).
    Q4(blockwise::Variant),
}

/// Pipelines by key, one registry per device. Insertion is double-checked so two threads
/// asking for the same variant at once compile it at most twice and share one result.
#[derive(Default)]
pub(crate) struct PipelineCache {
    map: Mutex<HashMap<PipelineKey, Arc<CachedPipeline>>>,
    /// The fixed passes' pipelines ([`Self::get_pass`]), by name and the value compiled
    /// into them ([`Self::get_pass_with`]).
    passes: Mutex<HashMap<(&'static str, u64), Box<FixedPass>>>,
}

/// A fixed pass's pipelines (an `Arc` of the pass's own type, boxed: `Arc<dyn Any>` can only
/// be downcast where it is `Send + Sync`), shared across threads where wgpu's objects may be
/// (everywhere but the browser, whose objects stay on its thread).
#[cfg(not(target_arch = "wasm32"))]
type FixedPass = dyn Any + Send + Sync;
#[cfg(target_arch = "wasm32")]
type FixedPass = dyn Any;

impl PipelineCache {
    /// Pipelines compiled so far, of every kind.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// The multi-tensor kernel of `key`, compiled on first use.
    pub(crate) fn get(&self, ctx: &GpuContext, key: &VariantKey) -> Result<Arc<CachedPipeline>> {
        self.get_or_compile(PipelineKey::Table(key.clone()), || compile(ctx, key))
    }

    /// The pipelines of a pass whose WGSL is fixed (the passes of a family that is not
    /// elementwise, compiled in its folder; the matrix products), named `name`: compiled by
    /// `compile` on first use, then shared. They are not variants, so [`Self::len`] does not
    /// count them.
    pub(crate) fn get_pass<T: Any + wgpu::WasmNotSendSync>(
        &self,
        name: &'static str,
        compile: impl FnOnce() -> Result<T>,
    ) -> Result<Arc<T>> {
        self.get_pass_with(name, 0, compile)
    }

    /// [`Self::get_pass`] for a pass that compiles a value in (an override constant), one
    /// pipeline per `value` (its bits, say).
    pub(crate) fn get_pass_with<T: Any + wgpu::WasmNotSendSync>(
        &self,
        name: &'static str,
        value: u64,
        compile: impl FnOnce() -> Result<T>,
    ) -> Result<Arc<T>> {
        let passes = || self.passes.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let key = (name, value);
        let shared = |stored: &FixedPass| stored.downcast_ref::<Arc<T>>().cloned();
        if let Some(hit) = passes().get(&key).and_then(|hit| shared(hit.as_ref())) {
            return Ok(hit);
        }
        // Compiled outside the lock; two threads may both compile it, the first stored is kept.
        let compiled = Arc::new(compile()?);
        let mut passes = passes();
        let stored = passes.entry(key).or_insert_with(|| Box::new(compiled.clone()));
        Ok(shared(stored.as_ref()).unwrap_or(compiled))
    }

    /// The pipeline of `key`, compiled by `compile` on first use: the low-bit formats
    /// (`gpu::q8`, `gpu::q4`) compile their own variants.
    pub(crate) fn get_or_compile(
        &self,
        key: PipelineKey,
        compile: impl FnOnce() -> Result<CachedPipeline>,
    ) -> Result<Arc<CachedPipeline>> {
        if let Some(hit) = self.lock().get(&key) {
            return Ok(hit.clone());
        }
        // Compiled outside the lock: other kernels stay available meanwhile.
        let compiled = Arc::new(compile()?);
        Ok(self.lock().entry(key).or_insert(compiled).clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PipelineKey, Arc<CachedPipeline>>> {
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
    /// `host` with the clip buffer at [`binding::CLIP`] (capturable kernels read the
    /// coefficient from the device state, so `device` serves them clipped or not).
    host_clipped: wgpu::BindGroupLayout,
    state: wgpu::BindGroupLayout,
    /// Gradient norms' partials (written).
    norm: wgpu::BindGroupLayout,
    /// The unscale pass that takes norms: the device state and the partials, both written.
    unscale_norm: wgpu::BindGroupLayout,
    /// The clip finalize pass: the partials (read), the clip buffer (written).
    finalize: wgpu::BindGroupLayout,
    /// `finalize` with the device state (written), in capturable mode.
    finalize_capturable: wgpu::BindGroupLayout,
    /// A family's table passes (`Scalars::Passes`): the uniform, the partials (written),
    /// the index (read).
    passes: wgpu::BindGroupLayout,
}

/// Group 0's layout entries of a family's table passes (`Scalars::Passes`): the uniform,
/// the partials and the index; `combine` (the family's pass that combines the partials)
/// flips which of the two buffers is written. The smallest sizes bound every family's:
/// a partial of two f32s, an index of at least its four header words.
pub(crate) fn pass_layout_entries(combine: bool) -> [wgpu::BindGroupLayoutEntry; 3] {
    use wgpu::BufferBindingType::{Storage, Uniform};
    [
        buffer_entry(binding::HYPER, Uniform, false, UNIFORM_SLOT_BYTES),
        buffer_entry(binding::PASS_PARTIALS, Storage { read_only: combine }, false, 8),
        buffer_entry(binding::PASS_INDEX, Storage { read_only: !combine }, false, 16),
    ]
}

impl ScalarLayouts {
    pub(crate) fn new(device: &wgpu::Device) -> Self {
        use wgpu::BufferBindingType::{Storage, Uniform};
        let layout = |label: &str, entries: &[wgpu::BindGroupLayoutEntry]| {
            device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: Some(label), entries })
        };
        let hyper = buffer_entry(binding::HYPER, Uniform, false, UNIFORM_SLOT_BYTES);
        let state =
            |binding, read_only| buffer_entry(binding, Storage { read_only }, false, DeviceHeader::BYTES);
        // The device state, and the group's learning rate (one f32).
        let device_entries = [
            hyper,
            state(binding::DEVICE_STATE, true),
            buffer_entry(binding::DEVICE_LR, Storage { read_only: true }, false, 4),
        ];
        let clip =
            |binding, read_only| buffer_entry(binding, Storage { read_only }, false, ClipHeader::BYTES);
        let partials = |binding, read_only| buffer_entry(binding, Storage { read_only }, false, 4);
        let finalize = [partials(binding::FINALIZE_PARTIALS, true), clip(binding::FINALIZE_CLIP, false)];
        let finalize_capturable = [finalize[0], finalize[1], state(binding::FINALIZE_DEVICE_STATE, false)];
        ScalarLayouts {
            host: layout("wgpu-optim hyperparameters", &[hyper]),
            device: layout("wgpu-optim capturable scalars", &device_entries),
            host_clipped: layout("wgpu-optim hyperparameters, clipped", &[hyper, clip(binding::CLIP, true)]),
            state: layout("wgpu-optim device state", &[state(binding::DEVICE_STATE_RW, false)]),
            norm: layout("wgpu-optim gradient norm partials", &[partials(binding::NORM_PARTIALS, false)]),
            unscale_norm: layout(
                "wgpu-optim unscale and gradient norm",
                &[state(binding::DEVICE_STATE_RW, false), partials(binding::UNSCALE_NORM_PARTIALS, false)],
            ),
            finalize: layout("wgpu-optim clip finalize", &finalize),
            finalize_capturable: layout("wgpu-optim clip finalize, capturable", &finalize_capturable),
            passes: layout("wgpu-optim table passes", &pass_layout_entries(false)),
        }
    }

    /// Group 0 of a kernel whose scalars come from `scalars`, with the clip buffer when
    /// `clip` (update kernels only).
    pub(crate) fn get(&self, scalars: Scalars, clip: bool) -> &wgpu::BindGroupLayout {
        match (scalars, clip) {
            (Scalars::Host, false) => &self.host,
            (Scalars::Host, true) => &self.host_clipped,
            (Scalars::Device, _) => &self.device,
            (Scalars::Unscale, _) => &self.state,
            (Scalars::Norm, _) => &self.norm,
            (Scalars::UnscaleNorm, _) => &self.unscale_norm,
            (Scalars::Passes(_), _) => &self.passes,
        }
    }

    /// The layout of the clip finalize pass, with the device state in capturable mode.
    pub(crate) fn finalize(&self, capturable: bool) -> &wgpu::BindGroupLayout {
        if capturable {
            &self.finalize_capturable
        } else {
            &self.finalize
        }
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
    let overrides = key.program.overrides();
    let label = format!("wgpu-optim {} {:?} {:?}", key.program.name(), key.math, overrides);
    let source = compose(key);
    // The dispatch's table of segments (see `gpu::table`).
    let mut entries =
        vec![buffer_entry(binding::TABLE, wgpu::BufferBindingType::Uniform, false, TABLE_BYTES)];
    for (b, desc) in key.layout.bindings.iter().enumerate() {
        // One element of the array (a vec4, or two words of halves, in vector variants);
        // storage bindings are whole words.
        let element = match desc.storage {
            Storage::Native(dtype) => dtype.size() * u64::from(key.width),
            Storage::Packed(_) => 2 * u64::from(key.width),
        };
        let ty = wgpu::BufferBindingType::Storage { read_only: !desc.read_write };
        entries.push(buffer_entry(binding::TENSORS + b as u32, ty, false, element.next_multiple_of(4)));
    }
    let group0 = ctx.inner.scalar_layouts.get(key.scalars, key.clip);
    let constants: Vec<(&str, f64)> = overrides.iter().map(|o| o.constant()).collect();
    let (pipeline, segment_layout) = create(ctx, &label, &source, group0, &entries, &constants)?;
    log::debug!("compiled {label}");
    Ok(CachedPipeline { pipeline, segment_layout })
}

#[cfg(test)]
mod tests {
    use crate::gpu::kernel::{BindingDesc, BindingLayout, Program, Scalars, Storage, VariantKey};
    use crate::gpu::GpuContext;
    use crate::step::clip::NormType;
    use crate::step::rounding::Stochastic;
    use crate::step::{Slot, Switches};
    use crate::{DType, StateKind};

    /// A device with exactly WebGPU's default limits (and the adapter's 16- and 64-bit
    /// shader features, which change types, not bindings).
    fn webgpu_default_ctx() -> GpuContext {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = pollster::block_on(wgpu::util::initialize_adapter_from_env_or_default(&instance, None))
            .unwrap_or_else(|e| panic!("GPU tests need an adapter: {e}"));
        let descriptor = wgpu::DeviceDescriptor {
            required_features: adapter.features() & (wgpu::Features::SHADER_F16 | wgpu::Features::SHADER_F64),
            required_limits: wgpu::Limits::default(),
            ..Default::default()
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&descriptor))
            .unwrap_or_else(|e| panic!("the adapter refused WebGPU's default limits: {e}"));
        GpuContext::from_device(device, queue)
    }

    /// The widest layout a step of `program` binds: every slot of the family's widest
    /// switches in a buffer of its own, updated in place, plus the model copy (master
    /// weights) or the Kahan compensation, which the options never combine.
    fn widest_layout(program: Program, storage: Storage, kahan: bool, copy: bool) -> BindingLayout {
        let bound = |slot: &Slot| match slot {
            Slot::State(StateKind::KahanCompensation) => kahan,
            Slot::ParamCopy => copy,
            _ => true,
        };
        let mut bindings = 0;
        let inputs: Vec<Option<usize>> = program
            .inputs()
            .iter()
            .map(|slot| {
                bound(slot).then(|| {
                    bindings += 1;
                    bindings - 1
                })
            })
            .collect();
        let outputs: Vec<Option<usize>> = program
            .outputs()
            .iter()
            .map(|slot| {
                bound(slot).then(|| match program.inputs().iter().position(|s| s == slot) {
                    Some(k) => inputs[k].unwrap_or(0),
                    None => {
                        bindings += 1;
                        bindings - 1
                    }
                })
            })
            .collect();
        let written: Vec<usize> = outputs.iter().flatten().copied().collect();
        let bindings =
            (0..bindings).map(|b| BindingDesc { storage, read_write: written.contains(&b) }).collect();
        BindingLayout { inputs, outputs, bindings }
    }

    #[test]
    fn every_kernel_variant_compiles_within_webgpus_default_limits() {
        let ctx = webgpu_default_ctx();
        let limit = ctx.device().limits().max_storage_buffers_per_shader_stage;
        assert_eq!(limit, 8, "WebGPU's default: 8 storage buffers per shader stage");
        let native_f16 = ctx.has_feature(wgpu::Features::SHADER_F16);
        let f64 = ctx.has_feature(wgpu::Features::SHADER_F64);
        // Each family with the switches that bind the most state.
        let updates = Switches::widest();
        let mut storages = vec![
            (DType::F32, Storage::Native(DType::F32)),
            (DType::F32, Storage::Packed(DType::F16)),
            (DType::F32, Storage::Packed(DType::BF16)),
        ];
        if native_f16 {
            storages.push((DType::F32, Storage::Native(DType::F16)));
        }
        if f64 {
            storages.push((DType::F64, Storage::Native(DType::F64)));
        }
        let mut keys = Vec::new();
        for switches in updates {
            let program = Program::Update(switches);
            for (scalars, clip) in [
                (Scalars::Host, false),
                (Scalars::Host, true),
                (Scalars::Device, false),
                (Scalars::Device, true),
            ] {
                for &(math, storage) in &storages {
                    // Capturable math is f32.
                    if math == DType::F64 && scalars == Scalars::Device {
                        continue;
                    }
                    // Schedule-Free and Muon have no capturable form.
                    if switches.family().capturable_wgsl().is_empty() && scalars == Scalars::Device {
                        continue;
                    }
                    let half = storage.dtype().size() == 2;
                    // (Kahan, model copy, stochastic stores): nearest even with or without a
                    // copy, and on 16-bit parameters Kahan or stochastic rounding.
                    let mut stores =
                        vec![(false, false, Stochastic::default()), (false, true, Stochastic::default())];
                    if half {
                        stores.push((true, false, Stochastic::default()));
                        stores.push((false, false, Stochastic { params: true, state: false }));
                        stores.push((false, false, Stochastic { params: true, state: true }));
                    }
                    for (kahan, copy, stochastic) in stores {
                        for width in if math == DType::F64 { vec![1] } else { vec![1, 4] } {
                            let layout = widest_layout(program, storage, kahan, copy);
                            let key = VariantKey::new(scalars, program, math, layout)
                                .clipped(clip)
                                .with_stochastic(stochastic)
                                .with_width(width);
                            keys.push(key);
                        }
                    }
                }
            }
        }
        for norm in [NormType::L2, NormType::Inf] {
            for &(_, storage) in storages.iter().filter(|(math, _)| *math == DType::F32) {
                let program = Program::GradNorm(norm);
                for width in [1, 4] {
                    keys.push(
                        VariantKey::new(
                            Scalars::Norm,
                            program,
                            DType::F32,
                            widest_layout(program, storage, false, false),
                        )
                        .with_width(width),
                    );
                }
            }
        }
        for norm in [NormType::L2, NormType::Inf] {
            let program = Program::UnscaleNorm(norm);
            let layout = widest_layout(program, Storage::Native(DType::F32), false, false);
            keys.push(VariantKey::new(Scalars::UnscaleNorm, program, DType::F32, layout));
        }
        let unscale = Program::Unscale;
        keys.push(VariantKey::new(
            Scalars::Unscale,
            unscale,
            DType::F32,
            widest_layout(unscale, Storage::Native(DType::F32), false, false),
        ));
        // A variant may bind more than the device allows, whatever its family: capturable
        // mode adds the device state and the learning rate to the family's tensors (four
        // states with master weights or Kahan compensation make nine). The optimizer refuses
        // such a variant when it binds it, by this same count (`Error::TooManyBindings`),
        // so it is never compiled; every other variant is.
        let needed =
            |key: &VariantKey| key.layout.bindings.len() as u32 + key.scalars.storage_bindings(key.clip);
        let (beyond, keys): (Vec<VariantKey>, Vec<VariantKey>) =
            keys.into_iter().partition(|key| needed(key) > limit);
        for key in &beyond {
            assert_eq!(
                key.scalars,
                Scalars::Device,
                "only capturable mode's bindings pass the limit: {key:?}"
            );
        }
        let mut widest = 0;
        for key in &keys {
            let needed = needed(key);
            assert!(needed <= limit, "{key:?} binds {needed} storage buffers");
            widest = widest.max(needed);
            ctx.inner.pipelines.get(&ctx, key).unwrap_or_else(|e| panic!("{key:?}: {e:#}"));
        }
        // Capturable AMSGrad with master weights or Kahan compensation fills all eight.
        assert_eq!(widest, 8);
        assert_eq!(ctx.compiled_pipelines(), keys.len(), "every variant is a pipeline of its own");
    }
}
