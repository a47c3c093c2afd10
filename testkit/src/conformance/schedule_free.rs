//! Running a `schedulefree.AdamWScheduleFree` trajectory: `steps` calls of `step()` from
//! the initial parameters, then `eval()`; the outputs are y (`param_out`), x
//! (`param_eval`), each tensor's `z` and `exp_avg_sq`, and the group's `k`, `weight_sum` and
//! `lr_max`.

#[cfg(feature = "cpu")]
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut, HostTensor};
use wgpu_optim::{Error, GpuContext, Optimizer, Result, ScheduleFreeAdamW, ScheduleFreeScalars, StateKind};

use super::case::{Case, Kind, Op};
use super::inputs::Inputs;
use super::run::Backend;
use crate::oracle::{ScheduleFreeOracle, Storage, ToOracle};

/// The op this module runs: its name, kind and every attribute it reads.
pub(super) const OP: Op = Op { name: "schedulefree.AdamWScheduleFree", kind: Kind::Trajectory, attributes: &["lr", "betas", "eps", "weight_decay", "warmup_steps", "r", "weight_lr_power"] };

type Outputs = Vec<(String, Vec<f64>)>;

/// A run's results: y after the steps, x after `eval()`, each tensor's `[z, exp_avg_sq]`,
/// and the group's running values.
type Finals = (Vec<Vec<f64>>, Vec<Vec<f64>>, Vec<[Vec<f64>; 2]>, ScheduleFreeScalars);

/// The case's hyperparameters, with the package's defaults.
fn config(case: &Case) -> Result<ScheduleFreeAdamW> {
    let defaults = ScheduleFreeAdamW::default();
    let warmup = case.attr_f64("warmup_steps", 0.0)?;
    if warmup.fract() != 0.0 || !(0.0..9e15).contains(&warmup) {
        return Err(case.bad(format!("attribute `warmup_steps` = {warmup} is not a whole number >= 0")));
    }
    let betas = case.attr_pair("betas", (defaults.beta1, defaults.beta2))?;
    Ok(ScheduleFreeAdamW {
        lr: case.attr_f64("lr", defaults.lr)?,
        beta1: betas.0,
        beta2: betas.1,
        eps: case.attr_f64("eps", defaults.eps)?,
        weight_decay: case.attr_f64("weight_decay", defaults.weight_decay)?,
        warmup_steps: warmup as u64,
        r: case.attr_f64("r", defaults.r)?,
        weight_lr_power: case.attr_f64("weight_lr_power", defaults.weight_lr_power)?,
    })
}

