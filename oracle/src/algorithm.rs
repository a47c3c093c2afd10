//! The algorithms the oracle transcribes, one variant per family, each holding the oracle's
//! own hyperparameters under its source's names: what [`TorchState`](crate::TorchState) and
//! [`bnb_8bit_step`](crate::bnb_8bit_step) dispatch on.

use super::adafactor::Adafactor;
use super::adan::AdanHyperparameters;
use super::ademamix::AdEMAMix;
use super::adopt::AdoptHyperparameters;
use super::lamb::Lamb;
use super::lion::Lion;
use super::muon::Muon;
use super::rmsprop::RmsProp;
use super::schedule_free::AdamWScheduleFree;
use super::torch::{Adagrad, Adam, Sgd};

/// One algorithm and its hyperparameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Algorithm {
    /// `torch.optim.Adam` / `AdamW`.
    Adam(Adam),
    /// `torch.optim.SGD`.
    Sgd(Sgd),
    /// `torch.optim.Adagrad`.
    Adagrad(Adagrad),
    /// `torch.optim.RMSprop`.
    RmsProp(RmsProp),
    /// lion-pytorch's `Lion`.
    Lion(Lion),
    /// bitsandbytes' `AdEMAMix`.
    AdEMAMix(AdEMAMix),
    /// The official `adopt.ADOPT`.
    Adopt(AdoptHyperparameters),
    /// The official `adan.Adan`.
    Adan(AdanHyperparameters),
    /// torch-optimizer's `Lamb` (group state: [`LambOracle`](crate::LambOracle)).
    Lamb(Lamb),
    /// schedulefree's `AdamWScheduleFree` (group state:
    /// [`ScheduleFreeOracle`](crate::ScheduleFreeOracle)).
    ScheduleFreeAdamW(AdamWScheduleFree),
    /// `torch.optim.Adafactor` (group state: [`AdafactorOracle`](crate::AdafactorOracle)).
    Adafactor(Adafactor),
    /// `torch.optim.Muon` ([`muon_step`](crate::muon_step)).
    Muon(Muon),
}

/// `From` each family's hyperparameters, so that a test writes `adam.into()`.
macro_rules! from_hyperparameters {
    ($($variant:ident($config:ty),)*) => {
        $(
            impl From<$config> for Algorithm {
                fn from(config: $config) -> Self {
                    Algorithm::$variant(config)
                }
            }
        )*
    };
}

from_hyperparameters! {
    Adam(Adam),
    Sgd(Sgd),
    Adagrad(Adagrad),
    RmsProp(RmsProp),
    Lion(Lion),
    AdEMAMix(AdEMAMix),
    Adopt(AdoptHyperparameters),
    Adan(AdanHyperparameters),
    Lamb(Lamb),
    ScheduleFreeAdamW(AdamWScheduleFree),
    Adafactor(Adafactor),
    Muon(Muon),
}
