//! Algorithms as `param_groups` entries in JSON, under PyTorch's keys: each family writes and
//! reads its own ([`FamilyCheckpoint`](super::family::FamilyCheckpoint), in its folder).

use super::family::{bad_json, JsonFields};
use crate::{Algorithm, Result};

/// An optimizer's `param_groups` entry in JSON. Kept with the checkpoints (not with the
/// algorithms) so that the `checkpoint` feature alone brings in serde_json.
impl Algorithm {
    /// The hyperparameters under PyTorch's names, as in an optimizer's `param_groups`, with
    /// `"optimizer"` naming the class ([`Algorithm::name`]).
    pub fn to_json(&self) -> serde_json::Map<String, serde_json::Value> {
        match self.family_json() {
            serde_json::Value::Object(map) => map,
            _ => serde_json::Map::new(),
        }
    }

    /// The inverse of [`Algorithm::to_json`]; [`Error::BadJson`](crate::Error::BadJson)
    /// names the field that is missing or wrong.
    pub fn from_json(map: &serde_json::Map<String, serde_json::Value>) -> Result<Self> {
        let name = map
            .get("optimizer")
            .and_then(|v| v.as_str())
            .ok_or_else(|| bad_json("`optimizer` is missing".into()))?;
        Algorithm::from_class_json(name, &JsonFields::new(map))
            .unwrap_or_else(|| Err(bad_json(format!("unknown optimizer `{name}`"))))
    }
}
