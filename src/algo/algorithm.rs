//! The algorithms the stateful optimizer runs, and the state tensors each keeps.

use crate::step::{Family, KernelStep};
use crate::AdEMAMix;
use crate::Adafactor;
use crate::Lamb;
use crate::Lion;
use crate::Muon;
use crate::RmsProp;
use crate::ScheduleFreeAdamW;
use crate::{Adagrad, Adam, Result, Sgd};

/// The algorithms the stateful optimizer runs, in PyTorch's conventions.
///
/// `#[non_exhaustive]`: new algorithms add variants, so a `match` needs a `_` arm.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum Algorithm {
    /// Adam, AdamW or AMSGrad.
    Adam(Adam),
    /// SGD, with standard or Nesterov momentum or none.
    Sgd(Sgd),
    /// Adagrad.
    Adagrad(Adagrad),
    /// Lion (lion-pytorch).
    Lion(Lion),
    /// Schedule-Free AdamW.
    ScheduleFreeAdamW(ScheduleFreeAdamW),
    /// Adafactor (PyTorch's).
    Adafactor(Adafactor),
    /// Muon (2-D parameters only).
    Muon(Muon),
    /// RMSprop, plain or centered, with or without momentum.
    RmsProp(RmsProp),
    /// AdEMAMix (bitsandbytes).
    AdEMAMix(AdEMAMix),
    /// LAMB (torch-optimizer's `Lamb`).
    Lamb(Lamb),
}

impl From<Adam> for Algorithm {
    fn from(config: Adam) -> Self {
        Algorithm::Adam(config)
    }
}

impl From<Sgd> for Algorithm {
    fn from(config: Sgd) -> Self {
        Algorithm::Sgd(config)
    }
}

impl From<Adagrad> for Algorithm {
    fn from(config: Adagrad) -> Self {
        Algorithm::Adagrad(config)
    }
}

impl From<Lion> for Algorithm {
    fn from(config: Lion) -> Self {
        Algorithm::Lion(config)
    }
}

impl From<ScheduleFreeAdamW> for Algorithm {
    fn from(config: ScheduleFreeAdamW) -> Self {
        Algorithm::ScheduleFreeAdamW(config)
    }
}

impl From<Adafactor> for Algorithm {
    fn from(config: Adafactor) -> Self {
        Algorithm::Adafactor(config)
    }
}

impl From<Muon> for Algorithm {
    fn from(config: Muon) -> Self {
        Algorithm::Muon(config)
    }
}

impl From<RmsProp> for Algorithm {
    fn from(config: RmsProp) -> Self {
        Algorithm::RmsProp(config)
    }
}

impl From<AdEMAMix> for Algorithm {
    fn from(config: AdEMAMix) -> Self {
        Algorithm::AdEMAMix(config)
    }
}

impl From<Lamb> for Algorithm {
    fn from(config: Lamb) -> Self {
        Algorithm::Lamb(config)
    }
}

impl Algorithm {
    /// Checks the hyperparameters. Building an optimizer and changing a group's algorithm
    /// check them anyway; a trainer calls this to check a configuration (one read from a
    /// file, say) before any device exists.
    pub fn validate(&self) -> Result<()> {
        match self {
            Algorithm::Adam(c) => c.validate(),
            Algorithm::Sgd(c) => c.validate(),
            Algorithm::Adagrad(c) => c.validate(),
            Algorithm::Lion(c) => c.validate(),
            Algorithm::ScheduleFreeAdamW(c) => c.validate(),
            Algorithm::Adafactor(c) => c.validate(),
            Algorithm::Muon(c) => c.validate(),
            Algorithm::RmsProp(c) => c.validate(),
            Algorithm::AdEMAMix(c) => c.validate(),
            Algorithm::Lamb(c) => c.validate(),
        }
    }

