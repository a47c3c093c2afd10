//! ADOPT as a `param_groups` entry in JSON, under the official `ADOPT`'s keys. The clipping
//! callable `clip_lambda` is kept as its exponent `q` (`step ** q`), or `null` for none, as
//! the conformance files write it.

use serde_json::{json, Map, Value};

use super::config::Adopt;
use crate::{Error, Result};

/// The configuration under the official keys, with `"optimizer": "ADOPT"`.
pub(crate) fn to_json(c: &Adopt) -> Value {
    json!({
        "optimizer": "ADOPT", "lr": c.lr, "betas": [c.beta1, c.beta2], "eps": c.eps,
        "weight_decay": c.weight_decay, "decouple": c.decouple, "clip_lambda": c.clip_exponent,
        "maximize": c.maximize,
    })
}

/// The inverse of [`to_json`]; [`Error::BadJson`] names the field that is missing or wrong.
pub(crate) fn from_json(map: &Map<String, Value>) -> Result<Adopt> {
    let bad = |problem: String| Error::BadJson { problem };
    let number = |key: &str| {
        map.get(key).and_then(Value::as_f64).ok_or_else(|| bad(format!("`{key}` is missing or not a number")))
    };
    let flag = |key: &str| {
        map.get(key)
            .and_then(Value::as_bool)
            .ok_or_else(|| bad(format!("`{key}` is missing or not a boolean")))
    };
    let betas = match map.get("betas").and_then(Value::as_array).map(Vec::as_slice) {
        Some([beta1, beta2]) => beta1.as_f64().zip(beta2.as_f64()),
        _ => None,
    };
    let (beta1, beta2) = betas.ok_or_else(|| bad("`betas` is missing or not 2 numbers".into()))?;
    let clip_exponent = match map.get("clip_lambda") {
        Some(Value::Null) => None,
        Some(value) => {
            Some(value.as_f64().ok_or_else(|| bad("`clip_lambda` is not null or an exponent".into()))?)
        }
        None => return Err(bad("`clip_lambda` is missing".into())),
    };
    Ok(Adopt {
        lr: number("lr")?,
        beta1,
        beta2,
        eps: number("eps")?,
        weight_decay: number("weight_decay")?,
        decouple: flag("decouple")?,
        clip_exponent,
        maximize: flag("maximize")?,
    })
}
