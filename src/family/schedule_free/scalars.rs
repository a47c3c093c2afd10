//! Schedule-Free AdamW's running group values (`ScheduleFreeScalars`): what a restored or
//! replaced set must satisfy, checked alike by the GPU front end, the CPU backend, Burn's
//! records and checkpoints.

use crate::{Algorithm, Error, Result, ScheduleFreeScalars};

/// Group values that fit `algorithm`: a schedule-free one, finite sums, and the initial
/// values at `k = 0`.
pub(crate) fn check_scalars(algorithm: &Algorithm, scalars: &ScheduleFreeScalars) -> Result<()> {
    if !matches!(algorithm, Algorithm::ScheduleFreeAdamW(_)) {
        return Err(Error::BadValue {
            argument: "schedule-free group values".into(),
            problem: format!("the group runs {}, not AdamWScheduleFree", algorithm.name()),
        });
    }
    let fresh = ScheduleFreeScalars::default();
    if !scalars.weight_sum.is_finite() || !scalars.lr_max.is_finite() || (scalars.k == 0 && *scalars != fresh)
    {
        return Err(Error::BadValue {
            argument: "schedule-free group values".into(),
            problem: format!("{scalars:?}: expected finite values, and the initial ones at k = 0"),
        });
    }
    Ok(())
}

impl ScheduleFreeScalars {
    /// Checks that these values can be `algorithm`'s running group values (restored from a
    /// framework's record, say): a Schedule-Free algorithm, finite sums, and the initial
    /// values at `k = 0`. Optimizers and checkpoints check theirs with the same rule.
    pub fn check_fits(&self, algorithm: &Algorithm) -> Result<()> {
        check_scalars(algorithm, self)
    }
}
