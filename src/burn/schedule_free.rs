//! Schedule-Free AdamW behind Burn's front ends: refused, by name, until they can keep what
//! it needs.

use crate::{Algorithm, BurnFailure, Error, Result};

/// Refuses Schedule-Free AdamW in `front_end`. Its step needs the group's running
/// `weight_sum` and `lr_max` beside the state tensors, and its parameters must be swapped
/// between y and x (`eval()`/`train()`) around evaluation: Burn's per-tensor `Optimizer`
/// trait has no place for either, and `ModuleStep` rebuilds its optimizers (from per-tensor
/// records that hold no group values) whenever the set of parameters with gradients
/// changes. The crate's `Optimizer` (over the module's wgpu buffers) runs it.
pub(super) fn refuse(algorithm: &Algorithm, front_end: &str) -> Result<()> {
    if let Algorithm::ScheduleFreeAdamW(_) = algorithm {
        return Err(Error::Burn {
            cause: BurnFailure::Config,
            detail: format!(
                "{front_end} does not run Schedule-Free AdamW: its step needs the group's running \
                 weight_sum and lr_max and an eval()/train() swap of the parameters, which Burn's \
                 optimizer records and traits do not carry; step the module's buffers with \
                 wgpu_optim::Optimizer instead"
            ),
        });
    }
    Ok(())
}
