//! The Adam family: PyTorch's Adam/AdamW/AMSGrad, ONNX Adam and DirectML Adam.

use crate::algo::{bias_correction, check, check_beta, check_finite, check_rate};
use super::contract::{AdamSwitches, AdamUniform64, EpsPlacement, FirstMoment};
use crate::step::KernelStep;
use crate::StateKind;
use crate::{Error, Result, StepProblem};

/// PyTorch's `torch.optim.Adam` and `torch.optim.AdamW` (and AMSGrad through `amsgrad`).
///
/// `Adam::default()` is `torch.optim.Adam()`'s defaults; [`Adam::adamw`] is `AdamW()`'s.
///
/// Bias corrections are computed on the host in f64 as `-expm1(t ln beta)`, which keeps
/// `1 - beta^t` accurate for small `t`. The arithmetic on the GPU is f32 (f64 for ONNX
/// double tensors, where the adapter has `SHADER_F64`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adam {
    /// Learning rate (`lr`, default 1e-3).
    pub lr: f64,
    /// Coefficient of the first moment's running average (`betas[0]`, default 0.9).
    pub beta1: f64,
    /// Coefficient of the second moment's running average (`betas[1]`, default 0.999).
    pub beta2: f64,
    /// Added to the bias-corrected `sqrt(v)` (default 1e-8).
    pub eps: f64,
    /// Weight decay (default 0 for Adam, 0.01 for AdamW).
    pub weight_decay: f64,
    /// `false`: L2, `g += weight_decay * p` (Adam). `true`: decoupled,
    /// `p *= 1 - lr * weight_decay` before the update (AdamW).
    pub decoupled_weight_decay: bool,
    /// Divide by the running maximum of the second moment (Reddi et al. 2018).
    pub amsgrad: bool,
    /// Ascend instead of descend (the gradient is negated).
    pub maximize: bool,
}

impl Default for Adam {
    fn default() -> Self {
        Adam {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled_weight_decay: false,
            amsgrad: false,
            maximize: false,
        }
    }
}

impl Adam {
    /// `torch.optim.AdamW()`'s defaults: as Adam with decoupled weight decay 0.01.
    pub fn adamw() -> Self {
        Adam { weight_decay: 0.01, decoupled_weight_decay: true, ..Adam::default() }
    }

    /// Burn's `AdamWConfig::new()` defaults, which are not PyTorch's: eps 1e-5 and weight
    /// decay 1e-4 (PyTorch: 1e-8 and 0.01), lr 1e-3 (Burn takes it at each step). Burn
    /// keeps them in f32, so these are the f32 values widened (`f64::from(0.999f32)`):
    /// with 0.999 itself, `1 - beta2` would differ from Burn's by 1.3e-5 relative.
    pub fn burn_adamw() -> Self {
        Adam {
            beta1: f64::from(0.9f32),
            beta2: f64::from(0.999f32),
            eps: f64::from(1e-5f32),
            weight_decay: f64::from(1e-4f32),
            ..Adam::adamw()
        }
    }

    /// Checks every hyperparameter against PyTorch's own constructor checks.
    /// ([`Algorithm::validate`](crate::Algorithm::validate) says when a trainer calls it.)
    pub fn validate(&self) -> Result<()> {
        check_rate("lr", self.lr)?;
        check_beta("beta1", self.beta1)?;
        check_beta("beta2", self.beta2)?;
        check_rate("eps", self.eps)?;
        check_rate("weight_decay", self.weight_decay)
    }

    /// The kernel step for PyTorch's step number `t` (counted from 1).
    pub(crate) fn kernel_step(&self, t: u64) -> KernelStep {
        let switches = AdamSwitches {
            amsgrad: self.amsgrad,
            eps: EpsPlacement::AfterCorrection,
            maximize: self.maximize,
            // The mode follows the algorithm, not the value, so a weight-decay schedule
            // that reaches 0 keeps the same pipeline.
            decoupled_weight_decay: self.decoupled_weight_decay,
            first_moment: FirstMoment::lerp(self.beta1),
            decay_after_update: false,
            l2_at_zero: false,
        };
        let decay = if self.decoupled_weight_decay { 1.0 - self.lr * self.weight_decay } else { 1.0 };
        let uniform = AdamUniform64 {
            weight_decay: self.weight_decay,
            decay,
            step_size: self.lr / bias_correction(self.beta1, t),
            sqrt_bias_correction2: bias_correction(self.beta2, t).sqrt(),
            eps: self.eps,
            ..moments(self.beta1, self.beta2)
        };
        KernelStep::Adam(switches, uniform)
    }
}

