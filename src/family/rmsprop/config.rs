//! RMSprop: PyTorch's `torch.optim.RMSprop`.

use crate::algo::check_rate;
use super::contract::{RmsPropSwitches, RmsPropUniform64};
use crate::step::KernelStep;
use crate::Result;
use crate::StateKind;

/// PyTorch's `torch.optim.RMSprop`. `RmsProp::default()` is its defaults.
///
/// Per element: `g = -g` if `maximize`; `g += weight_decay * p`;
/// `square_avg = alpha * square_avg + (1 - alpha) g^2`; centered:
/// `grad_avg = lerp(grad_avg, g, 1 - alpha)`, `avg = sqrt(square_avg - grad_avg^2) + eps`,
/// else `avg = sqrt(square_avg) + eps`; with momentum
/// `momentum_buffer = momentum * momentum_buffer + g / avg`, `p -= lr * momentum_buffer`,
/// else `p -= lr * g / avg`.
///
/// PyTorch's, op for op; its checkpoints round-trip through the repository's
/// `tools/torch_checkpoint.py`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RmsProp {
    /// Learning rate (default 1e-2).
    pub lr: f64,
    /// Smoothing constant of the running averages (default 0.99).
    pub alpha: f64,
    /// Added to the root of the (centered) second moment (default 1e-8).
    pub eps: f64,
    /// L2 weight decay added to the gradient (default 0).
    pub weight_decay: f64,
    /// Momentum factor (default 0: no momentum buffer is kept, as in PyTorch).
    pub momentum: f64,
    /// Normalize by the variance estimate, keeping a running mean of the gradient
    /// (`grad_avg`) (default false).
    pub centered: bool,
    /// Ascend instead of descend.
    pub maximize: bool,
}

impl Default for RmsProp {
    fn default() -> Self {
        RmsProp {
            lr: 1e-2,
            alpha: 0.99,
            eps: 1e-8,
            weight_decay: 0.0,
            momentum: 0.0,
            centered: false,
            maximize: false,
        }
    }
}

impl RmsProp {
    /// Checks the hyperparameters as PyTorch's constructor does (each `>= 0`).
    /// ([`Algorithm::validate`](crate::Algorithm::validate) says when a trainer calls it.)
    pub fn validate(&self) -> Result<()> {
        check_rate("lr", self.lr)?;
        check_rate("eps", self.eps)?;
        check_rate("momentum", self.momentum)?;
        check_rate("weight_decay", self.weight_decay)?;
        check_rate("alpha", self.alpha)
    }

    /// Whether PyTorch keeps a momentum buffer (`momentum > 0`).
    pub(crate) fn keeps_buffer(&self) -> bool {
        self.momentum > 0.0
    }

    /// The kernel step (RMSprop's update does not depend on the step count).
    pub(crate) fn kernel_step(&self) -> KernelStep {
        let one_minus_alpha = 1.0 - self.alpha;
        let switches = RmsPropSwitches {
            maximize: self.maximize,
            centered: self.centered,
            momentum: self.keeps_buffer(),
            // ATen's lerp takes another form for weights of 0.5 and more.
            lerp_from_grad: one_minus_alpha.abs() >= 0.5,
            step_with_raw_grad: false,
        };
        let uniform = RmsPropUniform64 {
            lr: self.lr,
            alpha: self.alpha,
            one_minus_alpha,
            eps: self.eps,
            weight_decay: self.weight_decay,
            momentum: self.momentum,
        };
        KernelStep::RmsProp(switches, uniform)
    }
}

/// The registry's view of the configuration (`crate::algo::FamilyConfig`).
impl crate::algo::FamilyConfig for RmsProp {
    const FAMILY: crate::step::Family = crate::step::Family::RmsProp;

    fn torch_class(&self) -> &'static str {
        "RMSprop"
    }

    fn validate(&self) -> crate::Result<()> {
        RmsProp::validate(self)
    }

    fn kernel_step(&self, t: u64) -> KernelStep {
        // RMSprop's update does not depend on the step count.
        let _ = t;
        RmsProp::kernel_step(self)
    }

    fn lr(&self) -> f64 {
        self.lr
    }

    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    fn state_kinds(&self) -> &'static [StateKind] {
        match (self.keeps_buffer(), self.centered) {
            (false, false) => &[StateKind::SquareAvg],
            (true, false) => &[StateKind::SquareAvg, StateKind::MomentumBuffer],
            (false, true) => &[StateKind::SquareAvg, StateKind::GradAvg],
            (true, true) => &[StateKind::SquareAvg, StateKind::MomentumBuffer, StateKind::GradAvg],
        }
    }
}

/// The oracle's copy (`RmsProp` of `wgpu-optim-oracle`), field by field: a field added here
/// fails to compile until the oracle has it.
#[cfg(test)]
impl crate::oracle::ToOracle for RmsProp {
    type Oracle = wgpu_optim_oracle::RmsProp;

    fn to_oracle(&self) -> Self::Oracle {
        let RmsProp { lr, alpha, eps, weight_decay, momentum, centered, maximize } = *self;
        wgpu_optim_oracle::RmsProp { lr, alpha, eps, weight_decay, momentum, centered, maximize }
    }
}
