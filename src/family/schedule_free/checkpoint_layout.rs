//! Schedule-Free groups in checkpoints: the group's running `k`, `weight_sum`, `lr_max`
//! and `train_mode` in its `param_groups` entry, under the `schedulefree` package's names
//! (its `state_dict` keeps them per group), written by either backend's passes
//! (`save_group`), checked when a file is parsed (`FamilyCheckpoint::check_saved_group`) and
//! read back by the passes (`load_group`).

use crate::checkpoint::{bad, Checkpoint, JsonMap};
use crate::{Algorithm, Result, ScheduleFreeMode, ScheduleFreeScalars};

/// Adds `k`, `weight_sum`, `lr_max` and `train_mode` to a schedule-free group's entry.
pub(crate) fn write(scalars: &ScheduleFreeScalars, mode: ScheduleFreeMode, entry: &mut JsonMap) {
    entry.insert("k".into(), scalars.k.into());
    entry.insert("weight_sum".into(), scalars.weight_sum.into());
    entry.insert("lr_max".into(), scalars.lr_max.into());
    entry.insert("train_mode".into(), (mode == ScheduleFreeMode::Train).into());
}

/// Group `g`'s saved values and mode, from its entry (`algorithm`: the group's, a
/// schedule-free one); [`Error::BadFile`](crate::Error::BadFile) names a value that is
/// missing, malformed or impossible.
pub(crate) fn read(
    g: usize,
    algorithm: &Algorithm,
    entry: &JsonMap,
) -> Result<(ScheduleFreeScalars, ScheduleFreeMode)> {
    let field = |key: &str| entry.get(key).ok_or_else(|| bad(format!("param_groups[{g}] has no `{key}`")));
    let number =
        |key: &str| field(key)?.as_f64().ok_or_else(|| bad(format!("param_groups[{g}].{key} is not a number")));
    let k = field("k")?
        .as_u64()
        .ok_or_else(|| bad(format!("param_groups[{g}].k is not a whole number >= 0")))?;
    let saved = ScheduleFreeScalars { k, weight_sum: number("weight_sum")?, lr_max: number("lr_max")? };
    super::scalars::check_scalars(algorithm, &saved).map_err(|e| bad(format!("param_groups[{g}]: {e}")))?;
    let train = field("train_mode")?
        .as_bool()
        .ok_or_else(|| bad(format!("param_groups[{g}].train_mode is not true or false")))?;
    Ok((saved, if train { ScheduleFreeMode::Train } else { ScheduleFreeMode::Eval }))
}

/// The mode group `g` was saved in, its entry checked ([`read`]); refused where an earlier
/// group was saved in the other mode (`earlier`).
pub(crate) fn saved_mode(
    g: usize,
    algorithm: &Algorithm,
    entry: &JsonMap,
    earlier: Option<ScheduleFreeMode>,
) -> Result<Option<ScheduleFreeMode>> {
    let (_, mode) = read(g, algorithm, entry)?;
    if earlier.is_some_and(|m| m != mode) {
        return Err(bad(format!("param_groups[{g}].train_mode differs from an earlier group's")));
    }
    Ok(Some(mode))
}

impl Checkpoint<'_> {
    /// Each group's Schedule-Free running values (`k`, `weight_sum`, `lr_max`), `None` for
    /// groups of other algorithms.
    pub fn schedule_free(&self) -> Vec<Option<ScheduleFreeScalars>> {
        let groups = self.groups.iter().zip(&self.entries).enumerate();
        groups
            .map(|(g, ((algorithm, _), entry))| match algorithm {
                // Checked when the file was parsed.
                Algorithm::ScheduleFreeAdamW(_) => read(g, algorithm, entry).ok().map(|(scalars, _)| scalars),
                _ => None,
            })
            .collect()
    }
}
