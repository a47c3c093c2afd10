//! The CPU reference: each convention's pseudo code transcribed line for line in f64.
//! Slow and obviously correct; every GPU result in the tests is checked against it.

use crate::algo::bias_correction;
use crate::{
    Adagrad, Adam, Algorithm, DType, DmlAdam, Error, GradClip, MomentumMode, NormType, OnnxAdagrad, OnnxAdam,
    OnnxMomentum, Result, Sgd,
};

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

/// The outputs of one ONNX Adam call for one tensor: `(X_new, V_new, H_new)`.
pub type OnnxAdamOutputs = (Vec<f64>, Vec<f64>, Vec<f64>);

/// `apply_adam` of the ONNX operator documentation, for one of the n tensors.
pub fn onnx_adam(
    a: &OnnxAdam,
    r: f64,
    t: u64,
    x: &[f64],
    g: &[f64],
    v: &[f64],
    h: &[f64],
) -> OnnxAdamOutputs {
    let mut out = (Vec::with_capacity(x.len()), Vec::with_capacity(x.len()), Vec::with_capacity(x.len()));
    for i in 0..x.len() {
        // Add gradient of regularization term.
        let g_regularized = a.norm_coefficient * x[i] + g[i];
        // Update momentum.
        let v_new = a.alpha * v[i] + (1.0 - a.alpha) * g_regularized;
        // Update second-order momentum.
        let h_new = a.beta * h[i] + (1.0 - a.beta) * (g_regularized * g_regularized);
        // Compute element-wise square root.
        let h_sqrt = h_new.sqrt() + a.epsilon;
        // Adjust learning rate.
        let r_adjusted = if t > 0 {
            // Consider bias correction on momentums.
            r * (1.0 - a.beta.powf(t as f64)).sqrt() / (1.0 - a.alpha.powf(t as f64))
        } else {
            // No bias correction on momentums.
            r
        };
        // Apply Adam update rule.
        let x_new = x[i] - r_adjusted * (v_new / h_sqrt);
        // It's possible to apply regularization in the end.
        let x_final = (1.0 - a.norm_coefficient_post) * x_new;
        out.0.push(x_final);
        out.1.push(v_new);
        out.2.push(h_new);
    }
    out
}