/// The trajectory on `backend`: the oracle, the CPU backend, or the GPU [`Optimizer`] on a
/// buffer per tensor (in place) or on tensors packed at odd offsets into one buffer
/// (out of place: Schedule-Free has no stateless operator, its step needs the group's
/// running values).
pub(super) async fn trajectory(case: &Case, backend: Backend, ctx: Option<&GpuContext>) -> Result<Outputs> {
    let config = config(case)?;
    let (n, steps) = (case.count, case.steps);
    let inputs = Inputs::read(case)?;
    let dtype = inputs.dtype;
    // y after the steps, x after eval(), each tensor's [z, exp_avg_sq], the group's values.
    let (y, x, states, scalars): Finals = match (backend, ctx) {
        (Backend::Oracle, _) => {
            let mut oracle = ScheduleFreeOracle::new(config.to_oracle(), n).storing(dtype.to_oracle(), dtype.to_oracle());
            let mut values = inputs.initial();
            for k in 0..steps {
                oracle.step(&mut values, &inputs.grads_at(k));
            }
            let mut x = values.clone();
            oracle.eval(&mut x);
            let states = (0..n).map(|i| [oracle.z[i].clone(), oracle.exp_avg_sq[i].clone()]).collect();
            let scalars =
                ScheduleFreeScalars { k: oracle.k, weight_sum: oracle.weight_sum, lr_max: oracle.lr_max };
            let round = |v: Vec<Vec<f64>>| -> Vec<Vec<f64>> {
                v.into_iter().map(|t| t.into_iter().map(|e| dtype.to_oracle().round(e)).collect()).collect()
            };
            (round(values), round(x), states, scalars)
        }
        #[cfg(feature = "cpu")]
        (Backend::Cpu, _) => {
            let mut tensors = inputs.host_params()?;
            let views: Vec<HostSlice<'_>> = tensors.iter().map(HostTensor::as_slice).collect();
            let mut optimizer = CpuOptimizer::builder().build(config, &views)?;
            for k in 0..steps {
                inputs.cpu_step(&mut optimizer, &mut tensors, k)?;
            }
            let y = tensors.iter().map(HostTensor::to_f64).collect();
            let mut param_views: Vec<HostSliceMut<'_>> =
                tensors.iter_mut().map(HostTensor::as_mut_slice).collect();
            optimizer.eval(&mut param_views)?;
            let x = tensors.iter().map(HostTensor::to_f64).collect();
            let state = |i: usize, kind: StateKind| -> Result<Vec<f64>> {
                Ok(optimizer
                    .state(i, kind)
                    .and_then(|s| s.dense())
                    .ok_or_else(|| case.bad("missing state".into()))?
                    .to_f64())
            };
            let states = (0..n)
                .map(|i| Ok([state(i, StateKind::Z)?, state(i, StateKind::ExpAvgSq)?]))
                .collect::<Result<_>>()?;
            let scalars =
                optimizer.schedule_free_scalars(0).ok_or_else(|| case.bad("no group values".into()))?;
            (y, x, states, scalars)
        }
        (_, None) => return Err(Error::MissingArgument { argument: "ctx", why: "by the GPU backends" }),
        (_, Some(ctx)) => {
            let (param_tensors, grad_tensors) = inputs.gpu_tensors(ctx, backend.in_place()).await?;
            let mut optimizer = Optimizer::builder().build(ctx, config, &param_tensors)?;
            for k in 0..steps {
                inputs.write_grads(ctx, &grad_tensors, k).await?;
                optimizer.step(&grad_tensors)?;
            }
            let mut y = Vec::with_capacity(n);
            for t in &param_tensors {
                y.push(ctx.read_async(t).await?);
            }
            optimizer.eval()?;
            let mut x = Vec::with_capacity(n);
            let mut states = Vec::with_capacity(n);
            for (i, t) in param_tensors.iter().enumerate() {
                x.push(ctx.read_async(t).await?);
                let mut pair = Vec::with_capacity(2);
                for kind in [StateKind::Z, StateKind::ExpAvgSq] {
                    let state = optimizer
                        .state_async(i, kind)
                        .await?
                        .and_then(|s| s.dense())
                        .ok_or_else(|| case.bad("missing state".into()))?;
                    pair.push(ctx.read_async(state).await?);
                }
                let exp_avg_sq = pair.pop().unwrap_or_default();
                states.push([pair.pop().unwrap_or_default(), exp_avg_sq]);
            }
            let scalars =
                optimizer.schedule_free_scalars(0).ok_or_else(|| case.bad("no group values".into()))?;
            (y, x, states, scalars)
        }
    };
    let mut outputs: Outputs = Vec::new();
    for (i, ((y, x), [z, v])) in y.into_iter().zip(x).zip(states).enumerate() {
        outputs.push((format!("param_out.{i}"), y));
        outputs.push((format!("param_eval.{i}"), x));
        outputs.push((format!("z.{i}"), z));
        outputs.push((format!("exp_avg_sq.{i}"), v));
    }
    outputs.push(("k".into(), vec![scalars.k as f64]));
    outputs.push(("weight_sum".into(), vec![scalars.weight_sum]));
    outputs.push(("lr_max".into(), vec![scalars.lr_max]));
    Ok(outputs)
}
