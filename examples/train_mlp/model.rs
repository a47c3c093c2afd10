//! The trainer's model: a 2 → 64 → 64 → 3 ReLU MLP with softmax cross-entropy, on the GPU.
//!
//! The model owns everything a step needs, created once: one parameter buffer and one
//! gradient buffer holding every layer's tensors at element offsets, the activation and
//! delta buffers, the four pipelines of `mlp.wgsl` and a bind group per dispatch. Recording
//! a step therefore creates no GPU objects; it only encodes nine dispatches into the
//! caller's command encoder, so the optimizer can follow in the same encoder.
//!
//! The browser trainer (`examples/web_mlp`) compiles this file too: there nothing may block,
//! so building the model and reading its metrics each have an async form
//! ([`Mlp::new_async`], [`Mlp::read_metrics_async`]), and the blocking forms exist only in
//! native builds.

#[cfg(not(target_arch = "wasm32"))]
use std::sync::mpsc;

use wgpu::util::DeviceExt;
use wgpu_optim::{DType, Tensor};

use crate::spirals::{Rng, Spirals, CLASSES, FEATURES};

/// Width of both hidden layers.
pub const HIDDEN: usize = 64;

/// Layer widths, input first.
pub const WIDTHS: [usize; 4] = [FEATURES, HIDDEN, HIDDEN, CLASSES];

/// Must match `WG` in `mlp.wgsl`.
const WORKGROUP: u32 = 64;

/// Must match the block height of `mlp.wgsl`'s kernels (their vec4 partial sums).
const ROWS_PER_BLOCK: usize = 4;

/// Boxed errors: the example reports them and stops, it never matches on them.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One parameter tensor: a PyTorch-style name, its shape, and where it sits in the packed
/// parameter and gradient buffers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamSpec {
    /// `fc{layer}.weight` or `fc{layer}.bias`, as `torch.nn.Linear` would name it.
    pub name: String,
    /// `[out, in]` for weights, `[out]` for biases.
    pub shape: Vec<usize>,
    /// Offset of the first element, in elements (the same in both buffers).
    pub offset: usize,
}

impl ParamSpec {
    /// Number of elements (PyTorch's `numel`).
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// The packed layout: per layer its weight then its bias, back to back with no padding, so
/// most tensors start at offsets that are not aligned to anything (the crate handles that).
pub fn param_layout() -> Vec<ParamSpec> {
    let mut specs = Vec::new();
    let mut offset = 0;
    for (layer, pair) in WIDTHS.windows(2).enumerate() {
        let (inputs, outputs) = (pair[0], pair[1]);
        for (what, shape) in [("weight", vec![outputs, inputs]), ("bias", vec![outputs])] {
            let spec = ParamSpec { name: format!("fc{}.{what}", layer + 1), shape, offset };
            offset += spec.numel();
            specs.push(spec);
        }
    }
    specs
}

/// Total number of parameters (4,547).
pub fn param_count() -> usize {
    param_layout().iter().map(ParamSpec::numel).sum()
}

/// He (Kaiming normal) initial values for the packed layout: weights `N(0, 2 / fan_in)`,
/// which keeps the activations' scale through ReLU layers; biases zero.
pub fn he_init(seed: u64) -> Vec<f64> {
    // A stream of its own, so the weights do not repeat the data set's noise.
    let mut rng = Rng::new(seed ^ 0x6D6C_705F_696E_6974);
    let mut values = Vec::with_capacity(param_count());
    for spec in param_layout() {
        if spec.shape.len() == 2 {
            let std = (2.0 / spec.shape[1] as f64).sqrt();
            values.extend((0..spec.numel()).map(|_| std * rng.normal()));
        } else {
            values.extend(std::iter::repeat_n(0.0, spec.numel()));
        }
    }
    values
}

/// Loss and accuracy over the data set, from the GPU's per-sample values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Metrics {
    /// Mean cross-entropy (summed in f64 on the host).
    pub loss: f64,
    /// Points whose arg-max logit is their label.
    pub correct: usize,
    /// Points in the data set.
    pub samples: usize,
}

