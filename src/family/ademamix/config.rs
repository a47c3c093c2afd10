//! AdEMAMix (Pagliardini et al. 2024, "The AdEMAMix Optimizer: Better, Faster, Older"), as
//! bitsandbytes' `AdEMAMix` runs it.

use crate::algo::{bias_correction, check, check_beta, check_rate};
use super::contract::{AdemamixSwitches, AdemamixUniform64};
use crate::step::KernelStep;
use crate::Result;
use crate::StateKind;

/// bitsandbytes' `bnb.optim.AdEMAMix` (32-bit states). `AdEMAMix::default()` is its defaults.
///
/// Adam's two moments plus a slow EMA `m2` of the gradient, mixed into the update with weight
/// `alpha`: per element, with `t` the step from 1,
/// `m1 = beta1 m1 + (1 - beta1) g`, `m2 = beta3_t m2 + (1 - beta3_t) g`,
/// `nu = beta2 nu + (1 - beta2) g^2`, `p *= 1 - lr weight_decay`,
/// `p -= lr (m1 / (1 - beta1^t) + alpha_t m2) / (sqrt(nu) / sqrt(1 - beta2^t) + eps)`.
/// The warmups (`t_alpha`, `t_beta3`) raise `alpha_t` linearly and `beta3_t` along the
/// paper's half-life schedule to `alpha` and `beta3`, where they hold.
///
/// Both warmups are computed from the step (on the device in capturable mode).
#[derive(Clone, Copy, Debug, PartialEq)]
#[allow(clippy::upper_case_acronyms)]
pub struct AdEMAMix {
    /// Learning rate (`lr`, default 1e-3).
    pub lr: f64,
    /// The fast EMA's coefficient (`betas[0]`, default 0.9).
    pub beta1: f64,
    /// The second moment's coefficient (`betas[1]`, default 0.999).
    pub beta2: f64,
    /// The slow EMA's coefficient once warmed up (`betas[2]`, default 0.9999).
    pub beta3: f64,
    /// The slow EMA's weight in the update once warmed up (default 5).
    pub alpha: f64,
    /// Steps of `alpha`'s linear warmup; `None` (default): `alpha` from the first step.
    pub t_alpha: Option<u64>,
    /// Steps of `beta3`'s warmup; `None` (default): `beta3` from the first step.
    pub t_beta3: Option<u64>,
    /// Added to the bias-corrected `sqrt(nu)` (default 1e-8).
    pub eps: f64,
    /// Decoupled weight decay, `p *= 1 - lr * weight_decay` (default 0.01).
    pub weight_decay: f64,
}

impl Default for AdEMAMix {
    fn default() -> Self {
        AdEMAMix {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            beta3: 0.9999,
            alpha: 5.0,
            t_alpha: None,
            t_beta3: None,
            eps: 1e-8,
            weight_decay: 1e-2,
        }
    }
}

impl AdEMAMix {
    /// Checks the hyperparameters as bitsandbytes' constructor does (every value finite).
    /// ([`Algorithm::validate`](crate::Algorithm::validate) says when a trainer calls it.)
    pub fn validate(&self) -> Result<()> {
        check_rate("lr", self.lr)?;
        check_beta("beta1", self.beta1)?;
        check_beta("beta2", self.beta2)?;
        check_beta("beta3", self.beta3)?;
        check_rate("alpha", self.alpha)?;
        for (name, steps) in [("t_alpha", self.t_alpha), ("t_beta3", self.t_beta3)] {
            if let Some(steps) = steps {
                check(name, steps as f64, steps > 0, "None or a number of steps > 0")?;
            }
        }
        check_rate("eps", self.eps)?;
        check_rate("weight_decay", self.weight_decay)
    }

    /// `alpha_t`: `alpha` warmed up linearly over `t_alpha` steps.
    pub(crate) fn alpha_at(&self, t: u64) -> f64 {
        match self.t_alpha {
            Some(t_alpha) => (t as f64 * self.alpha / t_alpha as f64).min(self.alpha),
            None => self.alpha,
        }
    }

