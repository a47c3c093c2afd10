//! Running a `torch_optimizer.Lamb` trajectory: `steps` calls of `step()` from the initial
//! parameters; the outputs are the parameters, each tensor's `exp_avg` and `exp_avg_sq`,
//! and each tensor's `weight_norm`, `adam_norm` and `trust_ratio` at the last step.

#[cfg(feature = "cpu")]
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostTensor};
use wgpu_optim::{Error, GpuContext, Lamb, Optimizer, Result, StateKind};

use super::case::{Case, Kind, Op};
use super::inputs::Inputs;
use super::run::Backend;
use crate::oracle::{LambOracle, ToOracle};

/// The op this module runs: its name, kind and every attribute it reads.
pub(super) const OP: Op = Op { name: "torch_optimizer.Lamb", kind: Kind::Trajectory, attributes: &["lr", "betas", "eps", "weight_decay", "clamp_value", "adam", "debias"] };

type Outputs = Vec<(String, Vec<f64>)>;

/// A tensor's final values: the parameter, `[exp_avg, exp_avg_sq]`, and
/// `[weight_norm, adam_norm, trust_ratio]`.
type Finals = Vec<(Vec<f64>, [Vec<f64>; 2], [f64; 3])>;

/// The case's hyperparameters, with the package's defaults.
fn config(case: &Case) -> Result<Lamb> {
    let defaults = Lamb::default();
    let betas = case.attr_pair("betas", (defaults.beta1, defaults.beta2))?;
    Ok(Lamb {
        lr: case.attr_f64("lr", defaults.lr)?,
        beta1: betas.0,
        beta2: betas.1,
        eps: case.attr_f64("eps", defaults.eps)?,
        weight_decay: case.attr_f64("weight_decay", defaults.weight_decay)?,
        clamp_value: case.attr_f64("clamp_value", defaults.clamp_value)?,
        adam: case.attr_bool("adam", defaults.adam)?,
        debias: case.attr_bool("debias", defaults.debias)?,
    })
}

/// The trajectory on `backend`: the oracle, the CPU backend, or the GPU [`Optimizer`] on a
/// buffer per tensor (in place) or on tensors packed at odd offsets into one buffer (out of
/// place: LAMB has no stateless operator).
pub(super) async fn trajectory(case: &Case, backend: Backend, ctx: Option<&GpuContext>) -> Result<Outputs> {
    let config = config(case)?;
    let (n, steps) = (case.count, case.steps);
    let inputs = Inputs::read(case)?;
    let dtype = inputs.dtype;
    let finals: Finals = match (backend, ctx) {
        (Backend::Oracle, _) => {
            let mut oracle = LambOracle::new(config.to_oracle(), n).storing(dtype.to_oracle(), dtype.to_oracle());
            let mut values = inputs.initial();
            for k in 0..steps {
                oracle.step(&mut values, &inputs.grads_at(k));
            }
            values
                .into_iter()
                .enumerate()
                .map(|(i, p)| {
                    let norms = oracle.norms[i];
                    let state = [oracle.exp_avg[i].clone(), oracle.exp_avg_sq[i].clone()];
                    (p, state, [norms.weight_norm, norms.adam_norm, norms.trust_ratio])
                })
                .collect()
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
                let norms = optimizer.lamb_norms(i).ok_or_else(|| case.bad("no LAMB norms".into()))?;
                let norms = [norms.weight_norm, norms.adam_norm, norms.trust_ratio].map(f64::from);
                finals.push((t.to_f64(), [state(StateKind::ExpAvg)?, state(StateKind::ExpAvgSq)?], norms));
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
                for kind in [StateKind::ExpAvg, StateKind::ExpAvgSq] {
                    let state = optimizer
                        .state_async(i, kind)
                        .await?
                        .and_then(|s| s.dense())
                        .ok_or_else(|| case.bad("missing state".into()))?;
                    pair.push(ctx.read_async(state).await?);
                }
                let norms = optimizer.lamb_norms(i).ok_or_else(|| case.bad("no LAMB norms".into()))?;
                let norms = ctx.read_async(&norms).await?;
                let exp_avg_sq = pair.pop().unwrap_or_default();
                let exp_avg = pair.pop().unwrap_or_default();
                let norms = [0, 1, 2].map(|k| norms.get(k).copied().unwrap_or(f64::NAN));
                finals.push((ctx.read_async(t).await?, [exp_avg, exp_avg_sq], norms));
            }
            finals
        }
    };
    let mut outputs: Outputs = Vec::new();
    for (i, (p, [m, v], [weight_norm, adam_norm, trust_ratio])) in finals.into_iter().enumerate() {
        outputs.push((format!("param_out.{i}"), p));
        outputs.push((format!("exp_avg.{i}"), m));
        outputs.push((format!("exp_avg_sq.{i}"), v));
        outputs.push((format!("weight_norm.{i}"), vec![weight_norm]));
        outputs.push((format!("adam_norm.{i}"), vec![adam_norm]));
        outputs.push((format!("trust_ratio.{i}"), vec![trust_ratio]));
    }
    Ok(outputs)
}
