//! Adagrad: PyTorch's `torch.optim.Adagrad` and ONNX Adagrad.

use crate::algo::{check, check_finite, check_rate};
use super::contract::{AdagradSwitches, AdagradUniform64};
use crate::step::KernelStep;
use crate::Result;
use crate::StateKind;

/// PyTorch's `torch.optim.Adagrad`. `Adagrad::default()` is its defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adagrad {
    /// Learning rate (default 1e-2).
    pub lr: f64,
    /// The rate at step t is `lr / (1 + (t - 1) * lr_decay)` (default 0).
    pub lr_decay: f64,
    /// L2 weight decay added to the gradient (default 0).
    pub weight_decay: f64,
    /// The value the sum of squares starts from (default 0).
    pub initial_accumulator_value: f64,
    /// Added to `sqrt(sum)` (default 1e-10).
    pub eps: f64,
    /// Ascend instead of descend.
    pub maximize: bool,
}

impl Default for Adagrad {
    fn default() -> Self {
        Adagrad {
            lr: 1e-2,
            lr_decay: 0.0,
            weight_decay: 0.0,
            initial_accumulator_value: 0.0,
            eps: 1e-10,
            maximize: false,
        }
    }
}

impl Adagrad {
    /// Checks the hyperparameters as PyTorch's constructor does.
    /// ([`Algorithm::validate`](crate::Algorithm::validate) says when a trainer calls it.)
    pub fn validate(&self) -> Result<()> {
        check_rate("lr", self.lr)?;
        check_rate("lr_decay", self.lr_decay)?;
        check_rate("weight_decay", self.weight_decay)?;
        check_rate("initial_accumulator_value", self.initial_accumulator_value)?;
        check_rate("eps", self.eps)
    }

    /// The kernel step for step `t` (from 1).
    pub(crate) fn kernel_step(&self, t: u64) -> KernelStep {
        let lr = self.lr / (1.0 + t.saturating_sub(1) as f64 * self.lr_decay);
        adagrad_step(self.maximize, self.weight_decay, lr, self.eps, self.lr_decay)
    }
}

/// Attributes of ONNX `ai.onnx.preview.training.Adagrad` (opset 1), with the schema defaults.
///
/// How it differs from PyTorch's Adagrad: the table of [`OnnxMomentum`](crate::OnnxMomentum).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OnnxAdagrad {
    /// The rate at step T is `R / (1 + T * decay_factor)` (default 0).
    pub decay_factor: f64,
    /// Added to `sqrt(H)` (default 1e-6).
    pub epsilon: f64,
    /// L2 coefficient added to the gradient (default 0).
    pub norm_coefficient: f64,
}

impl Default for OnnxAdagrad {
    fn default() -> Self {
        OnnxAdagrad { decay_factor: 0.0, epsilon: 1e-6, norm_coefficient: 0.0 }
    }
}

impl OnnxAdagrad {
    /// Checks the attributes and the inputs `R` and `T`.
    /// The operator in [`crate::ops`] checks them before it records; a caller checks
    /// them earlier, before any device exists.
    pub fn validate(&self, r: f64, t: u64) -> Result<()> {
        check_finite("R", r)?;
        check_finite("decay_factor", self.decay_factor)?;
        let denominator = 1.0 + t as f64 * self.decay_factor;
        check("decay_factor", self.decay_factor, denominator != 0.0, "1 + T * decay_factor != 0")?;
        check_rate("epsilon", self.epsilon)?;
        check_finite("norm_coefficient", self.norm_coefficient)
    }

    /// The kernel step for the inputs `R` and `T`.
    pub(crate) fn kernel_step(&self, r: f64, t: u64) -> KernelStep {
        let lr = r / (1.0 + t as f64 * self.decay_factor);
        adagrad_step(false, self.norm_coefficient, lr, self.epsilon, 0.0)
    }
}

fn adagrad_step(maximize: bool, weight_decay: f64, lr: f64, eps: f64, lr_decay: f64) -> KernelStep {
    KernelStep::Adagrad(AdagradSwitches { maximize }, AdagradUniform64 { lr, weight_decay, eps, lr_decay })
}

/// The registry's view of the configuration (`crate::algo::FamilyConfig`).
impl crate::algo::FamilyConfig for Adagrad {
    const FAMILY: crate::step::Family = crate::step::Family::Adagrad;

    fn torch_class(&self) -> &'static str {
        "Adagrad"
    }

    fn validate(&self) -> crate::Result<()> {
        Adagrad::validate(self)
    }

    fn kernel_step(&self, t: u64) -> KernelStep {
        Adagrad::kernel_step(self, t)
    }

    fn lr(&self) -> f64 {
        self.lr
    }

    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    fn state_kinds(&self) -> &'static [StateKind] {
        &[StateKind::Sum]
    }
    fn initial_state(&self) -> f64 {
        self.initial_accumulator_value
    }
}

/// The oracle's copy (`Adagrad` of `wgpu-optim-oracle`), field by field: a field added here
/// fails to compile until the oracle has it.
#[cfg(test)]
impl crate::oracle::ToOracle for Adagrad {
    type Oracle = wgpu_optim_oracle::Adagrad;

    fn to_oracle(&self) -> Self::Oracle {
        let Adagrad { lr, lr_decay, weight_decay, initial_accumulator_value, eps, maximize } = *self;
        wgpu_optim_oracle::Adagrad { lr, lr_decay, weight_decay, initial_accumulator_value, eps, maximize }
    }
}

/// The oracle's copy (`OnnxAdagrad` of `wgpu-optim-oracle`), field by field: a field added here
/// fails to compile until the oracle has it.
#[cfg(test)]
impl crate::oracle::ToOracle for OnnxAdagrad {
    type Oracle = wgpu_optim_oracle::OnnxAdagrad;

    fn to_oracle(&self) -> Self::Oracle {
        let OnnxAdagrad { decay_factor, epsilon, norm_coefficient } = *self;
        wgpu_optim_oracle::OnnxAdagrad { decay_factor, epsilon, norm_coefficient }
    }
}
