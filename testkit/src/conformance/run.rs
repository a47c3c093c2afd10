//! Running a case on a backend and comparing every expected output.

#[cfg(feature = "cpu")]
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostTensor};
use wgpu_optim::ops::directml::{self, AdamOptimizerDesc, TrainingStep};
use wgpu_optim::ops::{self, onnx, Update};
use wgpu_optim::{
    Adagrad, Adam, Algorithm, DType, DmlAdam, Error, GpuContext, GradClip, MomentumMode, NormType,
    OnnxAdagrad, OnnxAdam, OnnxMomentum, Optimizer, Result, Sgd, StateStorage, Tensor,
};

use wgpu_optim::q8::Q8States;
use wgpu_optim::q8::{self, StoredState};
use wgpu_optim::AdEMAMix;
use wgpu_optim::Lion;
use wgpu_optim::RmsProp;
use wgpu_optim::StateView;

use crate::compare::{compare, compare_codes, Tolerance};
use crate::conformance::case::{Case, Kind, ValueType};
use crate::conformance::inputs::Inputs;
use crate::oracle::{self, clip_grad_norm, Storage, ToLibrary, ToOracle, TorchState};

/// Where a case runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The f64 CPU oracle, rounding what it stores to the storage type.
    Oracle,
    /// The GPU, every output written over its input (the stateful optimizer for trajectories).
    GpuInPlace,
    /// The GPU, every output written to a tensor of its own (the stateless operators).
    GpuOutOfPlace,
    /// As `GpuInPlace`, with f16 stored as pairs in `u32` (the path without `SHADER_F16`).
    GpuPackedF16InPlace,
    /// As `GpuOutOfPlace`, with f16 stored as pairs in `u32`.
    GpuPackedF16OutOfPlace,
    /// The CPU backend (`wgpu_optim::cpu::CpuOptimizer`), for PyTorch trajectories. Runs
    /// with the testkit's `cpu` feature (the library's CPU backend, native builds); without
    /// it a case on this backend is refused.
    Cpu,
}

impl Backend {
    /// The name the runner prints.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Oracle => "oracle",
            Backend::GpuInPlace => "gpu",
            Backend::GpuOutOfPlace => "gpu-out-of-place",
            Backend::GpuPackedF16InPlace => "gpu-packed-f16",
            Backend::GpuPackedF16OutOfPlace => "gpu-packed-f16-oop",
            Backend::Cpu => "cpu",
        }
    }

    /// The backends that tell something about `case`: the packed-f16 ones only where the
    /// case has f16 tensors, the CPU backend for trajectories (it has no stateless
    /// operators; with the `cpu` feature), the oracle alone for an op the crate does not implement yet
    /// ([`Case::oracle_only`]).
    pub fn all_for(case: &Case) -> Vec<Backend> {
        if case.oracle_only() {
            return vec![Backend::Oracle];
        }
        let mut backends = vec![Backend::Oracle, Backend::GpuInPlace, Backend::GpuOutOfPlace];
        if case.tensors.values().any(|t| t.dtype == ValueType::Float(DType::F16)) {
            backends.extend([Backend::GpuPackedF16InPlace, Backend::GpuPackedF16OutOfPlace]);
        }
        // Every trajectory of PyTorch, bitsandbytes and lion-pytorch, and every op of a
        // module of its own, also runs on the CPU backend.
        let cpu_trajectory = ["torch.", "bnb.", "lion."].iter().any(|source| case.op.starts_with(source))
            || super::OWN_OPS.iter().any(|op| op.name == case.op);
        if cfg!(feature = "cpu") && case.kind == Kind::Trajectory && cpu_trajectory {
            backends.push(Backend::Cpu);
        }
        backends
    }

    pub(super) fn in_place(self) -> bool {
        matches!(self, Backend::GpuInPlace | Backend::GpuPackedF16InPlace)
    }
}

/// The verdict on one case and backend.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Every value within tolerance.
    Pass,
    /// At least one value outside tolerance; the first few are described.
    Fail(String),
    /// Not run because the case asks for an op or attribute this reader does not
    /// implement (the reason names it): neither a pass nor a failure of the crate.
    Refused(String),
}

/// One line of the runner's output.
#[derive(Clone, Debug)]
pub struct CaseReport {
    /// The case's name.
    pub case: String,
    /// The backend it ran on.
    pub backend: Backend,
    /// Pass, fail or refusal.
    pub outcome: Outcome,
    /// The largest `|got - want| / (atol + rtol * |want|)` over every compared value
    /// (a pass is at most 1).
    pub worst: f64,
}

type Outputs = Vec<(String, Vec<f64>)>;

/// Runs `case` on `backend` (`ctx` is needed for the GPU backends) and compares; a case
/// that [`Case::check_supported`] refuses is not run and reported as [`Outcome::Refused`],
/// and so is an [oracle-only](Case::oracle_only) case on any backend but the oracle.
/// Blocks on the GPU's readbacks: natively only (a browser uses [`run_case_async`]).
pub fn run_case(case: &Case, backend: Backend, ctx: Option<&GpuContext>) -> Result<CaseReport> {
    pollster::block_on(run_case_async(case, backend, ctx))
}

