//! The momentum family: PyTorch's SGD (plain, momentum, Nesterov) and ONNX Momentum.

use crate::algo::{check, check_finite, check_rate};
use super::contract::{MomentumSwitches, MomentumUniform64};
use crate::step::KernelStep;
use crate::Result;
use crate::StateKind;

/// PyTorch's `torch.optim.SGD`. `Sgd::default()` is its defaults (lr 1e-3, no momentum).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sgd {
    /// Learning rate (default 1e-3).
    pub lr: f64,
    /// Momentum factor (default 0: no buffer is kept at all).
    pub momentum: f64,
    /// Dampening of the gradient's contribution to the buffer (default 0).
    pub dampening: f64,
    /// L2 weight decay added to the gradient (default 0).
    pub weight_decay: f64,
    /// Nesterov momentum; needs `momentum > 0` and `dampening == 0`.
    pub nesterov: bool,
    /// Ascend instead of descend.
    pub maximize: bool,
}

impl Default for Sgd {
    fn default() -> Self {
        Sgd { lr: 1e-3, momentum: 0.0, dampening: 0.0, weight_decay: 0.0, nesterov: false, maximize: false }
    }
}

impl Sgd {
    /// Checks the hyperparameters as PyTorch's constructor does.
    /// ([`Algorithm::validate`](crate::Algorithm::validate) says when a trainer calls it.)
    pub fn validate(&self) -> Result<()> {
        check_rate("lr", self.lr)?;
        check_rate("momentum", self.momentum)?;
        check_finite("dampening", self.dampening)?;
        check_rate("weight_decay", self.weight_decay)?;
        if self.nesterov {
            check("momentum", self.momentum, self.momentum > 0.0, "momentum > 0 with nesterov")?;
            check("dampening", self.dampening, self.dampening == 0.0, "dampening = 0 with nesterov")?;
        }
        Ok(())
    }

    /// Whether a momentum buffer is kept (PyTorch keeps none when `momentum == 0`).
    pub fn keeps_buffer(&self) -> bool {
        self.momentum != 0.0
    }

    /// The kernel step for step `t` (from 1): on step 1 PyTorch sets the buffer to the gradient.
    pub(crate) fn kernel_step(&self, t: u64) -> KernelStep {
        let velocity = self.keeps_buffer();
        let switches =
            MomentumSwitches { maximize: self.maximize, nesterov: velocity && self.nesterov, velocity };
        let uniform = MomentumUniform64 {
            velocity_decay: self.momentum,
            grad_scale: 1.0 - self.dampening,
            weight_decay: self.weight_decay,
            lr: self.lr,
            nesterov_scale: self.momentum,
            restart: u32::from(t <= 1),
            reserved: 0,
        };
        KernelStep::Momentum(switches, uniform)
    }
}

/// ONNX Momentum's `mode` attribute. Exhaustive: the operator's specification fixes the set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MomentumMode {
    /// `X_new = X - R * V_new`.
    Standard,
    /// `X_new = X - R * (G_regularized + alpha * V_new)`.
    Nesterov,
}

/// Attributes of ONNX `ai.onnx.preview.training.Momentum` (opset 1; all are required).
///
/// # Against PyTorch's SGD, and the two Adagrads
///
/// | | PyTorch `SGD` | ONNX `Momentum` | PyTorch `Adagrad` | ONNX `Adagrad` |
/// |---|---|---|---|---|
/// | velocity | `buf = momentum * buf + (1 - dampening) * g`; step 1: `buf = g` | `V = alpha * V + beta * G`; `T = 0`: beta is 1 | | |
/// | Nesterov | `g + momentum * buf` | `G + alpha * V` | | |
/// | rate | `lr` | `R` | `lr / (1 + (step - 1) lr_decay)` | `R / (1 + T decay_factor)` |
/// | state | none when `momentum = 0` | `V` | `sum` (`initial_accumulator_value`) | `H` |
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OnnxMomentum {
    /// Coefficient of the previous velocity.
    pub alpha: f64,
    /// Coefficient of the gradient; replaced by 1 when `T = 0`.
    pub beta: f64,
    /// Standard or Nesterov.
    pub mode: MomentumMode,
    /// L2 coefficient added to the gradient.
    pub norm_coefficient: f64,
}

impl OnnxMomentum {
    /// Checks the attributes and the learning rate `R`.
    /// The operator in [`crate::ops`] checks them before it records; a caller checks
    /// them earlier, before any device exists.
    pub fn validate(&self, r: f64) -> Result<()> {
        check_finite("R", r)?;
        check_finite("alpha", self.alpha)?;
        check_finite("beta", self.beta)?;
        check_finite("norm_coefficient", self.norm_coefficient)
    }

    /// The kernel step for the inputs `R` and `T` (`beta_adjusted = T > 0 ? beta : 1`).
    pub(crate) fn kernel_step(&self, r: f64, t: u64) -> KernelStep {
        let switches = MomentumSwitches {
            maximize: false,
            nesterov: self.mode == MomentumMode::Nesterov,
            velocity: true,
        };
        let uniform = MomentumUniform64 {
            velocity_decay: self.alpha,
            grad_scale: if t > 0 { self.beta } else { 1.0 },
            weight_decay: self.norm_coefficient,
            lr: r,
            nesterov_scale: self.alpha,
            restart: 0,
            reserved: 0,
        };
        KernelStep::Momentum(switches, uniform)
    }
}

/// The registry's view of the configuration (`crate::algo::FamilyConfig`).
impl crate::algo::FamilyConfig for Sgd {
    const FAMILY: crate::step::Family = crate::step::Family::Momentum;

    fn torch_class(&self) -> &'static str {
        "SGD"
    }

    fn validate(&self) -> crate::Result<()> {
        Sgd::validate(self)
    }

    fn kernel_step(&self, t: u64) -> KernelStep {
        Sgd::kernel_step(self, t)
    }

    fn lr(&self) -> f64 {
        self.lr
    }

    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    fn state_kinds(&self) -> &'static [StateKind] {
        if self.keeps_buffer() {
            &[StateKind::MomentumBuffer]
        } else {
            &[]
        }
    }
}

/// The oracle's copy (`Sgd` of `wgpu-optim-oracle`), field by field: a field added here
/// fails to compile until the oracle has it.
#[cfg(test)]
impl crate::oracle::ToOracle for Sgd {
    type Oracle = wgpu_optim_oracle::Sgd;

    fn to_oracle(&self) -> Self::Oracle {
        let Sgd { lr, momentum, dampening, weight_decay, nesterov, maximize } = *self;
        wgpu_optim_oracle::Sgd { lr, momentum, dampening, weight_decay, nesterov, maximize }
    }
}

/// The oracle's copy (`OnnxMomentum` of `wgpu-optim-oracle`), field by field: a field added
/// here fails to compile until the oracle has it.
#[cfg(test)]
impl crate::oracle::ToOracle for OnnxMomentum {
    type Oracle = wgpu_optim_oracle::OnnxMomentum;

    fn to_oracle(&self) -> Self::Oracle {
        let OnnxMomentum { alpha, beta, mode, norm_coefficient } = *self;
        let mode = match mode {
            MomentumMode::Standard => wgpu_optim_oracle::MomentumMode::Standard,
            MomentumMode::Nesterov => wgpu_optim_oracle::MomentumMode::Nesterov,
        };
        wgpu_optim_oracle::OnnxMomentum { alpha, beta, mode, norm_coefficient }
    }
}
