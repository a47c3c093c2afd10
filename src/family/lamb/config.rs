//! LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning"), as the
//! `torch-optimizer` package's `Lamb` (0.3.0) runs it.
//!
//! Each step, per tensor: `exp_avg`, `exp_avg_sq` as Adam's, never bias-corrected;
//! `s = exp_avg / (sqrt(exp_avg_sq) + eps) + weight_decay p`; `weight_norm =
//! min(norm(p), clamp_value)`, `adam_norm = norm(s)` (L2 over the whole tensor);
//! `trust_ratio = weight_norm / adam_norm`, or 1 where either norm is 0;
//! `p -= step_size trust_ratio s`. Unlike the elementwise families, a step needs each
//! tensor's two norms before it can change any element: two passes over each tensor.

use crate::algo::{bias_correction, check, check_beta, check_rate};
use super::contract::{LambSwitches, LambUniform64};
use crate::step::KernelStep;
use crate::Result;
use crate::StateKind;

/// `torch_optimizer.Lamb`. `Lamb::default()` is its defaults.
///
/// # On this crate's backends
///
/// **LAMB** (You et al. 2019, as torch-optimizer 0.3.0's `Lamb`): Adam's moments, never
/// bias-corrected; `s = exp_avg / (sqrt(exp_avg_sq) + eps) + weight_decay p`; each tensor
/// steps by `step_size * trust_ratio * s` with `trust_ratio = min(norm(p), clamp_value) /
/// norm(s)` (1 where either norm is 0, and the step uses 1 with `adam`; `debias` corrects
/// the step size). No element can change before its tensor's two norms are known, so a step
/// reads each tensor twice: a moments pass (the moments, and per workgroup the partial sums
/// of `p^2` and `s^2`), a combine pass (each tensor's partials summed in a fixed order:
/// deterministic, no float atomics), and an apply pass that recomputes `s` from the stored
/// moments; the trust ratios stay on the device (`Optimizer::lamb_norms(i)` is a 3-element
/// device tensor of the last step's `weight_norm`, `adam_norm`, `trust_ratio`;
/// `CpuOptimizer::lamb_norms(i)` on the CPU backend). Capturable mode, global clipping,
/// stochastic rounding, 8-bit state and f64 parameters are refused for it by name.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lamb {
    /// Learning rate (`lr`, default 1e-3).
    pub lr: f64,
    /// The first moment's coefficient (`betas[0]`, default 0.9).
    pub beta1: f64,
    /// The second moment's coefficient (`betas[1]`, default 0.999).
    pub beta2: f64,
    /// Added to `sqrt(exp_avg_sq)` (default 1e-6).
    pub eps: f64,
    /// Added to the update as `weight_decay p`, inside the trust ratio (default 0).
    pub weight_decay: f64,
    /// The parameter norm is clamped to at most this (`clamp_value`, default 10).
    pub clamp_value: f64,
    /// `adam = True`: the trust ratio is computed but the step uses 1 (default false).
    pub adam: bool,
    /// `debias = True`: the step size is `lr sqrt(1 - beta2^t) / (1 - beta1^t)` (default
    /// false: `lr`).
    pub debias: bool,
}

impl Default for Lamb {
    fn default() -> Self {
        Lamb {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-6,
            weight_decay: 0.0,
            clamp_value: 10.0,
            adam: false,
            debias: false,
        }
    }
}

impl Lamb {
    /// Checks the hyperparameters as torch-optimizer's constructor does (`lr > 0`,
    /// `eps >= 0`, `0 <= beta < 1`, `weight_decay >= 0`, `clamp_value >= 0`), every value
    /// finite. ([`Algorithm::validate`](crate::Algorithm::validate) says when a trainer
    /// calls it.)
    pub fn validate(&self) -> Result<()> {
        check("lr", self.lr, self.lr.is_finite() && self.lr > 0.0, "a finite number > 0")?;
        check_rate("eps", self.eps)?;
        check_beta("beta1", self.beta1)?;
        check_beta("beta2", self.beta2)?;
        check_rate("weight_decay", self.weight_decay)?;
        check_rate("clamp_value", self.clamp_value)
    }

    /// The step size of step `t` (from 1).
    pub(crate) fn step_size(&self, t: u64) -> f64 {
        if self.debias {
            self.lr * bias_correction(self.beta2, t).sqrt() / bias_correction(self.beta1, t)
        } else {
            self.lr
        }
    }

    /// The kernel step of step `t` (the moments pass; the apply pass differs only in its
    /// switch).
    pub(crate) fn kernel_step(&self, t: u64) -> KernelStep {
        KernelStep::Lamb(LambSwitches { apply: false }, self.uniform(t))
    }