    pub(crate) fn kernel_step(&self, t: u64) -> KernelStep {
        match self {
            Algorithm::Adam(c) => c.kernel_step(t),
            Algorithm::Sgd(c) => c.kernel_step(t),
            Algorithm::Adagrad(c) => c.kernel_step(t),
            Algorithm::Lion(c) => c.kernel_step(t),
            Algorithm::ScheduleFreeAdamW(c) => c.kernel_step(),
            Algorithm::Adafactor(c) => c.kernel_step(t),
            Algorithm::Muon(c) => c.kernel_step(),
            Algorithm::RmsProp(c) => c.kernel_step(),
            Algorithm::AdEMAMix(c) => c.kernel_step(t),
            Algorithm::Lamb(c) => c.kernel_step(t),
        }
    }

    /// The family of kernels that runs it.
    pub(crate) fn family(&self) -> Family {
        match self {
            Algorithm::Adam(_) => Family::Adam,
            Algorithm::Sgd(_) => Family::Momentum,
            Algorithm::Adagrad(_) => Family::Adagrad,
            Algorithm::Lion(_) => Family::Lion,
            Algorithm::ScheduleFreeAdamW(_) => Family::ScheduleFree,
            Algorithm::Adafactor(_) => Family::Adafactor,
            Algorithm::Muon(_) => Family::Muon,
            Algorithm::RmsProp(_) => Family::RmsProp,
            Algorithm::AdEMAMix(_) => Family::Ademamix,
            Algorithm::Lamb(_) => Family::Lamb,
        }
    }

    /// The learning rate.
    pub fn lr(&self) -> f64 {
        match self {
            Algorithm::Adam(c) => c.lr,
            Algorithm::Sgd(c) => c.lr,
            Algorithm::Adagrad(c) => c.lr,
            Algorithm::Lion(c) => c.lr,
            Algorithm::ScheduleFreeAdamW(c) => c.lr,
            Algorithm::Adafactor(c) => c.lr,
            Algorithm::Muon(c) => c.lr,
            Algorithm::RmsProp(c) => c.lr,
            Algorithm::AdEMAMix(c) => c.lr,
            Algorithm::Lamb(c) => c.lr,
        }
    }

    /// The same algorithm with learning rate `lr`.
    pub fn with_lr(mut self, lr: f64) -> Self {
        match &mut self {
            Algorithm::Adam(c) => c.lr = lr,
            Algorithm::Sgd(c) => c.lr = lr,
            Algorithm::Adagrad(c) => c.lr = lr,
            Algorithm::Lion(c) => c.lr = lr,
            Algorithm::ScheduleFreeAdamW(c) => c.lr = lr,
            Algorithm::Adafactor(c) => c.lr = lr,
            Algorithm::Muon(c) => c.lr = lr,
            Algorithm::RmsProp(c) => c.lr = lr,
            Algorithm::AdEMAMix(c) => c.lr = lr,
            Algorithm::Lamb(c) => c.lr = lr,
        }
        self
    }

    /// The state tensors this algorithm keeps per parameter, in PyTorch's order.
    pub fn state_kinds(&self) -> &'static [StateKind] {
        match self {
            Algorithm::Adam(c) if c.amsgrad => {
                &[StateKind::ExpAvg, StateKind::ExpAvgSq, StateKind::MaxExpAvgSq]
            }
            Algorithm::Adam(_) => &[StateKind::ExpAvg, StateKind::ExpAvgSq],
            Algorithm::Sgd(c) if c.keeps_buffer() => &[StateKind::MomentumBuffer],
            Algorithm::Sgd(_) => &[],
            Algorithm::Adagrad(_) => &[StateKind::Sum],
            Algorithm::Lion(_) => &[StateKind::ExpAvg],
            Algorithm::ScheduleFreeAdamW(_) => &[StateKind::Z, StateKind::ExpAvgSq],
            // Its states depend on each tensor's shape (`row_var` and `col_var`, or `variance`:
            // `adafactor_state_kinds`) and are kept apart from the elementwise ones.
            Algorithm::Adafactor(_) => &[],
            Algorithm::Muon(_) => &[StateKind::MomentumBuffer],
            Algorithm::RmsProp(c) => match (c.keeps_buffer(), c.centered) {
                (false, false) => &[StateKind::SquareAvg],
                (true, false) => &[StateKind::SquareAvg, StateKind::MomentumBuffer],
                (false, true) => &[StateKind::SquareAvg, StateKind::GradAvg],
                (true, true) => &[StateKind::SquareAvg, StateKind::MomentumBuffer, StateKind::GradAvg],
            },
            Algorithm::AdEMAMix(_) => &[StateKind::ExpAvg, StateKind::ExpAvgSlow, StateKind::ExpAvgSq],
            Algorithm::Lamb(_) => &[StateKind::ExpAvg, StateKind::ExpAvgSq],
        }
    }

    /// The value a state tensor starts from.
    pub(crate) fn initial_state(&self) -> f64 {
        match self {
            Algorithm::Adagrad(c) => c.initial_accumulator_value,
            _ => 0.0,
        }
    }
}