/// DirectML's Adam formula (`DML_ADAM_OPTIMIZER_OPERATOR_DESC`) at training step `t >= 1`:
/// `(OutputParameters, OutputFirstMoment, OutputSecondMoment)`.
pub fn dml_adam(
    d: &DmlAdam,
    t: u64,
    parameters: &[f64],
    first_moment: &[f64],
    second_moment: &[f64],
    gradient: &[f64],
) -> OnnxAdamOutputs {
    let mut out = (Vec::new(), Vec::new(), Vec::new());
    // Alpha = sqrt(1.0 - pow(Beta2, T)) / (1.0 - pow(Beta1, T))
    let alpha = bias_correction(d.beta2, t).sqrt() / bias_correction(d.beta1, t);
    for i in 0..parameters.len() {
        // M = Beta1 * M + (1.0 - Beta1) * G
        let first = d.beta1 * first_moment[i] + (1.0 - d.beta1) * gradient[i];
        // V = Beta2 * V + (1.0 - Beta2) * G * G
        let second = d.beta2 * second_moment[i] + (1.0 - d.beta2) * gradient[i] * gradient[i];
        // X -= LearningRate * Alpha * M / (sqrt(V) + Epsilon)
        out.0.push(parameters[i] - d.learning_rate * alpha * first / (second.sqrt() + d.epsilon));
        out.1.push(first);
        out.2.push(second);
    }
    out
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

/// The outputs of one ONNX Momentum or Adagrad call for one tensor: `(X_new, state_new)`.
pub type OnnxOutputs2 = (Vec<f64>, Vec<f64>);

/// `_apply_momentum` / `_apply_nesterov` of ONNX's reference implementation, for one of
/// the n tensors.
pub fn onnx_momentum(a: &OnnxMomentum, r: f64, t: u64, x: &[f64], g: &[f64], v: &[f64]) -> OnnxOutputs2 {
    let mut out = (Vec::with_capacity(x.len()), Vec::with_capacity(x.len()));
    for i in 0..x.len() {
        // Add gradient of regularization term.
        let g_regularized = a.norm_coefficient * x[i] + g[i];
        // Coefficient of gradient should be 1 at the first iteration.
        let beta_adjusted = if t > 0 { a.beta } else { 1.0 };
        // Update momentum.
        let v_new = a.alpha * v[i] + beta_adjusted * g_regularized;
        // Apply SG with momentum update rule.
        let x_new = match a.mode {
            MomentumMode::Standard => x[i] - r * v_new,
            MomentumMode::Nesterov => x[i] - r * (g_regularized + a.alpha * v_new),
        };
        out.0.push(x_new);
        out.1.push(v_new);
    }
    out
}

/// `apply_adagrad` of the ONNX operator documentation, for one of the n tensors.
pub fn onnx_adagrad(a: &OnnxAdagrad, r: f64, t: u64, x: &[f64], g: &[f64], h: &[f64]) -> OnnxOutputs2 {
    let mut out = (Vec::with_capacity(x.len()), Vec::with_capacity(x.len()));
    for i in 0..x.len() {
        // Compute adjusted learning-rate.
        let r_ = r / (1.0 + t as f64 * a.decay_factor);
        // Add gradient of regularization term.
        let g_regularized = a.norm_coefficient * x[i] + g[i];
        // Update squared accumulated gradient.
        let h_new = h[i] + g_regularized * g_regularized;
        // Compute ADAGRAD's gradient scaling factors
        let h_sqrt = h_new.sqrt() + a.epsilon;
        // Apply ADAGRAD update rule.
        let x_new = x[i] - r_ * g_regularized / h_sqrt;
        out.0.push(x_new);
        out.1.push(h_new);
    }
    out
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
        };
        TorchState {
            algorithm,
            adam: TorchAdamState::zeros(len, amsgrad),
            momentum_buffer: None,
            sum: vec![initial_sum; len],
            step: 0,
            param_dtype: DType::F64,
            state_dtype: DType::F64,
        }
    }

    /// State that has taken `step` steps and holds `tensors` (in the order of
    /// [`Algorithm::state_kinds`]), e.g. values read back from the GPU or a checkpoint.
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
            Algorithm::Sgd(c) if c.keeps_buffer() && step > 0 => state.momentum_buffer = values.next(),
            Algorithm::Sgd(_) => {}
            Algorithm::Adagrad(_) => state.sum = values.next().unwrap_or_default(),
        }
        state
    }

    /// Rounds, after every step, the parameter to `param` and the state to `state`.
    pub fn storing(mut self, param: DType, state: DType) -> Self {
        self.param_dtype = param;
        self.state_dtype = state;
        let round = |v: &mut Vec<f64>| v.iter_mut().for_each(|x| *x = state.round(*x));
        round(&mut self.sum);
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
        }
        let (p, s) = (self.param_dtype, self.state_dtype);
        param.iter_mut().for_each(|x| *x = p.round(*x));
        let state =
            [&mut self.adam.exp_avg, &mut self.adam.exp_avg_sq, &mut self.adam.max_exp_avg_sq, &mut self.sum];
        for tensor in state.into_iter().chain(self.momentum_buffer.as_mut()) {
            tensor.iter_mut().for_each(|x| *x = s.round(*x));
        }
    }

    /// The state tensors in the order of [`Algorithm::state_kinds`].
    pub fn tensors(&self) -> Vec<Vec<f64>> {
        match &self.algorithm {
            Algorithm::Adam(c) => {
                let mut t = vec![self.adam.exp_avg.clone(), self.adam.exp_avg_sq.clone()];
                if c.amsgrad {
                    t.push(self.adam.max_exp_avg_sq.clone());
                }
                t
            }
            Algorithm::Sgd(c) if c.keeps_buffer() => {
                vec![self.momentum_buffer.clone().unwrap_or_else(|| vec![0.0; self.sum.len()])]
            }
            Algorithm::Sgd(_) => vec![],
            Algorithm::Adagrad(_) => vec![self.sum.clone()],
        }
    }
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

/// One state tensor of a bitsandbytes 8-bit optimizer: blockwise 8-bit for a tensor of at
/// least `min_8bit_size` elements, f32 below, as bitsandbytes keeps it.
pub use crate::q8::StoredState as BnbState;

/// Dequantized, widened.
fn load(state: &BnbState, map: &[f32; 256]) -> Result<Vec<f64>> {
    Ok(state.values(map)?.into_iter().map(f64::from).collect())
}

/// Rounded to f32, then requantized block by block.
fn store(state: &mut BnbState, values: &[f64], map: &[f32; 256]) -> Result<()> {
    let narrowed: Vec<f32> = values.iter().map(|&v| v as f32).collect();
    state.store(&narrowed, map)
}

/// Refuses a gradient of another length than the parameter's.
fn check_grad(param: &[f64], grad: &[f64]) -> Result<()> {
    if grad.len() != param.len() {
        return Err(Error::LengthMismatch {
            argument: "grad".into(),
            got: grad.len() as u64,
            expected: param.len() as u64,
            reference: "param".into(),
        });
    }
    Ok(())
}

/// `bitsandbytes.optim.Adam8bit` and `AdamW8bit`'s hyperparameters. Both apply weight decay
/// decoupled (`p *= 1 - lr * weight_decay`), unlike `torch.optim.Adam`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BnbAdam {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Added to the bias-corrected root of the second moment.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
}

