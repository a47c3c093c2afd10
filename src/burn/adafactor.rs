//! Adafactor behind Burn's front ends: refused, by name, until they carry what it needs.

use crate::{Algorithm, BurnFailure, Error, Result};

/// Refuses Adafactor in `front_end`. Its step reduces each tensor by its shape into
/// factored states (`row_var` of shape `[.., rows, 1]`, `col_var` of `[.., 1, cols]`) that
/// the Burn front ends' state records and per-tensor elementwise updates do not hold; the
/// crate's `Optimizer`, given `param_shapes` (Burn's tensors know theirs), runs it over the
/// module's wgpu buffers.
pub(super) fn refuse(algorithm: &Algorithm, front_end: &str) -> Result<()> {
    if let Algorithm::Adafactor(_) = algorithm {
        return Err(Error::Burn {
            cause: BurnFailure::Config,
            detail: format!(
                "{front_end} does not run Adafactor yet: its factored row_var/col_var states are not \
                 among the states its records and elementwise updates carry; step the module's \
                 buffers with wgpu_optim::Optimizer and param_shapes instead"
            ),
        });
    }
    Ok(())
}
