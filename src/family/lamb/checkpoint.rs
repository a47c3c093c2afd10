//! LAMB's `param_groups` entry in checkpoints, under torch-optimizer's keys.

use super::config::Lamb;
use crate::checkpoint::{FamilyCheckpoint, JsonFields};
use crate::Result;

impl FamilyCheckpoint for Lamb {
    const CLASSES: &'static [&'static str] = &["Lamb"];

    fn to_json(&self) -> serde_json::Value {
        let c = self;
        serde_json::json!({
            "optimizer": "Lamb", "lr": c.lr, "betas": [c.beta1, c.beta2], "eps": c.eps,
            "weight_decay": c.weight_decay, "clamp_value": c.clamp_value, "adam": c.adam, "debias": c.debias,
        })
    }

    fn from_json(_class: &str, fields: &JsonFields<'_>) -> Result<Self> {
        let [beta1, beta2] = fields.numbers("betas")?;
        Ok(Lamb {
            lr: fields.number("lr")?,
            beta1,
            beta2,
            eps: fields.number("eps")?,
            weight_decay: fields.number("weight_decay")?,
            clamp_value: fields.number("clamp_value")?,
            adam: fields.flag("adam")?,
            debias: fields.flag("debias")?,
        })
    }
}
