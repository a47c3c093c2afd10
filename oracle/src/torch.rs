//! PyTorch's optimizers (`_single_tensor_adam`, `_single_tensor_sgd`, `_single_tensor_adagrad`)
//! and `clip_grad_norm_`, in f64, with their hyperparameters under PyTorch's names.

use super::adan::AdanOracle;
use super::ademamix::ademamix_step;
use super::adopt::adopt_step;
use super::algorithm::Algorithm;
use super::dtype::{round, DType};

/// `torch.optim.Adam`'s (and `AdamW`'s) hyperparameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adam {
    /// `lr`.
    pub lr: f64,
    /// `betas[0]`: the old first moment's weight.
    pub beta1: f64,
    /// `betas[1]`: the old second moment's weight.
    pub beta2: f64,
    /// `eps`: added to the bias-corrected root of the second moment.
    pub eps: f64,
    /// `weight_decay`.
    pub weight_decay: f64,
    /// `decoupled_weight_decay` (`AdamW`): decay the parameter rather than add the decay to
    /// the gradient.
    pub decoupled_weight_decay: bool,
    /// `amsgrad`: divide by the running maximum of the second moment.
    pub amsgrad: bool,
    /// `maximize`: ascend the gradient.
    pub maximize: bool,
}

/// `torch.optim.SGD`'s hyperparameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sgd {
    /// `lr`.
    pub lr: f64,
    /// `momentum` (0: no momentum buffer).
    pub momentum: f64,
    /// `dampening`: the gradient's weight in the buffer is `1 - dampening`.
    pub dampening: f64,
    /// `weight_decay`: L2, added to the gradient.
    pub weight_decay: f64,
    /// `nesterov`.
    pub nesterov: bool,
    /// `maximize`: ascend the gradient.
    pub maximize: bool,
}

/// `torch.optim.Adagrad`'s hyperparameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adagrad {
    /// `lr`.
    pub lr: f64,
    /// `lr_decay`.
    pub lr_decay: f64,
    /// `weight_decay`: L2, added to the gradient.
    pub weight_decay: f64,
    /// `initial_accumulator_value`: where `state_sum` starts.
    pub initial_accumulator_value: f64,
    /// `eps`: added to the root of `state_sum`.
    pub eps: f64,
    /// `maximize`: ascend the gradient.
    pub maximize: bool,
}

/// `clip_grad_norm_`'s `norm_type`, the two values the tests clip with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormType {
    /// `norm_type=2`: the Euclidean norm.
    L2,
    /// `norm_type=inf`: the largest magnitude.
    Inf,
}

/// The arguments of `torch.nn.utils.clip_grad_norm_` besides the gradients.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GradClip {
    /// `max_norm`.
    pub max_norm: f64,
    /// `norm_type`.
    pub norm_type: NormType,
}
use super::lion::lion_step;
use super::rmsprop::{torch_rmsprop_step, TorchRmsPropState};

/// PyTorch's Adam state for one parameter.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TorchAdamState {
    /// `exp_avg`.
    pub exp_avg: Vec<f64>,
    /// `exp_avg_sq`.
    pub exp_avg_sq: Vec<f64>,
    /// `max_exp_avg_sq` (AMSGrad only; empty otherwise).
    pub max_exp_avg_sq: Vec<f64>,
    /// `step`, the number of steps taken.
    pub step: u64,
}

impl TorchAdamState {
    /// Zero state for `len` elements, as PyTorch lazily creates it.
    pub fn zeros(len: usize, amsgrad: bool) -> Self {
        TorchAdamState {
            exp_avg: vec![0.0; len],
            exp_avg_sq: vec![0.0; len],
            max_exp_avg_sq: if amsgrad { vec![0.0; len] } else { Vec::new() },
            step: 0,
        }
    }
}

