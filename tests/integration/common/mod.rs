//! Shared helpers of the GPU tests: the headless context, deterministic random data, and
//! the testkit's comparator, which names the first few mismatching indices.

use std::sync::OnceLock;

use wgpu_optim::GpuContext;
pub use wgpu_optim_testkit::cases::{adagrad_variants, adam_switch_combinations, sgd_variants, Rng};
pub use wgpu_optim_testkit::compare::{assert_close, Tolerance};

/// The headless context. No adapter is a test failure whose message says how to get one.
pub fn ctx() -> GpuContext {
    static CTX: OnceLock<GpuContext> = OnceLock::new();
    CTX.get_or_init(|| match GpuContext::headless_blocking() {
        Ok(ctx) => ctx,
        Err(e) => panic!("GPU tests need an adapter: {e}"),
    })
    .clone()
}

/// One GPU test at a time among those that take a turn (in every area: the areas share
/// one binary), for tests that compile many pipelines: on GL (llvmpipe) a thread that waits
/// for the adapter's context while others compile gives up after a timeout ("Could not lock
/// adapter context"), more often on a loaded machine.
pub fn gpu_turn() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A context of its own (its own pipeline cache), for tests that count compiled pipelines
/// while other tests compile theirs on the shared one.
/// The compute pipelines alive on `ctx`'s device, by wgpu's own counters: on a device of
/// the test's own, the pipelines the crate compiled for it (each variant once).
#[allow(dead_code)]
pub fn compute_pipelines(ctx: &GpuContext) -> isize {
    ctx.device().get_internal_counters().hal.compute_pipelines.read()
}

pub fn fresh_ctx() -> GpuContext {
    GpuContext::headless_blocking().unwrap_or_else(|e| panic!("GPU tests need an adapter: {e}"))
}

/// A context of its own whose uncaptured-error handler records every error instead of
/// logging it: the crate's calls must catch each of theirs, so a test asserts it saw none
/// ([`assert_no_uncaptured`]).
pub fn watched_ctx() -> (GpuContext, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    let ctx = fresh_ctx();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = seen.clone();
    ctx.device().on_uncaptured_error(std::sync::Arc::new(move |e: wgpu::Error| {
        sink.lock().unwrap_or_else(|p| p.into_inner()).push(e.to_string());
    }));
    (ctx, seen)
}

/// Fails with the errors that reached a [`watched_ctx`]'s handler, if any did.
#[track_caller]
pub fn assert_no_uncaptured(seen: &std::sync::Mutex<Vec<String>>) {
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner());
    assert!(seen.is_empty(), "errors reached the device's uncaptured-error handler: {seen:?}");
}

/// A context on a device created with exactly `limits` (on the adapter wgpu picks, as
/// `ctx`), to check what the crate does within a smaller device than the adapter offers.
pub fn ctx_with_limits(limits: wgpu::Limits) -> GpuContext {
    ctx_with_adapter_limits(|_| limits)
}

/// A context on a device created with the adapter's own limits as `adjust` changes them.
/// A test that needs a limit (a storage binding smaller than its tensor, say) sets it here
/// rather than assuming the adapter's: a discrete GPU's bindings may hold 2 GiB or more.
pub fn ctx_with_adapter_limits(adjust: impl FnOnce(wgpu::Limits) -> wgpu::Limits) -> GpuContext {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = pollster::block_on(wgpu::util::initialize_adapter_from_env_or_default(&instance, None))
        .unwrap_or_else(|e| panic!("GPU tests need an adapter: {e}"));
    let descriptor =
        wgpu::DeviceDescriptor { required_limits: adjust(adapter.limits()), ..Default::default() };
    let (device, queue) = pollster::block_on(adapter.request_device(&descriptor))
        .unwrap_or_else(|e| panic!("the adapter refused a device with smaller limits: {e}"));
    GpuContext::from_device(device, queue)
}

pub fn to_f32(values: &[f64]) -> Vec<f32> {
    values.iter().map(|v| *v as f32).collect()
}

/// Reads an f32 tensor and compares it with the oracle within [`Tolerance::F32`].
#[track_caller]
pub fn assert_tensor(ctx: &GpuContext, what: &str, tensor: &wgpu_optim::Tensor, want: &[f64]) {
    let got = ctx.read_f32(tensor).unwrap_or_else(|e| panic!("{what}: {e}"));
    let got: Vec<f64> = got.into_iter().map(f64::from).collect();
    assert_close(what, &got, want, Tolerance::F32);
}

/// Uploads `values` (rounded to `dtype`) as a new tensor.
pub fn upload(ctx: &GpuContext, values: &[f64], dtype: wgpu_optim::DType) -> wgpu_optim::Tensor {
    ctx.upload("input", values, dtype)
}

/// Reads a tensor of any dtype, widened to f64.
pub fn download(ctx: &GpuContext, tensor: &wgpu_optim::Tensor) -> Vec<f64> {
    ctx.read(tensor).unwrap_or_else(|e| panic!("reading a tensor back: {e}"))
}

/// One variadic ONNX training-operator call, checked against the oracle.
pub struct OnnxCall<'a> {
    /// The input groups after R and T, e.g. `["X", "G", "V", "H"]`; every group but `G`
    /// has an output.
    pub groups: &'a [&'a str],
    /// The lengths of the n tensors.
    pub lengths: &'a [usize],
    pub dtype: wgpu_optim::DType,
    /// Whether output k (in operator order) is written in place.
    pub in_place: &'a dyn Fn(usize) -> bool,
    pub seed: u64,
    pub tolerance: Tolerance,
}