/// Step `step` (from 1) of bitsandbytes' 8-bit blockwise Adam on one tensor, as its reference
/// `optimizer_update_8bit_blockwise_pytorch` does it: dequantize both moments, update them and
/// the parameter from the dequantized values, then requantize each moment (first with the
/// signed map, second with the unsigned one). Tensors kept in f32 take the same update.
/// A gradient or state of another length than `param` is refused and nothing changes.
pub fn bnb_adam8bit_step(
    config: &BnbAdam,
    step: u64,
    param: &mut [f64],
    grad: &[f64],
    exp_avg: &mut BnbState,
    exp_avg_sq: &mut BnbState,
) -> Result<()> {
    check_grad(param, grad)?;
    exp_avg.check("exp_avg", param.len())?;
    exp_avg_sq.check("exp_avg_sq", param.len())?;
    let (signed, unsigned) = (crate::q8::signed_map(), crate::q8::unsigned_map());
    let (mut m, mut v) = (load(exp_avg, &signed)?, load(exp_avg_sq, &unsigned)?);
    let bias_correction1 = bias_correction(config.beta1, step);
    let bias_correction2 = bias_correction(config.beta2, step);
    for (((p, g), m), v) in param.iter_mut().zip(grad).zip(&mut m).zip(&mut v) {
        // state1.mul_(beta1).add_(grad, alpha=1 - beta1)
        *m = *m * config.beta1 + (1.0 - config.beta1) * g;
        // state2.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        *v = *v * config.beta2 + (1.0 - config.beta2) * g * g;
        // denom = (state2.sqrt() / sqrt(bias_correction2)).add_(eps)
        let denom = v.sqrt() / bias_correction2.sqrt() + config.eps;
        if config.weight_decay > 0.0 {
            *p *= 1.0 - config.lr * config.weight_decay;
        }
        // p.addcdiv_(state1, denom, value=-lr / bias_correction1)
        *p += -config.lr / bias_correction1 * (*m / denom);
    }
    store(exp_avg, &m, &signed)?;
    store(exp_avg_sq, &v, &unsigned)
}

/// Step `step` of `algorithm` as bitsandbytes' 8-bit optimizers run it, over `states` in
/// the algorithm's state order ([`crate::Algorithm::state_kinds`]): Adam and AdamW as
/// [`bnb_adam8bit_step`] (decoupled decay), SGD with momentum as [`bnb_sgd8bit_step`]; then
/// the parameters rounded to f32, as an optimizer with 8-bit state stores them. Another
/// algorithm, or a count of states other than its own, is refused and nothing changes.
pub fn bnb_8bit_step(
    algorithm: &crate::Algorithm,
    step: u64,
    param: &mut [f64],
    grad: &[f64],
    states: &mut [BnbState],
) -> Result<()> {
    use crate::Algorithm;
    let kept = algorithm.state_kinds().len();
    if states.len() != kept {
        return Err(Error::CountMismatch { argument: "states".into(), got: states.len(), expected: kept });
    }
    match (algorithm, states) {
        (Algorithm::Adam(a), [m, v]) if !a.amsgrad => {
            let config = BnbAdam {
                lr: a.lr,
                beta1: a.beta1,
                beta2: a.beta2,
                eps: a.eps,
                weight_decay: a.weight_decay,
            };
            bnb_adam8bit_step(&config, step, param, grad, m, v)?;
        }
        (Algorithm::Sgd(s), [buffer]) => {
            let config = BnbSgd { lr: s.lr, momentum: s.momentum, weight_decay: s.weight_decay };
            bnb_sgd8bit_step(&config, step, param, grad, buffer)?;
        }
        _ => {
            return Err(Error::ConflictingOptions {
                first: "q8_states",
                second: "algorithm",
                reason: "bitsandbytes' 8-bit optimizers are Adam, AdamW and SGD with momentum",
            })
        }
    }
    for p in param.iter_mut() {
        *p = f64::from(*p as f32);
    }
    Ok(())
}

/// `bitsandbytes.optim.SGD8bit`'s hyperparameters (its 8-bit update has no dampening and no
/// Nesterov form).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BnbSgd {
    /// Learning rate.
    pub lr: f64,
    /// Momentum.
    pub momentum: f64,
    /// L2 weight decay, added to the gradient.
    pub weight_decay: f64,
}

/// Step `step` (from 1) of bitsandbytes' 8-bit blockwise SGD with momentum on one tensor, as
/// its reference does it: the first step's buffer is the gradient, later ones
/// `momentum * buffer + gradient`, requantized with the signed map. A gradient or buffer of
/// another length than `param` is refused and nothing changes.
pub fn bnb_sgd8bit_step(
    config: &BnbSgd,
    step: u64,
    param: &mut [f64],
    grad: &[f64],
    buffer: &mut BnbState,
) -> Result<()> {
    check_grad(param, grad)?;
    buffer.check("momentum_buffer", param.len())?;
    let signed = crate::q8::signed_map();
    let mut b = load(buffer, &signed)?;
    for ((p, g), b) in param.iter_mut().zip(grad).zip(&mut b) {
        // grad.add_(p, alpha=weight_decay), only where there is a decay (as PyTorch's
        // `if weight_decay != 0`): 0 * p would make a NaN or infinite parameter's gradient NaN.
        let g = if config.weight_decay != 0.0 { g + config.weight_decay * *p } else { *g };
        *b = if step == 1 { g } else { *b * config.momentum + g };
        // p.add_(state1, alpha=-lr)
        *p += -config.lr * *b;
    }
    store(buffer, &b, &signed)
}
