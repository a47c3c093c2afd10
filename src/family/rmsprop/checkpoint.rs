//! RMSprop's `param_groups` entry in checkpoints, under PyTorch's keys.

use super::config::RmsProp;
use crate::checkpoint::{FamilyCheckpoint, JsonFields};
use crate::Result;

impl FamilyCheckpoint for RmsProp {
    const CLASSES: &'static [&'static str] = &["RMSprop"];

    fn to_json(&self) -> serde_json::Value {
        let c = self;
        serde_json::json!({
            "optimizer": "RMSprop", "lr": c.lr, "alpha": c.alpha, "eps": c.eps, "weight_decay": c.weight_decay,
            "momentum": c.momentum, "centered": c.centered, "maximize": c.maximize,
        })
    }

    fn from_json(_class: &str, fields: &JsonFields<'_>) -> Result<Self> {
        Ok(RmsProp {
            lr: fields.number("lr")?,
            alpha: fields.number("alpha")?,
            eps: fields.number("eps")?,
            weight_decay: fields.number("weight_decay")?,
            momentum: fields.number("momentum")?,
            centered: fields.flag("centered")?,
            maximize: fields.flag("maximize")?,
        })
    }
}
