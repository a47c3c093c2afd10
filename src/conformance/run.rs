//! Running a case on a backend and comparing every expected output.

use crate::conformance::case::{Case, HostTensor, Kind, ValueType};
use crate::ops::directml::{self, AdamOptimizerDesc, TrainingStep};
use crate::ops::{self, onnx, AdamTensors};
use crate::oracle::{self, TorchAdamState};
use crate::{
    Adam, DType, DmlAdam, Error, GpuContext, OnnxAdam, Optimizer, Result, StateKind, Tensor,
};

/// Where a case runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The f64 CPU oracle, outputs rounded once to the storage type.
    Oracle,
    /// The GPU, every output written over its input (the stateful optimizer for trajectories).
    GpuInPlace,
    /// The GPU, every output written to a tensor of its own (the stateless operators).
    GpuOutOfPlace,
}

impl Backend {
    /// The name the runner prints.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Oracle => "oracle",
            Backend::GpuInPlace => "gpu",
            Backend::GpuOutOfPlace => "gpu-out-of-place",
        }
    }
}

/// The verdict on one case and backend.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Every value within tolerance.
    Pass,
    /// At least one value outside tolerance; the first few are described.
    Fail(String),
    /// Not run, and why.
    Skipped(String),
}

/// One line of the runner's output.
#[derive(Clone, Debug)]
pub struct CaseReport {
    /// The case's name.
    pub case: String,
    /// The backend it ran on.
    pub backend: Backend,
    /// Pass, fail or skip.
    pub outcome: Outcome,
    /// The largest `|got - want| / (atol + rtol * |want|)` over every compared value
    /// (a pass is at most 1).
    pub worst: f64,
}

type Outputs = Vec<(String, Vec<f64>)>;

/// Runs `case` on `backend` (`ctx` is needed for the GPU backends) and compares.
pub fn run_case(case: &Case, backend: Backend, ctx: Option<&GpuContext>) -> Result<CaseReport> {
    let report = |outcome, worst| CaseReport {
        case: case.name.clone(),
        backend,
        outcome,
        worst,
    };
    if let Some(reason) = unsupported(case) {
        return Ok(report(Outcome::Skipped(reason), 0.0));
    }
    let ctx = match (backend, ctx) {
        (Backend::Oracle, _) => None,
        (_, Some(ctx)) => Some(ctx),
        (_, None) => {
            return Err(Error::NoAdapter {
                reason: "the GPU backends need a GpuContext".into(),
            })
        }
    };
    let outputs = match (case.op.as_str(), case.kind) {
        ("onnx.Adam", Kind::Op) => onnx_adam(case, backend, ctx)?,
        ("dml.Adam", Kind::Op) => dml_adam(case, backend, ctx)?,
        ("torch.Adam" | "torch.AdamW", Kind::Trajectory) => torch_adam(case, backend, ctx)?,
        (op, _) => {
            return Ok(report(
                Outcome::Skipped(format!("op {op} is not implemented yet")),
                0.0,
            ))
        }
    };
    let mut worst: f64 = 0.0;
    let mut failures = Vec::new();
    for (name, got) in &outputs {
        let want = case.tensor(name)?;
        let (w, bad) = compare(name, got, want, case.rtol, case.atol);
        worst = worst.max(w);
        failures.extend(bad);
    }
    let outcome = if failures.is_empty() {
        Outcome::Pass
    } else {
        Outcome::Fail(failures.join("; "))
    };
    Ok(report(outcome, worst))
}

/// Why a case cannot run yet, if it cannot.
fn unsupported(case: &Case) -> Option<String> {
    let low_precision = case
        .tensors
        .iter()
        .find(|(_, t)| matches!(t.dtype, ValueType::F16 | ValueType::BF16));
    low_precision.map(|(name, t)| format!("{:?} tensors ({name}) are not supported yet", t.dtype))
}

