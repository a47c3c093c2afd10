//! Running an `adan.Adan` trajectory: `steps` calls of `step()` from the initial parameters,
//! on the oracle only (the crate has no Adan yet); the outputs are the parameters and each
//! tensor's `exp_avg`, `exp_avg_diff`, `exp_avg_sq` and `neg_pre_grad`.

use wgpu_optim::Result;

use super::case::Case;
use super::inputs::Inputs;
use crate::oracle::{AdanHyperparameters, AdanOracle};

type Outputs = Vec<(String, Vec<f64>)>;

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

/// The trajectory on the oracle, storing what it keeps in the parameters' dtype.
pub(super) fn oracle_trajectory(case: &Case) -> Result<Outputs> {
    let inputs = Inputs::read(case)?;
    let mut oracle = AdanOracle::new(config(case)?, case.count).storing(inputs.dtype, inputs.dtype);
    let mut params = inputs.initial();
    for k in 0..case.steps {
        oracle.step(&mut params, &inputs.grads_at(k));
    }
    let mut outputs = Outputs::new();
    for (i, p) in params.into_iter().enumerate() {
        outputs.push((format!("param_out.{i}"), p));
        outputs.push((format!("exp_avg.{i}"), oracle.exp_avg[i].clone()));
        outputs.push((format!("exp_avg_diff.{i}"), oracle.exp_avg_diff[i].clone()));
        outputs.push((format!("exp_avg_sq.{i}"), oracle.exp_avg_sq[i].clone()));
        outputs.push((format!("neg_pre_grad.{i}"), oracle.neg_pre_grad[i].clone()));
    }
    Ok(outputs)
}