impl Metrics {
    /// `correct / samples`, in `[0, 1]`.
    pub fn accuracy(&self) -> f64 {
        self.correct as f64 / self.samples as f64
    }
}

/// A compiled pipeline with its bind group and its grid: `columns` invocations across
/// (padded to whole workgroups) by `rows` workgroups down. For the layer kernels each
/// workgroup row is a block of four rows of the output (see `mlp.wgsl`); the loss kernel
/// has one row with a column per sample.
struct Dispatch {
    pipeline: wgpu::ComputePipeline,
    bind_group: wgpu::BindGroup,
    columns: u32,
    rows: u32,
}

impl Dispatch {
    fn record(&self, pass: &mut wgpu::ComputePass<'_>) {
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(self.columns.div_ceil(WORKGROUP), self.rows, 1);
    }
}

/// The four entry points of `mlp.wgsl`.
struct Pipelines {
    forward: wgpu::ComputePipeline,
    softmax_xent: wgpu::ComputePipeline,
    weight_grad: wgpu::ComputePipeline,
    input_grad: wgpu::ComputePipeline,
}

/// The f32 buffers between the kernels, `[samples, width]` each.
struct Activations {
    /// Inputs, then both hidden layers' ReLU outputs, then the logits.
    layers: [wgpu::Buffer; 4],
    /// dLoss/dz of each layer's output before its ReLU: `deltas[l]` belongs to layer `l + 1`.
    deltas: [wgpu::Buffer; 3],
    labels: wgpu::Buffer,
    loss: wgpu::Buffer,
    correct: wgpu::Buffer,
}

/// The MLP with its buffers, pipelines and bind groups.
pub struct Mlp {
    device: wgpu::Device,
    queue: wgpu::Queue,
    dtype: DType,
    layout: Vec<ParamSpec>,
    params: wgpu::Buffer,
    grads: wgpu::Buffer,
    forward: Vec<Dispatch>,
    backward: Vec<Dispatch>,
    acts: Activations,
    /// Mapped by [`Mlp::read_metrics`]: per-sample losses, then per-sample correctness.
    metrics_readback: wgpu::Buffer,
    samples: usize,
}