/// One step of `torch.optim.Adam`/`AdamW`'s single-tensor path (`_single_tensor_adam`).
pub fn torch_adam_step(config: &Adam, param: &mut [f64], grad: &[f64], state: &mut TorchAdamState) {
    state.step += 1;
    let step = state.step;
    let (lr, beta1, beta2, eps, weight_decay) =
        (config.lr, config.beta1, config.beta2, config.eps, config.weight_decay);
    for i in 0..param.len() {
        let mut grad = if config.maximize { -grad[i] } else { grad[i] };
        if weight_decay != 0.0 {
            if config.decoupled_weight_decay {
                param[i] *= 1.0 - lr * weight_decay;
            } else {
                grad += weight_decay * param[i];
            }
        }
        // exp_avg.lerp_(grad, 1 - beta1), in the form ATen's lerp takes for the weight.
        let (m, weight) = (state.exp_avg[i], 1.0 - beta1);
        state.exp_avg[i] =
            if weight.abs() < 0.5 { m + weight * (grad - m) } else { grad - (grad - m) * (1.0 - weight) };
        // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        state.exp_avg_sq[i] = state.exp_avg_sq[i] * beta2 + (1.0 - beta2) * grad * grad;
        let bias_correction1 = 1.0 - beta1.powf(step as f64);
        let bias_correction2 = 1.0 - beta2.powf(step as f64);
        let step_size = lr / bias_correction1;
        let bias_correction2_sqrt = bias_correction2.sqrt();
        let denom = if config.amsgrad {
            // torch.maximum propagates NaN (f64::max would drop it).
            let (a, b) = (state.max_exp_avg_sq[i], state.exp_avg_sq[i]);
            state.max_exp_avg_sq[i] = if a.is_nan() || b.is_nan() { f64::NAN } else { a.max(b) };
            state.max_exp_avg_sq[i].sqrt() / bias_correction2_sqrt + eps
        } else {
            state.exp_avg_sq[i].sqrt() / bias_correction2_sqrt + eps
        };
        // param.addcdiv_(exp_avg, denom, value=-step_size)
        param[i] += -step_size * (state.exp_avg[i] / denom);
    }
}

/// One step of `torch.optim.SGD`'s single-tensor path (`_single_tensor_sgd`).
/// `momentum_buffer` is `None` until the first step with momentum creates it.
pub fn torch_sgd_step(config: &Sgd, param: &mut [f64], grad: &[f64], momentum_buffer: &mut Option<Vec<f64>>) {
    let mut grad: Vec<f64> = if config.maximize { grad.iter().map(|g| -g).collect() } else { grad.to_vec() };
    if config.weight_decay != 0.0 {
        // grad = grad.add(param, alpha=weight_decay)
        for (g, p) in grad.iter_mut().zip(param.iter()) {
            *g += config.weight_decay * p;
        }
    }
    if config.momentum != 0.0 {
        match momentum_buffer {
            // buf = torch.clone(grad).detach()
            None => *momentum_buffer = Some(grad.clone()),
            // buf.mul_(momentum).add_(grad, alpha=1 - dampening)
            Some(buf) => {
                for (b, g) in buf.iter_mut().zip(&grad) {
                    *b = *b * config.momentum + (1.0 - config.dampening) * g;
                }
            }
        }
        let buf = momentum_buffer.as_ref().map(Vec::as_slice).unwrap_or_default();
        if config.nesterov {
            // grad = grad.add(buf, alpha=momentum)
            for (g, b) in grad.iter_mut().zip(buf) {
                *g += config.momentum * b;
            }
        } else {
            grad.copy_from_slice(buf);
        }
    }
    // param.add_(grad, alpha=-lr)
    for (p, g) in param.iter_mut().zip(&grad) {
        *p += -config.lr * g;
    }
}

