//! The Adam family: PyTorch's Adam/AdamW/AMSGrad, ONNX Adam and DirectML Adam.

use super::{bias_correction, check, check_beta, check_finite, check_rate};
use crate::gpu::kernel::Family;
use crate::gpu::step::KernelStep;
use crate::{Error, Result};

/// PyTorch's `torch.optim.Adam` and `torch.optim.AdamW` (and AMSGrad through `amsgrad`).
///
/// `Adam::default()` is `torch.optim.Adam()`'s defaults; [`Adam::adamw`] is `AdamW()`'s.
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

    /// Checks every hyperparameter against PyTorch's own constructor checks.
    pub fn validate(&self) -> Result<()> {
        check_rate("lr", self.lr)?;
        check_beta("beta1", self.beta1)?;
        check_beta("beta2", self.beta2)?;
        check_rate("eps", self.eps)?;
        check_rate("weight_decay", self.weight_decay)
    }

    /// The kernel step for PyTorch's step number `t` (counted from 1).
    pub(crate) fn kernel_step(&self, t: u64) -> KernelStep {
        // The mode follows the algorithm, not the value, so a weight-decay schedule that
        // reaches 0 keeps the same pipeline.
        let (l2, decay) = if self.decoupled_weight_decay {
            (WeightDecay::Decoupled(self.weight_decay), 1.0 - self.lr * self.weight_decay)
        } else {
            (WeightDecay::L2(self.weight_decay), 1.0)
        };
        AdamKernel {
            first_moment_lerp: true,
            amsgrad: self.amsgrad,
            eps_after_correction: true,
            maximize: self.maximize,
            weight_decay: l2,
            beta1: self.beta1,
            beta2: self.beta2,
            decay,
            step_size: self.lr / bias_correction(self.beta1, t),
            sqrt_bias_correction2: bias_correction(self.beta2, t).sqrt(),
            eps: self.eps,
            post_scale: 1.0,
        }
        .step()
    }
}

/// Attributes of ONNX `ai.onnx.preview.training.Adam` (opset 1), with the schema defaults.
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
        AdamKernel {
            first_moment_lerp: false,
            amsgrad: false,
            eps_after_correction: false,
            maximize: false,
            weight_decay: WeightDecay::L2(self.norm_coefficient),
            beta1: self.alpha,
            beta2: self.beta,
            decay: 1.0,
            step_size,
            sqrt_bias_correction2: 1.0,
            eps: self.epsilon,
            post_scale: 1.0 - self.norm_coefficient_post,
        }
        .step()
    }
}

/// The scalar members of DirectML's `DML_ADAM_OPTIMIZER_OPERATOR_DESC`.
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
    pub fn validate(&self, t: u64) -> Result<()> {
        check_rate("LearningRate", self.learning_rate)?;
        check_beta("Beta1", self.beta1)?;
        check_beta("Beta2", self.beta2)?;
        check_rate("Epsilon", self.epsilon)?;
        if t == 0 {
            return Err(Error::BadStep(
                "TrainingStepTensor is 0, but DirectML's Adam divides the moments by (1 - Beta1^T) \
                 and (1 - Beta2^T), which are 0 at T = 0 (0/0); DirectML counts steps from 1"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The kernel step for training step `t` (>= 1).
    pub(crate) fn kernel_step(&self, t: u64) -> KernelStep {
        AdamKernel {
            first_moment_lerp: false,
            amsgrad: false,
            eps_after_correction: true,
            maximize: false,
            weight_decay: WeightDecay::None,
            beta1: self.beta1,
            beta2: self.beta2,
            decay: 1.0,
            step_size: self.learning_rate / bias_correction(self.beta1, t),
            sqrt_bias_correction2: bias_correction(self.beta2, t).sqrt(),
            eps: self.epsilon,
            post_scale: 1.0,
        }
        .step()
    }
}

enum WeightDecay {
    None,
    L2(f64),
    Decoupled(f64),
}

/// The Adam kernel's switches and uniform, field for field as `shaders/adam.wgsl` reads them.
struct AdamKernel {
    amsgrad: bool,
    eps_after_correction: bool,
    maximize: bool,
    weight_decay: WeightDecay,
    beta1: f64,
    beta2: f64,
    decay: f64,
    step_size: f64,
    sqrt_bias_correction2: f64,
    /// PyTorch's lerp form of the first moment (the others write it out).
    first_moment_lerp: bool,
    eps: f64,
    post_scale: f64,
}

impl AdamKernel {
    fn step(&self) -> KernelStep {
        let (mode, l2) = match self.weight_decay {
            WeightDecay::None => (0, 0.0),
            WeightDecay::L2(c) => (1, c),
            WeightDecay::Decoupled(c) => (2, c),
        };
        KernelStep::new(
            Family::Adam,
            // The order of Family::Adam.override_names().
            &[
                u32::from(self.amsgrad),
                u32::from(self.eps_after_correction),
                u32::from(self.maximize),
                mode,
                // ATen's lerp takes its first form for weights below 0.5.
                match (self.first_moment_lerp, 1.0 - self.beta1 < 0.5) {
                    (false, _) => 0,
                    (true, true) => 1,
                    (true, false) => 2,
                },
            ],
            // The fields of Hyper in shaders/adam.wgsl.
            &[
                self.beta1,
                1.0 - self.beta1,
                self.beta2,
                1.0 - self.beta2,
                l2,
                self.decay,
                self.step_size,
                self.sqrt_bias_correction2,
                self.eps,
                self.post_scale,
                self.beta1.ln(),
                self.beta2.ln(),
            ],
        )
    }
}
