//! Muon behind Burn's front ends: refused, by name, until they carry what it needs.

use crate::{Algorithm, BurnFailure, Error, Result};

/// Refuses Muon in `front_end`. Muon takes only 2-D parameters (a module's biases go to
/// another algorithm's group) and keeps Newton-Schulz scratch per matrix shape; Burn's
/// per-tensor `Optimizer` trait and `ModuleStep`'s one algorithm for every parameter have
/// no place for a second group. The crate's `Optimizer` over the module's wgpu buffers,
/// with a Muon group and an AdamW group, runs it.
pub(super) fn refuse(algorithm: &Algorithm, front_end: &str) -> Result<()> {
    if let Algorithm::Muon(_) = algorithm {
        return Err(Error::Burn {
            cause: BurnFailure::Config,
            detail: format!(
                "{front_end} does not run Muon: it takes 2-D parameters only, with the others in \
                 an AdamW group, which one algorithm per optimizer cannot express; step the \
                 module's buffers with wgpu_optim::Optimizer and a Muon group beside an AdamW \
                 group instead"
            ),
        });
    }
    Ok(())
}
