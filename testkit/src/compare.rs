//! The one comparator of the tests and the conformance runner: NaN- and infinity-aware,
//! and reporting the first few mismatching indices, never the arrays.
//!
//! A NaN matches only a NaN and an infinity only the same infinity, whatever the tolerance:
//! a tolerance measures how far two numbers are apart, and a non-finite value is not near
//! anything.

use std::fmt;

use crate::oracle::{Storage, ToOracle};
use wgpu_optim::DType;

/// How many mismatches a [`Comparison`] describes.
pub const FIRST: usize = 3;

/// The slack of a 16-bit store whose value cancels to nearly zero: there the stored value
/// carries the absolute error of the f32 arithmetic, which can be many ulps of a 16-bit
/// type that keeps f32's exponent range (SGD's `0.9 * v - g + 0.1 * p` on unit-scale
/// bfloat16 data is exactly 0 in f64 and 2^-25 in f32). One f32 rounding of a value below
/// 2 is at most 2^-24, so this bounds one rounding of unit-scale data and nothing more.
pub const CANCELLATION: f64 = 1.0 / (1u64 << 24) as f64;

/// How close a value must be to the expected one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Tolerance {
    /// `|got - want| <= atol + rtol * |want|`: the rule of the conformance vectors.
    Close {
        /// Relative to `|want|`.
        rtol: f64,
        /// Absolute.
        atol: f64,
    },
    /// At most `ulps` units in the last place of `dtype` apart, or at most `abs` apart.
    /// Both values must be values of `dtype`; one that is not is only accepted by `abs`.
    Ulps {
        /// The type both values are stored in.
        dtype: DType,
        /// The largest distance in units in the last place.
        ulps: u64,
        /// The largest absolute distance accepted regardless of ulps.
        abs: f64,
    },
}

impl Tolerance {
    /// An f32 result against the f64 oracle, as the f32 conformance vectors state it.
    pub const F32: Tolerance = Tolerance::Close { rtol: 1e-5, atol: 1e-6 };

    /// An f64 result against the f64 oracle: the two differ only in the order of operations.
    pub const F64: Tolerance = Tolerance::Close { rtol: 1e-12, atol: 1e-14 };

    /// The rule for one value the crate stores in `dtype`, against the oracle's value rounded
    /// once to `dtype` from the same stored inputs: a 16-bit store within 1 ulp (f32 rather
    /// than f64 intermediates can move a result across one 16-bit rounding boundary) or
    /// within [`CANCELLATION`]; f32 and f64 stores within [`Self::F32`] and [`Self::F64`]
    /// (cancellation in `b1 * m + (1 - b1) * g` makes the f32 error many f32 ulps).
    pub fn stored(dtype: DType) -> Tolerance {
        match dtype {
            DType::F16 | DType::BF16 => Tolerance::Ulps { dtype, ulps: 1, abs: CANCELLATION },
            DType::F32 => Tolerance::F32,
            DType::F64 => Tolerance::F64,
            other => panic!("no stored-value tolerance for {other:?} yet"),
        }
    }

    /// Bit for bit in `dtype` (a NaN matching any NaN, and `-0` matching `+0`).
    pub fn exact(dtype: DType) -> Tolerance {
        Tolerance::Ulps { dtype, ulps: 0, abs: 0.0 }
    }

    /// How far `got` is from `want` in units of this tolerance: at most 1 passes, 0 is
    /// equal, and infinity is a NaN or infinity that does not match.
    pub fn error(&self, got: f64, want: f64) -> f64 {
        if want.is_nan() || got.is_nan() || want.is_infinite() || got.is_infinite() {
            let matches = (want.is_nan() && got.is_nan()) || got == want;
            return if matches { 0.0 } else { f64::INFINITY };
        }
        if got == want {
            return 0.0;
        }
        let distance = (got - want).abs();
        match *self {
            Tolerance::Close { rtol, atol } => ratio(distance, atol + rtol * want.abs()),
            Tolerance::Ulps { dtype, ulps, abs } => {
                let in_ulps = match (ulp_index(got, dtype), ulp_index(want, dtype)) {
                    (Some(g), Some(w)) => ratio(g.abs_diff(w) as f64, ulps as f64),
                    _ => f64::INFINITY,
                };
                in_ulps.min(ratio(distance, abs))
            }
        }
    }
}

impl fmt::Display for Tolerance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tolerance::Close { rtol, atol } => write!(f, "atol {atol:e} + rtol {rtol:e} * |want|"),
            Tolerance::Ulps { dtype, ulps, abs } => write!(f, "{ulps} ulp of {dtype:?} or {abs:e} absolute"),
        }
    }
}