/// [`run_case`] as a future whose readbacks are awaited, never blocking: the same runner
/// in a browser's main thread, on its WebGPU adapter.
pub async fn run_case_async(case: &Case, backend: Backend, ctx: Option<&GpuContext>) -> Result<CaseReport> {
    let report = |outcome, worst| CaseReport { case: case.name.clone(), backend, outcome, worst };
    if let Err(refusal) = case.check_supported() {
        return Ok(report(Outcome::Refused(refusal.to_string()), 0.0));
    }
    if !cfg!(feature = "cpu") && backend == Backend::Cpu {
        let reason = "the CPU backend: the testkit was built without its `cpu` feature".to_string();
        return Ok(report(Outcome::Refused(reason), 0.0));
    }
    if case.oracle_only() && backend != Backend::Oracle {
        let reason = format!("oracle-checked only: no crate implementation of `{}` yet", case.op);
        return Ok(report(Outcome::Refused(reason), 0.0));
    }
    let chosen;
    let ctx = match (backend, ctx) {
        (Backend::Oracle | Backend::Cpu, _) => None,
        (Backend::GpuPackedF16InPlace | Backend::GpuPackedF16OutOfPlace, Some(ctx)) => {
            chosen = ctx.with_packed_f16(true);
            Some(&chosen)
        }
        // Native f16 wherever the device has it, whichever path it would choose itself.
        (_, Some(ctx)) => {
            chosen = ctx.with_packed_f16(false);
            Some(&chosen)
        }
        (_, None) => return Err(Error::MissingArgument { argument: "ctx", why: "by the GPU backends" }),
    };
    let outputs = match super::run_own(case, backend, ctx).await {
        Some(outputs) => outputs?,
        None => match (case.op.as_str(), case.kind) {
            ("onnx.Adam" | "onnx.Momentum" | "onnx.Adagrad", Kind::Op) => onnx_op(case, backend, ctx).await?,
            ("dml.Adam", Kind::Op) => dml_adam(case, backend, ctx).await?,
            ("torch.Adam" | "torch.AdamW" | "torch.SGD" | "torch.Adagrad", Kind::Trajectory) => {
                torch_trajectory(case, backend, ctx).await?
            }
            ("lion.Lion", Kind::Trajectory) => torch_trajectory(case, backend, ctx).await?,
            ("torch.RMSprop", Kind::Trajectory) => torch_trajectory(case, backend, ctx).await?,
            ("bnb.AdEMAMix", Kind::Trajectory) => ademamix_names(torch_trajectory(case, backend, ctx).await?),
            ("bnb.Adam8bit" | "bnb.AdamW8bit" | "bnb.SGD8bit", Kind::Trajectory) => {
                bnb_trajectory(case, backend, ctx).await?
            }
            ("bnb.Lion8bit" | "bnb.RMSprop8bit", Kind::Trajectory) => {
                bnb_trajectory(case, backend, ctx).await?
            }
            ("bnb.AdEMAMix8bit", Kind::Trajectory) => {
                ademamix8bit_names(bnb_trajectory(case, backend, ctx).await?)
            }
            (op, kind) => {
                return Err(
                    case.bad(format!("{op} ({}) passed the reader's check but has no runner", kind.name()))
                )
            }
        },
    };
    let tolerance = Tolerance::Close { rtol: case.rtol, atol: case.atol };
    let mut worst: f64 = 0.0;
    let mut failures = Vec::new();
    // A trajectory's every expected tensor (all but its inputs) must be produced: a runner
    // that forgot one (the norms of a clipped case) must not pass by omission.
    if case.kind == Kind::Trajectory {
        for name in case.tensors.keys() {
            let input = name.starts_with("param.") || name.starts_with("grad.");
            if !input && !outputs.iter().any(|(produced, _)| produced == name) {
                failures.push(format!("{name}: expected but not produced by {}", backend.name()));
            }
        }
    }
    for (name, got) in &outputs {
        let want = case.tensor(name)?;
        // 8-bit codes and their absmax compare as the format says; everything else as the case.
        let comparison = if want.dtype == ValueType::Integer && name.starts_with("state") {
            compare_codes(got, &want.values)
        } else if want.dtype == ValueType::Integer && name.contains("_codes.") {
            // 4-bit codes (torchao's `exp_avg_codes`, ...), by the same rule.
            compare_codes(got, &want.values)
        } else if name.contains("_scale.") {
            // 4-bit scales, as absmax.
            compare(got, &want.values, Tolerance::Close { rtol: 1e-4, atol: 0.0 })
        } else if name.starts_with("absmax") {
            compare(got, &want.values, Tolerance::Close { rtol: 1e-4, atol: 0.0 })
        } else {
            compare(got, &want.values, tolerance)
        };
        worst = worst.max(comparison.worst);
        if !comparison.passed() {
            failures.push(format!("{name}: {comparison}"));
        }
    }
    let outcome = if failures.is_empty() { Outcome::Pass } else { Outcome::Fail(failures.join("; ")) };
    Ok(report(outcome, worst))
}

fn storage_dtype(case: &Case, name: &str) -> Result<DType> {
    match case.tensor(name)?.dtype {
        ValueType::Float(d) => Ok(d),
        other => Err(case.bad(format!("tensor `{name}` is {other:?}, expected a float tensor"))),
    }
}

fn whole_step(case: &Case, name: &str) -> Result<u64> {
    let t = case.scalar(name)?;
    if t.fract() == 0.0 && t >= 0.0 && t < 2f64.powi(53) {
        Ok(t as u64)
    } else {
        Err(case.bad(format!("`{name}` = {t} is not a whole number >= 0")))
    }
}

/// The tensors a GPU backend writes to: the inputs themselves, or fresh zeroed tensors.
fn destinations(ctx: &GpuContext, backend: Backend, inputs: &[Tensor]) -> Vec<Tensor> {
    inputs
        .iter()
        .map(|t| match backend {
            _ if !backend.in_place() => ctx.zeros("output", t.len, t.dtype),
            _ => t.clone(),
        })
        .collect()
}

