//! The checks of a configuration that the GPU front end (`crate::optimizer`) and the CPU
//! backend (`crate::cpu`) share: what they refuse alike, in one place that knows neither.

use crate::{DType, Error, Result, Rounding};

/// `param_shapes` (of either builder) against the parameters' lengths.
pub(crate) fn check_shapes(shapes: &[Vec<usize>], lens: &[u64]) -> Result<()> {
    if shapes.is_empty() {
        return Ok(());
    }
    if shapes.len() != lens.len() {
        return Err(Error::CountMismatch {
            argument: "param_shapes".into(),
            got: shapes.len(),
            expected: lens.len(),
        });
    }
    for (i, (shape, len)) in shapes.iter().zip(lens).enumerate() {
        let elements = shape.iter().try_fold(1u64, |n, d| n.checked_mul(*d as u64));
        if elements != Some(*len) {
            return Err(Error::LengthMismatch {
                argument: format!("param_shapes[{i}] {shape:?}"),
                got: elements.unwrap_or(u64::MAX),
                expected: *len,
                reference: format!("params[{i}]"),
            });
        }
    }
    Ok(())
}

/// Stochastic and Kahan rounding act on 16-bit parameter stores: every parameter must be
/// F16 or BF16 (an f32 store does not round, so either would silently do nothing).
pub(crate) fn check_rounding_dtypes(
    rounding: Rounding,
    dtypes: impl Iterator<Item = DType>,
    argument: &str,
) -> Result<()> {
    if rounding == Rounding::NearestEven {
        return Ok(());
    }
    for (i, dtype) in dtypes.enumerate() {
        if !matches!(dtype, DType::F16 | DType::BF16) {
            return Err(Error::DTypeMismatch {
                argument: format!("{argument}[{i}]"),
                got: dtype,
                expected: format!("F16 or BF16 with {} rounding (f32 stores are exact)", rounding.name()),
            });
        }
    }
    Ok(())
}
