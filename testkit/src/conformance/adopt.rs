//! Running an `adopt.ADOPT` trajectory: `steps` calls of `step()` from the initial
//! parameters, on the oracle, the CPU backend or the GPU; the outputs are the parameters and
//! each tensor's `exp_avg` and `exp_avg_sq`.

#[cfg(feature = "cpu")]
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostTensor};
use wgpu_optim::{Adopt, Error, GpuContext, Optimizer, Result, StateKind};

use super::case::{Case, Kind, Op};
use super::inputs::Inputs;
use super::run::Backend;
use crate::oracle::{AdoptOracle, ToOracle};

/// The op this module runs: its name, kind and every attribute it reads.
pub(super) const OP: Op = Op { name: "adopt.ADOPT", kind: Kind::Trajectory, attributes: &["lr", "betas", "eps", "weight_decay", "decouple", "clip_lambda", "maximize"] };

type Outputs = Vec<(String, Vec<f64>)>;

/// The case's `clip_lambda`: the exponent `q` of `step ** q`, `null` for no clipping, the
/// official `0.25` when absent.
fn clip_lambda(case: &Case, default: Option<f64>) -> Result<Option<f64>> {
    match case.attributes.get("clip_lambda") {
        None => Ok(default),
        Some(serde_json::Value::Null) => Ok(None),
        Some(value) => value
            .as_f64()
            .map(Some)
            .ok_or_else(|| case.bad(format!("attribute `clip_lambda` = {value} is not a number or null"))),
    }
}

/// The case's hyperparameters, with the official defaults.
fn config(case: &Case) -> Result<Adopt> {
    let defaults = Adopt::default();
    let (beta1, beta2) = case.attr_pair("betas", (defaults.beta1, defaults.beta2))?;
    Ok(Adopt {
        lr: case.attr_f64("lr", defaults.lr)?,
        beta1,
        beta2,
        eps: case.attr_f64("eps", defaults.eps)?,
        weight_decay: case.attr_f64("weight_decay", defaults.weight_decay)?,
        decouple: case.attr_bool("decouple", defaults.decouple)?,
        clip_exponent: clip_lambda(case, defaults.clip_exponent)?,
        maximize: case.attr_bool("maximize", defaults.maximize)?,
    })
}

/// The trajectory on `backend`: the oracle (storing what it keeps in the parameters'
/// dtype), the CPU backend, or the GPU [`Optimizer`] on a buffer per tensor (in place) or on
/// tensors packed at odd offsets into one buffer (out of place).
pub(super) async fn trajectory(case: &Case, backend: Backend, ctx: Option<&GpuContext>) -> Result<Outputs> {
    let config = config(case)?;
    let (n, steps) = (case.count, case.steps);
    let inputs = Inputs::read(case)?;
    let dtype = inputs.dtype;
    let kinds = [StateKind::ExpAvg, StateKind::ExpAvgSq];
    let finals: Vec<(Vec<f64>, [Vec<f64>; 2])> = match (backend, ctx) {
        (Backend::Oracle, _) => {
            let mut oracle = AdoptOracle::new(config.to_oracle(), n).storing(dtype.to_oracle(), dtype.to_oracle());
            let mut params = inputs.initial();
            for k in 0..steps {
                oracle.step(&mut params, &inputs.grads_at(k));
            }
            let states = oracle.exp_avg.into_iter().zip(oracle.exp_avg_sq);
            params.into_iter().zip(states).map(|(p, (m, v))| (p, [m, v])).collect()
        }
        #[cfg(feature = "cpu")]
        (Backend::Cpu, _) => {
            let mut tensors = inputs.host_params()?;
            let views: Vec<HostSlice<'_>> = tensors.iter().map(HostTensor::as_slice).collect();
            let mut optimizer = CpuOptimizer::builder().build(config, &views)?;
            for k in 0..steps {
                inputs.cpu_step(&mut optimizer, &mut tensors, k)?;
            }
            let mut finals = Vec::with_capacity(n);
            for (i, t) in tensors.iter().enumerate() {
                let state = |kind: StateKind| -> Result<Vec<f64>> {
                    Ok(optimizer
                        .state(i, kind)
                        .and_then(|s| s.dense())
                        .ok_or_else(|| case.bad("missing state".into()))?
                        .to_f64())
                };
                finals.push((t.to_f64(), [state(kinds[0])?, state(kinds[1])?]));
            }
            finals
        }
        (_, None) => return Err(Error::MissingArgument { argument: "ctx", why: "by the GPU backends" }),
        (_, Some(ctx)) => {
            let (param_tensors, grad_tensors) = inputs.gpu_tensors(ctx, backend.in_place()).await?;
            let mut optimizer = Optimizer::builder().build(ctx, config, &param_tensors)?;
            for k in 0..steps {
                inputs.write_grads(ctx, &grad_tensors, k).await?;
                optimizer.step(&grad_tensors)?;
            }
            let mut finals = Vec::with_capacity(n);
            for (i, t) in param_tensors.iter().enumerate() {
                let mut pair = Vec::with_capacity(2);
                for kind in kinds {
                    let state = optimizer
                        .state_async(i, kind)
                        .await?
                        .and_then(|s| s.dense())
                        .ok_or_else(|| case.bad("missing state".into()))?;
                    pair.push(ctx.read_async(state).await?);
                }
                let exp_avg_sq = pair.pop().unwrap_or_default();
                let exp_avg = pair.pop().unwrap_or_default();
                finals.push((ctx.read_async(t).await?, [exp_avg, exp_avg_sq]));
            }
            finals
        }
    };
    let mut outputs = Outputs::new();
    for (i, (p, [m, v])) in finals.into_iter().enumerate() {
        outputs.push((format!("param_out.{i}"), p));
        outputs.push((format!("exp_avg.{i}"), m));
        outputs.push((format!("exp_avg_sq.{i}"), v));
    }
    Ok(outputs)
}