/// An ONNX training operator with its attributes read from the case.
enum OnnxOp {
    Adam(OnnxAdam),
    Momentum(OnnxMomentum),
    Adagrad(OnnxAdagrad),
}

impl OnnxOp {
    fn from_case(case: &Case) -> Result<Self> {
        Ok(match case.op.as_str() {
            "onnx.Adam" => OnnxOp::Adam(OnnxAdam {
                alpha: case.attr_f64("alpha", 0.9)?,
                beta: case.attr_f64("beta", 0.999)?,
                epsilon: case.attr_f64("epsilon", 1e-6)?,
                norm_coefficient: case.attr_f64("norm_coefficient", 0.0)?,
                norm_coefficient_post: case.attr_f64("norm_coefficient_post", 0.0)?,
            }),
            "onnx.Momentum" => OnnxOp::Momentum(OnnxMomentum {
                alpha: case.attr_f64("alpha", 0.9)?,
                beta: case.attr_f64("beta", 1.0)?,
                mode: match case.attr_str("mode", "standard")? {
                    "standard" => MomentumMode::Standard,
                    "nesterov" => MomentumMode::Nesterov,
                    other => return Err(case.bad(format!("mode `{other}` is neither standard nor nesterov"))),
                },
                norm_coefficient: case.attr_f64("norm_coefficient", 0.0)?,
            }),
            _ => OnnxOp::Adagrad(OnnxAdagrad {
                decay_factor: case.attr_f64("decay_factor", 0.0)?,
                epsilon: case.attr_f64("epsilon", 1e-6)?,
                norm_coefficient: case.attr_f64("norm_coefficient", 0.0)?,
            }),
        })
    }

    /// The variadic input groups after R and T, in the operator's order.
    fn groups(&self) -> &'static [&'static str] {
        match self {
            OnnxOp::Adam(_) => &["X", "G", "V", "H"],
            OnnxOp::Momentum(_) => &["X", "G", "V"],
            OnnxOp::Adagrad(_) => &["X", "G", "H"],
        }
    }

    /// The oracle's outputs for one tensor, in the operator's output order.
    fn oracle(&self, r: f64, t: u64, inputs: &[Vec<f64>]) -> Vec<Vec<f64>> {
        let i = inputs;
        match self {
            OnnxOp::Adam(a) => {
                let (x, v, h) = oracle::onnx_adam(&a.to_oracle(), r, t, &i[0], &i[1], &i[2], &i[3]);
                vec![x, v, h]
            }
            OnnxOp::Momentum(a) => {
                let (x, v) = oracle::onnx_momentum(&a.to_oracle(), r, t, &i[0], &i[1], &i[2]);
                vec![x, v]
            }
            OnnxOp::Adagrad(a) => {
                let (x, h) = oracle::onnx_adagrad(&a.to_oracle(), r, t, &i[0], &i[1], &i[2]);
                vec![x, h]
            }
        }
    }

    fn record(
        &self,
        ctx: &GpuContext,
        encoder: &mut wgpu::CommandEncoder,
        r: f64,
        t: u64,
        inputs: &[Tensor],
        outputs: &[Option<Tensor>],
    ) -> Result<()> {
        match self {
            OnnxOp::Adam(a) => onnx::adam(ctx, encoder, a, r, t, inputs, outputs),
            OnnxOp::Momentum(a) => onnx::momentum(ctx, encoder, a, r, t, inputs, outputs),
            OnnxOp::Adagrad(a) => onnx::adagrad(ctx, encoder, a, r, t, inputs, outputs),
        }
    }
}

async fn onnx_op(case: &Case, backend: Backend, ctx: Option<&GpuContext>) -> Result<Outputs> {
    let op = OnnxOp::from_case(case)?;
    let r = case.scalar("R")?;
    let t = whole_step(case, "T")?;
    let n = case.count;
    let groups = op.groups();
    // Every group but the gradient has an output `<group>_new`.
    let updated: Vec<&str> = groups.iter().copied().filter(|g| *g != "G").collect();
    let output_names: Vec<String> =
        updated.iter().flat_map(|g| (0..n).map(move |i| format!("{g}_new.{i}"))).collect();
    let dtype = storage_dtype(case, "X.0")?;
    let Some(ctx) = ctx else {
        let mut per_tensor = Vec::new();
        for i in 0..n {
            let inputs = groups
                .iter()
                .map(|g| case.tensor(&format!("{g}.{i}")).map(|t| t.values.clone()))
                .collect::<Result<Vec<_>>>()?;
            per_tensor.push(op.oracle(r, t, &inputs));
        }
        // Operator order: every tensor's first output, then every tensor's second, ...
        let values = (0..updated.len()).flat_map(|k| per_tensor.iter().map(move |out| out[k].clone()));
        return Ok(output_names.into_iter().zip(values.map(|v| round_all(v, dtype))).collect());
    };
    let mut inputs = Vec::with_capacity(groups.len() * n);
    for g in groups {
        for i in 0..n {
            let name = format!("{g}.{i}");
            inputs.push(ctx.upload(&name, &case.tensor(&name)?.values, storage_dtype(case, &name)?));
        }
    }
    let updated_inputs: Vec<Tensor> = groups
        .iter()
        .enumerate()
        .filter(|(_, g)| **g != "G")
        .flat_map(|(k, _)| inputs[k * n..(k + 1) * n].iter().cloned())
        .collect();
    let written = destinations(ctx, backend, &updated_inputs);
    let outputs: Vec<Option<Tensor>> =
        written.iter().map(|t| (!backend.in_place()).then(|| t.clone())).collect();
    ctx.submit(&case.op, |encoder| op.record(ctx, encoder, r, t, &inputs, &outputs))?;
    let mut outputs = Vec::with_capacity(written.len());
    for (name, t) in output_names.into_iter().zip(&written) {
        outputs.push((name, ctx.read_async(t).await?));
    }
    Ok(outputs)
}