    /// The uniform of step `t`, both passes.
    pub(crate) fn uniform(&self, t: u64) -> LambUniform64 {
        LambUniform64 {
            beta1: self.beta1,
            one_minus_beta1: 1.0 - self.beta1,
            beta2: self.beta2,
            one_minus_beta2: 1.0 - self.beta2,
            eps: self.eps,
            weight_decay: self.weight_decay,
            step_size: self.step_size(t),
            clamp_value: self.clamp_value,
            adam: u32::from(self.adam),
            reserved: 0,
        }
    }
}

/// A tensor's norms at its last LAMB step, as torch-optimizer keeps them in its state
/// (`weight_norm`, `adam_norm`, `trust_ratio`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LambNorms {
    /// `min(norm(p), clamp_value)`, of the parameter before the step.
    pub weight_norm: f32,
    /// `norm(s)`, of the update direction before the trust ratio.
    pub adam_norm: f32,
    /// `weight_norm / adam_norm`, or 1 where either is 0; as computed, also where `adam`
    /// makes the step use 1.
    pub trust_ratio: f32,
}

impl LambNorms {
    /// The norms from the sums of squares of the parameter and of the update direction,
    /// as the device's combine pass computes them (in f32).
    #[cfg_attr(not(feature = "cpu"), allow(dead_code))]
    pub(crate) fn from_sums(config: &Lamb, sum_p: f32, sum_s: f32) -> Self {
        let weight_norm = sum_p.sqrt().min(config.clamp_value as f32);
        let adam_norm = sum_s.sqrt();
        let trust_ratio = if weight_norm == 0.0 || adam_norm == 0.0 { 1.0 } else { weight_norm / adam_norm };
        LambNorms { weight_norm, adam_norm, trust_ratio }
    }

    /// The ratio the step applies: 1 with `adam`, else the trust ratio.
    #[cfg_attr(not(feature = "cpu"), allow(dead_code))]
    pub(crate) fn applied(&self, config: &Lamb) -> f32 {
        if config.adam {
            1.0
        } else {
            self.trust_ratio
        }
    }
}

/// The registry's view of the configuration (`crate::algo::FamilyConfig`).
impl crate::algo::FamilyConfig for Lamb {
    /// Its norms are each tensor's: a sharded optimizer combines each tensor's sums of
    /// `p^2` and `s^2` over the ranks' pieces of it.
    fn shard_sums(&self) -> bool {
        true
    }

    const FAMILY: crate::step::Family = crate::step::Family::Lamb;
    const GPU_PASSES: Option<crate::optimizer::passes::Build> = Some(super::gpu_passes::build);
    const STATELESS_PASSES: Option<crate::ops::RecordStateless> =
        Some(super::gpu_passes::record_stateless);

    fn torch_class(&self) -> &'static str {
        "Lamb"
    }

    fn validate(&self) -> crate::Result<()> {
        Lamb::validate(self)
    }

    fn kernel_step(&self, t: u64) -> KernelStep {
        Lamb::kernel_step(self, t)
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

    #[cfg(feature = "cpu")]
    fn cpu_passes(
        &self,
        options: &crate::OptimizerOptions,
        lens: &[usize],
    ) -> crate::Result<Option<Box<dyn crate::cpu::passes::CpuPasses>>> {
        let _ = (options, lens);
        Ok(Some(Box::<super::cpu_passes::LambPasses>::default()))
    }

    /// Capturable mode (and so AMP), global gradient clipping and stochastic rounding are
    /// not implemented for LAMB's passes, on either backend.
    fn check_options(&self, options: &crate::OptimizerOptions) -> Result<()> {
        let refuse = |first, reason| Err(crate::Error::ConflictingOptions { first, second: "algorithm", reason });
        if options.capturable {
            return refuse(
                "capturable",
                "LAMB's two passes take their scalars from the host; a captured LAMB step is not implemented",
            );
        }
        if options.grad_clip.is_some() {
            return refuse(
                "grad_clip",
                "global gradient clipping before a LAMB step is not implemented (LAMB's trust ratio \
                 already bounds each tensor's step)",
            );
        }
        if options.rounding.seed().is_some() {
            return refuse(
                "rounding",
                "stochastic rounding of LAMB's stores is not implemented; use nearest-even or Kahan rounding",
            );
        }
        Ok(())
    }

    fn check_gpu_group(
        &self,
        group: &crate::ParamGroup,
        first: usize,
        options: &crate::OptimizerOptions,
    ) -> Result<()> {
        let _ = (first, options);
        super::gpu_passes::check_group(group)
    }
}

/// The oracle's copy (`Lamb` of `wgpu-optim-oracle`), field by field: a field added here
/// fails to compile until the oracle has it.
#[cfg(test)]
impl crate::oracle::ToOracle for Lamb {
    type Oracle = wgpu_optim_oracle::Lamb;

    fn to_oracle(&self) -> Self::Oracle {
        let Lamb { lr, beta1, beta2, eps, weight_decay, clamp_value, adam, debias } = *self;
        wgpu_optim_oracle::Lamb { lr, beta1, beta2, eps, weight_decay, clamp_value, adam, debias }
    }
}
