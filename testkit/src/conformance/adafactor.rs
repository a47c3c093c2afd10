//! Running a `torch.Adafactor` trajectory: `steps` calls of `step()` from the initial
//! parameters, each tensor given its shape; the outputs are `param_out`, `step` and the
//! states under torch's names (`row_var` and `col_var` in torch's shapes, or `variance`).

#[cfg(feature = "cpu")]
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostTensor};
use wgpu_optim::{adafactor_state_kinds, Adafactor, Error, GpuContext, Optimizer, Result};

use super::case::{Case, Kind, Op};
use super::inputs::Inputs;
use super::run::Backend;
use crate::oracle::{AdafactorOracle, Storage, ToOracle};

/// The op this module runs: its name, kind and every attribute it reads.
pub(super) const OP: Op = Op { name: "torch.Adafactor", kind: Kind::Trajectory, attributes: &["lr", "beta2_decay", "eps", "d", "weight_decay", "maximize"] };

type Outputs = Vec<(String, Vec<f64>)>;

/// The case's hyperparameters, with torch's defaults; `eps` is `[eps1 or null, eps2]`.
fn config(case: &Case) -> Result<Adafactor> {
    let defaults = Adafactor::default();
    let (eps1, eps2) = match case.attributes.get("eps") {
        None => (defaults.eps1, defaults.eps2),
        Some(v) => match v.as_array().map(Vec::as_slice) {
            Some([first, second]) if first.is_null() || first.is_number() => {
                let eps2 = second.as_f64().ok_or_else(|| case.bad(format!("attribute `eps` = {v}")))?;
                (first.as_f64(), eps2)
            }
            _ => return Err(case.bad(format!("attribute `eps` = {v} is not [number or null, number]"))),
        },
    };
    Ok(Adafactor {
        lr: case.attr_f64("lr", defaults.lr)?,
        beta2_decay: case.attr_f64("beta2_decay", defaults.beta2_decay)?,
        eps1,
        eps2,
        d: case.attr_f64("d", defaults.d)?,
        weight_decay: case.attr_f64("weight_decay", defaults.weight_decay)?,
        maximize: case.attr_bool("maximize", defaults.maximize)?,
    })
}

/// The trajectory on `backend`: the oracle, the CPU backend, or the GPU [`Optimizer`] on a
/// buffer per tensor (in place) or on tensors packed at odd offsets into one buffer each for
/// the parameters and the gradients (out of place: Adafactor has no stateless operator).
pub(super) async fn trajectory(case: &Case, backend: Backend, ctx: Option<&GpuContext>) -> Result<Outputs> {
    let config = config(case)?;
    let (n, steps) = (case.count, case.steps);
    let inputs = Inputs::read(case)?;
    let dtype = inputs.dtype;
    let shapes = inputs.shapes();
    // Each tensor's final value and its states in `adafactor_state_kinds` order.
    let mut finals: Vec<(Vec<f64>, Vec<Vec<f64>>)> = Vec::with_capacity(n);
    match (backend, ctx) {
        (Backend::Oracle, _) => {
            let mut oracle = AdafactorOracle::new(config.to_oracle(), shapes.clone(), dtype.to_oracle());
            let mut values = inputs.initial();
            for k in 0..steps {
                oracle.step(&mut values, &inputs.grads_at(k));
            }
            for (value, state) in values.into_iter().zip(oracle.state) {
                let states = if state.variance.is_empty() && !state.row_var.is_empty() {
                    vec![state.row_var, state.col_var]
                } else {
                    vec![state.variance]
                };
                finals.push((value, states));
            }
        }
        #[cfg(feature = "cpu")]
        (Backend::Cpu, _) => {
            let mut tensors = inputs.host_params()?;
            let views: Vec<HostSlice<'_>> = tensors.iter().map(HostTensor::as_slice).collect();
            let mut optimizer = CpuOptimizer::builder().param_shapes(shapes.clone()).build(config, &views)?;
            for k in 0..steps {
                inputs.cpu_step(&mut optimizer, &mut tensors, k)?;
            }
            for (i, t) in tensors.iter().enumerate() {
                let states = adafactor_state_kinds(&shapes[i])
                    .iter()
                    .map(|kind| {
                        Ok(optimizer
                            .state(i, *kind)
                            .and_then(|s| s.dense())
                            .ok_or_else(|| case.bad("missing state".into()))?
                            .to_f64())
                    })
                    .collect::<Result<_>>()?;
                finals.push((t.to_f64(), states));
            }
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
            for (i, t) in param_tensors.iter().enumerate() {
                let mut states = Vec::new();
                for kind in adafactor_state_kinds(&shapes[i]) {
                    let state = optimizer
                        .state_async(i, *kind)
                        .await?
                        .and_then(|s| s.dense())
                        .ok_or_else(|| case.bad("missing state".into()))?;
                    states.push(ctx.read_async(state).await?);
                }
                finals.push((ctx.read_async(t).await?, states));
            }
        }
    }
    let mut outputs: Outputs = Vec::new();
    for (i, (value, states)) in finals.into_iter().enumerate() {
        outputs.push((format!("param_out.{i}"), value.into_iter().map(|v| dtype.to_oracle().round(v)).collect()));
        for (kind, state) in adafactor_state_kinds(&shapes[i]).iter().zip(states) {
            outputs.push((format!("{}.{i}", kind.torch_name()), state));
        }
        // torch keeps a per-tensor step; every tensor here gets a gradient at every step.
        outputs.push((format!("step.{i}"), vec![steps as f64]));
    }
    Ok(outputs)
}