async fn dml_adam(case: &Case, backend: Backend, ctx: Option<&GpuContext>) -> Result<Outputs> {
    let scalars = DmlAdam {
        learning_rate: case.attr_f64("LearningRate", 0.0)?,
        beta1: case.attr_f64("Beta1", 0.0)?,
        beta2: case.attr_f64("Beta2", 0.0)?,
        epsilon: case.attr_f64("Epsilon", 0.0)?,
    };
    let step = case.scalar("TrainingStepTensor")?;
    let input_names =
        ["InputParametersTensor", "InputFirstMomentTensor", "InputSecondMomentTensor", "GradientTensor"];
    let output_names = ["OutputParametersTensor", "OutputFirstMomentTensor", "OutputSecondMomentTensor"];
    let dtype = storage_dtype(case, input_names[0])?;
    let Some(ctx) = ctx else {
        let t = TrainingStep::Float(step).value()?;
        scalars.validate(t)?;
        let get = |name: &str| case.tensor(name).map(|t| t.values.clone());
        let out = oracle::dml_adam(
            &scalars.to_oracle(),
            t,
            &get(input_names[0])?,
            &get(input_names[1])?,
            &get(input_names[2])?,
            &get(input_names[3])?,
        );
        return Ok(output_names
            .iter()
            .map(|n| n.to_string())
            .zip([out.0, out.1, out.2].map(|v| round_all(v, dtype)))
            .collect());
    };
    let inputs = input_names
        .iter()
        .map(|name| Ok(ctx.upload(name, &case.tensor(name)?.values, dtype)))
        .collect::<Result<Vec<_>>>()?;
    let written = destinations(ctx, backend, &inputs[..3]);
    let desc = AdamOptimizerDesc {
        input_parameters_tensor: inputs[0].clone(),
        input_first_moment_tensor: inputs[1].clone(),
        input_second_moment_tensor: inputs[2].clone(),
        gradient_tensor: inputs[3].clone(),
        training_step_tensor: TrainingStep::Float(step),
        output_parameters_tensor: written[0].clone(),
        output_first_moment_tensor: written[1].clone(),
        output_second_moment_tensor: written[2].clone(),
        scalars,
    };
    ctx.submit("dml.Adam", |encoder| directml::adam(ctx, encoder, &desc))?;
    let mut outputs = Vec::with_capacity(written.len());
    for (name, t) in output_names.iter().zip(&written) {
        outputs.push((name.to_string(), ctx.read_async(t).await?));
    }
    Ok(outputs)
}

/// The PyTorch optimizer a trajectory case describes.
fn torch_algorithm(case: &Case) -> Result<Algorithm> {
    let maximize = case.attr_bool("maximize", false)?;
    let weight_decay = case.attr_f64("weight_decay", 0.0)?;
    Ok(match case.op.as_str() {
        "torch.SGD" => Algorithm::Sgd(Sgd {
            lr: case.attr_f64("lr", 1e-3)?,
            momentum: case.attr_f64("momentum", 0.0)?,
            dampening: case.attr_f64("dampening", 0.0)?,
            weight_decay,
            nesterov: case.attr_bool("nesterov", false)?,
            maximize,
        }),
        "torch.Adagrad" => Algorithm::Adagrad(Adagrad {
            lr: case.attr_f64("lr", 1e-2)?,
            lr_decay: case.attr_f64("lr_decay", 0.0)?,
            weight_decay,
            initial_accumulator_value: case.attr_f64("initial_accumulator_value", 0.0)?,
            eps: case.attr_f64("eps", 1e-10)?,
            maximize,
        }),
        "bnb.AdEMAMix" => Algorithm::AdEMAMix(ademamix_attributes(case)?),
        "lion.Lion" => {
            let (beta1, beta2) = case.attr_pair("betas", (0.9, 0.99))?;
            Algorithm::Lion(Lion { lr: case.attr_f64("lr", 1e-4)?, beta1, beta2, weight_decay })
        }
        "torch.RMSprop" => Algorithm::RmsProp(RmsProp {
            lr: case.attr_f64("lr", 1e-2)?,
            alpha: case.attr_f64("alpha", 0.99)?,
            eps: case.attr_f64("eps", 1e-8)?,
            weight_decay,
            momentum: case.attr_f64("momentum", 0.0)?,
            centered: case.attr_bool("centered", false)?,
            maximize,
        }),
        op => Algorithm::Adam(adam_attributes(case, op == "torch.AdamW")?),
    })
}

/// An Adam case's attributes, with PyTorch's defaults; `decoupled`: AdamW's weight decay
/// (default 0.01), else L2 (default 0).
fn adam_attributes(case: &Case, decoupled: bool) -> Result<Adam> {
    let (beta1, beta2) = case.attr_pair("betas", (0.9, 0.999))?;
    Ok(Adam {
        lr: case.attr_f64("lr", 1e-3)?,
        beta1,
        beta2,
        eps: case.attr_f64("eps", 1e-8)?,
        weight_decay: case.attr_f64("weight_decay", if decoupled { 0.01 } else { 0.0 })?,
        decoupled_weight_decay: decoupled,
        amsgrad: case.attr_bool("amsgrad", false)?,
        maximize: case.attr_bool("maximize", false)?,
    })
}

