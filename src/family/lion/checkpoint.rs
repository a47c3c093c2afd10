//! Lion's `param_groups` entry in checkpoints, under lion-pytorch's keys.

use super::config::Lion;
use crate::checkpoint::{FamilyCheckpoint, JsonFields};
use crate::Result;

impl FamilyCheckpoint for Lion {
    const CLASSES: &'static [&'static str] = &["Lion"];

    fn to_json(&self) -> serde_json::Value {
        let c = self;
        serde_json::json!({
            "optimizer": "Lion", "lr": c.lr, "betas": [c.beta1, c.beta2], "weight_decay": c.weight_decay,
        })
    }

    fn from_json(_class: &str, fields: &JsonFields<'_>) -> Result<Self> {
        let [beta1, beta2] = fields.numbers("betas")?;
        Ok(Lion { lr: fields.number("lr")?, beta1, beta2, weight_decay: fields.number("weight_decay")? })
    }
}