impl Mlp {
    /// Builds the model on `device` for `data`, with parameters of `dtype` (`F32`, or `F16`
    /// where the device has `SHADER_F16`) set to He initial values from `seed`.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new(
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        data: &Spirals,
        dtype: DType,
        seed: u64,
    ) -> Result<Self, BoxError> {
        pollster::block_on(Self::new_async(device, queue, data, dtype, seed))
    }

    /// [`Mlp::new`] without blocking: it awaits the shader compiler's verdict.
    pub async fn new_async(
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        data: &Spirals,
        dtype: DType,
        seed: u64,
    ) -> Result<Self, BoxError> {
        check_dtype(device, dtype)?;
        check_rows(device, data.len())?;
        let layout = param_layout();
        let (params, grads) = param_buffers(device, dtype, seed);
        let acts = Activations::new(device, data);
        let pipelines = compile(device, dtype).await?;
        let dims = layer_dims(device, data.len(), &layout);
        let wiring = Wiring { device, pipelines: &pipelines, dims: &dims, params: &params, grads: &grads };
        let (forward, backward) = (wiring.forward(&acts, data.len()), wiring.backward(&acts, data.len()));
        let metrics_readback = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("mlp metrics readback"),
            size: (data.len() * 8) as u64,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Ok(Mlp {
            device: device.clone(),
            queue: queue.clone(),
            dtype,
            layout,
            params,
            grads,
            forward,
            backward,
            acts,
            metrics_readback,
            samples: data.len(),
        })
    }

    /// The parameters' storage type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The packed layout of the parameter and gradient buffers.
    pub fn layout(&self) -> &[ParamSpec] {
        &self.layout
    }

    /// Every parameter tensor, as ranges of the one parameter buffer (for the optimizer).
    pub fn param_tensors(&self) -> Vec<Tensor> {
        self.tensors(&self.params, self.dtype)
    }

    /// Every gradient tensor, as ranges of the one f32 gradient buffer. Gradients stay f32
    /// even for f16 parameters: they are small (the loss is a batch mean), and f16 would
    /// flush many to zero without loss scaling.
    pub fn grad_tensors(&self) -> Vec<Tensor> {
        self.tensors(&self.grads, DType::F32)
    }

    fn tensors(&self, buffer: &wgpu::Buffer, dtype: DType) -> Vec<Tensor> {
        let element = dtype.size();
        self.layout
            .iter()
            .map(|s| Tensor {
                buffer: (buffer).clone(),
                offset: s.offset as u64 * element,
                len: s.numel() as u64,
                dtype,
            })
            .collect()
    }

    /// Replaces every parameter with `bytes` (the packed layout in the model's dtype), at
    /// the next submit.
    pub fn write_params(&self, bytes: &[u8]) -> Result<(), BoxError> {
        let expected = param_count() * self.dtype.size() as usize;
        if bytes.len() != expected {
            return Err(format!("{} parameter bytes given, the model has {expected}", bytes.len()).into());
        }
        self.queue.write_buffer(&self.params, 0, &padded(bytes.to_vec()));
        Ok(())
    }

    /// Records the forward pass and the loss: logits, per-sample loss and correctness, and
    /// the gradient of the mean loss with respect to the logits.
    pub fn record_forward(&self, encoder: &mut wgpu::CommandEncoder) {
        record_pass(encoder, "mlp forward", &self.forward);
    }

    /// Records the backward pass, which writes every element of the gradient buffer (so it
    /// needs no clearing). Call after [`Mlp::record_forward`] in the same encoder.
    pub fn record_backward(&self, encoder: &mut wgpu::CommandEncoder) {
        record_pass(encoder, "mlp backward", &self.backward);
    }

    /// Records a copy of the per-sample loss and correctness (from the last forward pass)
    /// to the readback buffer; [`Mlp::read_metrics`] reads it after the submit.
    pub fn record_metrics_copy(&self, encoder: &mut wgpu::CommandEncoder) {
        let bytes = (self.samples * 4) as u64;
        encoder.copy_buffer_to_buffer(&self.acts.loss, 0, &self.metrics_readback, 0, bytes);
        encoder.copy_buffer_to_buffer(&self.acts.correct, 0, &self.metrics_readback, bytes, bytes);
    }

    /// Waits for the submitted work and sums what [`Mlp::record_metrics_copy`] copied.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_metrics(&self) -> Result<Metrics, BoxError> {
        let (sender, receiver) = mpsc::channel();
        self.metrics_readback.map_async(wgpu::MapMode::Read, .., move |result| {
            // The receiver waits below, so the send cannot fail.
            let _ = sender.send(result);
        });
        self.device.poll(wgpu::PollType::wait_indefinitely())?;
        receiver.recv()??;
        self.sum_mapped_metrics()
    }

    /// [`Mlp::read_metrics`] without blocking: it awaits the mapping, which a browser
    /// completes from its event loop. (The native trainer blocks instead.)
    #[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
    pub async fn read_metrics_async(&self) -> Result<Metrics, BoxError> {
        let (sender, receiver) = futures_intrusive::channel::shared::oneshot_channel();
        self.metrics_readback.map_async(wgpu::MapMode::Read, .., move |result| {
            sender.send(result).ok();
        });
        // Native wgpu completes mappings only when polled; a browser needs no poll.
        #[cfg(not(target_arch = "wasm32"))]
        self.device.poll(wgpu::PollType::wait_indefinitely())?;
        match receiver.receive().await {
            Some(result) => result?,
            None => return Err("the metrics readback was dropped before it was mapped".into()),
        }
        self.sum_mapped_metrics()
    }

    /// Sums the mapped readback buffer's per-sample values, then unmaps it.
    fn sum_mapped_metrics(&self) -> Result<Metrics, BoxError> {
        let (loss, correct) = {
            let view = self.metrics_readback.get_mapped_range(..)?;
            let (loss, correct) = view.split_at(self.samples * 4);
            let loss: Vec<f32> = bytemuck::pod_collect_to_vec(loss);
            let correct: Vec<u32> = bytemuck::pod_collect_to_vec(correct);
            (loss.iter().map(|l| f64::from(*l)).sum::<f64>(), correct.iter().filter(|c| **c != 0).count())
        };
        self.metrics_readback.unmap();
        Ok(Metrics { loss: loss / self.samples as f64, correct, samples: self.samples })
    }

    /// Runs the forward pass alone in a submit of its own and returns the metrics: the loss
    /// and accuracy of the current parameters (after the last optimizer step).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn evaluate(&self) -> Result<Metrics, BoxError> {
        self.submit_evaluation();
        self.read_metrics()
    }

    /// [`Mlp::evaluate`] without blocking.
    #[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
    pub async fn evaluate_async(&self) -> Result<Metrics, BoxError> {
        self.submit_evaluation();
        self.read_metrics_async().await
    }

    fn submit_evaluation(&self) {
        let mut encoder = self.device.create_command_encoder(&Default::default());
        self.record_forward(&mut encoder);
        self.record_metrics_copy(&mut encoder);
        self.queue.submit([encoder.finish()]);
    }
}