/// A PyTorch optimizer run for `steps` steps from zero state: on the oracle, through the
/// stateful optimizer (in place), or through the stateless `ops::update` with every output
/// ping-ponging between two sets of tensors (out of place).
/// The clipping a PyTorch trajectory asks for (`max_norm`, `norm_type`), if any.
fn torch_clip(case: &Case) -> Result<Option<GradClip>> {
    if !case.attributes.contains_key("max_norm") {
        return Ok(None);
    }
    let max_norm = case.attr_f64("max_norm", 0.0)?;
    let norm_type = match case.attributes.get("norm_type") {
        None => NormType::L2,
        Some(serde_json::Value::String(s)) if s == "inf" => NormType::Inf,
        Some(v) => match v.as_f64().and_then(NormType::from_torch_value) {
            Some(norm) => norm,
            None => return Err(case.bad(format!("norm_type {v}: only 2 and \"inf\" are implemented"))),
        },
    };
    Ok(Some(GradClip { max_norm, norm_type }))
}

/// A PyTorch trajectory: `steps` calls of `step()` (each after `clip_grad_norm_` when the
/// case clips) from zero state. The oracle and the CPU backend run it as the source did;
/// `GpuInPlace` runs the stateful [`Optimizer`] on a tensor per buffer; `GpuOutOfPlace` runs
/// the stateless `ops::update`, writing each step's outputs to other tensors, or, for a
/// clipped case (clipping belongs to the stateful optimizer), the [`Optimizer`] over
/// parameters and gradients packed at odd offsets into one buffer each.
async fn torch_trajectory(case: &Case, backend: Backend, ctx: Option<&GpuContext>) -> Result<Outputs> {
    let algorithm = torch_algorithm(case)?;
    let clip = torch_clip(case)?;
    let steps = case.steps;
    let inputs = Inputs::read(case)?;
    let dtype = inputs.dtype;
    let kinds = algorithm.state_kinds();
    let name_of = |k: usize, i: usize| match k {
        0 => format!("param_out.{i}"),
        k => format!("{}.{i}", kinds[k - 1].torch_name()),
    };
    let mut outputs: Outputs = Vec::new();
    let mut norms = Vec::with_capacity(steps);
    let options = Optimizer::builder().grad_clip(clip);
    match (backend, ctx) {
        (Backend::Oracle, _) => {
            let mut values = inputs.initial();
            let mut states: Vec<TorchState> = values
                .iter()
                .map(|p| {
                    TorchState::new(algorithm.to_oracle(), p.len())
                        .storing(dtype.to_oracle(), dtype.to_oracle())
                })
                .collect();
            for k in 0..steps {
                let mut g = inputs.grads_at(k);
                if let Some(clip) = &clip {
                    norms.push(clip_grad_norm(&mut g, &clip.to_oracle()));
                }
                for ((param, state), g) in values.iter_mut().zip(&mut states).zip(&g) {
                    state.step(param, g);
                }
            }
            for (i, (param, state)) in values.into_iter().zip(states).enumerate() {
                for (k, values) in std::iter::once(param).chain(state.tensors()).enumerate() {
                    outputs.push((name_of(k, i), round_all(values, dtype)));
                }
            }
        }
        #[cfg(feature = "cpu")]
        (Backend::Cpu, _) => {
            let mut param_tensors = inputs.host_params()?;
            let views: Vec<HostSlice<'_>> = param_tensors.iter().map(HostTensor::as_slice).collect();
            let mut optimizer = CpuOptimizer::builder().grad_clip(clip).build(algorithm, &views)?;
            for k in 0..steps {
                inputs.cpu_step(&mut optimizer, &mut param_tensors, k)?;
                norms.extend(optimizer.grad_norm());
            }
            for (i, param) in param_tensors.iter().enumerate() {
                outputs.push((name_of(0, i), param.to_f64()));
                for (k, kind) in kinds.iter().enumerate() {
                    let state = optimizer
                        .state(i, *kind)
                        .and_then(|s| s.dense())
                        .ok_or_else(|| case.bad("missing state".into()))?;
                    outputs.push((name_of(k + 1, i), state.to_f64()));
                }
            }
        }
        (_, None) => return Err(Error::MissingArgument { argument: "ctx", why: "by the GPU backends" }),
        (_, Some(ctx)) if backend.in_place() || clip.is_some() => {
            let (param_tensors, grad_tensors) = inputs.gpu_tensors(ctx, backend.in_place()).await?;
            let mut optimizer = options.build(ctx, algorithm, &param_tensors)?;
            for k in 0..steps {
                inputs.write_grads(ctx, &grad_tensors, k).await?;
                optimizer.step(&grad_tensors)?;
                if clip.is_some() {
                    norms.push(optimizer.grad_norm_async().await?);
                }
            }
            for (i, param) in param_tensors.iter().enumerate() {
                outputs.push((name_of(0, i), ctx.read_async(param).await?));
                for (k, kind) in kinds.iter().enumerate() {
                    let state = optimizer
                        .state_async(i, *kind)
                        .await?
                        .and_then(|s| s.dense())
                        .ok_or_else(|| case.bad("missing state".into()))?;
                    outputs.push((name_of(k + 1, i), ctx.read_async(state).await?));
                }
            }
        }
        (_, Some(ctx)) => outputs = stateless_trajectory(case, algorithm, &inputs, ctx).await?,
    }
    if clip.is_some() {
        outputs.push(("total_norm".into(), norms));
    }
    Ok(outputs)
}

