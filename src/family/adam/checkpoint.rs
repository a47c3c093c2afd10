//! Adam's `param_groups` entry in checkpoints, under PyTorch's keys (class `Adam` or `AdamW`).

use super::config::Adam;
use crate::checkpoint::{bad_json, FamilyCheckpoint, JsonFields};
use crate::Result;

impl FamilyCheckpoint for Adam {
    const CLASSES: &'static [&'static str] = &["Adam", "AdamW"];

    fn to_json(&self) -> serde_json::Value {
        let c = self;
        serde_json::json!({
            "optimizer": if c.decoupled_weight_decay { "AdamW" } else { "Adam" },
            "lr": c.lr, "betas": [c.beta1, c.beta2], "eps": c.eps, "weight_decay": c.weight_decay,
            "amsgrad": c.amsgrad, "maximize": c.maximize,
        })
    }

    fn from_json(class: &str, fields: &JsonFields<'_>) -> Result<Self> {
        let betas = fields
            .get("betas")
            .and_then(|v| v.as_array())
            .ok_or_else(|| bad_json("`betas` is missing".into()))?;
        let beta = |k: usize| {
            betas.get(k).and_then(|v| v.as_f64()).ok_or_else(|| bad_json("`betas` is not two numbers".into()))
        };
        Ok(Adam {
            lr: fields.number("lr")?,
            beta1: beta(0)?,
            beta2: beta(1)?,
            eps: fields.number("eps")?,
            weight_decay: fields.number("weight_decay")?,
            decoupled_weight_decay: class == "AdamW",
            amsgrad: fields.flag("amsgrad")?,
            maximize: fields.flag("maximize")?,
        })
    }
}