/// f16 parameters need `SHADER_F16` for the kernels' `array<f16>`.
fn check_dtype(device: &wgpu::Device, dtype: DType) -> Result<(), BoxError> {
    match dtype {
        DType::F32 | DType::BF16 => Ok(()),
        DType::F16 if device.features().contains(wgpu::Features::SHADER_F16) => Ok(()),
        DType::F16 => Err("f16 parameters need the adapter feature SHADER_F16, which this device lacks \
                           (run with --dtype f32, or pick another adapter with WGPU_ADAPTER_NAME)"
            .into()),
        other => Err(format!("the model stores its parameters as f32, f16 or bf16, not {other:?}").into()),
    }
}

/// The layer kernels' workgroup rows are blocks of samples, at most a dispatch's worth.
fn check_rows(device: &wgpu::Device, samples: usize) -> Result<(), BoxError> {
    let blocks = samples.div_ceil(ROWS_PER_BLOCK);
    if blocks > device.limits().max_compute_workgroups_per_dimension as usize {
        return Err(format!("{samples} samples need more than one dispatch's rows of workgroups").into());
    }
    Ok(())
}

/// `values` as the little-endian bytes of `dtype`, each rounded to nearest.
fn encode(dtype: DType, values: &[f64]) -> Vec<u8> {
    match dtype {
        DType::F64 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::F32 => values.iter().flat_map(|v| (*v as f32).to_le_bytes()).collect(),
        DType::F16 => values.iter().flat_map(|v| half::f16::from_f64(*v).to_le_bytes()).collect(),
        DType::BF16 => values.iter().flat_map(|v| bf16_nearest(*v).to_le_bytes()).collect(),
        other => panic!("the MLP is not built in {other:?}"),
    }
}

/// `value` rounded to the nearest bfloat16, ties to even. Rounding to f32 first is exact
/// except where it lands on a bfloat16 halfway point that `value` is not on; there the
/// direction comes from `value` (`half::bf16::from_f64` rounds through f32 without this).
fn bf16_nearest(value: f64) -> half::bf16 {
    let single = value as f32;
    let bits = single.to_bits();
    if !single.is_nan() && bits & 0xffff == 0x8000 && f64::from(single) != value {
        let truncated = bits & 0xffff_0000;
        let up = value.abs() > f64::from(single).abs();
        return half::bf16::from_bits((if up { truncated + 0x1_0000 } else { truncated } >> 16) as u16);
    }
    half::bf16::from_f32(single)
}

