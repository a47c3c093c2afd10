//! Running an `adan.Adan` trajectory: `steps` calls of `step()` from the initial parameters,
//! on the oracle, the CPU backend or the GPU; the outputs are the parameters and each
//! tensor's `exp_avg`, `exp_avg_diff`, `exp_avg_sq` and `neg_pre_grad`.

#[cfg(feature = "cpu")]
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostTensor};
use wgpu_optim::{Adan, Error, GpuContext, Optimizer, Result, StateKind};

use super::case::{Case, Kind, Op};
use super::inputs::Inputs;
use super::run::Backend;
use crate::oracle::{AdanHyperparameters, AdanOracle, ToOracle};

/// The op this module runs: its name, kind and every attribute it reads.
pub(super) const OP: Op = Op { name: "adan.Adan", kind: Kind::Trajectory, attributes: &["lr", "betas", "eps", "weight_decay", "no_prox", "max_grad_norm"] };

type Outputs = Vec<(String, Vec<f64>)>;

/// The state kinds in the files' order of outputs.
const KINDS: [StateKind; 4] =
    [StateKind::ExpAvg, StateKind::ExpAvgDiff, StateKind::ExpAvgSq, StateKind::NegPreGrad];

/// The case's `betas`: three numbers, or the official defaults when absent.
fn betas(case: &Case, defaults: &AdanHyperparameters) -> Result<[f64; 3]> {
    let Some(value) = case.attributes.get("betas") else {
        return Ok([defaults.beta1, defaults.beta2, defaults.beta3]);
    };
    let numbers: Option<Vec<f64>> =
        value.as_array().and_then(|a| a.iter().map(serde_json::Value::as_f64).collect());
    match numbers.as_deref() {
        Some(&[beta1, beta2, beta3]) => Ok([beta1, beta2, beta3]),
        _ => Err(case.bad(format!("attribute `betas` = {value} is not three numbers"))),
    }
}

/// The case's hyperparameters, with the official defaults.
fn config(case: &Case) -> Result<AdanHyperparameters> {
    let defaults = AdanHyperparameters::default();
    let [beta1, beta2, beta3] = betas(case, &defaults)?;
    Ok(AdanHyperparameters {
        lr: case.attr_f64("lr", defaults.lr)?,
        beta1,
        beta2,
        beta3,
        eps: case.attr_f64("eps", defaults.eps)?,
        weight_decay: case.attr_f64("weight_decay", defaults.weight_decay)?,
        max_grad_norm: case.attr_f64("max_grad_norm", defaults.max_grad_norm)?,
        no_prox: case.attr_bool("no_prox", defaults.no_prox)?,
    })
}

/// The crate's configuration of the case's hyperparameters.
fn crate_config(c: &AdanHyperparameters) -> Adan {
    Adan {
        lr: c.lr,
        beta1: c.beta1,
        beta2: c.beta2,
        beta3: c.beta3,
        eps: c.eps,
        weight_decay: c.weight_decay,
        max_grad_norm: c.max_grad_norm,
        no_prox: c.no_prox,
    }
}

/// The trajectory on `backend`: the oracle (storing what it keeps in the parameters'
/// dtype), the CPU backend, or the GPU [`Optimizer`] on a buffer per tensor (in place) or on
/// tensors packed at odd offsets into one buffer (out of place).
pub(super) async fn trajectory(case: &Case, backend: Backend, ctx: Option<&GpuContext>) -> Result<Outputs> {
    let hyperparameters = config(case)?;
    let config = crate_config(&hyperparameters);
    let (n, steps) = (case.count, case.steps);
    let inputs = Inputs::read(case)?;
    let finals: Vec<(Vec<f64>, [Vec<f64>; 4])> = match (backend, ctx) {
        (Backend::Oracle, _) => {
            let mut oracle = AdanOracle::new(hyperparameters, n).storing(inputs.dtype.to_oracle(), inputs.dtype.to_oracle());
            let mut params = inputs.initial();
            for k in 0..steps {
                oracle.step(&mut params, &inputs.grads_at(k));
            }
            let mut finals = Vec::with_capacity(n);
            for (i, p) in params.into_iter().enumerate() {
                let states =
                    [&oracle.exp_avg, &oracle.exp_avg_diff, &oracle.exp_avg_sq, &oracle.neg_pre_grad];
                finals.push((p, states.map(|s| s[i].clone())));
            }
            finals
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
                let mut states: [Vec<f64>; 4] = Default::default();
                for (state, kind) in states.iter_mut().zip(KINDS) {
                    *state = optimizer
                        .state(i, kind)
                        .and_then(|s| s.dense())
                        .ok_or_else(|| case.bad("missing state".into()))?
                        .to_f64();
                }
                finals.push((t.to_f64(), states));
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
                let mut states: [Vec<f64>; 4] = Default::default();
                for (state, kind) in states.iter_mut().zip(KINDS) {
                    let tensor = optimizer
                        .state_async(i, kind)
                        .await?
                        .and_then(|s| s.dense())
                        .ok_or_else(|| case.bad("missing state".into()))?;
                    *state = ctx.read_async(tensor).await?;
                }
                finals.push((ctx.read_async(t).await?, states));
            }
            finals
        }
    };
    let mut outputs = Outputs::new();
    for (i, (p, [m, v, n, neg_pre_grad])) in finals.into_iter().enumerate() {
        outputs.push((format!("param_out.{i}"), p));
        outputs.push((format!("exp_avg.{i}"), m));
        outputs.push((format!("exp_avg_diff.{i}"), v));
        outputs.push((format!("exp_avg_sq.{i}"), n));
        outputs.push((format!("neg_pre_grad.{i}"), neg_pre_grad));
    }
    Ok(outputs)
}
