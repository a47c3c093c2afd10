//! Adan (Xie et al. 2022, "Adan: Adaptive Nesterov Momentum Algorithm for Faster Optimizing
//! Deep Models"), as the official sail-sg/Adan `adan.Adan` runs it.

use crate::algo::{bias_correction, check_beta, check_rate};
use super::contract::{AdanSwitches, AdanUniform64};
use crate::step::KernelStep;
use crate::Result;
use crate::StateKind;

/// The official `adan.Adan`. `Adan::default()` is its defaults.
///
/// Per element, with `t` the step from 1 and `g` the gradient: `d = g - g_prev`, where
/// `g_prev` is the previous step's gradient and at `t = 1` the gradient itself (the first
/// difference is 0); `exp_avg = beta1 exp_avg + (1 - beta1) g`;
/// `exp_avg_diff = beta2 exp_avg_diff + (1 - beta2) d`;
/// `exp_avg_sq = beta3 exp_avg_sq + (1 - beta3) (g + beta2 d)^2`;
/// `u = (exp_avg / (1 - beta1^t) + beta2 exp_avg_diff / (1 - beta2^t)) /
/// (sqrt(exp_avg_sq) / sqrt(1 - beta3^t) + eps)`; then `p = (p - lr u) / (1 + lr weight_decay)`,
/// or with `no_prox` `p = p (1 - lr weight_decay) - lr u`. The state `neg_pre_grad` keeps
/// `-g` for the next step's difference.
///
/// Each beta is the weight of the OLD value, as in the official code (the paper's
/// Algorithm 1 writes `1 -` them).
///
/// Its four states make a step bind more storage buffers than the other families: capturable
/// mode with master weights or Kahan compensation needs nine, so a device created with
/// WebGPU's default limits (eight per shader stage) refuses that step
/// ([`Error::TooManyBindings`](crate::Error::TooManyBindings)); the adapter's own limits
/// are usually higher.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adan {
    /// Learning rate (`lr`, default 1e-3).
    pub lr: f64,
    /// The old first moment's weight (`betas[0]`, default 0.98).
    pub beta1: f64,
    /// The old gradient-difference moment's weight (`betas[1]`, default 0.92).
    pub beta2: f64,
    /// The old second moment's weight (`betas[2]`, default 0.99).
    pub beta3: f64,
    /// Added to the denominator outside the root (default 1e-8).
    pub eps: f64,
    /// Weight decay (default 0): a proximal division after the update, or with `no_prox`
    /// a decay of the parameter before it.
    pub weight_decay: f64,
    /// The official global gradient-norm bound (default 0: no clipping). When positive,
    /// every gradient of the optimizer (all groups together) is multiplied by
    /// `min(1, max_grad_norm / (L2 norm + eps))` before the step, with this `eps` (where
    /// the optimizer's `grad_clip` adds 1e-6), and `neg_pre_grad` keeps the clipped
    /// gradient. It runs through the same fused passes as `grad_clip`, and
    /// `grad_norm()` reports the norm; every group must have the same `max_grad_norm` and,
    /// when clipping, the same `eps`, and `grad_clip` is refused beside it
    /// ([`Error::ConflictingOptions`](crate::Error::ConflictingOptions)).
    pub max_grad_norm: f64,
    /// Decay the parameter before the update (`p *= 1 - lr weight_decay`) instead of the
    /// proximal division after it (default false).
    pub no_prox: bool,
}

impl Default for Adan {
    fn default() -> Self {
        Adan {
            lr: 1e-3,
            beta1: 0.98,
            beta2: 0.92,
            beta3: 0.99,
            eps: 1e-8,
            weight_decay: 0.0,
            max_grad_norm: 0.0,
            no_prox: false,
        }
    }
}

impl Adan {
    /// Checks the hyperparameters as the official constructor does (`lr`, `eps` and
    /// `weight_decay` `>= 0`, each beta in `[0, 1)`), and `max_grad_norm >= 0`, every value
    /// finite. ([`Algorithm::validate`](crate::Algorithm::validate) says when a trainer calls it.)
    pub fn validate(&self) -> Result<()> {
        check_rate("lr", self.lr)?;
        check_rate("eps", self.eps)?;
        check_beta("beta1", self.beta1)?;
        check_beta("beta2", self.beta2)?;
        check_beta("beta3", self.beta3)?;
        check_rate("weight_decay", self.weight_decay)?;
        check_rate("max_grad_norm", self.max_grad_norm)
    }

    /// The kernel step for step `t` (counted from 1): the bias corrections, the step sizes,
    /// the decay's mode and the first step's flag, computed here in f64.
    pub(crate) fn kernel_step(&self, t: u64) -> KernelStep {
        let decay_rate = self.lr * self.weight_decay;
        let uniform = AdanUniform64 {
            lr: self.lr,
            beta1: self.beta1,
            one_minus_beta1: 1.0 - self.beta1,
            beta2: self.beta2,
            one_minus_beta2: 1.0 - self.beta2,
            beta3: self.beta3,
            one_minus_beta3: 1.0 - self.beta3,
            step_size: self.lr / bias_correction(self.beta1, t),
            step_size_diff: self.lr * self.beta2 / bias_correction(self.beta2, t),
            sqrt_bias_correction3: bias_correction(self.beta3, t).sqrt(),
            eps: self.eps,
            weight_decay: self.weight_decay,
            decay: if self.no_prox { 1.0 - decay_rate } else { 1.0 },
            prox_divisor: if self.no_prox { 1.0 } else { 1.0 + decay_rate },
            ln_beta1: self.beta1.ln(),
            ln_beta2: self.beta2.ln(),
            ln_beta3: self.beta3.ln(),
            first_step: u32::from(t <= 1),
            no_prox: u32::from(self.no_prox),
        };
        KernelStep::Adan(AdanSwitches, uniform)
    }
}

/// The registry's view of the configuration (`crate::algo::FamilyConfig`).
impl crate::algo::FamilyConfig for Adan {
    const FAMILY: crate::step::Family = crate::step::Family::Adan;

    fn torch_class(&self) -> &'static str {
        "Adan"
    }

    fn validate(&self) -> crate::Result<()> {
        Adan::validate(self)
    }

    fn kernel_step(&self, t: u64) -> KernelStep {
        Adan::kernel_step(self, t)
    }

    fn lr(&self) -> f64 {
        self.lr
    }

    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    fn state_kinds(&self) -> &'static [StateKind] {
        &[StateKind::ExpAvg, StateKind::ExpAvgSq, StateKind::ExpAvgDiff, StateKind::NegPreGrad]
    }

    fn own_grad_clip(&self) -> Option<(f64, f64)> {
        (self.max_grad_norm > 0.0).then_some((self.max_grad_norm, self.eps))
    }
}

/// The oracle's copy (`AdanHyperparameters` of `wgpu-optim-oracle`), field by field: a field added here
/// fails to compile until the oracle has it.
#[cfg(test)]
impl crate::oracle::ToOracle for Adan {
    type Oracle = wgpu_optim_oracle::AdanHyperparameters;

    fn to_oracle(&self) -> Self::Oracle {
        let Adan { lr, beta1, beta2, beta3, eps, weight_decay, max_grad_norm, no_prox } = *self;
        wgpu_optim_oracle::AdanHyperparameters { lr, beta1, beta2, beta3, eps, weight_decay, max_grad_norm, no_prox }
    }
}