/// Attributes of ONNX `ai.onnx.preview.training.Adam` (opset 1), with the schema defaults.
///
/// # Against PyTorch's and DirectML's Adam
///
/// | | PyTorch `Adam`/`AdamW` | ONNX `Adam` | DirectML Adam |
/// |---|---|---|---|
/// | eps default | 1e-8 | 1e-6 | (required) |
/// | eps added to | `sqrt(v) / sqrt(1 - beta2^t)` | `sqrt(H)`; the rate carries the correction | `sqrt(V)`; the rate carries the correction |
/// | update | `p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)` | `X -= R * sqrt(1 - beta^T) / (1 - alpha^T) * V / (sqrt(H) + epsilon)` | `X -= LearningRate * Alpha * M / (sqrt(V) + Epsilon)`, `Alpha = sqrt(1 - Beta2^T) / (1 - Beta1^T)` (as documented) |
/// | step | counted by the optimizer from 1 | input `T`; `T = 0`: no bias correction | input tensor; `T = 0` refused (0/0) |
/// | weight decay | L2 (`Adam`) or decoupled (`AdamW`) | `norm_coefficient` (L2), `norm_coefficient_post` | none |
/// | extra | `amsgrad`, `maximize` | | |
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OnnxAdam {
    /// First-moment coefficient (default 0.9).
    pub alpha: f64,
    /// Second-moment coefficient (default 0.999).
    pub beta: f64,
    /// Added to `sqrt(H)` (default 1e-6).
    pub epsilon: f64,
    /// L2 coefficient added to the gradient (default 0).
    pub norm_coefficient: f64,
    /// The parameter is scaled by `1 - norm_coefficient_post` after the update (default 0).
    pub norm_coefficient_post: f64,
}

impl Default for OnnxAdam {
    fn default() -> Self {
        OnnxAdam { alpha: 0.9, beta: 0.999, epsilon: 1e-6, norm_coefficient: 0.0, norm_coefficient_post: 0.0 }
    }
}

impl OnnxAdam {
    /// Checks the attributes and the inputs `R` and `T`.
    /// The operator in [`crate::ops`] checks them before it records; a caller checks
    /// them earlier, before any device exists.
    pub fn validate(&self, r: f64, t: u64) -> Result<()> {
        check("R", r, r.is_finite(), "a finite learning rate")?;
        check("alpha", self.alpha, (0.0..=1.0).contains(&self.alpha), "0 <= alpha <= 1")?;
        if t > 0 {
            check("alpha", self.alpha, self.alpha < 1.0, "alpha < 1 when T > 0 (1 - alpha^T divides)")?;
        }
        check("beta", self.beta, (0.0..=1.0).contains(&self.beta), "0 <= beta <= 1")?;
        check_rate("epsilon", self.epsilon)?;
        check_finite("norm_coefficient", self.norm_coefficient)?;
        check_finite("norm_coefficient_post", self.norm_coefficient_post)
    }

    /// The kernel step for the inputs `R` (learning rate) and `T` (training step).
    pub(crate) fn kernel_step(&self, r: f64, t: u64) -> KernelStep {
        let step_size =
            if t > 0 { r * bias_correction(self.beta, t).sqrt() / bias_correction(self.alpha, t) } else { r };
        let uniform = AdamUniform64 {
            weight_decay: self.norm_coefficient,
            step_size,
            eps: self.epsilon,
            post_scale: 1.0 - self.norm_coefficient_post,
            ..moments(self.alpha, self.beta)
        };
        KernelStep::Adam(ROOT_EPS_LINEAR_MOMENT, uniform)
    }
}

/// The scalar members of DirectML's `DML_ADAM_OPTIMIZER_OPERATOR_DESC`.
///
/// How it differs from PyTorch's and ONNX's Adam: the table of [`OnnxAdam`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DmlAdam {
    /// `LearningRate`.
    pub learning_rate: f64,
    /// `Beta1`.
    pub beta1: f64,
    /// `Beta2`.
    pub beta2: f64,
    /// `Epsilon`.
    pub epsilon: f64,
}

impl DmlAdam {
    /// Checks the members and the training step.
    /// The operator in [`crate::ops`] checks them before it records; a caller checks
    /// them earlier, before any device exists.
    pub fn validate(&self, t: u64) -> Result<()> {
        check_rate("LearningRate", self.learning_rate)?;
        check_beta("Beta1", self.beta1)?;
        check_beta("Beta2", self.beta2)?;
        check_rate("Epsilon", self.epsilon)?;
        if t == 0 {
            // DirectML's Adam divides the moments by (1 - Beta1^T) and (1 - Beta2^T): 0/0 at T = 0.
            return Err(Error::BadStep {
                argument: "TrainingStepTensor",
                step: 0.0,
                problem: StepProblem::Zero,
            });
        }
        Ok(())
    }