/// Tensors of `lengths` elements of `dtype` packed one after another into one buffer, each
/// starting one element past the previous one's end (so none starts on a word boundary of
/// its own choosing).
pub(super) fn packed(ctx: &GpuContext, label: &str, lengths: &[u64], dtype: DType) -> Vec<Tensor> {
    let total: u64 = lengths.iter().map(|l| l + 1).sum::<u64>() + 1;
    let buffer = ctx.zeros(label, total, dtype).buffer;
    let mut offset = dtype.size();
    lengths
        .iter()
        .map(|&len| {
            let t = Tensor { buffer: buffer.clone(), offset, len, dtype };
            offset += (len + 1) * dtype.size();
            t
        })
        .collect()
}

/// The stateless path: `ops::update` for every step, outputs to other tensors each time.
async fn stateless_trajectory(
    case: &Case,
    algorithm: Algorithm,
    inputs: &Inputs<'_>,
    ctx: &GpuContext,
) -> Result<Outputs> {
    let dtype = inputs.dtype;
    let kinds = algorithm.state_kinds();
    let name_of = |k: usize, i: usize| match k {
        0 => format!("param_out.{i}"),
        k => format!("{}.{i}", kinds[k - 1].torch_name()),
    };
    // Per parameter: the parameter followed by its state tensors.
    let mut current: Vec<Vec<Tensor>> = inputs
        .params
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let len = p.values.len() as u64;
            let mut set = vec![ctx.upload(&format!("param.{i}"), &p.values, dtype)];
            set.extend(kinds.iter().map(|_| ctx.zeros("state", len, dtype)));
            set
        })
        .collect();
    let grad_tensors: Vec<Tensor> = current.iter().map(|s| ctx.zeros("grad", s[0].len, dtype)).collect();
    let mut other: Vec<Vec<Tensor>> =
        current.iter().map(|set| set.iter().map(|t| ctx.zeros("out", t.len, dtype)).collect()).collect();
    if let Algorithm::Adagrad(c) = algorithm {
        for set in &current {
            for t in &set[1..] {
                ctx.write_async(t, &vec![c.initial_accumulator_value; t.len as usize]).await?;
            }
        }
    }
    for k in 0..case.steps {
        inputs.write_grads(ctx, &grad_tensors, k).await?;
        let updates: Vec<Update> = current
            .iter()
            .zip(&other)
            .zip(&grad_tensors)
            .map(|((src, dst), g)| Update {
                param: src[0].clone(),
                grad: g.clone(),
                state: src[1..].to_vec(),
                param_out: Some(dst[0].clone()),
                state_out: dst[1..].iter().cloned().map(Some).collect(),
                param_copy: None,
            })
            .collect();
        ctx.submit(&case.op, |encoder| ops::update(ctx, encoder, &algorithm, k as u64 + 1, &updates))?;
        std::mem::swap(&mut current, &mut other);
    }
    let mut outputs = Vec::new();
    for (i, set) in current.iter().enumerate() {
        for (k, t) in set.iter().enumerate() {
            outputs.push((name_of(k, i), ctx.read_async(t).await?));
        }
    }
    Ok(outputs)
}

fn round_all(values: Vec<f64>, dtype: DType) -> Vec<f64> {
    values.into_iter().map(|v| dtype.to_oracle().round(v)).collect()
}

/// A bitsandbytes 8-bit trajectory's algorithm in this crate's terms (Adam8bit and AdamW8bit
/// both decay decoupled, so both are AdamW here) and its [`Q8States`].
fn bnb_algorithm(case: &Case) -> Result<(Algorithm, Q8States)> {
    let block_size = case.attr_f64("block_size", q8::BLOCK_SIZE as f64)?;
    if block_size != q8::BLOCK_SIZE as f64 {
        return Err(case.bad(format!("block_size {block_size}: only {} is implemented", q8::BLOCK_SIZE)));
    }
    let min_8bit_size = case.attr_f64("min_8bit_size", q8::MIN_8BIT_SIZE as f64)?;
    let config = Q8States { min_8bit_size: min_8bit_size as u64 };
    let algorithm = if case.op == "bnb.AdEMAMix8bit" {
        Algorithm::AdEMAMix(ademamix_attributes(case)?)
    } else if case.op == "bnb.Lion8bit" {
        let (beta1, beta2) = case.attr_pair("betas", (0.9, 0.99))?;
        let weight_decay = case.attr_f64("weight_decay", 0.0)?;
        Algorithm::Lion(Lion { lr: case.attr_f64("lr", 1e-4)?, beta1, beta2, weight_decay })
    } else if case.op == "bnb.RMSprop8bit" {
        // bitsandbytes' constructor refuses centered RMSprop and alpha 0; its kernels take
        // `momentum` as their `beta2` and never read it, so it is run as 0.
        let defaults = RmsProp { lr: 1e-2, ..RmsProp::default() };
        if case.attr_bool("centered", false)? {
            return Err(case.bad("centered: bitsandbytes' RMSprop8bit refuses centered RMSprop".into()));
        }
        let alpha = case.attr_f64("alpha", defaults.alpha)?;
        if alpha == 0.0 {
            return Err(case.bad("alpha 0: bitsandbytes' RMSprop8bit refuses it".into()));
        }
        let _ignored = case.attr_f64("momentum", 0.0)?;
        Algorithm::RmsProp(RmsProp {
            lr: case.attr_f64("lr", defaults.lr)?,
            alpha,
            eps: case.attr_f64("eps", defaults.eps)?,
            weight_decay: case.attr_f64("weight_decay", 0.0)?,
            ..defaults
        })
    } else if case.op == "bnb.SGD8bit" {
        let dampening = case.attr_f64("dampening", 0.0)?;
        if dampening != 0.0 {
            return Err(case.bad(format!("dampening {dampening}: bitsandbytes' 8-bit SGD has none")));
        }
        Algorithm::Sgd(Sgd {
            lr: case.attr_f64("lr", 1e-3)?,
            momentum: case.attr_f64("momentum", 0.0)?,
            weight_decay: case.attr_f64("weight_decay", 0.0)?,
            ..Sgd::default()
        })
    } else {
        // Both decay decoupled; only their default weight decay differs.
        let weight_decay =
            case.attr_f64("weight_decay", if case.op == "bnb.AdamW8bit" { 0.01 } else { 0.0 })?;
        Algorithm::Adam(Adam { weight_decay, ..adam_attributes(case, true)? })
    };
    Ok((algorithm, config))
}

