//! Schedule-Free AdamW (Defazio et al. 2024), as the `schedulefree` package's
//! `AdamWScheduleFree` runs it.
//!
//! The parameter buffer holds `y`, the point the gradient is taken at, in train mode; the
//! state keeps `z` and `exp_avg_sq`. Each step's averaging weight `c` depends on the group's
//! running `k`, `weight_sum` and `lr_max` ([`ScheduleFreeScalars`]), which the host keeps per
//! group, as the package does, and hands the kernel in its uniform.

use crate::algo::{bias_correction, check, check_beta, check_rate};
use super::contract::{ScheduleFreeSwitches, ScheduleFreeUniform64};
use crate::step::KernelStep;
use crate::Result;
use crate::StateKind;

/// The `schedulefree` package's `AdamWScheduleFree`. `ScheduleFreeAdamW::default()` is its
/// defaults.
///
/// # On this crate's backends
///
/// **Schedule-Free AdamW** (Defazio et al. 2024): the parameter buffer holds y while
/// training; `Optimizer::record_eval(&mut encoder)` (or `eval()`) swaps in the average
/// `x = lerp(y, z, 1 - 1/beta1)` in one fused pass over every schedule-free group, and
/// `record_train`/`train()` swaps y back; `mode()` says which the parameters hold, a step in
/// eval mode is refused (`Error::EvalMode`), and a checkpoint records the mode it was
/// saved in. The averaging weight needs the host's running `lr_max` and `weight_sum` each
/// step, so capturable mode (and AMP) is refused for it.
/// `CpuOptimizer::eval(&mut params)`/`train` do the same on the CPU backend, and Burn's
/// front ends have `eval(module)`/`train(module)` (the `burn` module).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScheduleFreeAdamW {
    /// Learning rate (default 0.0025).
    pub lr: f64,
    /// Interpolates between the average `x` and `z` (`betas[0]`, default 0.9).
    pub beta1: f64,
    /// The second moment's coefficient (`betas[1]`, default 0.999).
    pub beta2: f64,
    /// Added to the bias-corrected `sqrt(exp_avg_sq)` (default 1e-8).
    pub eps: f64,
    /// Decoupled weight decay, taken at `y` (default 0).
    pub weight_decay: f64,
    /// The rate rises linearly over this many steps (default 0).
    pub warmup_steps: u64,
    /// The averaging weight's polynomial power in the step: `(k + 1)^r` (default 0).
    pub r: f64,
    /// The averaging weight's power of the largest rate so far: `lr_max^weight_lr_power`
    /// (default 2).
    pub weight_lr_power: f64,
}

impl Default for ScheduleFreeAdamW {
    fn default() -> Self {
        ScheduleFreeAdamW {
            lr: 0.0025,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            warmup_steps: 0,
            r: 0.0,
            weight_lr_power: 2.0,
        }
    }
}

/// A schedule-free group's running values, the package's `group['k']`,
/// `group['weight_sum']` and `group['lr_max']`; one per parameter group.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScheduleFreeScalars {
    /// Steps taken by the group.
    pub k: u64,
    /// The sum of the averaging weights so far.
    pub weight_sum: f64,
    /// The largest scheduled rate so far (-1 before the first step).
    pub lr_max: f64,
}

impl Default for ScheduleFreeScalars {
    fn default() -> Self {
        ScheduleFreeScalars { k: 0, weight_sum: 0.0, lr_max: -1.0 }
    }
}

impl ScheduleFreeAdamW {
    /// Checks the hyperparameters as the package's constructor would (it checks none; these
    /// are the ranges its formula is meant for).
    /// ([`Algorithm::validate`](crate::Algorithm::validate) says when a trainer calls it.)
    pub fn validate(&self) -> Result<()> {
        check_rate("lr", self.lr)?;
        check_beta("beta1", self.beta1)?;
        check_beta("beta2", self.beta2)?;
        check_rate("eps", self.eps)?;
        check_rate("weight_decay", self.weight_decay)?;
        check_rate("r", self.r)?;
        check("weight_lr_power", self.weight_lr_power, self.weight_lr_power.is_finite(), "a finite number")
    }

    /// The step after `scalars`: its kernel step and the group's values after it, as the
    /// package's `step()` computes them (`sched`, `lr`, `lr_max`, `weight`, `weight_sum`,
    /// `ckp1`, `adaptive_y_lr`, `bias_correction2`).
    pub(crate) fn advance(&self, scalars: &ScheduleFreeScalars) -> (KernelStep, ScheduleFreeScalars) {
        let k = scalars.k;
        let sched = if k < self.warmup_steps { (k + 1) as f64 / self.warmup_steps as f64 } else { 1.0 };
        let lr = self.lr * sched;
        let lr_max = lr.max(scalars.lr_max);
        let weight = ((k + 1) as f64).powf(self.r) * lr_max.powf(self.weight_lr_power);
        let weight_sum = scalars.weight_sum + weight;
        // The package catches the ZeroDivisionError of a zero sum (every rate 0) as ckp1 = 0.
        let ckp1 = if weight_sum == 0.0 { 0.0 } else { weight / weight_sum };
        let beta1 = self.beta1;
        let uniform = ScheduleFreeUniform64 {
            lr,
            beta2: self.beta2,
            one_minus_beta2: 1.0 - self.beta2,
            bias_correction2: bias_correction(self.beta2, k + 1),
            eps: self.eps,
            weight_decay: self.weight_decay,
            ckp1,
            y_rate: lr * (beta1 * (1.0 - ckp1) - 1.0),
            first: if k == 0 { 1.0 } else { 0.0 },
            swap_weight: 0.0,
        };
        let next = ScheduleFreeScalars { k: k + 1, weight_sum, lr_max };
        (KernelStep::ScheduleFree(ScheduleFreeSwitches { swap: false }, uniform), next)
    }

