// Adam, AdamW and AMSGrad, one element at a time, every element read once and written once.
//
// One formula covers the three conventions the crate reproduces; the host fills `hp`:
//   PyTorch Adam/AdamW, DirectML: denom = sqrt(v) / sqrt(1 - beta2^t) + eps,
//                                 step_size = lr / (1 - beta1^t)
//   ONNX:                          denom = sqrt(v) + eps,
//                                 step_size = R * sqrt(1 - beta^T) / (1 - alpha^T) (R when T = 0)
// The prelude supplies R (the value type: a scalar, or vec4 when an invocation updates four
// elements at once), S (the uniform's scalar type) and the load_/store_ functions;
// store_param_copy writes the model's low-precision copy in master-weight mode and is a
// no-op otherwise. Every operation is componentwise, so one body serves both widths.

// Negate the gradient (PyTorch `maximize`).
override MAXIMIZE: bool = false;
// 0: no weight decay. 1: L2, `g += weight_decay * p`, skipped at run time when the
// coefficient is 0 (as PyTorch does, and so a schedule that reaches 0 compiles nothing) (Adam, ONNX norm_coefficient).
// 2: decoupled, `p *= decay` before the update (AdamW).
override WEIGHT_DECAY: u32 = 0u;
// true: eps is added after dividing sqrt(v) by sqrt(1 - beta2^t) (PyTorch, DirectML).
// false: eps is added to sqrt(v) itself and the bias correction is in step_size (ONNX).
override EPS_AFTER_CORRECTION: bool = true;
// Keep the running maximum of the second moment and divide by it (Reddi et al. 2018).
override AMSGRAD: bool = false;
// 0: `beta1 * m + (1 - beta1) * g` as ONNX and DirectML write it. 1 and 2: PyTorch's
// `exp_avg.lerp_(grad, 1 - beta1)`, whose form depends on the weight (1: below 0.5,
// 2: otherwise); the forms differ where values are infinite. A compile-time choice keeps
// the per-element loop free of the test.
override FIRST_MOMENT_LERP: u32 = 0u;

struct Hyper {
    beta1: S,
    one_minus_beta1: S,
    beta2: S,
    one_minus_beta2: S,
    weight_decay: S,
    decay: S,
    step_size: S,
    sqrt_bias_correction2: S,
    eps: S,
    // ONNX norm_coefficient_post: the parameter is scaled by this after the update.
    post_scale: S,
    // ln(beta1), ln(beta2), for bias corrections computed on the device (capturable mode).
    ln_beta1: S,
    ln_beta2: S,
}

// Updates element i. The generated entry point calls it for every element of the segment.
fn update(i: u32) {
    // Every input is loaded before any output is stored: an output may alias any input.
    var p = load_param(i);
    var g = load_grad(i);
    let m_prev = load_exp_avg(i);
    let v_prev = load_exp_avg_sq(i);
    let v_max_prev = load_max_exp_avg_sq(i);

    if MAXIMIZE {
        g = -g;
    }
    if WEIGHT_DECAY == 1u && hp.weight_decay != S(0) {
        g = g + hp.weight_decay * p;
    } else if WEIGHT_DECAY == 2u {
        p = p * hp.decay;
    }
    var m: R;
    if FIRST_MOMENT_LERP == 1u {
        m = m_prev + hp.one_minus_beta1 * (g - m_prev);
    } else if FIRST_MOMENT_LERP == 2u {
        m = g - (g - m_prev) * (S(1) - hp.one_minus_beta1);
    } else {
        m = hp.beta1 * m_prev + hp.one_minus_beta1 * g;
    }
    let v = hp.beta2 * v_prev + hp.one_minus_beta2 * g * g;
    var v_hat = v;
    if AMSGRAD {
        // torch.maximum propagates NaN; WGSL's max may return either operand.
        v_hat = max_propagating_nan(v_max_prev, v);
    }
    var denom: R;
    if EPS_AFTER_CORRECTION {
        denom = sqrt(v_hat) / hp.sqrt_bias_correction2 + hp.eps;
    } else {
        denom = sqrt(v_hat) + hp.eps;
    }

    // PyTorch's addcdiv and ONNX both divide first: p - step_size * (m / denom).
    let p_new = (p - hp.step_size * (m / denom)) * hp.post_scale;
    store_param(i, p_new);
    store_param_copy(i, p_new);
    store_exp_avg(i, m);
    store_exp_avg_sq(i, v);
    store_max_exp_avg_sq(i, v_hat);
}
