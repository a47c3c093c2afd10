//! AdEMAMix in checkpoints: its `param_groups` entry under bitsandbytes' keys, and its
//! states under bitsandbytes' `state_dict` names.

use super::config::AdEMAMix;
use crate::checkpoint::{bad_json, FamilyCheckpoint, JsonFields};
use crate::{Result, StateKind};

impl FamilyCheckpoint for AdEMAMix {
    const CLASSES: &'static [&'static str] = &["AdEMAMix"];

    fn to_json(&self) -> serde_json::Value {
        let c = self;
        serde_json::json!({
            "optimizer": "AdEMAMix", "lr": c.lr, "betas": [c.beta1, c.beta2, c.beta3], "alpha": c.alpha,
            "t_alpha": c.t_alpha, "t_beta3": c.t_beta3, "eps": c.eps, "weight_decay": c.weight_decay,
        })
    }

    fn from_json(_class: &str, fields: &JsonFields<'_>) -> Result<Self> {
        let [beta1, beta2, beta3] = fields.numbers("betas")?;
        let steps = |key: &str| match fields.get(key) {
            Some(serde_json::Value::Null) => Ok(None),
            Some(v) => {
                v.as_u64().map(Some).ok_or_else(|| bad_json(format!("`{key}` is not null or a step count")))
            }
            None => Err(bad_json(format!("`{key}` is missing"))),
        };
        Ok(AdEMAMix {
            lr: fields.number("lr")?,
            beta1,
            beta2,
            beta3,
            alpha: fields.number("alpha")?,
            t_alpha: steps("t_alpha")?,
            t_beta3: steps("t_beta3")?,
            eps: fields.number("eps")?,
            weight_decay: fields.number("weight_decay")?,
        })
    }

    /// bitsandbytes keeps the two EMAs stacked in `state1` (`[2, *shape]`: m1, then m2) and
    /// the second moment in `state2`, with 32-bit state as with 8-bit.
    fn bnb_state_name(&self, kind: StateKind) -> Option<(&'static str, Option<usize>)> {
        match kind {
            StateKind::ExpAvg => Some(("state1", Some(0))),
            StateKind::ExpAvgSlow => Some(("state1", Some(1))),
            StateKind::ExpAvgSq => Some(("state2", None)),
            _ => None,
        }
    }
}