/// Compares element by element; returns the worst ratio and descriptions of the first
/// few mismatches (never the whole array).
fn compare(
    name: &str,
    got: &[f64],
    want: &HostTensor,
    rtol: f64,
    atol: f64,
) -> (f64, Option<String>) {
    if got.len() != want.values.len() {
        return (
            f64::INFINITY,
            Some(format!(
                "{name}: {} values, expected {}",
                got.len(),
                want.values.len()
            )),
        );
    }
    let mut worst: f64 = 0.0;
    let mut bad = Vec::new();
    let mut bad_count = 0;
    for (i, (&g, &w)) in got.iter().zip(&want.values).enumerate() {
        let ratio = if w.is_nan() || w.is_infinite() {
            if g.is_nan() == w.is_nan() && (w.is_nan() || g == w) {
                0.0
            } else {
                f64::INFINITY
            }
        } else if g.is_nan() {
            f64::INFINITY
        } else {
            (g - w).abs() / (atol + rtol * w.abs())
        };
        worst = worst.max(ratio);
        if ratio > 1.0 {
            bad_count += 1;
            if bad.len() < 3 {
                bad.push(format!("[{i}] got {g:e} want {w:e}"));
            }
        }
    }
    let detail = (bad_count > 0).then(|| {
        format!(
            "{name}: {bad_count} of {} outside tolerance: {}",
            got.len(),
            bad.join(", ")
        )
    });
    (worst, detail)
}

fn storage_dtype(case: &Case, name: &str) -> Result<DType> {
    match case.tensor(name)?.dtype {
        ValueType::Float(d) => Ok(d),
        other => Err(case.bad(format!(
            "tensor `{name}` is {other:?}, expected a float tensor"
        ))),
    }
}