/// `value / bound`, where any positive value over a zero bound is infinitely far.
fn ratio(value: f64, bound: f64) -> f64 {
    if value == 0.0 {
        0.0
    } else if bound > 0.0 {
        value / bound
    } else {
        f64::INFINITY
    }
}

/// The position of `x` on a line on which neighbouring values of `dtype` differ by one
/// (`-0` and `+0` share 0), or `None` when `x` is not a finite value of `dtype`.
fn ulp_index(x: f64, dtype: DType) -> Option<i128> {
    if !x.is_finite() || dtype.to_oracle().round(x) != x {
        return None;
    }
    let (bits, sign_bit): (u64, u64) = match dtype {
        DType::F16 | DType::BF16 => {
            let bytes = dtype.to_oracle().encode(&[x]);
            (u64::from(u16::from_le_bytes([bytes[0], bytes[1]])), 1 << 15)
        }
        DType::F32 => (u64::from((x as f32).to_bits()), 1 << 31),
        DType::F64 => (x.to_bits(), 1 << 63),
        other => panic!("no ulp count for {other:?} yet"),
    };
    let magnitude = i128::from(bits & (sign_bit - 1));
    Some(if bits & sign_bit != 0 { -magnitude } else { magnitude })
}

/// One value outside tolerance.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mismatch {
    /// Its index.
    pub index: usize,
    /// The value compared.
    pub got: f64,
    /// The expected value.
    pub want: f64,
    /// [`Tolerance::error`]: how many tolerances apart they are.
    pub error: f64,
}

/// The result of comparing two arrays.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// How many values were compared.
    pub got_len: usize,
    /// How many values were expected.
    pub want_len: usize,
    /// How many values are outside tolerance.
    pub mismatches: usize,
    /// The first [`FIRST`] of them.
    pub first: Vec<Mismatch>,
    /// The largest [`Tolerance::error`] over every value (infinite when the lengths differ).
    pub worst: f64,
    /// The tolerance applied.
    pub tolerance: Tolerance,
}

impl Comparison {
    /// Whether the lengths agree and every value is within tolerance.
    pub fn passed(&self) -> bool {
        self.got_len == self.want_len && self.mismatches == 0
    }
}

impl fmt::Display for Comparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.got_len != self.want_len {
            return write!(f, "{} values, expected {}", self.got_len, self.want_len);
        }
        if self.mismatches == 0 {
            return write!(f, "all {} within {}", self.got_len, self.tolerance);
        }
        write!(f, "{} of {} outside {}: ", self.mismatches, self.got_len, self.tolerance)?;
        for (k, m) in self.first.iter().enumerate() {
            let separator = if k == 0 { "" } else { ", " };
            write!(f, "{separator}[{}] got {:e} want {:e} ({:.3e}x)", m.index, m.got, m.want, m.error)?;
        }
        if self.mismatches > self.first.len() {
            write!(f, ", ...")?;
        }
        Ok(())
    }
}

/// Compares `got` with `want` element by element.
pub fn compare(got: &[f64], want: &[f64], tolerance: Tolerance) -> Comparison {
    let mut comparison = Comparison {
        got_len: got.len(),
        want_len: want.len(),
        mismatches: 0,
        first: Vec::new(),
        worst: 0.0,
        tolerance,
    };
    if got.len() != want.len() {
        comparison.worst = f64::INFINITY;
        return comparison;
    }
    for (index, (&g, &w)) in got.iter().zip(want).enumerate() {
        let error = tolerance.error(g, w);
        comparison.worst = comparison.worst.max(error);
        if error > 1.0 {
            comparison.mismatches += 1;
            if comparison.first.len() < FIRST {
                comparison.first.push(Mismatch { index, got: g, want: w, error });
            }
        }
    }
    comparison
}

/// 8-bit codes as the vectors' format compares them: each within 1 of the expected code
/// (a value near the midpoint of two codes takes either, depending on the last bit of f32
/// arithmetic), and at most 1 % of them different. A code further away is a mismatch; so is
/// every differing code past the 1 %.
pub fn compare_codes(got: &[f64], want: &[f64]) -> Comparison {
    let mut comparison = compare(got, want, Tolerance::Close { rtol: 0.0, atol: 1.0 });
    if !comparison.passed() {
        return comparison;
    }
    let differing: Vec<usize> = (0..got.len()).filter(|&i| got[i] != want[i]).collect();
    let allowed = want.len() / 100;
    if differing.len() > allowed {
        comparison.mismatches = differing.len() - allowed;
        // Past the allowance, each differing code counts as outside tolerance.
        comparison.worst = comparison.worst.max(differing.len() as f64 / allowed.max(1) as f64);
        comparison.first = differing
            .iter()
            .skip(allowed)
            .take(FIRST)
            .map(|&index| Mismatch { index, got: got[index], want: want[index], error: 1.0 })
            .collect();
    }
    comparison
}