    /// The kernel step of a step taken from fresh group values (for the switches, and for
    /// callers that keep no group values).
    pub(crate) fn kernel_step(&self) -> KernelStep {
        self.advance(&ScheduleFreeScalars::default()).0
    }

    /// The swap pass: `param = lerp(param, z, weight)`, with `weight = 1 - 1/beta1` to go to
    /// `x` (`eval()`) and `1 - beta1` to go back to `y` (`train()`).
    pub(crate) fn swap_step(&self, to_eval: bool) -> KernelStep {
        let beta1 = self.beta1;
        let swap_weight = if to_eval { 1.0 - 1.0 / beta1 } else { 1.0 - beta1 };
        let uniform = ScheduleFreeUniform64 { swap_weight, ..ScheduleFreeUniform64::default() };
        KernelStep::ScheduleFree(ScheduleFreeSwitches { swap: true }, uniform)
    }
}

/// Which point a schedule-free optimizer's parameters hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ScheduleFreeMode {
    /// `y`, the point gradients are taken at and steps update (the package's
    /// `train_mode = True`, where it starts).
    #[default]
    Train,
    /// `x`, the average to evaluate (after `eval()`); steps are refused until `train()`.
    Eval,
}

/// Stochastic rounding's step for the swap passes, or'ed into the step count: a stream of
/// their own, never a step's (the device keeps the low 32 bits of a step).
pub(crate) const SWAP_ROUNDING_STEP: u64 = 1 << 31;

/// Refuses `eval()` for `config` with `beta1 = 0`: then y = z after every step and the
/// average x cannot be recovered (the package's `1 - 1/beta1` weight makes it NaN).
pub(crate) fn check_eval(config: &ScheduleFreeAdamW) -> Result<()> {
    check(
        "beta1",
        config.beta1,
        config.beta1 > 0.0,
        "> 0 for eval(): with beta1 = 0, y is z and x cannot be recovered",
    )
}

/// The registry's view of the configuration (`crate::algo::FamilyConfig`).
impl crate::algo::FamilyConfig for ScheduleFreeAdamW {
    const FAMILY: crate::step::Family = crate::step::Family::ScheduleFree;
    const GPU_PASSES: Option<crate::optimizer::passes::Build> = Some(super::gpu_passes::build);

    fn torch_class(&self) -> &'static str {
        "AdamWScheduleFree"
    }

    fn validate(&self) -> crate::Result<()> {
        ScheduleFreeAdamW::validate(self)
    }

    fn kernel_step(&self, t: u64) -> KernelStep {
        // Its step counter is the group's `k` (`ScheduleFreeScalars`), not `t`.
        let _ = t;
        ScheduleFreeAdamW::kernel_step(self)
    }

    fn lr(&self) -> f64 {
        self.lr
    }

    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    fn state_kinds(&self) -> &'static [StateKind] {
        &[StateKind::Z, StateKind::ExpAvgSq]
    }

    fn stateless_refusal(&self) -> Option<&'static str> {
        Some(
            "Schedule-Free AdamW's step depends on its group's running k, weight_sum and \
             lr_max, which a stateless update does not keep: step it with an Optimizer",
        )
    }

    #[cfg(feature = "cpu")]
    fn cpu_passes(
        &self,
        options: &crate::OptimizerOptions,
        lens: &[usize],
    ) -> crate::Result<Option<Box<dyn crate::cpu::passes::CpuPasses>>> {
        let _ = (options, lens);
        Ok(Some(Box::new(super::cpu_passes::ScheduleFreePasses::new())))
    }

    /// Capturable mode (and so AMP, which needs it) is refused: each step's averaging
    /// weight comes from the host's running `lr_max` and `weight_sum`.
    fn check_options(&self, options: &crate::OptimizerOptions) -> crate::Result<()> {
        if options.capturable {
            return Err(crate::Error::ConflictingOptions {
                first: "capturable",
                second: "algorithm",
                reason: "Schedule-Free AdamW's averaging weight needs the host's running lr_max and \
                         weight_sum each step, which a captured step cannot take",
            });
        }
        Ok(())
    }

    fn step_after(&self, values: &ScheduleFreeScalars) -> Option<(KernelStep, ScheduleFreeScalars)> {
        Some(self.advance(values))
    }

    fn mode_swap(&self, to: ScheduleFreeMode) -> Option<crate::Result<KernelStep>> {
        let to_eval = to == ScheduleFreeMode::Eval;
        let checked = if to_eval { check_eval(self) } else { Ok(()) };
        Some(checked.map(|()| self.swap_step(to_eval)))
    }
}

/// The oracle's copy (`AdamWScheduleFree` of `wgpu-optim-oracle`), field by field: a field added here
/// fails to compile until the oracle has it.
#[cfg(test)]
impl crate::oracle::ToOracle for ScheduleFreeAdamW {
    type Oracle = wgpu_optim_oracle::AdamWScheduleFree;

    fn to_oracle(&self) -> Self::Oracle {
        let ScheduleFreeAdamW { lr, beta1, beta2, eps, weight_decay, warmup_steps, r, weight_lr_power } = *self;
        wgpu_optim_oracle::AdamWScheduleFree { lr, beta1, beta2, eps, weight_decay, warmup_steps, r, weight_lr_power }
    }
}