/// One step of `torch.optim.Adagrad`'s single-tensor path; `step` counts from 1.
pub fn torch_adagrad_step(
    config: &Adagrad,
    step: u64,
    param: &mut [f64],
    grad: &[f64],
    state_sum: &mut [f64],
) {
    for i in 0..param.len() {
        let mut grad = if config.maximize { -grad[i] } else { grad[i] };
        if config.weight_decay != 0.0 {
            grad += config.weight_decay * param[i];
        }
        let clr = config.lr / (1.0 + (step as f64 - 1.0) * config.lr_decay);
        state_sum[i] += grad * grad;
        let std = state_sum[i].sqrt() + config.eps;
        // param.addcdiv_(grad, std, value=-clr)
        param[i] += -clr * (grad / std);
    }
}

/// The oracle's state for one parameter under any [`Algorithm`], stepped as PyTorch does.
///
/// With [`TorchState::storing`], every step ends by rounding the parameter and each state
/// tensor to its storage dtype (nearest even), as the GPU's stores do; the arithmetic
/// stays f64.
#[derive(Clone, Debug, PartialEq)]
pub struct TorchState {
    algorithm: Algorithm,
    adam: TorchAdamState,
    momentum_buffer: Option<Vec<f64>>,
    sum: Vec<f64>,
    rmsprop: TorchRmsPropState,
    /// AdEMAMix's slow EMA (its fast one and `nu` live in `adam`).
    exp_avg_slow: Vec<f64>,
    /// Adan's group of this one parameter (its four states under the official names).
    adan: Option<AdanOracle>,
    step: u64,
    param_dtype: DType,
    state_dtype: DType,
}

impl TorchState {
    /// Fresh state for a parameter of `len` elements.
    pub fn new(algorithm: Algorithm, len: usize) -> Self {
        let (amsgrad, initial_sum) = match algorithm {
            Algorithm::Adam(c) => (c.amsgrad, 0.0),
            Algorithm::Adagrad(c) => (false, c.initial_accumulator_value),
            Algorithm::Sgd(_) => (false, 0.0),
            Algorithm::Lion(_) => (false, 0.0),
            Algorithm::RmsProp(_) => (false, 0.0),
            Algorithm::AdEMAMix(_) | Algorithm::Adopt(_) | Algorithm::Adan(_) => (false, 0.0),
            other => untranscribed(&other),
        };
        TorchState {
            algorithm,
            adam: TorchAdamState::zeros(len, amsgrad),
            momentum_buffer: None,
            sum: vec![initial_sum; len],
            rmsprop: match algorithm {
                Algorithm::RmsProp(c) => TorchRmsPropState::zeros(&c, len),
                _ => TorchRmsPropState::default(),
            },
            exp_avg_slow: vec![0.0; len],
            adan: match algorithm {
                Algorithm::Adan(c) => Some(AdanOracle::new(c, 1)),
                _ => None,
            },
            step: 0,
            param_dtype: DType::F64,
            state_dtype: DType::F64,
        }
    }

