//! Adafactor in checkpoints: its `param_groups` entry under PyTorch's keys, and its factored
//! states in torch's shapes.

use super::config::{state_kinds_for, state_shapes, Adafactor};
use crate::checkpoint::{bad_json, FamilyCheckpoint, JsonFields};
use crate::{Result, StateKind};

impl FamilyCheckpoint for Adafactor {
    const CLASSES: &'static [&'static str] = &["Adafactor"];

    fn to_json(&self) -> serde_json::Value {
        let c = self;
        serde_json::json!({
            "optimizer": "Adafactor", "lr": c.lr, "beta2_decay": c.beta2_decay, "eps": [c.eps1, c.eps2],
            "d": c.d, "weight_decay": c.weight_decay, "maximize": c.maximize,
        })
    }

    fn from_json(_class: &str, fields: &JsonFields<'_>) -> Result<Self> {
        // torch's `eps` is `(eps1 or None, eps2)`.
        let eps = fields.get("eps").and_then(|v| v.as_array()).filter(|a| a.len() == 2);
        let eps = eps.ok_or_else(|| bad_json("`eps` is missing or not a pair".into()))?;
        let eps1 = match &eps[0] {
            serde_json::Value::Null => None,
            v => Some(v.as_f64().ok_or_else(|| bad_json("`eps[0]` is not null or a number".into()))?),
        };
        let eps2 = eps[1].as_f64().ok_or_else(|| bad_json("`eps[1]` is not a number".into()))?;
        Ok(Adafactor {
            lr: fields.number("lr")?,
            beta2_decay: fields.number("beta2_decay")?,
            eps1,
            eps2,
            d: fields.number("d")?,
            weight_decay: fields.number("weight_decay")?,
            maximize: fields.flag("maximize")?,
        })
    }

    /// `row_var` and `col_var` in torch's shapes (`[.., rows, 1]`, `[.., 1, cols]`), or
    /// `variance` for a vector.
    fn state_shape(&self, kind: StateKind, shape: &[usize]) -> Option<(Vec<usize>, &'static str)> {
        let at = state_kinds_for(shape).iter().position(|s| *s == kind)?;
        Some((state_shapes(shape).swap_remove(at), " (Adafactor's factored state, in torch's shape)"))
    }
}
