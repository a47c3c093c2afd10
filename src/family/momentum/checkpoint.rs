//! SGD's `param_groups` entry in checkpoints, under PyTorch's keys.

use super::config::Sgd;
use crate::checkpoint::{FamilyCheckpoint, JsonFields};
use crate::Result;

impl FamilyCheckpoint for Sgd {
    const CLASSES: &'static [&'static str] = &["SGD"];

    fn to_json(&self) -> serde_json::Value {
        let c = self;
        serde_json::json!({
            "optimizer": "SGD", "lr": c.lr, "momentum": c.momentum, "dampening": c.dampening,
            "weight_decay": c.weight_decay, "nesterov": c.nesterov, "maximize": c.maximize,
        })
    }

    fn from_json(_class: &str, fields: &JsonFields<'_>) -> Result<Self> {
        Ok(Sgd {
            lr: fields.number("lr")?,
            momentum: fields.number("momentum")?,
            dampening: fields.number("dampening")?,
            weight_decay: fields.number("weight_decay")?,
            nesterov: fields.flag("nesterov")?,
            maximize: fields.flag("maximize")?,
        })
    }
}