    /// The kernel step for training step `t` (>= 1), as the documentation writes it:
    /// `Alpha = sqrt(1 - Beta2^T) / (1 - Beta1^T)` and
    /// `X -= LearningRate * Alpha * M / (sqrt(V) + Epsilon)`, which is ONNX's placement of
    /// epsilon (next to `sqrt(V)`, the correction in the rate), not PyTorch's.
    pub(crate) fn kernel_step(&self, t: u64) -> KernelStep {
        let alpha = bias_correction(self.beta2, t).sqrt() / bias_correction(self.beta1, t);
        let uniform = AdamUniform64 {
            step_size: self.learning_rate * alpha,
            eps: self.epsilon,
            ..moments(self.beta1, self.beta2)
        };
        KernelStep::Adam(ROOT_EPS_LINEAR_MOMENT, uniform)
    }
}

/// ONNX's and DirectML's Adam: eps next to `sqrt(V)`, the moments as written, no AMSGrad,
/// no maximize, L2 weight decay (a coefficient of 0 is skipped).
const ROOT_EPS_LINEAR_MOMENT: AdamSwitches = AdamSwitches {
    amsgrad: false,
    eps: EpsPlacement::OnRoot,
    maximize: false,
    decoupled_weight_decay: false,
    first_moment: FirstMoment::Linear,
    decay_after_update: false,
    l2_at_zero: false,
};

/// The uniform's moment coefficients; the rest neutral (no decay, no correction, scale 1).
fn moments(beta1: f64, beta2: f64) -> AdamUniform64 {
    AdamUniform64 {
        beta1,
        one_minus_beta1: 1.0 - beta1,
        beta2,
        one_minus_beta2: 1.0 - beta2,
        weight_decay: 0.0,
        decay: 1.0,
        step_size: 0.0,
        sqrt_bias_correction2: 1.0,
        eps: 0.0,
        post_scale: 1.0,
        ln_beta1: beta1.ln(),
        ln_beta2: beta2.ln(),
    }
}

/// The registry's view of the configuration (`crate::algo::FamilyConfig`).
impl crate::algo::FamilyConfig for Adam {
    const FAMILY: crate::step::Family = crate::step::Family::Adam;

    fn torch_class(&self) -> &'static str {
        if self.decoupled_weight_decay {
            "AdamW"
        } else {
            "Adam"
        }
    }

    fn validate(&self) -> crate::Result<()> {
        Adam::validate(self)
    }

    fn kernel_step(&self, t: u64) -> KernelStep {
        Adam::kernel_step(self, t)
    }

    fn lr(&self) -> f64 {
        self.lr
    }

    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    fn state_kinds(&self) -> &'static [StateKind] {
        if self.amsgrad {
            &[StateKind::ExpAvg, StateKind::ExpAvgSq, StateKind::MaxExpAvgSq]
        } else {
            &[StateKind::ExpAvg, StateKind::ExpAvgSq]
        }
    }
}

/// The oracle's copy (`Adam` of `wgpu-optim-oracle`), field by field: a field added here
/// fails to compile until the oracle has it.
#[cfg(test)]
impl crate::oracle::ToOracle for Adam {
    type Oracle = wgpu_optim_oracle::Adam;

    fn to_oracle(&self) -> Self::Oracle {
        let Adam { lr, beta1, beta2, eps, weight_decay, decoupled_weight_decay, amsgrad, maximize } = *self;
        wgpu_optim_oracle::Adam { lr, beta1, beta2, eps, weight_decay, decoupled_weight_decay, amsgrad, maximize }
    }
}

/// The oracle's copy (`OnnxAdam` of `wgpu-optim-oracle`), field by field: a field added here
/// fails to compile until the oracle has it.
#[cfg(test)]
impl crate::oracle::ToOracle for OnnxAdam {
    type Oracle = wgpu_optim_oracle::OnnxAdam;

    fn to_oracle(&self) -> Self::Oracle {
        let OnnxAdam { alpha, beta, epsilon, norm_coefficient, norm_coefficient_post } = *self;
        wgpu_optim_oracle::OnnxAdam { alpha, beta, epsilon, norm_coefficient, norm_coefficient_post }
    }
}

/// The oracle's copy (`DmlAdam` of `wgpu-optim-oracle`), field by field: a field added here
/// fails to compile until the oracle has it.
#[cfg(test)]
impl crate::oracle::ToOracle for DmlAdam {
    type Oracle = wgpu_optim_oracle::DmlAdam;

    fn to_oracle(&self) -> Self::Oracle {
        let DmlAdam { learning_rate, beta1, beta2, epsilon } = *self;
        wgpu_optim_oracle::DmlAdam { learning_rate, beta1, beta2, epsilon }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DirectML's Adam has no weight decay at all: neither switch nor coefficient.
    #[test]
    fn directml_adam_has_no_weight_decay_at_all() {
        let d = DmlAdam { learning_rate: 0.01, beta1: 0.9, beta2: 0.999, epsilon: 1e-8 };
        let step = d.kernel_step(4);
        let KernelStep::Adam(switches, uniform) = step else { panic!("{step:?} is not an Adam step") };
        assert!(!switches.decoupled_weight_decay && uniform.weight_decay == 0.0, "{step:?}");
    }
}
