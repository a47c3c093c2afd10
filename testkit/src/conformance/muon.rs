//! Running a `torch.Muon` trajectory: `steps` calls of `step()` from the initial
//! parameters (2-D, their shapes from the file); the outputs are `param_out` and
//! `momentum_buffer` of each tensor.

#[cfg(feature = "cpu")]
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostTensor};
use wgpu_optim::{Error, GpuContext, Muon, MuonLrAdjust, NsPrecision, Optimizer, Result, StateKind};

use super::case::{Case, Kind, Op};
use super::inputs::Inputs;
use super::run::Backend;
use crate::oracle::{muon_step, Storage, ToOracle};

/// The op this module runs: its name, kind and every attribute it reads.
pub(super) const OP: Op = Op { name: "torch.Muon", kind: Kind::Trajectory, attributes: &["lr", "weight_decay", "momentum", "nesterov", "ns_coefficients", "eps", "ns_steps", "adjust_lr_fn", "ns_dtype"] };

type Outputs = Vec<(String, Vec<f64>)>;

/// The case's hyperparameters, with torch's defaults.
fn config(case: &Case) -> Result<Muon> {
    let defaults = Muon::default();
    let adjust_lr = match case.attributes.get("adjust_lr_fn") {
        None | Some(serde_json::Value::Null) => MuonLrAdjust::Original,
        Some(v) => v
            .as_str()
            .and_then(MuonLrAdjust::from_torch_name)
            .ok_or_else(|| case.bad(format!("attribute `adjust_lr_fn` = {v} is not one of torch's")))?,
    };
    let ns_precision = match case.attr_str("ns_dtype", "bfloat16")? {
        "bfloat16" => NsPrecision::BF16,
        "float32" => NsPrecision::F32,
        other => return Err(case.bad(format!("attribute `ns_dtype` = {other} is not bfloat16 or float32"))),
    };
    let ns_coefficients = match case.attributes.get("ns_coefficients") {
        None => defaults.ns_coefficients,
        Some(v) => match v.as_array().map(|a| a.iter().filter_map(|x| x.as_f64()).collect::<Vec<_>>()) {
            Some(abc) if abc.len() == 3 => (abc[0], abc[1], abc[2]),
            _ => return Err(case.bad(format!("attribute `ns_coefficients` = {v} is not three numbers"))),
        },
    };
    let ns_steps = case.attr_f64("ns_steps", f64::from(defaults.ns_steps))?;
    if ns_steps.fract() != 0.0 || !(0.0..=f64::from(u32::MAX)).contains(&ns_steps) {
        return Err(case.bad(format!("attribute `ns_steps` = {ns_steps} is not a whole number >= 0")));
    }
    Ok(Muon {
        lr: case.attr_f64("lr", defaults.lr)?,
        weight_decay: case.attr_f64("weight_decay", defaults.weight_decay)?,
        momentum: case.attr_f64("momentum", defaults.momentum)?,
        nesterov: case.attr_bool("nesterov", defaults.nesterov)?,
        ns_coefficients,
        eps: case.attr_f64("eps", defaults.eps)?,
        ns_steps: ns_steps as u32,
        adjust_lr,
        ns_precision,
    })
}

/// The trajectory on `backend`: the oracle, the CPU backend, or the GPU [`Optimizer`] on a
/// buffer per tensor (in place) or on tensors packed at odd offsets into one buffer (out of
/// place: Muon has no stateless operator).
pub(super) async fn trajectory(case: &Case, backend: Backend, ctx: Option<&GpuContext>) -> Result<Outputs> {
    let config = config(case)?;
    let (n, steps) = (case.count, case.steps);
    let inputs = Inputs::read(case)?;
    let dtype = inputs.dtype;
    let shapes = inputs.shapes();
    let (finals, buffers): (Vec<Vec<f64>>, Vec<Vec<f64>>) = match (backend, ctx) {
        (Backend::Oracle, _) => {
            let mut values = inputs.initial();
            let mut buffers: Vec<Vec<f64>> = values.iter().map(|v| vec![0.0; v.len()]).collect();
            for k in 0..steps {
                for (i, g) in inputs.grads_at(k).iter().enumerate() {
                    let (rows, cols) = match shapes[i].as_slice() {
                        &[rows, cols] => (rows, cols),
                        other => return Err(case.bad(format!("param.{i} has shape {other:?}, expected 2-D"))),
                    };
                    muon_step(&config.to_oracle(), &mut values[i], g, &mut buffers[i], rows, cols);
                    for v in values[i].iter_mut().chain(buffers[i].iter_mut()) {
                        *v = dtype.to_oracle().round(*v);
                    }
                }
            }
            (values, buffers)
        }
        #[cfg(feature = "cpu")]
        (Backend::Cpu, _) => {
            let mut tensors = inputs.host_params()?;
            let views: Vec<HostSlice<'_>> = tensors.iter().map(HostTensor::as_slice).collect();
            let mut optimizer = CpuOptimizer::builder().param_shapes(shapes.clone()).build(config, &views)?;
            for k in 0..steps {
                inputs.cpu_step(&mut optimizer, &mut tensors, k)?;
            }
            let buffers = (0..n)
                .map(|i| {
                    Ok(optimizer
                        .state(i, StateKind::MomentumBuffer)
                        .and_then(|s| s.dense())
                        .ok_or_else(|| case.bad("missing state".into()))?
                        .to_f64())
                })
                .collect::<Result<_>>()?;
            (tensors.iter().map(HostTensor::to_f64).collect(), buffers)
        }
        (_, None) => return Err(Error::MissingArgument { argument: "ctx", why: "by the GPU backends" }),
        (_, Some(ctx)) => {
            let (param_tensors, grad_tensors) = inputs.gpu_tensors(ctx, backend.in_place()).await?;
            let mut optimizer =
                Optimizer::builder().param_shapes(shapes.clone()).build(ctx, config, &param_tensors)?;
            for k in 0..steps {
                inputs.write_grads(ctx, &grad_tensors, k).await?;
                optimizer.step(&grad_tensors)?;
            }
            let mut finals = Vec::with_capacity(n);
            let mut buffers = Vec::with_capacity(n);
            for (i, t) in param_tensors.iter().enumerate() {
                finals.push(ctx.read_async(t).await?);
                let state = optimizer
                    .state_async(i, StateKind::MomentumBuffer)
                    .await?
                    .and_then(|s| s.dense())
                    .ok_or_else(|| case.bad("missing state".into()))?;
                buffers.push(ctx.read_async(state).await?);
            }
            (finals, buffers)
        }
    };
    let mut outputs: Outputs = Vec::new();
    for (i, (p, b)) in finals.into_iter().zip(buffers).enumerate() {
        outputs.push((format!("param_out.{i}"), p));
        outputs.push((format!("momentum_buffer.{i}"), b));
    }
    Ok(outputs)
}
