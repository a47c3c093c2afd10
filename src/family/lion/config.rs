//! Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"), as
//! lion-pytorch's `Lion` runs it.

use crate::algo::{check_beta, check_rate};
use super::contract::{LionSwitches, LionUniform64};
use crate::step::KernelStep;
use crate::Result;
use crate::StateKind;

/// lion-pytorch's `Lion`. `Lion::default()` is its defaults.
///
/// Each step, per element: `c = beta1 m + (1 - beta1) g`; `p *= 1 - lr weight_decay`;
/// `p -= lr sign(c)`; `m = beta2 m + (1 - beta2) g`. `sign` is `torch.sign`'s (and
/// bitsandbytes' `sgn`): 0 for 0 and for NaN, so a NaN gradient only decays its parameter
/// (its `m` goes NaN, and with 8-bit state restarts from 0). The update has the same
/// magnitude everywhere, so Lion's rate is usually 3 to 10 times smaller than AdamW's.
///
/// One state, half of Adam's memory; lion-pytorch's default rate is 1e-4.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lion {
    /// Learning rate (`lr`, default 1e-4).
    pub lr: f64,
    /// The weight of the running average in the update's direction (`betas[0]`, default 0.9).
    pub beta1: f64,
    /// The running average's coefficient (`betas[1]`, default 0.99).
    pub beta2: f64,
    /// Decoupled weight decay, `p *= 1 - lr * weight_decay` before the update (default 0).
    pub weight_decay: f64,
}

impl Default for Lion {
    fn default() -> Self {
        Lion { lr: 1e-4, beta1: 0.9, beta2: 0.99, weight_decay: 0.0 }
    }
}

impl Lion {
    /// Checks the hyperparameters as lion-pytorch's constructor does (every value finite).
    /// ([`Algorithm::validate`](crate::Algorithm::validate) says when a trainer calls it.)
    pub fn validate(&self) -> Result<()> {
        check_rate("lr", self.lr)?;
        check_beta("beta1", self.beta1)?;
        check_beta("beta2", self.beta2)?;
        check_rate("weight_decay", self.weight_decay)
    }

    /// The kernel step; Lion's update does not depend on the step number.
    pub(crate) fn kernel_step(&self, _t: u64) -> KernelStep {
        let uniform = LionUniform64 {
            beta1: self.beta1,
            one_minus_beta1: 1.0 - self.beta1,
            beta2: self.beta2,
            one_minus_beta2: 1.0 - self.beta2,
            lr: self.lr,
            weight_decay: self.weight_decay,
            decay: 1.0 - self.lr * self.weight_decay,
        };
        KernelStep::Lion(LionSwitches, uniform)
    }
}

/// The registry's view of the configuration (`crate::algo::FamilyConfig`).
impl crate::algo::FamilyConfig for Lion {
    const FAMILY: crate::step::Family = crate::step::Family::Lion;

    fn torch_class(&self) -> &'static str {
        "Lion"
    }

    fn validate(&self) -> crate::Result<()> {
        Lion::validate(self)
    }

    fn kernel_step(&self, t: u64) -> KernelStep {
        Lion::kernel_step(self, t)
    }

    fn lr(&self) -> f64 {
        self.lr
    }

    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    fn state_kinds(&self) -> &'static [StateKind] {
        &[StateKind::ExpAvg]
    }
}

/// The oracle's copy (`Lion` of `wgpu-optim-oracle`), field by field: a field added here
/// fails to compile until the oracle has it.
#[cfg(test)]
impl crate::oracle::ToOracle for Lion {
    type Oracle = wgpu_optim_oracle::Lion;

    fn to_oracle(&self) -> Self::Oracle {
        let Lion { lr, beta1, beta2, weight_decay } = *self;
        wgpu_optim_oracle::Lion { lr, beta1, beta2, weight_decay }
    }
}