/// The packed parameter buffer, holding He initial values in `dtype`, and the packed f32
/// gradient buffer.
fn param_buffers(device: &wgpu::Device, dtype: DType, seed: u64) -> (wgpu::Buffer, wgpu::Buffer) {
    let params = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some("mlp params"),
        contents: &padded(encode(dtype, &he_init(seed))),
        // STORAGE for the kernels and the optimizer; COPY_SRC for checkpoints (and the
        // optimizer's master copies); COPY_DST to load a checkpoint.
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
    });
    let grads = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("mlp grads"),
        size: (param_count() * 4) as u64,
        // COPY_SRC so a test can compare them with a CPU reference.
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    (params, grads)
}

/// Pads to whole 4-byte words: storage bindings and buffer copies are in words.
fn padded(mut bytes: Vec<u8>) -> Vec<u8> {
    bytes.resize(bytes.len().next_multiple_of(4), 0);
    bytes
}

fn record_pass(encoder: &mut wgpu::CommandEncoder, label: &str, dispatches: &[Dispatch]) {
    let mut pass = encoder
        .begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(label), timestamp_writes: None });
    // wgpu orders the dispatches of a pass (a barrier where one reads what another wrote).
    for dispatch in dispatches {
        dispatch.record(&mut pass);
    }
}

/// Compiles `mlp.wgsl` for the parameter dtype, turning a shader or pipeline error into an
/// error value instead of wgpu's default panic.
async fn compile(device: &wgpu::Device, dtype: DType) -> Result<Pipelines, BoxError> {
    let header = match dtype {
        DType::F16 => "enable f16;\nalias Param = f16;\nfn param(i: u32) -> f32 { return f32(params[i]); }\n",
        // Pairs of bf16 bits in each word, low half first.
        DType::BF16 => {
            "alias Param = u32;\n\
             fn param(i: u32) -> f32 { return bitcast<f32>(((params[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu) << 16u); }\n"
        }
        _ => "alias Param = f32;\nfn param(i: u32) -> f32 { return params[i]; }\n",
    };
    let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
    // A driver that fails to compile a shader that validated reports an internal error.
    let internal = device.push_error_scope(wgpu::ErrorFilter::Internal);
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("mlp.wgsl"),
        source: wgpu::ShaderSource::Wgsl(format!("{header}{}", include_str!("mlp.wgsl")).into()),
    });
    let pipeline = |entry: &str| {
        device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(entry),
            // Auto layout: each entry point's bind group holds only the bindings it uses.
            layout: None,
            module: &module,
            entry_point: Some(entry),
            compilation_options: Default::default(),
            cache: None,
        })
    };
    let pipelines = Pipelines {
        forward: pipeline("forward"),
        softmax_xent: pipeline("softmax_xent"),
        weight_grad: pipeline("weight_grad"),
        input_grad: pipeline("input_grad"),
    };
    let internal = internal.pop().await;
    match internal.or(validation.pop().await) {
        Some(error) => Err(format!("compiling mlp.wgsl: {error}").into()),
        None => Ok(pipelines),
    }
}

impl Activations {
    fn new(device: &wgpu::Device, data: &Spirals) -> Self {
        let n = data.len();
        let storage = |label: &str, floats: usize| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: (floats * 4) as u64,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            })
        };
        let init = |label: &str, contents: &[u8]| {
            device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents,
                usage: wgpu::BufferUsages::STORAGE,
            })
        };
        Activations {
            layers: [
                init("mlp inputs", bytemuck::cast_slice(&data.features)),
                storage("mlp h1", n * WIDTHS[1]),
                storage("mlp h2", n * WIDTHS[2]),
                storage("mlp logits", n * WIDTHS[3]),
            ],
            deltas: [
                storage("mlp dz1", n * WIDTHS[1]),
                storage("mlp dz2", n * WIDTHS[2]),
                storage("mlp dlogits", n * WIDTHS[3]),
            ],
            labels: init("mlp labels", bytemuck::cast_slice(&data.labels)),
            loss: storage("mlp loss", n),
            correct: storage("mlp correct", n),
        }
    }
}