    /// State that has taken `step` steps and holds `tensors` (in the order of
    /// [`TorchState::tensors`]), e.g. values read back from the GPU or a checkpoint.
    pub fn resume(algorithm: Algorithm, step: u64, tensors: &[Vec<f64>]) -> Self {
        let len = tensors.first().map_or(0, Vec::len);
        let mut state = TorchState::new(algorithm, len);
        state.step = step;
        state.adam.step = step;
        let mut values = tensors.iter().cloned();
        match algorithm {
            Algorithm::Adam(c) => {
                state.adam.exp_avg = values.next().unwrap_or_default();
                state.adam.exp_avg_sq = values.next().unwrap_or_default();
                if c.amsgrad {
                    state.adam.max_exp_avg_sq = values.next().unwrap_or_default();
                }
            }
            // PyTorch creates the buffer on the first step; before it there is none.
            Algorithm::Sgd(c) if c.momentum != 0.0 && step > 0 => state.momentum_buffer = values.next(),
            Algorithm::Sgd(_) => {}
            Algorithm::Adagrad(_) => state.sum = values.next().unwrap_or_default(),
            // Lion's running average lives where Adam's first moment does.
            Algorithm::Lion(_) => state.adam.exp_avg = values.next().unwrap_or_default(),
            Algorithm::RmsProp(c) => state.rmsprop = TorchRmsPropState::from_tensors(&c, tensors),
            Algorithm::AdEMAMix(_) => {
                state.adam.exp_avg = values.next().unwrap_or_default();
                state.exp_avg_slow = values.next().unwrap_or_default();
                state.adam.exp_avg_sq = values.next().unwrap_or_default();
            }
            // ADOPT's two moments live where Adam's do.
            Algorithm::Adopt(_) => {
                state.adam.exp_avg = values.next().unwrap_or_default();
                state.adam.exp_avg_sq = values.next().unwrap_or_default();
            }
            Algorithm::Adan(_) => {
                if let Some(adan) = state.adan.as_mut() {
                    adan.step = step;
                    for tensor in [&mut adan.exp_avg, &mut adan.exp_avg_sq, &mut adan.exp_avg_diff] {
                        tensor[0] = values.next().unwrap_or_default();
                    }
                    adan.neg_pre_grad[0] = values.next().unwrap_or_default();
                }
            }
            other => untranscribed(&other),
        }
        state
    }

    /// Rounds, after every step, the parameter to `param` and the state to `state`.
    pub fn storing(mut self, param: DType, state: DType) -> Self {
        self.param_dtype = param;
        self.state_dtype = state;
        self.sum.iter_mut().for_each(|x| *x = round(state, *x));
        for tensor in self.rmsprop.tensors_mut() {
            tensor.iter_mut().for_each(|x| *x = round(state, *x));
        }
        self
    }

    /// Changes the hyperparameters for the following steps (a schedule).
    pub fn set_algorithm(&mut self, algorithm: Algorithm) {
        self.algorithm = algorithm;
    }

    /// One step.
    pub fn step(&mut self, param: &mut [f64], grad: &[f64]) {
        self.step += 1;
        match &self.algorithm {
            Algorithm::Adam(c) => torch_adam_step(c, param, grad, &mut self.adam),
            Algorithm::Sgd(c) => torch_sgd_step(c, param, grad, &mut self.momentum_buffer),
            Algorithm::Adagrad(c) => torch_adagrad_step(c, self.step, param, grad, &mut self.sum),
            Algorithm::Lion(c) => lion_step(c, param, grad, &mut self.adam.exp_avg),
            Algorithm::RmsProp(c) => torch_rmsprop_step(c, param, grad, &mut self.rmsprop),
            Algorithm::AdEMAMix(c) => {
                let adam = &mut self.adam;
                let (m1, m2, nu) = (&mut adam.exp_avg, &mut self.exp_avg_slow, &mut adam.exp_avg_sq);
                ademamix_step(c, self.step, param, grad, m1, m2, nu)
            }
            Algorithm::Adopt(c) => {
                let (m, v) = (&mut self.adam.exp_avg, &mut self.adam.exp_avg_sq);
                let unrounded = (DType::F64, DType::F64);
                adopt_step(c, self.step - 1, param, grad, m, v, unrounded)
            }
            Algorithm::Adan(c) => {
                let adan = self.adan.get_or_insert_with(|| AdanOracle::new(*c, 1));
                adan.config = *c;
                let mut params = [param.to_vec()];
                adan.step(&mut params, &[grad.to_vec()]);
                param.copy_from_slice(&params[0]);
            }
            other => untranscribed(other),
        }
        let (p, s) = (self.param_dtype, self.state_dtype);
        param.iter_mut().for_each(|x| *x = round(p, *x));
        let state =
            [&mut self.adam.exp_avg, &mut self.adam.exp_avg_sq, &mut self.adam.max_exp_avg_sq, &mut self.sum];
        let rmsprop = self.rmsprop.tensors_mut();
        let slow = std::iter::once(&mut self.exp_avg_slow);
        let adan = self.adan.iter_mut().flat_map(|a| {
            [&mut a.exp_avg[0], &mut a.exp_avg_sq[0], &mut a.exp_avg_diff[0], &mut a.neg_pre_grad[0]]
        });
        let tensors = state.into_iter().chain(slow).chain(self.momentum_buffer.as_mut()).chain(rmsprop);
        for tensor in tensors.chain(adan) {
            tensor.iter_mut().for_each(|x| *x = round(s, *x));
        }
    }

