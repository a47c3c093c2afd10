//! ADOPT (Taniguchi et al. 2024, "ADOPT: Modified Adam Can Converge with Any beta2 with the
//! Optimal Rate"), as the official iShohei220/adopt `ADOPT` (PyPI `torch-adopt` 0.1.0) runs
//! it.

use crate::algo::{check, check_beta, check_rate};
use super::contract::{AdoptSwitches, AdoptUniform64};
use crate::step::KernelStep;
use crate::Result;
use crate::StateKind;

/// The official `adopt.ADOPT`. `Adopt::default()` is its defaults.
///
/// Per element, with `t` the step from 1 and `s = t - 1`: `g = -g` if `maximize`; without
/// `decouple`, `g += weight_decay p` (on every step). The first step only sets
/// `exp_avg_sq = g^2`: the parameter and `exp_avg` stay as they are. From the second on:
/// with `decouple`, `p *= 1 - lr weight_decay`; `x = g / max(sqrt(exp_avg_sq), eps)`, clamped
/// to `[-s^q, s^q]` where `clip_exponent` is `Some(q)`; `exp_avg = lerp(exp_avg, x, 1 - beta1)`;
/// `p -= lr exp_avg`; then `exp_avg_sq = beta2 exp_avg_sq + (1 - beta2) g^2`, so the
/// normalization never sees the gradient it normalizes. A NaN gradient spoils its own
/// element for good, as in the official code (`torch.clamp` keeps a NaN root).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adopt {
    /// Learning rate (`lr`, default 1e-3).
    pub lr: f64,
    /// The old first moment's weight (`betas[0]`, default 0.9).
    pub beta1: f64,
    /// The old second moment's weight (`betas[1]`, default 0.9999).
    pub beta2: f64,
    /// The floor of `sqrt(exp_avg_sq)`, a clamp rather than an addition (default 1e-6).
    pub eps: f64,
    /// Weight decay (default 0): added to the gradient, or with `decouple` applied to the
    /// parameter from the second step on.
    pub weight_decay: f64,
    /// Decay the parameter (`p *= 1 - lr weight_decay`) instead of adding the decay to the
    /// gradient (default false).
    pub decouple: bool,
    /// The exponent `q` of the official `clip_lambda = lambda step: step ** q`, which bounds
    /// the normalized gradient at `s^q` after `s` earlier steps (default `Some(0.25)`);
    /// `None`: no clipping (the official `clip_lambda=None`).
    pub clip_exponent: Option<f64>,
    /// Ascend instead of descend (default false).
    pub maximize: bool,
}

impl Default for Adopt {
    fn default() -> Self {
        Adopt {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.9999,
            eps: 1e-6,
            weight_decay: 0.0,
            decouple: false,
            clip_exponent: Some(0.25),
            maximize: false,
        }
    }
}

impl Adopt {
    /// Checks the hyperparameters as the official constructor does (`lr`, `eps` and
    /// `weight_decay` `>= 0`, each beta in `[0, 1)`), every value finite, and the clipping
    /// exponent finite and `>= 0`.
    /// ([`Algorithm::validate`](crate::Algorithm::validate) says when a trainer calls it.)
    pub fn validate(&self) -> Result<()> {
        check_rate("lr", self.lr)?;
        check_rate("eps", self.eps)?;
        check_beta("beta1", self.beta1)?;
        check_beta("beta2", self.beta2)?;
        check_rate("weight_decay", self.weight_decay)?;
        if let Some(q) = self.clip_exponent {
            check("clip_exponent", q, q.is_finite() && q >= 0.0, "None or a finite number >= 0")?;
        }
        Ok(())
    }

    /// The kernel step for step `t` (counted from 1): the first step's flag, the decay's
    /// mode and the clipping bound `(t - 1)^q`, computed here in f64.
    pub(crate) fn kernel_step(&self, t: u64) -> KernelStep {
        let decoupled = if self.decouple { self.weight_decay } else { 0.0 };
        let earlier = t.saturating_sub(1) as f64;
        let uniform = AdoptUniform64 {
            lr: self.lr,
            one_minus_beta1: 1.0 - self.beta1,
            beta2: self.beta2,
            one_minus_beta2: 1.0 - self.beta2,
            eps: self.eps,
            grad_sign: if self.maximize { -1.0 } else { 1.0 },
            l2: if self.decouple { 0.0 } else { self.weight_decay },
            weight_decay: decoupled,
            decay: 1.0 - self.lr * decoupled,
            clip_bound: self.clip_exponent.map_or(f64::INFINITY, |q| earlier.powf(q)),
            clip_exponent: self.clip_exponent.unwrap_or(0.0),
            first_step: u32::from(t <= 1),
            clips: u32::from(self.clip_exponent.is_some()),
        };
        KernelStep::Adopt(AdoptSwitches, uniform)
    }
}

/// The registry's view of the configuration (`crate::algo::FamilyConfig`).
impl crate::algo::FamilyConfig for Adopt {
    const FAMILY: crate::step::Family = crate::step::Family::Adopt;

    fn torch_class(&self) -> &'static str {
        "ADOPT"
    }

    fn validate(&self) -> crate::Result<()> {
        Adopt::validate(self)
    }

    fn kernel_step(&self, t: u64) -> KernelStep {
        Adopt::kernel_step(self, t)
    }

    fn lr(&self) -> f64 {
        self.lr
    }

    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    fn state_kinds(&self) -> &'static [StateKind] {
        &[StateKind::ExpAvg, StateKind::ExpAvgSq]
    }
}

/// The oracle's copy (`AdoptHyperparameters` of `wgpu-optim-oracle`, where the official
/// code's `clip_lambda` is `step ** q` and holds `q`), field by field: a field added here
/// fails to compile until the oracle has it.
#[cfg(test)]
impl crate::oracle::ToOracle for Adopt {
    type Oracle = wgpu_optim_oracle::AdoptHyperparameters;

    fn to_oracle(&self) -> Self::Oracle {
        let Adopt { lr, beta1, beta2, eps, weight_decay, decouple, clip_exponent, maximize } = *self;
        wgpu_optim_oracle::AdoptHyperparameters {
            lr,
            beta1,
            beta2,
            eps,
            clip_lambda: clip_exponent,
            weight_decay,
            decouple,
            maximize,
        }
    }
}
