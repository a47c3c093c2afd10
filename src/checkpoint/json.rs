//! Algorithms as `param_groups` entries in JSON, under PyTorch's keys.

use crate::AdEMAMix;
use crate::Adafactor;
use crate::Lamb;
use crate::Lion;
use crate::RmsProp;
use crate::ScheduleFreeAdamW;
use crate::{Adagrad, Adam, Algorithm, Error, Result, Sgd};
use crate::{Muon, MuonLrAdjust, NsPrecision};

/// An optimizer's `param_groups` entry in JSON. Kept with the checkpoints (not with the
/// algorithms) so that the `checkpoint` feature alone brings in serde_json.
impl Algorithm {
    /// The hyperparameters under PyTorch's names, as in an optimizer's `param_groups`, with
    /// `"optimizer"` naming the class ([`Algorithm::name`]).
    pub fn to_json(&self) -> serde_json::Map<String, serde_json::Value> {
        use serde_json::json;
        let value = match self {
            Algorithm::Adam(c) => json!({
                "optimizer": if c.decoupled_weight_decay { "AdamW" } else { "Adam" },
                "lr": c.lr, "betas": [c.beta1, c.beta2], "eps": c.eps, "weight_decay": c.weight_decay,
                "amsgrad": c.amsgrad, "maximize": c.maximize,
            }),
            Algorithm::Sgd(c) => json!({
                "optimizer": "SGD", "lr": c.lr, "momentum": c.momentum, "dampening": c.dampening,
                "weight_decay": c.weight_decay, "nesterov": c.nesterov, "maximize": c.maximize,
            }),
            Algorithm::Adagrad(c) => json!({
                "optimizer": "Adagrad", "lr": c.lr, "lr_decay": c.lr_decay, "weight_decay": c.weight_decay,
                "initial_accumulator_value": c.initial_accumulator_value, "eps": c.eps, "maximize": c.maximize,
            }),
            Algorithm::Lion(c) => json!({
                "optimizer": "Lion", "lr": c.lr, "betas": [c.beta1, c.beta2], "weight_decay": c.weight_decay,
            }),
            Algorithm::ScheduleFreeAdamW(c) => json!({
                "optimizer": "AdamWScheduleFree", "lr": c.lr, "betas": [c.beta1, c.beta2], "eps": c.eps,
                "weight_decay": c.weight_decay, "warmup_steps": c.warmup_steps, "r": c.r,
                "weight_lr_power": c.weight_lr_power,
            }),
            Algorithm::Adafactor(c) => json!({
                "optimizer": "Adafactor", "lr": c.lr, "beta2_decay": c.beta2_decay, "eps": [c.eps1, c.eps2],
                "d": c.d, "weight_decay": c.weight_decay, "maximize": c.maximize,
            }),
            Algorithm::Muon(c) => json!({
                "optimizer": "Muon", "lr": c.lr, "weight_decay": c.weight_decay, "momentum": c.momentum,
                "nesterov": c.nesterov,
                "ns_coefficients": [c.ns_coefficients.0, c.ns_coefficients.1, c.ns_coefficients.2],
                "eps": c.eps, "ns_steps": c.ns_steps, "adjust_lr_fn": c.adjust_lr.torch_name(),
                "ns_dtype": c.ns_precision.torch_name(),
            }),
            Algorithm::RmsProp(c) => json!({
                "optimizer": "RMSprop", "lr": c.lr, "alpha": c.alpha, "eps": c.eps, "weight_decay": c.weight_decay,
                "momentum": c.momentum, "centered": c.centered, "maximize": c.maximize,
            }),
            Algorithm::AdEMAMix(c) => json!({
                "optimizer": "AdEMAMix", "lr": c.lr, "betas": [c.beta1, c.beta2, c.beta3], "alpha": c.alpha,
                "t_alpha": c.t_alpha, "t_beta3": c.t_beta3, "eps": c.eps, "weight_decay": c.weight_decay,
            }),
            Algorithm::Adopt(c) => crate::family::adopt::checkpoint::to_json(c),
            Algorithm::Lamb(c) => json!({
                "optimizer": "Lamb", "lr": c.lr, "betas": [c.beta1, c.beta2], "eps": c.eps,
                "weight_decay": c.weight_decay, "clamp_value": c.clamp_value, "adam": c.adam, "debias": c.debias,
            }),
        };
        match value {
            serde_json::Value::Object(map) => map,
            _ => serde_json::Map::new(),
        }
    }