/// A bitsandbytes 8-bit trajectory from zero state: the oracle's transcription of
/// bitsandbytes' reference, the [`CpuOptimizer`] and the GPU [`Optimizer`] with
/// [`Q8States`], each tensor in a buffer of its own (`GpuInPlace`) or all packed at odd
/// offsets into one buffer for parameters and one for gradients (`GpuOutOfPlace`: 8-bit
/// state has no stateless operator).
async fn bnb_trajectory(case: &Case, backend: Backend, ctx: Option<&GpuContext>) -> Result<Outputs> {
    let (algorithm, config) = bnb_algorithm(case)?;
    let kinds = algorithm.state_kinds();
    let (n, steps) = (case.count, case.steps);
    let inputs = Inputs::read(case)?;
    let mut finals: Vec<(Vec<f64>, Vec<StoredState>)> = Vec::with_capacity(n);
    match (backend, ctx) {
        (Backend::Oracle, _) => {
            for (i, mut values) in inputs.initial().into_iter().enumerate() {
                let quantized = config.quantizes(values.len() as u64);
                let mut states: Vec<oracle::State8bit> =
                    kinds.iter().map(|_| oracle::State8bit::zeros(values.len(), quantized)).collect();
                for k in 0..steps {
                    let g = inputs.grad(i, k);
                    match (algorithm, &mut states[..]) {
                        (Algorithm::Adam(a), [m, v]) => {
                            let config = oracle::BnbAdam {
                                lr: a.lr,
                                beta1: a.beta1,
                                beta2: a.beta2,
                                eps: a.eps,
                                weight_decay: a.weight_decay,
                            };
                            oracle::bnb_adam8bit_step(&config, k as u64 + 1, &mut values, g, m, v)
                                .map_err(|e| e.to_library())?
                        }
                        (Algorithm::Sgd(s), [b]) => {
                            let config = oracle::BnbSgd {
                                lr: s.lr,
                                momentum: s.momentum,
                                weight_decay: s.weight_decay,
                            };
                            oracle::bnb_sgd8bit_step(&config, k as u64 + 1, &mut values, g, b)
                                .map_err(|e| e.to_library())?
                        }
                        (Algorithm::Lion(l), [m]) => {
                            oracle::bnb_lion8bit_step(&l.to_oracle(), &mut values, g, m)
                                .map_err(|e| e.to_library())?
                        }
                        (Algorithm::RmsProp(r), [s]) => {
                            let config = oracle::BnbRmsProp {
                                lr: r.lr,
                                alpha: r.alpha,
                                eps: r.eps,
                                weight_decay: r.weight_decay,
                            };
                            oracle::bnb_rmsprop8bit_step(&config, &mut values, g, s)
                                .map_err(|e| e.to_library())?
                        }
                        (Algorithm::AdEMAMix(a), [m1, m2, nu]) => oracle::bnb_ademamix8bit_step(
                            &a.to_oracle(),
                            k as u64 + 1,
                            &mut values,
                            g,
                            m1,
                            m2,
                            nu,
                        )
                        .map_err(|e| e.to_library())?,
                        _ => return Err(case.bad("an 8-bit trajectory without 8-bit state".into())),
                    }
                }
                finals.push((values, states.iter().map(ToLibrary::to_library).collect()));
            }
        }
        #[cfg(feature = "cpu")]
        (Backend::Cpu, _) => {
            let mut tensors = inputs.host_params()?;
            let views: Vec<HostSlice<'_>> = tensors.iter().map(HostTensor::as_slice).collect();
            let mut optimizer =
                CpuOptimizer::builder().state_storage(StateStorage::Q8(config)).build(algorithm, &views)?;
            for k in 0..steps {
                inputs.cpu_step(&mut optimizer, &mut tensors, k)?;
            }
            for (i, t) in tensors.iter().enumerate() {
                let states = kinds
                    .iter()
                    .map(|kind| {
                        optimizer
                            .state(i, *kind)
                            .and_then(|s| s.q8())
                            .cloned()
                            .ok_or_else(|| case.bad("missing state".into()))
                    })
                    .collect::<Result<_>>()?;
                finals.push((t.to_f64(), states));
            }
        }
        (_, None) => return Err(Error::MissingArgument { argument: "ctx", why: "by the GPU backends" }),
        (_, Some(ctx)) => {
            let (param_tensors, grad_tensors) = inputs.gpu_tensors(ctx, backend.in_place()).await?;
            let options = Optimizer::builder().state_storage(StateStorage::Q8(config));
            let mut optimizer = options.build(ctx, algorithm, &param_tensors)?;
            for k in 0..steps {
                inputs.write_grads(ctx, &grad_tensors, k).await?;
                optimizer.step(&grad_tensors)?;
            }
            for (i, param) in param_tensors.iter().enumerate() {
                let mut states = Vec::with_capacity(kinds.len());
                for kind in kinds.iter() {
                    let state = optimizer.state_async(i, *kind).await?.and_then(StateView::q8);
                    states.push(state.ok_or_else(|| case.bad("missing state".into()))?);
                }
                finals.push((ctx.read_async(param).await?, states));
            }
        }
    }
    let mut outputs: Outputs = Vec::new();
    for (i, (param, states)) in finals.into_iter().enumerate() {
        outputs.push((format!("param_out.{i}"), param));
        for (k, state) in states.into_iter().enumerate() {
            match state {
                StoredState::Q8 { codes, absmax } => {
                    outputs.push((format!("state{}.{i}", k + 1), codes.into_iter().map(f64::from).collect()));
                    outputs
                        .push((format!("absmax{}.{i}", k + 1), absmax.into_iter().map(f64::from).collect()));
                }
                StoredState::F32(values) => {
                    outputs
                        .push((format!("state{}.{i}", k + 1), values.into_iter().map(f64::from).collect()));
                }
            }
        }
    }
    // The maps the states were quantized with, one per state kind: the oracle's own, or the
    // crate's as its dequantization shows them (every code under absmax 1).
    for (k, kind) in kinds.iter().enumerate() {
        let map = match backend {
            Backend::Oracle => oracle::bnb::map_for(kind.torch_name()).to_vec(),
            _ => StoredState::Q8 { codes: (0..=255).collect(), absmax: vec![1.0] }.values(*kind)?,
        };
        outputs.push((format!("qmap{}", k + 1), map.into_iter().map(f64::from).collect()));
    }
    Ok(outputs)
}