/// Panics with `what` and the first few mismatches unless every value of `got` is within
/// `tolerance` of `want`.
#[track_caller]
pub fn assert_close(what: &str, got: &[f64], want: &[f64], tolerance: Tolerance) {
    let comparison = compare(got, want, tolerance);
    assert!(comparison.passed(), "{what}: {comparison}");
}

#[cfg(test)]
mod tests {
    use super::*;

    const F16_ULP_AT_ONE: f64 = 1.0 / 1024.0;

    #[test]
    fn close_is_the_vectors_rule_at_its_boundary() {
        let tolerance = Tolerance::Close { rtol: 0.5, atol: 0.25 };
        assert!(compare(&[3.25], &[2.0], tolerance).passed());
        assert!(!compare(&[3.2500001], &[2.0], tolerance).passed());
        assert!(!compare(&[0.5], &[0.0], Tolerance::Close { rtol: 1.0, atol: 0.0 }).passed());
    }

    #[test]
    fn a_nan_matches_only_a_nan_and_an_infinity_only_itself() {
        let loose = Tolerance::Close { rtol: 1e9, atol: 1e9 };
        assert!(compare(&[f64::NAN, f64::INFINITY], &[f64::NAN, f64::INFINITY], loose).passed());
        for (got, want) in [
            (1.0, f64::NAN),
            (f64::NAN, 1.0),
            (f64::NEG_INFINITY, f64::INFINITY),
            (f64::INFINITY, 1.0),
            (f64::MAX, f64::INFINITY),
        ] {
            assert!(!compare(&[got], &[want], loose).passed(), "{got} against {want}");
        }
        let f16_max = 65504.0;
        assert!(!compare(&[f16_max], &[f64::INFINITY], Tolerance::stored(DType::F16)).passed());
    }

    #[test]
    fn ulps_count_representable_values_across_zero() {
        let one_ulp = Tolerance::Ulps { dtype: DType::F16, ulps: 1, abs: 0.0 };
        assert!(compare(&[1.0 + F16_ULP_AT_ONE], &[1.0], one_ulp).passed());
        assert!(!compare(&[1.0 + 2.0 * F16_ULP_AT_ONE], &[1.0], one_ulp).passed());
        // The smallest subnormals on either side of zero are two ulps apart.
        let tiny = 2f64.powi(-24);
        assert!(compare(&[tiny], &[0.0], one_ulp).passed());
        assert!(!compare(&[tiny], &[-tiny], one_ulp).passed());
        assert!(compare(&[-0.0], &[0.0], Tolerance::exact(DType::F16)).passed());
    }

    #[test]
    fn a_value_not_of_the_dtype_is_accepted_only_by_the_absolute_bound() {
        let off = 1.0 + F16_ULP_AT_ONE / 2.0;
        assert!(!compare(&[off], &[1.0], Tolerance::Ulps { dtype: DType::F16, ulps: 1, abs: 0.0 }).passed());
        assert!(compare(&[off], &[1.0], Tolerance::Ulps { dtype: DType::F16, ulps: 0, abs: 1e-3 }).passed());
    }

    #[test]
    fn sixteen_bit_stores_allow_one_ulp_or_the_cancellation_slack() {
        let bf16 = Tolerance::stored(DType::BF16);
        assert!(compare(&[2f64.powi(-25)], &[0.0], bf16).passed());
        assert!(!compare(&[2f64.powi(-23)], &[0.0], bf16).passed());
        assert!(!compare(&[1.0 + 2.0 / 128.0], &[1.0], bf16).passed());
        assert_eq!(Tolerance::stored(DType::F32), Tolerance::F32);
    }

    #[test]
    fn the_report_names_the_first_mismatches_and_not_the_array() {
        let want = vec![0.0; 1000];
        let mut got = want.clone();
        for i in [10, 20, 30, 40, 50] {
            got[i] = 1.0;
        }
        let comparison = compare(&got, &want, Tolerance::F32);
        assert_eq!(comparison.mismatches, 5);
        assert_eq!(comparison.first.iter().map(|m| m.index).collect::<Vec<_>>(), [10, 20, 30]);
        let text = comparison.to_string();
        assert!(text.starts_with("5 of 1000 outside"), "{text}");
        assert!(text.contains("[30]") && !text.contains("[40]"), "{text}");
        assert!(!compare(&[0.0; 3], &[0.0; 4], Tolerance::F32).passed());
    }

    #[test]
    #[should_panic(expected = "param: 1 of 2 outside")]
    fn assert_close_panics_with_what_and_the_mismatch() {
        assert_close("param", &[1.0, 2.0], &[1.0, 3.0], Tolerance::F32);
    }
}