fn round_to(values: Vec<f64>, dtype: DType) -> Vec<f64> {
    match dtype {
        DType::F32 => values.into_iter().map(|v| f64::from(v as f32)).collect(),
        DType::F64 => values,
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

fn upload(ctx: &GpuContext, name: &str, values: &[f64], dtype: DType) -> Tensor {
    match dtype {
        DType::F32 => ctx.upload_f32(name, &values.iter().map(|v| *v as f32).collect::<Vec<_>>()),
        DType::F64 => ctx.upload_f64(name, values),
    }
}

fn download(ctx: &GpuContext, tensor: &Tensor) -> Result<Vec<f64>> {
    match tensor.dtype {
        DType::F32 => Ok(ctx.read_f32(tensor)?.into_iter().map(f64::from).collect()),
        DType::F64 => ctx.read_f64(tensor),
    }
}

/// The tensors a GPU backend writes to: the inputs themselves, or fresh zeroed tensors.
fn destinations(ctx: &GpuContext, backend: Backend, inputs: &[Tensor]) -> Vec<Tensor> {
    inputs
        .iter()
        .map(|t| match backend {
            Backend::GpuOutOfPlace => ctx.zeros("output", t.len, t.dtype),
            _ => t.clone(),
        })
        .collect()
}

fn onnx_adam(case: &Case, backend: Backend, ctx: Option<&GpuContext>) -> Result<Outputs> {
    let attributes = OnnxAdam {
        alpha: case.attr_f64("alpha", 0.9)?,
        beta: case.attr_f64("beta", 0.999)?,
        epsilon: case.attr_f64("epsilon", 1e-6)?,
        norm_coefficient: case.attr_f64("norm_coefficient", 0.0)?,
        norm_coefficient_post: case.attr_f64("norm_coefficient_post", 0.0)?,
    };
    let r = case.scalar("R")?;
    let t = whole_step(case, "T")?;
    let n = case.count;
    let names = |prefixes: &[&str]| -> Vec<String> {
        prefixes
            .iter()
            .flat_map(|p| (0..n).map(move |i| format!("{p}.{i}")))
            .collect()
    };
    let input_names = names(&["X", "G", "V", "H"]);
    let output_names = names(&["X_new", "V_new", "H_new"]);
    let dtype = storage_dtype(case, "X.0")?;
    let Some(ctx) = ctx else {
        let mut outputs: Outputs = Vec::new();
        let mut per_tensor = Vec::new();
        for i in 0..n {
            let get = |p: &str| case.tensor(&format!("{p}.{i}")).map(|t| t.values.clone());
            per_tensor.push(oracle::onnx_adam(
                &attributes,
                r,
                t,
                &get("X")?,
                &get("G")?,
                &get("V")?,
                &get("H")?,
            ));
        }
        for (k, prefix) in ["X_new", "V_new", "H_new"].iter().enumerate() {
            for (i, out) in per_tensor.iter().enumerate() {
                let values = [&out.0, &out.1, &out.2][k].clone();
                outputs.push((format!("{prefix}.{i}"), round_to(values, dtype)));
            }
        }
        return Ok(outputs);
    };
    let inputs = input_names
        .iter()
        .map(|name| {
            Ok(upload(
                ctx,
                name,
                &case.tensor(name)?.values,
                storage_dtype(case, name)?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    // X, V and H (not G) are the updated inputs: entries 0..n, 2n..3n, 3n..4n.
    let updated: Vec<Tensor> = inputs[..n]
        .iter()
        .chain(&inputs[2 * n..])
        .cloned()
        .collect();
    let written = destinations(ctx, backend, &updated);
    let outputs: Vec<Option<Tensor>> = written
        .iter()
        .map(|t| (backend == Backend::GpuOutOfPlace).then(|| t.clone()))
        .collect();
    ctx.submit("onnx.Adam", |encoder| {
        onnx::adam(ctx, encoder, &attributes, r, t, &inputs, &outputs)
    })?;
    output_names
        .into_iter()
        .zip(&written)
        .map(|(name, t)| Ok((name, download(ctx, t)?)))
        .collect()
}

fn dml_adam(case: &Case, backend: Backend, ctx: Option<&GpuContext>) -> Result<Outputs> {
    let scalars = DmlAdam {
        learning_rate: case.attr_f64("LearningRate", 0.0)?,
        beta1: case.attr_f64("Beta1", 0.0)?,
        beta2: case.attr_f64("Beta2", 0.0)?,
        epsilon: case.attr_f64("Epsilon", 0.0)?,
    };
    let step = case.scalar("TrainingStepTensor")?;
    let input_names = [
        "InputParametersTensor",
        "InputFirstMomentTensor",
        "InputSecondMomentTensor",
        "GradientTensor",
    ];
    let output_names = [
        "OutputParametersTensor",
        "OutputFirstMomentTensor",
        "OutputSecondMomentTensor",
    ];
    let dtype = storage_dtype(case, input_names[0])?;
    let Some(ctx) = ctx else {
        let t = TrainingStep::Float(step).value()?;
        scalars.validate(t)?;
        let get = |name: &str| case.tensor(name).map(|t| t.values.clone());
        let out = oracle::dml_adam(
            &scalars,
            t,
            &get(input_names[0])?,
            &get(input_names[1])?,
            &get(input_names[2])?,
            &get(input_names[3])?,
        );
        return Ok(output_names
            .iter()
            .map(|n| n.to_string())
            .zip([out.0, out.1, out.2].map(|v| round_to(v, dtype)))
            .collect());
    };
    let inputs = input_names
        .iter()
        .map(|name| Ok(upload(ctx, name, &case.tensor(name)?.values, dtype)))
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
    output_names
        .iter()
        .zip(&written)
        .map(|(name, t)| Ok((name.to_string(), download(ctx, t)?)))
        .collect()
}

fn torch_adam(case: &Case, backend: Backend, ctx: Option<&GpuContext>) -> Result<Outputs> {
    let (beta1, beta2) = case.attr_pair("betas", (0.9, 0.999))?;
    let config = Adam {
        lr: case.attr_f64("lr", 1e-3)?,
        beta1,
        beta2,
        eps: case.attr_f64("eps", 1e-8)?,
        weight_decay: case.attr_f64("weight_decay", 0.0)?,
        decoupled_weight_decay: case.op == "torch.AdamW",
        amsgrad: case.attr_bool("amsgrad", false)?,
        maximize: case.attr_bool("maximize", false)?,
    };
    let (n, steps) = (case.count, case.steps);
    let dtype = storage_dtype(case, "param.0")?;
    let params: Vec<&HostTensor> = (0..n)
        .map(|i| case.tensor(&format!("param.{i}")))
        .collect::<Result<_>>()?;
    let grads: Vec<&HostTensor> = (0..n)
        .map(|i| case.tensor(&format!("grad.{i}")))
        .collect::<Result<_>>()?;
    for (i, (p, g)) in params.iter().zip(&grads).enumerate() {
        if g.values.len() != steps * p.values.len() {
            return Err(case.bad(format!(
                "grad.{i} has {} values, expected steps x param.{i} = {}",
                g.values.len(),
                steps * p.values.len()
            )));
        }
    }
    let grad_at = |i: usize, k: usize| {
        let len = params[i].values.len();
        &grads[i].values[k * len..(k + 1) * len]
    };
    let mut names = vec!["param_out", "exp_avg", "exp_avg_sq"];
    if config.amsgrad {
        names.push("max_exp_avg_sq");
    }
    let mut outputs: Outputs = Vec::new();
    match (backend, ctx) {
        (Backend::Oracle, _) | (_, None) => {
            for (i, p) in params.iter().enumerate() {
                let mut param = p.values.clone();
                let mut state = TorchAdamState::zeros(param.len(), config.amsgrad);
                for k in 0..steps {
                    oracle::torch_adam_step(&config, &mut param, grad_at(i, k), &mut state);
                }
                let values = [param, state.exp_avg, state.exp_avg_sq, state.max_exp_avg_sq];
                for (name, v) in names.iter().zip(values) {
                    outputs.push((format!("{name}.{i}"), round_to(v, dtype)));
                }
            }
        }
        (Backend::GpuInPlace, Some(ctx)) => {
            let param_tensors: Vec<Tensor> = params
                .iter()
                .enumerate()
                .map(|(i, p)| upload(ctx, &format!("param.{i}"), &p.values, dtype))
                .collect();
            let grad_tensors: Vec<Tensor> = param_tensors
                .iter()
                .map(|p| ctx.zeros("grad", p.len, dtype))
                .collect();
            let mut optimizer = Optimizer::new(ctx, config, &param_tensors)?;
            for k in 0..steps {
                for (i, g) in grad_tensors.iter().enumerate() {
                    write(ctx, g, grad_at(i, k))?;
                }
                optimizer.step(&grad_tensors)?;
            }
            let kinds = [
                StateKind::ExpAvg,
                StateKind::ExpAvgSq,
                StateKind::MaxExpAvgSq,
            ];
            for (i, param) in param_tensors.iter().enumerate() {
                outputs.push((format!("param_out.{i}"), download(ctx, param)?));
                for (name, kind) in names[1..].iter().zip(kinds) {
                    let state = optimizer
                        .state(i, kind)
                        .ok_or_else(|| case.bad(format!("no {name} state")))?;
                    outputs.push((format!("{name}.{i}"), download(ctx, state)?));
                }
            }
        }
        (Backend::GpuOutOfPlace, Some(ctx)) => {
            // The stateless operator, ping-ponging every output between two tensor sets.
            let tensors_per = names.len();
            let mut current: Vec<Vec<Tensor>> = params
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let mut set = vec![upload(ctx, &format!("param.{i}"), &p.values, dtype)];
                    set.extend(
                        (1..tensors_per).map(|_| ctx.zeros("state", p.values.len() as u64, dtype)),
                    );
                    set
                })
                .collect();
            let mut other: Vec<Vec<Tensor>> = current
                .iter()
                .map(|set| set.iter().map(|t| ctx.zeros("out", t.len, dtype)).collect())
                .collect();
            let grad_tensors: Vec<Tensor> = current
                .iter()
                .map(|s| ctx.zeros("grad", s[0].len, dtype))
                .collect();
            for k in 0..steps {
                for (i, g) in grad_tensors.iter().enumerate() {
                    write(ctx, g, grad_at(i, k))?;
                }
                let io: Vec<AdamTensors> = current
                    .iter()
                    .zip(&other)
                    .zip(&grad_tensors)
                    .map(|((src, dst), g)| AdamTensors {
                        param: src[0].clone(),
                        grad: g.clone(),
                        exp_avg: src[1].clone(),
                        exp_avg_sq: src[2].clone(),
                        max_exp_avg_sq: src.get(3).cloned(),
                        param_out: Some(dst[0].clone()),
                        exp_avg_out: Some(dst[1].clone()),
                        exp_avg_sq_out: Some(dst[2].clone()),
                        max_exp_avg_sq_out: dst.get(3).cloned(),
                    })
                    .collect();
                ctx.submit("adam", |encoder| {
                    ops::adam(ctx, encoder, &config, k as u64 + 1, &io)
                })?;
                std::mem::swap(&mut current, &mut other);
            }
            for (i, set) in current.iter().enumerate() {
                for (name, t) in names.iter().zip(set) {
                    outputs.push((format!("{name}.{i}"), download(ctx, t)?));
                }
            }
        }
    }
    Ok(outputs)
}

fn write(ctx: &GpuContext, tensor: &Tensor, values: &[f64]) -> Result<()> {
    match tensor.dtype {
        DType::F32 => {
            let v: Vec<f32> = values.iter().map(|x| *x as f32).collect();
            ctx.write_bytes(tensor, bytemuck::cast_slice(&v))
        }
        DType::F64 => ctx.write_bytes(tensor, bytemuck::cast_slice(values)),
    }
}
