//! Schedule-Free groups in checkpoints: the group's running `k`, `weight_sum`, `lr_max`
//! and `train_mode` in its `param_groups` entry, under the `schedulefree` package's names
//! (its `state_dict` keeps them per group), written by either backend and read back.

use crate::checkpoint::bad;
use crate::{Algorithm, Result, ScheduleFreeMode, ScheduleFreeScalars};

/// What a checkpoint records of an optimizer's Schedule-Free groups.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ScheduleFreeLayout {
    /// Each group's running values (read only for schedule-free groups).
    pub(crate) scalars: Vec<ScheduleFreeScalars>,
    /// The mode the parameters were in.
    pub(crate) mode: ScheduleFreeMode,
}

impl ScheduleFreeLayout {
    /// Adds `k`, `weight_sum`, `lr_max` and `train_mode` to each schedule-free group's entry.
    pub(crate) fn annotate(
        &self,
        algorithms: impl Iterator<Item = Algorithm>,
        mut groups: Vec<serde_json::Value>,
    ) -> Vec<serde_json::Value> {
        for ((algorithm, entry), scalars) in algorithms.zip(&mut groups).zip(&self.scalars) {
            let (Algorithm::ScheduleFreeAdamW(_), Some(map)) = (algorithm, entry.as_object_mut()) else {
                continue;
            };
            map.insert("k".into(), scalars.k.into());
            map.insert("weight_sum".into(), scalars.weight_sum.into());
            map.insert("lr_max".into(), scalars.lr_max.into());
            map.insert("train_mode".into(), (self.mode == ScheduleFreeMode::Train).into());
        }
        groups
    }
}

/// Each group's saved Schedule-Free values (`None` for other algorithms) and the mode, from
/// the `param_groups` entries; [`Error::BadFile`](crate::Error::BadFile) names a value that
/// is missing, malformed or impossible, or groups saved in different modes.
pub(crate) fn parse(
    entries: &[serde_json::Value],
    groups: &[(Algorithm, Vec<usize>)],
) -> Result<(Vec<Option<ScheduleFreeScalars>>, ScheduleFreeMode)> {
    let mut mode = None;
    let mut scalars = Vec::with_capacity(groups.len());
    for (g, (entry, (algorithm, _))) in entries.iter().zip(groups).enumerate() {
        if !matches!(algorithm, Algorithm::ScheduleFreeAdamW(_)) {
            scalars.push(None);
            continue;
        }
        let field =
            |key: &str| entry.get(key).ok_or_else(|| bad(format!("param_groups[{g}] has no `{key}`")));
        let number = |key: &str| {
            field(key)?.as_f64().ok_or_else(|| bad(format!("param_groups[{g}].{key} is not a number")))
        };
        let k = field("k")?
            .as_u64()
            .ok_or_else(|| bad(format!("param_groups[{g}].k is not a whole number >= 0")))?;
        let saved = ScheduleFreeScalars { k, weight_sum: number("weight_sum")?, lr_max: number("lr_max")? };
        crate::family::schedule_free::scalars::check_scalars(algorithm, &saved)
            .map_err(|e| bad(format!("param_groups[{g}]: {e}")))?;
        let train = field("train_mode")?
            .as_bool()
            .ok_or_else(|| bad(format!("param_groups[{g}].train_mode is not true or false")))?;
        let group_mode = if train { ScheduleFreeMode::Train } else { ScheduleFreeMode::Eval };
        if mode.is_some_and(|m| m != group_mode) {
            return Err(bad(format!("param_groups[{g}].train_mode differs from an earlier group's")));
        }
        mode = Some(group_mode);
        scalars.push(Some(saved));
    }
    Ok((scalars, mode.unwrap_or_default()))
}