impl OnnxCall<'_> {
    /// Generates inputs (the `H` group non-negative), records the call with `record`, and
    /// compares every output with `oracle(inputs of tensor i)`, which returns the outputs of
    /// tensor i in operator order.
    pub fn check(
        &self,
        record: impl FnOnce(
            &GpuContext,
            &mut wgpu::CommandEncoder,
            &[wgpu_optim::Tensor],
            &[Option<wgpu_optim::Tensor>],
        ) -> wgpu_optim::Result<()>,
        oracle: impl Fn(&[Vec<f64>]) -> Vec<Vec<f64>>,
    ) {
        let ctx = ctx();
        let mut rng = Rng::new(self.seed);
        let n = self.lengths.len();
        let values: Vec<Vec<Vec<f64>>> = self
            .groups
            .iter()
            .map(|g| {
                self.lengths
                    .iter()
                    .map(|&l| match *g {
                        "H" => rng.positive(l, 0.01),
                        "V" => rng.vec(l, 0.1),
                        _ => rng.vec(l, 1.0),
                    })
                    .collect()
            })
            .collect();
        let inputs: Vec<wgpu_optim::Tensor> =
            values.iter().flat_map(|group| group.iter().map(|v| upload(&ctx, v, self.dtype))).collect();
        let updated: Vec<usize> = (0..self.groups.len()).filter(|&k| self.groups[k] != "G").collect();
        let outputs: Vec<Option<wgpu_optim::Tensor>> = (0..updated.len() * n)
            .map(|k| {
                (!(self.in_place)(k)).then(|| ctx.zeros("output", self.lengths[k % n] as u64, self.dtype))
            })
            .collect();
        ctx.submit("onnx", |encoder| record(&ctx, encoder, &inputs, &outputs)).unwrap();
        for i in 0..n {
            let tensor_inputs: Vec<Vec<f64>> = values.iter().map(|group| group[i].clone()).collect();
            let want = oracle(&tensor_inputs);
            for (k, group) in updated.iter().enumerate() {
                let slot = k * n + i;
                let written = outputs[slot].as_ref().unwrap_or(&inputs[group * n + i]);
                let got = download(&ctx, written);
                let what = format!(
                    "{}_new_{} (n = {}, {:?})",
                    self.groups[*group],
                    i + 1,
                    self.lengths[i],
                    self.dtype
                );
                assert_close(&what, &got, &want[k], self.tolerance);
            }
        }
    }
}

/// Whether a test of the path that needs `feature` (named `name`: `SHADER_F64`, `SHADER_F16`)
/// can run it.
///
/// The suite runs on two adapter classes in CI: Vulkan (lavapipe, with `SHADER_F64` and
/// `SHADER_F16`) and GL (with neither). True where the adapter has `feature`. Where it does
/// not, the adapter must be GL, whose run leaves the path to the Vulkan run: any other
/// adapter without the feature fails the calling test rather than letting it report a path
/// it did not run.
pub fn has_feature_unless_gl(ctx: &GpuContext, feature: wgpu::Features, name: &str) -> bool {
    if ctx.has_feature(feature) {
        return true;
    }
    let report = ctx.report();
    assert_eq!(
        report.backend,
        wgpu::Backend::Gl,
        "{} ({:?}) lacks {name}: only GL is expected to, and the path of this test did not run",
        report.adapter_name,
        report.backend
    );
    println!("GL has no {name}: this path runs in the Vulkan run");
    false
}

/// A context on the default adapter's device opened without any optional feature (no
/// `SHADER_F64`, no `SHADER_F16`), as on adapters that lack them: what the refusal tests run
/// on, on every adapter.
pub fn ctx_without_features() -> GpuContext {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = pollster::block_on(wgpu::util::initialize_adapter_from_env_or_default(&instance, None))
        .unwrap_or_else(|e| panic!("GPU tests need an adapter: {e}"));
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor::default()))
        .unwrap_or_else(|e| panic!("{e}"));
    let ctx = GpuContext::from_device(device, queue);
    assert!(!ctx.has_feature(wgpu::Features::SHADER_F64) && !ctx.has_feature(wgpu::Features::SHADER_F16));
    ctx
}

/// Asserts that `call` on `inputs` f64 tensors is refused with `Error::MissingFeature` naming
/// `SHADER_F64` on `ctx` (a context without the feature).
pub fn assert_f64_refused(
    ctx: &GpuContext,
    inputs: usize,
    call: impl FnOnce(&GpuContext, &mut wgpu::CommandEncoder, &[wgpu_optim::Tensor]) -> wgpu_optim::Result<()>,
) {
    let tensors: Vec<wgpu_optim::Tensor> =
        (0..inputs).map(|_| ctx.upload("f64 input", &[0.5; 8], wgpu_optim::DType::F64)).collect();
    let mut encoder = ctx.device().create_command_encoder(&Default::default());
    match call(ctx, &mut encoder, &tensors) {
        Err(err @ wgpu_optim::Error::MissingFeature { feature: "SHADER_F64", .. }) => {
            assert!(err.to_string().contains("SHADER_F64"), "{err}");
        }
        other => panic!("f64 tensors without SHADER_F64: expected MissingFeature(SHADER_F64), got {other:?}"),
    }
}
