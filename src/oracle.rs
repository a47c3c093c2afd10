//! The CPU reference: each convention's pseudo code transcribed line for line in f64.
//! Slow and obviously correct; every GPU result in the tests is checked against it.

use crate::algo::bias_correction;
use crate::{Adam, DmlAdam, OnnxAdam};

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
    let (lr, beta1, beta2, eps, weight_decay) = (
        config.lr,
        config.beta1,
        config.beta2,
        config.eps,
        config.weight_decay,
    );
    for i in 0..param.len() {
        let mut grad = if config.maximize { -grad[i] } else { grad[i] };
        if weight_decay != 0.0 {
            if config.decoupled_weight_decay {
                param[i] *= 1.0 - lr * weight_decay;
            } else {
                grad += weight_decay * param[i];
            }
        }
        // exp_avg.lerp_(grad, 1 - beta1)
        state.exp_avg[i] += (1.0 - beta1) * (grad - state.exp_avg[i]);
        // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        state.exp_avg_sq[i] = state.exp_avg_sq[i] * beta2 + (1.0 - beta2) * grad * grad;
        let bias_correction1 = 1.0 - beta1.powf(step as f64);
        let bias_correction2 = 1.0 - beta2.powf(step as f64);
        let step_size = lr / bias_correction1;
        let bias_correction2_sqrt = bias_correction2.sqrt();
        let denom = if config.amsgrad {
            state.max_exp_avg_sq[i] = state.max_exp_avg_sq[i].max(state.exp_avg_sq[i]);
            state.max_exp_avg_sq[i].sqrt() / bias_correction2_sqrt + eps
        } else {
            state.exp_avg_sq[i].sqrt() / bias_correction2_sqrt + eps
        };
        param[i] += -step_size * state.exp_avg[i] / denom;
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
    let mut out = (
        Vec::with_capacity(x.len()),
        Vec::with_capacity(x.len()),
        Vec::with_capacity(x.len()),
    );
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
    for i in 0..parameters.len() {
        let first = d.beta1 * first_moment[i] + (1.0 - d.beta1) * gradient[i];
        let second = d.beta2 * second_moment[i] + (1.0 - d.beta2) * gradient[i] * gradient[i];
        let bias_corrected_first = first / bias_correction(d.beta1, t);
        let bias_corrected_second = second / bias_correction(d.beta2, t);
        out.0.push(
            parameters[i]
                - d.learning_rate * bias_corrected_first
                    / (bias_corrected_second.sqrt() + d.epsilon),
        );
        out.1.push(first);
        out.2.push(second);
    }
    out
}
