//! What a checkpoint reads of a family: its `param_groups` entry in JSON and the names its
//! states take in files. Each family implements [`FamilyCheckpoint`] in its folder
//! (`crate::family::<name>::checkpoint`); the family registry (`crate::family::registry`) generates the
//! dispatch, so that no checkpoint code matches on families by hand.

use crate::{Error, Result, ScheduleFreeMode, StateKind};

/// A `param_groups` entry as JSON.
pub(crate) type JsonMap = serde_json::Map<String, serde_json::Value>;

/// A family's configuration in checkpoints, implemented in the family's folder.
pub(crate) trait FamilyCheckpoint: Sized {
    /// The `"optimizer"` values of a `param_groups` entry that name this family (PyTorch's
    /// class names: Adam's are `Adam` and `AdamW`).
    const CLASSES: &'static [&'static str];

    /// The hyperparameters under PyTorch's names, `"optimizer"` naming the class.
    fn to_json(&self) -> serde_json::Value;

    /// The configuration from a `param_groups` entry of `class` (one of [`Self::CLASSES`]);
    /// [`Error::BadJson`] names the field that is missing or wrong.
    fn from_json(class: &str, fields: &JsonFields<'_>) -> Result<Self>;

    /// bitsandbytes' name of a state of `kind` where files keep it under bitsandbytes'
    /// `state_dict` names even with full-precision state, and its half of a stacked tensor
    /// (`Some(0)`: the first). `None` (most families): PyTorch's name
    /// ([`StateKind::torch_name`]).
    fn bnb_state_name(&self, _kind: StateKind) -> Option<(&'static str, Option<usize>)> {
        None
    }

    /// The shape in files of a state of `kind` of a parameter of `shape` where the family
    /// keeps it in a shape of its own (not one element per parameter element), and the note
    /// that describes it in refusals. `None` (most families): one per element, in the
    /// parameter's shape.
    fn state_shape(&self, _kind: StateKind, _shape: &[usize]) -> Option<(Vec<usize>, &'static str)> {
        None
    }

    /// Checks what the family's passes add to group `g`'s `param_groups` entry when saving
    /// (their per-group values: `GroupPasses::save_group`, `CpuPasses::save_group`), when a
    /// file is parsed, so that loading reads it back unrefused; [`Error::BadFile`] names the
    /// entry that is missing, malformed or impossible. Returns the mode the group was saved
    /// in, for a family with modes, which must agree with `earlier` (an earlier group's).
    /// `None` (most families): nothing added, no mode.
    fn check_saved_group(
        &self,
        _g: usize,
        _entry: &JsonMap,
        _earlier: Option<ScheduleFreeMode>,
    ) -> Result<Option<ScheduleFreeMode>> {
        Ok(None)
    }
}

/// A `param_groups` entry's fields, read with refusals that name the field.
pub(crate) struct JsonFields<'a> {
    map: &'a serde_json::Map<String, serde_json::Value>,
}

impl<'a> JsonFields<'a> {
    /// The fields of `map`.
    pub(crate) fn new(map: &'a serde_json::Map<String, serde_json::Value>) -> Self {
        JsonFields { map }
    }

    /// The value of `key`, if the entry has one.
    pub(crate) fn get(&self, key: &str) -> Option<&'a serde_json::Value> {
        self.map.get(key)
    }

    /// The number `key`.
    pub(crate) fn number(&self, key: &str) -> Result<f64> {
        self.get(key)
            .and_then(|v| v.as_f64())
            .ok_or_else(|| bad_json(format!("`{key}` is missing or not a number")))
    }

    /// The boolean `key`.
    pub(crate) fn flag(&self, key: &str) -> Result<bool> {
        self.get(key)
            .and_then(|v| v.as_bool())
            .ok_or_else(|| bad_json(format!("`{key}` is missing or not a boolean")))
    }

    /// The `N` numbers of the array `key` (`betas`).
    pub(crate) fn numbers<const N: usize>(&self, key: &str) -> Result<[f64; N]> {
        let bad = || bad_json(format!("`{key}` is missing or not {N} numbers"));
        let values = self.get(key).and_then(|v| v.as_array()).ok_or_else(bad)?;
        if values.len() != N {
            return Err(bad());
        }
        let mut out = [0.0; N];
        for (o, v) in out.iter_mut().zip(values) {
            *o = v.as_f64().ok_or_else(bad)?;
        }
        Ok(out)
    }
}

/// The refusal of a `param_groups` entry, `problem` naming the field.
pub(crate) fn bad_json(problem: String) -> Error {
    Error::BadJson { problem }
}
