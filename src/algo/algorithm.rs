//! The algorithms the stateful optimizer runs, and the state tensors each keeps.

use crate::step::{Family, KernelStep};
use crate::{Adagrad, Adam, Result, Sgd};

/// The algorithms the stateful optimizer runs, in PyTorch's conventions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Algorithm {
    /// Adam, AdamW or AMSGrad.
    Adam(Adam),
    /// SGD, with standard or Nesterov momentum or none.
    Sgd(Sgd),
    /// Adagrad.
    Adagrad(Adagrad),
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

impl Algorithm {
    /// Checks the hyperparameters.
    pub fn validate(&self) -> Result<()> {
        match self {
            Algorithm::Adam(c) => c.validate(),
            Algorithm::Sgd(c) => c.validate(),
            Algorithm::Adagrad(c) => c.validate(),
        }
    }

    pub(crate) fn kernel_step(&self, t: u64) -> KernelStep {
        match self {
            Algorithm::Adam(c) => c.kernel_step(t),
            Algorithm::Sgd(c) => c.kernel_step(t),
            Algorithm::Adagrad(c) => c.kernel_step(t),
        }
    }

    /// The family of kernels that runs it.
    pub(crate) fn family(&self) -> Family {
        match self {
            Algorithm::Adam(_) => Family::Adam,
            Algorithm::Sgd(_) => Family::Momentum,
            Algorithm::Adagrad(_) => Family::Adagrad,
        }
    }

    /// The learning rate.
    pub fn lr(&self) -> f64 {
        match self {
            Algorithm::Adam(c) => c.lr,
            Algorithm::Sgd(c) => c.lr,
            Algorithm::Adagrad(c) => c.lr,
        }
    }

    /// The same algorithm with learning rate `lr`.
    pub fn with_lr(mut self, lr: f64) -> Self {
        match &mut self {
            Algorithm::Adam(c) => c.lr = lr,
            Algorithm::Sgd(c) => c.lr = lr,
            Algorithm::Adagrad(c) => c.lr = lr,
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StateKind {
    /// Adam's first moment.
    ExpAvg,
    /// Adam's second moment.
    ExpAvgSq,
    /// AMSGrad's running maximum of the second moment.
    MaxExpAvgSq,
    /// SGD's momentum buffer.
    MomentumBuffer,
    /// Adagrad's sum of squared gradients.
    Sum,
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
        }
    }
}

impl Algorithm {
    /// The hyperparameters under PyTorch's names, as in an optimizer's `param_groups`, with
    /// `"optimizer"` naming the class (`Adam`, `AdamW`, `SGD`, `Adagrad`).
    pub fn to_json(&self) -> serde_json::Map<String, serde_json::Value> {
        use serde_json::json;
        let value = match self {
            Algorithm::Adam(c) => json!({
                "optimizer": if c.decoupled_weight_decay { "AdamW" } else { "Adam" },
                "lr": c.lr, "betas": [c.beta1, c.beta2], "eps": c.eps, "weight_decay": c.weight_decay,
                "amsgrad": c.amsgrad, "maximize": c.maximize,
            }),
            Algorithm::Sgd(c) => json!({
                "optimizer": "SGD", "lr": c.lr, "momentum": c.momentum, "dampening": c.dampening,
                "weight_decay": c.weight_decay, "nesterov": c.nesterov, "maximize": c.maximize,
            }),
            Algorithm::Adagrad(c) => json!({
                "optimizer": "Adagrad", "lr": c.lr, "lr_decay": c.lr_decay, "weight_decay": c.weight_decay,
                "initial_accumulator_value": c.initial_accumulator_value, "eps": c.eps, "maximize": c.maximize,
            }),
        };
        match value {
            serde_json::Value::Object(map) => map,
            _ => serde_json::Map::new(),
        }
    }

    /// The inverse of [`Algorithm::to_json`]; the message says which field is missing or wrong.
    pub fn from_json(map: &serde_json::Map<String, serde_json::Value>) -> std::result::Result<Self, String> {
        let number = |key: &str| {
            map.get(key).and_then(|v| v.as_f64()).ok_or(format!("`{key}` is missing or not a number"))
        };
        let flag = |key: &str| {
            map.get(key).and_then(|v| v.as_bool()).ok_or(format!("`{key}` is missing or not a boolean"))
        };
        let name = map.get("optimizer").and_then(|v| v.as_str()).ok_or("`optimizer` is missing")?;
        Ok(match name {
            "Adam" | "AdamW" => {
                let betas = map.get("betas").and_then(|v| v.as_array()).ok_or("`betas` is missing")?;
                let beta =
                    |k: usize| betas.get(k).and_then(|v| v.as_f64()).ok_or("`betas` is not two numbers");
                Algorithm::Adam(Adam {
                    lr: number("lr")?,
                    beta1: beta(0)?,
                    beta2: beta(1)?,
                    eps: number("eps")?,
                    weight_decay: number("weight_decay")?,
                    decoupled_weight_decay: name == "AdamW",
                    amsgrad: flag("amsgrad")?,
                    maximize: flag("maximize")?,
                })
            }
            "SGD" => Algorithm::Sgd(Sgd {
                lr: number("lr")?,
                momentum: number("momentum")?,
                dampening: number("dampening")?,
                weight_decay: number("weight_decay")?,
                nesterov: flag("nesterov")?,
                maximize: flag("maximize")?,
            }),
            "Adagrad" => Algorithm::Adagrad(Adagrad {
                lr: number("lr")?,
                lr_decay: number("lr_decay")?,
                weight_decay: number("weight_decay")?,
                initial_accumulator_value: number("initial_accumulator_value")?,
                eps: number("eps")?,
                maximize: flag("maximize")?,
            }),
            other => return Err(format!("unknown optimizer `{other}`")),
        })
    }

    /// The class name PyTorch would use.
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::Adam(c) if c.decoupled_weight_decay => "AdamW",
            Algorithm::Adam(_) => "Adam",
            Algorithm::Sgd(_) => "SGD",
            Algorithm::Adagrad(_) => "Adagrad",
        }
    }
}
