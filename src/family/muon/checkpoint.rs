//! Muon's `param_groups` entry in checkpoints, under PyTorch's keys.

use super::config::{Muon, MuonLrAdjust, NsPrecision};
use crate::checkpoint::{bad_json, FamilyCheckpoint, JsonFields};
use crate::Result;

impl FamilyCheckpoint for Muon {
    const CLASSES: &'static [&'static str] = &["Muon"];

    fn to_json(&self) -> serde_json::Value {
        let c = self;
        serde_json::json!({
            "optimizer": "Muon", "lr": c.lr, "weight_decay": c.weight_decay, "momentum": c.momentum,
            "nesterov": c.nesterov,
            "ns_coefficients": [c.ns_coefficients.0, c.ns_coefficients.1, c.ns_coefficients.2],
            "eps": c.eps, "ns_steps": c.ns_steps, "adjust_lr_fn": c.adjust_lr.torch_name(),
            "ns_dtype": c.ns_precision.torch_name(),
        })
    }

    fn from_json(_class: &str, fields: &JsonFields<'_>) -> Result<Self> {
        let [a, b, c] = fields.numbers("ns_coefficients")?;
        let adjust_lr = match fields.get("adjust_lr_fn") {
            None | Some(serde_json::Value::Null) => MuonLrAdjust::Original,
            Some(v) => v.as_str().and_then(MuonLrAdjust::from_torch_name).ok_or_else(|| {
                bad_json("`adjust_lr_fn` is not original, match_rms_adamw or spectral_unclamped".into())
            })?,
        };
        let ns_precision = match fields.get("ns_dtype").and_then(|v| v.as_str()) {
            None | Some("bfloat16") => NsPrecision::BF16,
            Some("float32") => NsPrecision::F32,
            Some(_) => return Err(bad_json("`ns_dtype` is not bfloat16 or float32".into())),
        };
        let ns_steps = fields
            .get("ns_steps")
            .and_then(|v| v.as_u64())
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| bad_json("`ns_steps` is missing or not a whole number >= 0".into()))?;
        Ok(Muon {
            lr: fields.number("lr")?,
            weight_decay: fields.number("weight_decay")?,
            momentum: fields.number("momentum")?,
            nesterov: fields.flag("nesterov")?,
            ns_coefficients: (a, b, c),
            eps: fields.number("eps")?,
            ns_steps,
            adjust_lr,
            ns_precision,
        })
    }
}
