//! Running a `torch.Muon` trajectory: `steps` calls of `step()` from the initial
//! parameters (2-D, their shapes from the file); the outputs are `param_out` and
//! `momentum_buffer` of each tensor.

use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut, HostTensor};
use wgpu_optim::{Error, GpuContext, Muon, MuonLrAdjust, NsPrecision, Optimizer, Result, StateKind, Tensor};

use super::case::{Case, CaseTensor, ValueType};
use super::run::{packed, Backend};
use crate::oracle::{muon_step, Storage};

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
    let params: Vec<&CaseTensor> =
        (0..n).map(|i| case.tensor(&format!("param.{i}"))).collect::<Result<_>>()?;
    let grads: Vec<&CaseTensor> = (0..n).map(|i| case.tensor(&format!("grad.{i}"))).collect::<Result<_>>()?;
    let dtype = match params.first().map(|p| p.dtype) {
        Some(ValueType::Float(d)) => d,
        other => return Err(case.bad(format!("param.0 is {other:?}, expected a float tensor"))),
    };
    let shapes: Vec<Vec<usize>> = params.iter().map(|p| p.shape.clone()).collect();
    for (i, (p, g)) in params.iter().zip(&grads).enumerate() {
        if g.values.len() != steps * p.values.len() {
            return Err(case.bad(format!("grad.{i} does not hold {steps} gradients of param.{i}")));
        }
    }
    let grads_at = |k: usize| -> Vec<Vec<f64>> {
        (0..n)
            .map(|i| {
                let len = params[i].values.len();
                grads[i].values[k * len..(k + 1) * len].to_vec()
            })
            .collect()
    };
    let (finals, buffers): (Vec<Vec<f64>>, Vec<Vec<f64>>) = match (backend, ctx) {
        (Backend::Oracle, _) => {
            let mut values: Vec<Vec<f64>> = params.iter().map(|p| p.values.clone()).collect();
            let mut buffers: Vec<Vec<f64>> = values.iter().map(|v| vec![0.0; v.len()]).collect();
            for k in 0..steps {
                for (i, g) in grads_at(k).iter().enumerate() {
                    let (rows, cols) = match shapes[i].as_slice() {
                        &[rows, cols] => (rows, cols),
                        other => return Err(case.bad(format!("param.{i} has shape {other:?}, expected 2-D"))),
                    };
                    muon_step(&config, &mut values[i], g, &mut buffers[i], rows, cols);
                    for v in values[i].iter_mut().chain(buffers[i].iter_mut()) {
                        *v = dtype.round(*v);
                    }
                }
            }
            (values, buffers)
        }
        (Backend::Cpu, _) => {
            let host = |values: &[f64]| HostTensor::from_f64(dtype, values);
            let mut tensors: Vec<HostTensor> =
                params.iter().map(|p| host(&p.values)).collect::<Result<_>>()?;
            let views: Vec<HostSlice<'_>> = tensors.iter().map(HostTensor::as_slice).collect();
            let mut optimizer = CpuOptimizer::builder().param_shapes(shapes.clone()).build(config, &views)?;
            for k in 0..steps {
                let g: Vec<HostTensor> = grads_at(k).iter().map(|g| host(g)).collect::<Result<_>>()?;
                let grad_views: Vec<HostSlice<'_>> = g.iter().map(HostTensor::as_slice).collect();
                let mut param_views: Vec<HostSliceMut<'_>> =
                    tensors.iter_mut().map(HostTensor::as_mut_slice).collect();
                optimizer.step(&mut param_views, &grad_views)?;
            }
            let buffers = (0..n)
                .map(|i| {
                    Ok(optimizer
                        .state(i, StateKind::MomentumBuffer)
                        .ok_or_else(|| case.bad("missing state".into()))?
                        .to_f64())
                })
                .collect::<Result<_>>()?;
            (tensors.iter().map(HostTensor::to_f64).collect(), buffers)
        }
        (_, None) => return Err(Error::MissingArgument { argument: "ctx", why: "by the GPU backends" }),
        (_, Some(ctx)) => {
            let lengths: Vec<u64> = params.iter().map(|p| p.values.len() as u64).collect();
            let (param_tensors, grad_tensors) = if backend.in_place() {
                let p: Vec<Tensor> = params
                    .iter()
                    .enumerate()
                    .map(|(i, p)| ctx.upload(&format!("param.{i}"), &p.values, dtype))
                    .collect();
                let g = p.iter().map(|t| ctx.zeros("grad", t.len, dtype)).collect();
                (p, g)
            } else {
                let p = packed(ctx, "params", &lengths, dtype);
                for (t, values) in p.iter().zip(&params) {
                    ctx.write_async(t, &values.values).await?;
                }
                (p, packed(ctx, "grads", &lengths, dtype))
            };
            let mut optimizer =
                Optimizer::builder().param_shapes(shapes.clone()).build(ctx, config, &param_tensors)?;
            for k in 0..steps {
                for (t, g) in grad_tensors.iter().zip(grads_at(k)) {
                    ctx.write_async(t, &g).await?;
                }
                optimizer.step(&grad_tensors)?;
            }
            let mut finals = Vec::with_capacity(n);
            let mut buffers = Vec::with_capacity(n);
            for (i, t) in param_tensors.iter().enumerate() {
                finals.push(ctx.read_async(t).await?);
                let state = optimizer
                    .state(i, StateKind::MomentumBuffer)
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
