//! Burn's optimizer configurations as this crate's algorithms.

use burn::optim::AdamWConfig;

use wgpu_optim::{Adam, BurnFailure, Error, Result};

/// Burn's AdamW configuration as the library's AdamW (`Adam::try_from(&config)` before
/// the Burn integration became its own crate): betas, eps, weight decay and AMSGrad,
/// in Burn's f32 values widened (so that `1 - beta2` is Burn's), lr 1e-3 (Burn takes the
/// learning rate at each step, as [`FusedOptimizer`](crate::FusedOptimizer) and
/// [`ModuleStep`](crate::ModuleStep) do). `AdamWConfig::new()` gives [`Adam::burn_adamw`].
///
/// Refused ([`Error::Burn`]) for what this crate's AdamW does not do: cautious weight decay,
/// and Burn's per-parameter gradient clipping (this crate clips the global norm, with
/// [`OptimizerBuilder::grad_clip`](wgpu_optim::OptimizerBuilder::grad_clip)).
pub fn adam_from_config(config: &AdamWConfig) -> Result<Adam> {
    {
        // Burn keeps the fields private; its `Config` serializes them by name.
        let json = serde_json::to_value(config).map_err(|e| Error::Burn {
            cause: BurnFailure::Config,
            detail: format!("Burn's AdamWConfig did not serialize: {e}"),
        })?;
        let field = |name: &str| json.get(name).ok_or_else(|| missing(name));
        let float =
            |name: &str| field(name)?.as_f64().map(|v| f64::from(v as f32)).ok_or_else(|| missing(name));
        let flag = |name: &str| field(name)?.as_bool().ok_or_else(|| missing(name));
        if flag("cautious_weight_decay")? {
            return Err(Error::Burn {
                cause: BurnFailure::Config,
                detail: "AdamWConfig's cautious weight decay has no kernel here".into(),
            });
        }
        if !field("grad_clipping")?.is_null() {
            return Err(Error::Burn {
                cause: BurnFailure::Config,
                detail: "AdamWConfig's gradient clipping is Burn's, per parameter; clip the global norm \
                 with OptimizerBuilder::grad_clip instead"
                    .into(),
            });
        }
        let adam = Adam {
            beta1: float("beta_1")?,
            beta2: float("beta_2")?,
            eps: float("epsilon")?,
            weight_decay: float("weight_decay")?,
            amsgrad: flag("amsgrad")?,
            ..Adam::adamw()
        };
        adam.validate()?;
        Ok(adam)
    }
}

fn missing(name: &str) -> Error {
    Error::Burn {
        cause: BurnFailure::Config,
        detail: format!("Burn's AdamWConfig has no `{name}` of the expected type"),
    }
}
