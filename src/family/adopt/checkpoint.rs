//! ADOPT's `param_groups` entry in checkpoints, under the official `ADOPT`'s keys. The
//! clipping callable `clip_lambda` is kept as its exponent `q` (`step ** q`), or `null` for
//! none, as the conformance files write it.

use super::config::Adopt;
use crate::checkpoint::{bad_json, FamilyCheckpoint, JsonFields};
use crate::Result;

impl FamilyCheckpoint for Adopt {
    const CLASSES: &'static [&'static str] = &["ADOPT"];

    fn to_json(&self) -> serde_json::Value {
        let c = self;
        serde_json::json!({
            "optimizer": "ADOPT", "lr": c.lr, "betas": [c.beta1, c.beta2], "eps": c.eps,
            "weight_decay": c.weight_decay, "decouple": c.decouple, "clip_lambda": c.clip_exponent,
            "maximize": c.maximize,
        })
    }

    fn from_json(_class: &str, fields: &JsonFields<'_>) -> Result<Self> {
        let [beta1, beta2] = fields.numbers("betas")?;
        let clip_exponent = match fields.get("clip_lambda") {
            Some(serde_json::Value::Null) => None,
            Some(value) => Some(
                value.as_f64().ok_or_else(|| bad_json("`clip_lambda` is not null or an exponent".into()))?,
            ),
            None => return Err(bad_json("`clip_lambda` is missing".into())),
        };
        Ok(Adopt {
            lr: fields.number("lr")?,
            beta1,
            beta2,
            eps: fields.number("eps")?,
            weight_decay: fields.number("weight_decay")?,
            decouple: fields.flag("decouple")?,
            clip_exponent,
            maximize: fields.flag("maximize")?,
        })
    }
}
