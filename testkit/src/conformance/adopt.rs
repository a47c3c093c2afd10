//! Running an `adopt.ADOPT` trajectory: `steps` calls of `step()` from the initial
//! parameters, on the oracle only (the crate has no ADOPT yet); the outputs are the
//! parameters and each tensor's `exp_avg` and `exp_avg_sq`.

use wgpu_optim::Result;

use super::case::Case;
use super::inputs::Inputs;
use crate::oracle::{AdoptHyperparameters, AdoptOracle};

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
fn config(case: &Case) -> Result<AdoptHyperparameters> {
    let defaults = AdoptHyperparameters::default();
    let (beta1, beta2) = case.attr_pair("betas", (defaults.beta1, defaults.beta2))?;
    Ok(AdoptHyperparameters {
        lr: case.attr_f64("lr", defaults.lr)?,
        beta1,
        beta2,
        eps: case.attr_f64("eps", defaults.eps)?,
        clip_lambda: clip_lambda(case, defaults.clip_lambda)?,
        weight_decay: case.attr_f64("weight_decay", defaults.weight_decay)?,
        decouple: case.attr_bool("decouple", defaults.decouple)?,
        maximize: case.attr_bool("maximize", defaults.maximize)?,
    })
}

/// The trajectory on the oracle, storing what it keeps in the parameters' dtype.
pub(super) fn oracle_trajectory(case: &Case) -> Result<Outputs> {
    let inputs = Inputs::read(case)?;
    let mut oracle = AdoptOracle::new(config(case)?, case.count).storing(inputs.dtype, inputs.dtype);
    let mut params = inputs.initial();
    for k in 0..case.steps {
        oracle.step(&mut params, &inputs.grads_at(k));
    }
    let mut outputs = Outputs::new();
    for (i, p) in params.into_iter().enumerate() {
        outputs.push((format!("param_out.{i}"), p));
        outputs.push((format!("exp_avg.{i}"), oracle.exp_avg[i].clone()));
        outputs.push((format!("exp_avg_sq.{i}"), oracle.exp_avg_sq[i].clone()));
    }
    Ok(outputs)
}
