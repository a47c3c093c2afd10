//! Algorithm configurations: plain data with each convention's documented defaults, their
//! validation, and their translation into one step of a fused kernel. Each family's lives in
//! its folder (`crate::family::<name>::config`); this module gathers them, with
//! [`Algorithm`] and the checks they share.
//!
//! Each convention's eps and step counting are tabled on the crate's front page
//! (`src/lib.rs`, "Conventions").

use crate::family::adafactor::config as adafactor;
use crate::family::adagrad::config as adagrad;
use crate::family::adam::config as adam;
mod algorithm;
mod low_bit;
use crate::family::lamb::config as lamb;
use crate::family::momentum::config as momentum;
use crate::family::muon::config as muon;
use crate::family::schedule_free::config as schedule_free;

pub(crate) use adafactor::factored_dims;
pub use adafactor::{
    machine_epsilon, state_kinds_for as adafactor_state_kinds, state_shapes as adafactor_state_shapes,
};
pub use adagrad::OnnxAdagrad;
pub use adam::{DmlAdam, OnnxAdam};
pub(crate) use algorithm::FamilyConfig;
pub use algorithm::{Algorithm, StateKind};
pub use lamb::LambNorms;
pub(crate) use low_bit::FamilyLowBit;
pub use momentum::{MomentumMode, OnnxMomentum};
pub(crate) use muon::matrix_shapes;
pub use muon::{MuonLrAdjust, NsPrecision, MAX_NS_STEPS};
pub(crate) use schedule_free::{check_eval, SWAP_ROUNDING_STEP};
pub use schedule_free::{ScheduleFreeMode, ScheduleFreeScalars};

use crate::{Error, Result};

/// `1 - beta^t`, accurate for small `t` and for `beta` close to 1 (no cancellation).
pub(crate) fn bias_correction(beta: f64, t: u64) -> f64 {
    if beta == 0.0 || t == 0 {
        return if t == 0 { 0.0 } else { 1.0 };
    }
    -f64::exp_m1(t as f64 * beta.ln())
}

pub(crate) fn check(name: &'static str, value: f64, ok: bool, expected: &'static str) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::BadHyperparameter { name, value, expected })
    }
}

pub(crate) fn check_rate(name: &'static str, value: f64) -> Result<()> {
    check(name, value, value.is_finite() && value >= 0.0, "a finite number >= 0")
}

pub(crate) fn check_finite(name: &'static str, value: f64) -> Result<()> {
    check(name, value, value.is_finite(), "a finite number")
}

pub(crate) fn check_beta(name: &'static str, value: f64) -> Result<()> {
    check(name, value, (0.0..1.0).contains(&value), "0 <= beta < 1")
}

#[cfg(test)]
mod tests {
    use super::bias_correction;
    use crate::{Adafactor, Adam, Algorithm, Error, Lamb, Muon, Sgd};

    /// The families whose passes are made with the optimizer (Adafactor, Muon) refuse a change
    /// to or from them with their own reason, the group's family's first; LAMB and Adam,
    /// which share their states, change into each other.
    #[test]
    fn a_change_of_family_is_refused_with_the_family_s_reason() {
        let reason = |from: Algorithm, to: Algorithm| match from.check_change(&to) {
            Err(Error::ConflictingOptions { first: "algorithm", second: "set_group_algorithm", reason }) => {
                Some(reason)
            }
            Err(other) => panic!("{from:?} -> {to:?}: {other:?}"),
            Ok(()) => None,
        };
        let (adafactor, muon) = (Algorithm::from(Adafactor::default()), Algorithm::from(Muon::default()));
        let sgd = Algorithm::from(Sgd { momentum: 0.9, ..Sgd::default() });
        let (adam, lamb) = (Algorithm::from(Adam::default()), Algorithm::from(Lamb::default()));
        assert!(reason(adafactor, sgd).unwrap().contains("to or from Adafactor"));
        assert!(reason(sgd, adafactor).unwrap().contains("to or from Adafactor"));
        assert!(reason(muon, sgd).unwrap().contains("between Muon and another"));
        assert!(reason(adam, muon).unwrap().contains("between Muon and another"));
        assert!(reason(adafactor, muon).unwrap().contains("to or from Adafactor"));
        assert!(reason(muon, adafactor).unwrap().contains("between Muon and another"));
        assert_eq!(reason(adam, lamb), None);
        assert_eq!(reason(lamb, adam), None);
        assert_eq!(reason(muon, muon.with_lr(0.5)), None);
        assert_eq!(reason(adafactor, adafactor.with_lr(0.5)), None);
    }

    #[test]
    fn bias_correction_is_exact_at_small_steps_and_saturates() {
        assert_eq!(bias_correction(0.9, 0), 0.0);
        assert!((bias_correction(0.9, 1) - 0.1).abs() < 1e-16);
        assert!((bias_correction(0.999, 2) - (1.0 - 0.999f64 * 0.999)).abs() < 1e-16);
        // Near beta = 1 the naive 1 - beta^t loses digits; expm1 keeps them.
        let beta: f64 = 1.0 - 1e-12;
        let exact = 1e-12 * (1.0 - 0.5e-12); // 1 - (1 - e)^1 ~ e, second term from the series
        assert!((bias_correction(beta, 1) - exact).abs() / exact < 1e-3);
        assert_eq!(bias_correction(0.9, 1_000_000), 1.0);
        assert_eq!(bias_correction(0.0, 3), 1.0);
    }
}