/// A per-parameter state tensor, named as in PyTorch's `state_dict`.
///
/// `#[non_exhaustive]`: new algorithms bring new state kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StateKind {
    /// Adam's first moment (Lion's running average of the gradient too).
    ExpAvg,
    /// Adam's second moment.
    ExpAvgSq,
    /// AMSGrad's running maximum of the second moment.
    MaxExpAvgSq,
    /// SGD's momentum buffer (Muon's too).
    MomentumBuffer,
    /// Adagrad's sum of squared gradients.
    Sum,
    /// Schedule-Free's `z`, the sequence the base optimizer steps.
    Z,
    /// RMSprop's running average of the squared gradient.
    SquareAvg,
    /// Centered RMSprop's running average of the gradient.
    GradAvg,
    /// AdEMAMix's slow EMA of the gradient (bitsandbytes keeps it as `state1[1]`).
    ExpAvgSlow,
    /// Adafactor's row factor of the second moment (the parameter's shape, last dim 1).
    RowVar,
    /// Adafactor's column factor of the second moment (the parameter's shape, second-last
    /// dim 1).
    ColVar,
    /// Adafactor's unfactored second moment of a vector.
    Variance,
    /// The rounding error of the last parameter store, added back at the next step
    /// ([`Rounding::Kahan`](crate::Rounding::Kahan)); kept in the parameter's dtype. Not a
    /// state of any algorithm ([`Algorithm::state_kinds`]) but of the optimizer's rounding.
    KahanCompensation,
}

impl StateKind {
    /// PyTorch's name for it, which is also the kernel's slot name.
    pub fn torch_name(self) -> &'static str {
        match self {
            StateKind::ExpAvg => "exp_avg",
            StateKind::ExpAvgSq => "exp_avg_sq",
            StateKind::MaxExpAvgSq => "max_exp_avg_sq",
            StateKind::MomentumBuffer => "momentum_buffer",
            StateKind::Sum => "sum",
            StateKind::Z => "z",
            StateKind::SquareAvg => "square_avg",
            StateKind::GradAvg => "grad_avg",
            StateKind::ExpAvgSlow => "exp_avg_slow",
            StateKind::RowVar => "row_var",
            StateKind::ColVar => "col_var",
            StateKind::Variance => "variance",
            StateKind::KahanCompensation => "kahan_comp",
        }
    }
}

impl Algorithm {
    /// The class name PyTorch would use.
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::Adam(c) if c.decoupled_weight_decay => "AdamW",
            Algorithm::Adam(_) => "Adam",
            Algorithm::Sgd(_) => "SGD",
            Algorithm::Adagrad(_) => "Adagrad",
            Algorithm::Lion(_) => "Lion",
            Algorithm::ScheduleFreeAdamW(_) => "AdamWScheduleFree",
            Algorithm::Adafactor(_) => "Adafactor",
            Algorithm::Muon(_) => "Muon",
            Algorithm::RmsProp(_) => "RMSprop",
            Algorithm::AdEMAMix(_) => "AdEMAMix",
            Algorithm::Lamb(_) => "Lamb",
        }
    }
}
