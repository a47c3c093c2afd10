//! The ONNX training operators (`Adam`, `Momentum`, `Adagrad` of `ai.onnx.preview.training`)
//! as their documentation's pseudo code, and DirectML's Adam formula, in f64.

/// The attributes of ONNX's `Adam` (`ai.onnx.preview.training`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OnnxAdam {
    /// `alpha`: the old momentum's weight.
    pub alpha: f64,
    /// `beta`: the old second-order momentum's weight.
    pub beta: f64,
    /// `epsilon`.
    pub epsilon: f64,
    /// `norm_coefficient`: L2, added to the gradient.
    pub norm_coefficient: f64,
    /// `norm_coefficient_post`: the decay applied after the update.
    pub norm_coefficient_post: f64,
}

/// ONNX `Momentum`'s `mode` attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MomentumMode {
    /// `"standard"`.
    Standard,
    /// `"nesterov"`.
    Nesterov,
}

/// The attributes of ONNX's `Momentum`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OnnxMomentum {
    /// `alpha`: the old momentum's weight.
    pub alpha: f64,
    /// `beta`: the gradient's weight (1 on the first step).
    pub beta: f64,
    /// `mode`.
    pub mode: MomentumMode,
    /// `norm_coefficient`: L2, added to the gradient.
    pub norm_coefficient: f64,
}

/// The attributes of ONNX's `Adagrad`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OnnxAdagrad {
    /// `decay_factor`: the learning rate's decay per step.
    pub decay_factor: f64,
    /// `epsilon`.
    pub epsilon: f64,
    /// `norm_coefficient`: L2, added to the gradient.
    pub norm_coefficient: f64,
}

/// DirectML's `DML_ADAM_OPTIMIZER_OPERATOR_DESC`: its scalar inputs and attributes.
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
    let alpha = one_minus_pow(d.beta2, t).sqrt() / one_minus_pow(d.beta1, t);
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

/// `1 - beta^t`, without the cancellation of subtracting a power close to 1 from 1.
pub(super) fn one_minus_pow(beta: f64, t: u64) -> f64 {
    if beta == 0.0 || t == 0 {
        return if t == 0 { 0.0 } else { 1.0 };
    }
    -f64::exp_m1(t as f64 * beta.ln())
}