    /// `(beta3_t, 1 - beta3_t)`: the paper's schedule, which warms the slow EMA's half-life
    /// up linearly, `exp(ln(beta1) ln(beta3) / ((1 - s) ln(beta3) + s ln(beta1)))` with
    /// `s = t / t_beta3`, capped at `beta3`. `1 - beta3_t` is taken as `-expm1` of the
    /// exponent, which keeps its digits for `beta3_t` close to 1.
    pub(crate) fn beta3_at(&self, t: u64) -> (f64, f64) {
        let held = (self.beta3, 1.0 - self.beta3);
        let Some(t_beta3) = self.t_beta3 else { return held };
        let s = t as f64 / t_beta3 as f64;
        let (ln1, ln3) = (self.beta1.ln(), self.beta3.ln());
        let exponent = ln1 * ln3 / ((1.0 - s) * ln3 + s * ln1);
        let beta3_t = exponent.exp();
        if beta3_t.is_nan() || beta3_t >= self.beta3 {
            held
        } else {
            (beta3_t, -exponent.exp_m1())
        }
    }

    /// The kernel step for step `t` (counted from 1): the schedules and bias corrections
    /// computed here in f64.
    pub(crate) fn kernel_step(&self, t: u64) -> KernelStep {
        let (beta3_t, one_minus_beta3_t) = self.beta3_at(t);
        let uniform = AdemamixUniform64 {
            beta1: self.beta1,
            one_minus_beta1: 1.0 - self.beta1,
            beta2: self.beta2,
            one_minus_beta2: 1.0 - self.beta2,
            beta3_t,
            one_minus_beta3_t,
            alpha_t: self.alpha_at(t),
            bias_correction1: bias_correction(self.beta1, t),
            sqrt_bias_correction2: bias_correction(self.beta2, t).sqrt(),
            eps: self.eps,
            lr: self.lr,
            weight_decay: self.weight_decay,
            decay: 1.0 - self.lr * self.weight_decay,
            ln_beta1: self.beta1.ln(),
            ln_beta2: self.beta2.ln(),
            ln_beta3: self.beta3.ln(),
            beta3: self.beta3,
            one_minus_beta3: 1.0 - self.beta3,
            alpha: self.alpha,
            t_alpha: self.t_alpha.map_or(0.0, |t| t as f64),
            t_beta3: self.t_beta3.map_or(0.0, |t| t as f64),
        };
        KernelStep::Ademamix(AdemamixSwitches { decay_after_update: false }, uniform)
    }
}

/// The registry's view of the configuration (`crate::algo::FamilyConfig`).
impl crate::algo::FamilyConfig for AdEMAMix {
    const FAMILY: crate::step::Family = crate::step::Family::Ademamix;

    fn torch_class(&self) -> &'static str {
        "AdEMAMix"
    }

    fn validate(&self) -> crate::Result<()> {
        AdEMAMix::validate(self)
    }

    fn kernel_step(&self, t: u64) -> KernelStep {
        AdEMAMix::kernel_step(self, t)
    }

    fn lr(&self) -> f64 {
        self.lr
    }

    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    fn state_kinds(&self) -> &'static [StateKind] {
        &[StateKind::ExpAvg, StateKind::ExpAvgSlow, StateKind::ExpAvgSq]
    }
}

/// The oracle's copy (`AdEMAMix` of `wgpu-optim-oracle`), field by field: a field added here
/// fails to compile until the oracle has it.
#[cfg(test)]
impl crate::oracle::ToOracle for AdEMAMix {
    type Oracle = wgpu_optim_oracle::AdEMAMix;

    fn to_oracle(&self) -> Self::Oracle {
        let AdEMAMix { lr, beta1, beta2, beta3, alpha, t_alpha, t_beta3, eps, weight_decay } = *self;
        wgpu_optim_oracle::AdEMAMix { lr, beta1, beta2, beta3, alpha, t_alpha, t_beta3, eps, weight_decay }
    }
}
