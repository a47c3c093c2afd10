//! Adan's `param_groups` entry in checkpoints, under the official `Adan`'s keys.

use super::config::Adan;
use crate::checkpoint::{FamilyCheckpoint, JsonFields};
use crate::Result;

impl FamilyCheckpoint for Adan {
    const CLASSES: &'static [&'static str] = &["Adan"];

    fn to_json(&self) -> serde_json::Value {
        let c = self;
        serde_json::json!({
            "optimizer": "Adan", "lr": c.lr, "betas": [c.beta1, c.beta2, c.beta3], "eps": c.eps,
            "weight_decay": c.weight_decay, "max_grad_norm": c.max_grad_norm, "no_prox": c.no_prox,
        })
    }

    fn from_json(_class: &str, fields: &JsonFields<'_>) -> Result<Self> {
        let [beta1, beta2, beta3] = fields.numbers("betas")?;
        Ok(Adan {
            lr: fields.number("lr")?,
            beta1,
            beta2,
            beta3,
            eps: fields.number("eps")?,
            weight_decay: fields.number("weight_decay")?,
            max_grad_norm: fields.number("max_grad_norm")?,
            no_prox: fields.flag("no_prox")?,
        })
    }
}