/// bitsandbytes' AdEMAMix attributes, with its defaults: `betas` has three numbers, and
/// `t_alpha`, `t_beta3` are `null` (no warmup) or a step count.
fn ademamix_attributes(case: &Case) -> Result<AdEMAMix> {
    let defaults = AdEMAMix::default();
    let (beta1, beta2, beta3) = match case.attributes.get("betas") {
        None => (defaults.beta1, defaults.beta2, defaults.beta3),
        Some(v) => match v.as_array().map(|a| a.iter().filter_map(|x| x.as_f64()).collect::<Vec<_>>()) {
            Some(b) if b.len() == 3 => (b[0], b[1], b[2]),
            _ => return Err(case.bad(format!("attribute `betas` = {v} is not three numbers"))),
        },
    };
    let steps = |name: &str| match case.attributes.get(name) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(t) if t.fract() == 0.0 && t >= 0.0 => Ok(Some(t as u64)),
            _ => Err(case.bad(format!("attribute `{name}` = {v} is not null or a step count"))),
        },
    };
    Ok(AdEMAMix {
        lr: case.attr_f64("lr", defaults.lr)?,
        beta1,
        beta2,
        beta3,
        alpha: case.attr_f64("alpha", defaults.alpha)?,
        t_alpha: steps("t_alpha")?,
        t_beta3: steps("t_beta3")?,
        eps: case.attr_f64("eps", defaults.eps)?,
        weight_decay: case.attr_f64("weight_decay", defaults.weight_decay)?,
    })
}

/// An AdEMAMix trajectory's outputs under bitsandbytes' names: `state1.i` stacks `m1`
/// (`exp_avg.i`) and `m2` (`exp_avg_slow.i`) as `[2, *shape]`, `state2.i` is `nu`
/// (`exp_avg_sq.i`).
fn ademamix_names(outputs: Outputs) -> Outputs {
    let mut renamed: Outputs = Vec::with_capacity(outputs.len());
    let mut slow: Vec<(String, Vec<f64>)> = Vec::new();
    for (name, values) in outputs {
        if let Some(i) = name.strip_prefix("exp_avg_sq.") {
            renamed.push((format!("state2.{i}"), values));
        } else if let Some(i) = name.strip_prefix("exp_avg_slow.") {
            slow.push((i.to_string(), values));
        } else if let Some(i) = name.strip_prefix("exp_avg.") {
            renamed.push((format!("state1.{i}"), values));
        } else {
            renamed.push((name, values));
        }
    }
    for (i, m2) in slow {
        if let Some((_, m1)) = renamed.iter_mut().find(|(n, _)| *n == format!("state1.{i}")) {
            m1.extend(m2);
        }
    }
    renamed
}

/// An AdEMAMix8bit trajectory's outputs (states 1, 2, 3: m1, m2, nu, each with its absmax
/// and map) under bitsandbytes' names: `state1.i` stacks m1's and m2's codes (or f32 values)
/// as `[2, *shape]` and `absmax1.i` their absmax as `[2, blocks]`, both with `qmap1`;
/// `state2.i`, `absmax2.i` and `qmap2` are nu's.
fn ademamix8bit_names(outputs: Outputs) -> Outputs {
    let mut renamed: Outputs = Vec::with_capacity(outputs.len());
    let mut slow: Vec<(String, Vec<f64>)> = Vec::new();
    for (name, values) in outputs {
        let (prefix, i) = name.split_once('.').unwrap_or((name.as_str(), ""));
        match prefix {
            "state2" | "absmax2" => slow.push((format!("{}1.{i}", &prefix[..prefix.len() - 1]), values)),
            "qmap2" => {}
            "state3" | "absmax3" | "qmap3" => {
                let name = format!("{}2", &prefix[..prefix.len() - 1]);
                renamed.push((if i.is_empty() { name } else { format!("{name}.{i}") }, values));
            }
            _ => renamed.push((name, values)),
        }
    }
    for (name, m2) in slow {
        if let Some((_, m1)) = renamed.iter_mut().find(|(n, _)| *n == name) {
            m1.extend(m2);
        }
    }
    renamed
}
