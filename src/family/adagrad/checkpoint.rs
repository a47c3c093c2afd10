//! Adagrad's `param_groups` entry in checkpoints, under PyTorch's keys.

use super::config::Adagrad;
use crate::checkpoint::{FamilyCheckpoint, JsonFields};
use crate::Result;

impl FamilyCheckpoint for Adagrad {
    const CLASSES: &'static [&'static str] = &["Adagrad"];

    fn to_json(&self) -> serde_json::Value {
        let c = self;
        serde_json::json!({
            "optimizer": "Adagrad", "lr": c.lr, "lr_decay": c.lr_decay, "weight_decay": c.weight_decay,
            "initial_accumulator_value": c.initial_accumulator_value, "eps": c.eps, "maximize": c.maximize,
        })
    }

    fn from_json(_class: &str, fields: &JsonFields<'_>) -> Result<Self> {
        Ok(Adagrad {
            lr: fields.number("lr")?,
            lr_decay: fields.number("lr_decay")?,
            weight_decay: fields.number("weight_decay")?,
            initial_accumulator_value: fields.number("initial_accumulator_value")?,
            eps: fields.number("eps")?,
            maximize: fields.flag("maximize")?,
        })
    }
}