/// The `Dims` uniform of each layer (see `mlp.wgsl`), written once.
fn layer_dims(device: &wgpu::Device, samples: usize, layout: &[ParamSpec]) -> Vec<wgpu::Buffer> {
    (0..WIDTHS.len() - 1)
        .map(|layer| {
            let (weight, bias) = (&layout[2 * layer], &layout[2 * layer + 1]);
            let relu = u32::from(layer + 2 < WIDTHS.len());
            let words: [u32; 8] = [
                samples as u32,
                WIDTHS[layer] as u32,
                WIDTHS[layer + 1] as u32,
                weight.offset as u32,
                bias.offset as u32,
                relu,
                0,
                0,
            ];
            device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(&format!("mlp dims fc{}", layer + 1)),
                contents: bytemuck::cast_slice(&words),
                usage: wgpu::BufferUsages::UNIFORM,
            })
        })
        .collect()
}

/// What building the bind groups needs, so each dispatch is one short expression.
struct Wiring<'a> {
    device: &'a wgpu::Device,
    pipelines: &'a Pipelines,
    dims: &'a [wgpu::Buffer],
    params: &'a wgpu::Buffer,
    grads: &'a wgpu::Buffer,
}

impl Wiring<'_> {
    /// A dispatch of `pipeline` with the given `(binding, buffer)` pairs.
    fn dispatch(
        &self,
        pipeline: &wgpu::ComputePipeline,
        entries: &[(u32, &wgpu::Buffer)],
        (columns, rows): (usize, usize),
    ) -> Dispatch {
        let entries: Vec<wgpu::BindGroupEntry> = entries
            .iter()
            .map(|(binding, buffer)| wgpu::BindGroupEntry {
                binding: *binding,
                resource: buffer.as_entire_binding(),
            })
            .collect();
        let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("mlp bind group"),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        Dispatch { pipeline: pipeline.clone(), bind_group, columns: columns as u32, rows: rows as u32 }
    }

    /// Three layers, then the loss with its gradient with respect to the logits.
    fn forward(&self, acts: &Activations, n: usize) -> Vec<Dispatch> {
        let mut dispatches: Vec<Dispatch> = (0..3)
            .map(|l| {
                let entries =
                    [(0, &self.dims[l]), (1, self.params), (2, &acts.layers[l]), (4, &acts.layers[l + 1])];
                self.dispatch(&self.pipelines.forward, &entries, (WIDTHS[l + 1], n.div_ceil(ROWS_PER_BLOCK)))
            })
            .collect();
        let entries = [
            (0, &self.dims[2]),
            (2, &acts.layers[3]),
            (4, &acts.deltas[2]),
            (6, &acts.labels),
            (7, &acts.loss),
            (8, &acts.correct),
        ];
        dispatches.push(self.dispatch(&self.pipelines.softmax_xent, &entries, (n, 1)));
        dispatches
    }

    /// From the last layer down: each layer's weight and bias gradients, then (except for
    /// the first layer, whose input is the data) the delta of the layer below.
    fn backward(&self, acts: &Activations, n: usize) -> Vec<Dispatch> {
        let mut dispatches = Vec::new();
        for l in (0..3).rev() {
            let (input, delta) = (&acts.layers[l], &acts.deltas[l]);
            let entries = [(0, &self.dims[l]), (2, input), (3, delta), (5, self.grads)];
            let grid = (WIDTHS[l] + 1, WIDTHS[l + 1].div_ceil(ROWS_PER_BLOCK));
            dispatches.push(self.dispatch(&self.pipelines.weight_grad, &entries, grid));
            if l > 0 {
                let entries =
                    [(0, &self.dims[l]), (1, self.params), (2, input), (3, delta), (4, &acts.deltas[l - 1])];
                dispatches.push(self.dispatch(
                    &self.pipelines.input_grad,
                    &entries,
                    (WIDTHS[l], n.div_ceil(ROWS_PER_BLOCK)),
                ));
            }
        }
        dispatches
    }
}
