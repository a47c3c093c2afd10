//! Schedule-Free AdamW's `param_groups` entry in checkpoints, under the `schedulefree`
//! package's keys (its running values are the optimizer's: `checkpoint_layout`).

use super::checkpoint_layout;
use super::config::ScheduleFreeAdamW;
use crate::checkpoint::{bad_json, FamilyCheckpoint, JsonFields, JsonMap};
use crate::{Algorithm, Result, ScheduleFreeMode};

impl FamilyCheckpoint for ScheduleFreeAdamW {
    const CLASSES: &'static [&'static str] = &["AdamWScheduleFree"];

    fn to_json(&self) -> serde_json::Value {
        let c = self;
        serde_json::json!({
            "optimizer": "AdamWScheduleFree", "lr": c.lr, "betas": [c.beta1, c.beta2], "eps": c.eps,
            "weight_decay": c.weight_decay, "warmup_steps": c.warmup_steps, "r": c.r,
            "weight_lr_power": c.weight_lr_power,
        })
    }

    fn from_json(_class: &str, fields: &JsonFields<'_>) -> Result<Self> {
        let [beta1, beta2] = fields.numbers("betas")?;
        let warmup_steps = fields
            .get("warmup_steps")
            .and_then(|v| v.as_u64())
            .ok_or_else(|| bad_json("`warmup_steps` is missing or not a whole number >= 0".into()))?;
        Ok(ScheduleFreeAdamW {
            lr: fields.number("lr")?,
            beta1,
            beta2,
            eps: fields.number("eps")?,
            weight_decay: fields.number("weight_decay")?,
            warmup_steps,
            r: fields.number("r")?,
            weight_lr_power: fields.number("weight_lr_power")?,
        })
    }

    /// The running values and mode the passes add to the entry, checked; every group in one
    /// mode.
    fn check_saved_group(
        &self,
        g: usize,
        entry: &JsonMap,
        earlier: Option<ScheduleFreeMode>,
    ) -> Result<Option<ScheduleFreeMode>> {
        checkpoint_layout::saved_mode(g, &Algorithm::from(*self), entry, earlier)
    }
}