    /// The inverse of [`Algorithm::to_json`]; [`Error::BadJson`] names the field that is
    /// missing or wrong.
    pub fn from_json(map: &serde_json::Map<String, serde_json::Value>) -> Result<Self> {
        let bad = |problem: String| Error::BadJson { problem };
        let number = |key: &str| {
            map.get(key)
                .and_then(|v| v.as_f64())
                .ok_or_else(|| bad(format!("`{key}` is missing or not a number")))
        };
        let flag = |key: &str| {
            map.get(key)
                .and_then(|v| v.as_bool())
                .ok_or_else(|| bad(format!("`{key}` is missing or not a boolean")))
        };
        let name = map
            .get("optimizer")
            .and_then(|v| v.as_str())
            .ok_or_else(|| bad("`optimizer` is missing".into()))?;
        Ok(match name {
            "Adam" | "AdamW" => {
                let betas = map
                    .get("betas")
                    .and_then(|v| v.as_array())
                    .ok_or_else(|| bad("`betas` is missing".into()))?;
                let beta = |k: usize| {
                    betas
                        .get(k)
                        .and_then(|v| v.as_f64())
                        .ok_or_else(|| bad("`betas` is not two numbers".into()))
                };
                Algorithm::Adam(Adam {
                    lr: number("lr")?,
                    beta1: beta(0)?,
                    beta2: beta(1)?,
                    eps: number("eps")?,
                    weight_decay: number("weight_decay")?,
                    decoupled_weight_decay: name == "AdamW",
                    amsgrad: flag("amsgrad")?,
                    maximize: flag("maximize")?,
                })
            }
            "SGD" => Algorithm::Sgd(Sgd {
                lr: number("lr")?,
                momentum: number("momentum")?,
                dampening: number("dampening")?,
                weight_decay: number("weight_decay")?,
                nesterov: flag("nesterov")?,
                maximize: flag("maximize")?,
            }),
            "Adagrad" => Algorithm::Adagrad(Adagrad {
                lr: number("lr")?,
                lr_decay: number("lr_decay")?,
                weight_decay: number("weight_decay")?,
                initial_accumulator_value: number("initial_accumulator_value")?,
                eps: number("eps")?,
                maximize: flag("maximize")?,
            }),
            "Lion" => {
                let [beta1, beta2] = numbers(map, "betas")?;
                Algorithm::Lion(Lion {
                    lr: number("lr")?,
                    beta1,
                    beta2,
                    weight_decay: number("weight_decay")?,
                })
            }
            "AdamWScheduleFree" => {
                let [beta1, beta2] = numbers(map, "betas")?;
                let warmup_steps = map
                    .get("warmup_steps")
                    .and_then(|v| v.as_u64())
                    .ok_or_else(|| bad("`warmup_steps` is missing or not a whole number >= 0".into()))?;
                Algorithm::ScheduleFreeAdamW(ScheduleFreeAdamW {
                    lr: number("lr")?,
                    beta1,
                    beta2,
                    eps: number("eps")?,
                    weight_decay: number("weight_decay")?,
                    warmup_steps,
                    r: number("r")?,
                    weight_lr_power: number("weight_lr_power")?,
                })
            }
            "Adafactor" => {
                // torch's `eps` is `(eps1 or None, eps2)`.
                let eps = map.get("eps").and_then(|v| v.as_array()).filter(|a| a.len() == 2);
                let eps = eps.ok_or_else(|| bad("`eps` is missing or not a pair".into()))?;
                let eps1 = match &eps[0] {
                    serde_json::Value::Null => None,
                    v => Some(v.as_f64().ok_or_else(|| bad("`eps[0]` is not null or a number".into()))?),
                };
                let eps2 = eps[1].as_f64().ok_or_else(|| bad("`eps[1]` is not a number".into()))?;
                Algorithm::Adafactor(Adafactor {
                    lr: number("lr")?,
                    beta2_decay: number("beta2_decay")?,
                    eps1,
                    eps2,
                    d: number("d")?,
                    weight_decay: number("weight_decay")?,
                    maximize: flag("maximize")?,
                })
            }
            "Muon" => {
                let [a, b, c] = numbers(map, "ns_coefficients")?;
                let adjust_lr = match map.get("adjust_lr_fn") {
                    None | Some(serde_json::Value::Null) => MuonLrAdjust::Original,
                    Some(v) => v.as_str().and_then(MuonLrAdjust::from_torch_name).ok_or_else(|| {
                        bad("`adjust_lr_fn` is not original, match_rms_adamw or spectral_unclamped".into())
                    })?,
                };
                let ns_precision = match map.get("ns_dtype").and_then(|v| v.as_str()) {
                    None | Some("bfloat16") => NsPrecision::BF16,
                    Some("float32") => NsPrecision::F32,
                    Some(_) => return Err(bad("`ns_dtype` is not bfloat16 or float32".into())),
                };
                let ns_steps = map
                    .get("ns_steps")
                    .and_then(|v| v.as_u64())
                    .and_then(|v| u32::try_from(v).ok())
                    .ok_or_else(|| bad("`ns_steps` is missing or not a whole number >= 0".into()))?;
                Algorithm::Muon(Muon {
                    lr: number("lr")?,
                    weight_decay: number("weight_decay")?,
                    momentum: number("momentum")?,
                    nesterov: flag("nesterov")?,
                    ns_coefficients: (a, b, c),
                    eps: number("eps")?,
                    ns_steps,
                    adjust_lr,
                    ns_precision,
                })
            }
            "RMSprop" => Algorithm::RmsProp(RmsProp {
                lr: number("lr")?,
                alpha: number("alpha")?,
                eps: number("eps")?,
                weight_decay: number("weight_decay")?,
                momentum: number("momentum")?,
                centered: flag("centered")?,
                maximize: flag("maximize")?,
            }),
            "AdEMAMix" => {
                let [beta1, beta2, beta3] = numbers(map, "betas")?;
                let steps = |key: &str| match map.get(key) {
                    Some(serde_json::Value::Null) => Ok(None),
                    Some(v) => v
                        .as_u64()
                        .map(Some)
                        .ok_or_else(|| bad(format!("`{key}` is not null or a step count"))),
                    None => Err(bad(format!("`{key}` is missing"))),
                };
                Algorithm::AdEMAMix(AdEMAMix {
                    lr: number("lr")?,
                    beta1,
                    beta2,
                    beta3,
                    alpha: number("alpha")?,
                    t_alpha: steps("t_alpha")?,
                    t_beta3: steps("t_beta3")?,
                    eps: number("eps")?,
                    weight_decay: number("weight_decay")?,
                })
            }
            "Lamb" => {
                let [beta1, beta2] = numbers(map, "betas")?;
                Algorithm::Lamb(Lamb {
                    lr: number("lr")?,
                    beta1,
                    beta2,
                    eps: number("eps")?,
                    weight_decay: number("weight_decay")?,
                    clamp_value: number("clamp_value")?,
                    adam: flag("adam")?,
                    debias: flag("debias")?,
                })
            }
            "ADOPT" => Algorithm::Adopt(crate::family::adopt::checkpoint::from_json(map)?),
            other => return Err(bad(format!("unknown optimizer `{other}`"))),
        })
    }
}

/// The `N` numbers of the array `key` (`betas`), or [`Error::BadJson`] naming it.
fn numbers<const N: usize>(map: &serde_json::Map<String, serde_json::Value>, key: &str) -> Result<[f64; N]> {
    let bad = || Error::BadJson { problem: format!("`{key}` is missing or not {N} numbers") };
    let values = map.get(key).and_then(|v| v.as_array()).ok_or_else(bad)?;
    if values.len() != N {
        return Err(bad());
    }
    let mut out = [0.0; N];
    for (o, v) in out.iter_mut().zip(values) {
        *o = v.as_f64().ok_or_else(bad)?;
    }
    Ok(out)
}