    /// The state tensors in PyTorch's `state_dict` order (AdEMAMix: `exp_avg`,
    /// `exp_avg_slow`, `exp_avg_sq`; Adan: `exp_avg`, `exp_avg_sq`, `exp_avg_diff`,
    /// `neg_pre_grad`), as wgpu-optim lists its state kinds.
    pub fn tensors(&self) -> Vec<Vec<f64>> {
        match &self.algorithm {
            Algorithm::Adam(c) => {
                let mut t = vec![self.adam.exp_avg.clone(), self.adam.exp_avg_sq.clone()];
                if c.amsgrad {
                    t.push(self.adam.max_exp_avg_sq.clone());
                }
                t
            }
            Algorithm::Sgd(c) if c.momentum != 0.0 => {
                vec![self.momentum_buffer.clone().unwrap_or_else(|| vec![0.0; self.sum.len()])]
            }
            Algorithm::Sgd(_) => vec![],
            Algorithm::Adagrad(_) => vec![self.sum.clone()],
            Algorithm::Lion(_) => vec![self.adam.exp_avg.clone()],
            Algorithm::RmsProp(c) => self.rmsprop.tensors(c),
            Algorithm::AdEMAMix(_) => {
                vec![self.adam.exp_avg.clone(), self.exp_avg_slow.clone(), self.adam.exp_avg_sq.clone()]
            }
            Algorithm::Adopt(_) => vec![self.adam.exp_avg.clone(), self.adam.exp_avg_sq.clone()],
            Algorithm::Adan(_) => self.adan.as_ref().map_or_else(Vec::new, |a| {
                vec![
                    a.exp_avg[0].clone(),
                    a.exp_avg_sq[0].clone(),
                    a.exp_avg_diff[0].clone(),
                    a.neg_pre_grad[0].clone(),
                ]
            }),
            other => untranscribed(other),
        }
    }
}

/// A family this per-tensor state does not step (those with group state have oracles of
/// their own) stops the test that asks for it, by name.
fn untranscribed(algorithm: &Algorithm) -> ! {
    panic!("the oracle has no transcription of {algorithm:?} yet")
}

/// `torch.nn.utils.clip_grad_norm_(params, clip.max_norm, norm_type)` over `grads` as one
/// vector: scales every gradient in place by `min(1, max_norm / (total_norm + 1e-6))` and
/// returns `total_norm`. A NaN norm makes the coefficient, and so every gradient, NaN.
pub fn clip_grad_norm(grads: &mut [Vec<f64>], clip: &GradClip) -> f64 {
    let values = || grads.iter().flat_map(|g| g.iter());
    let total_norm = match clip.norm_type {
        NormType::L2 => values().map(|g| g * g).sum::<f64>().sqrt(),
        // torch.max propagates NaN; f64::max would drop it.
        NormType::Inf => {
            values().fold(0.0, |m: f64, g| if g.is_nan() || m.is_nan() { f64::NAN } else { m.max(g.abs()) })
        }
    };
    let coefficient = clip.max_norm / (total_norm + 1e-6);
    let clamped = if coefficient.is_nan() { coefficient } else { coefficient.min(1.0) };
    for g in grads.iter_mut().flat_map(|g| g.iter_mut()) {
        *g *= clamped;
    }
    total_norm
}
