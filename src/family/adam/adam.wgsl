// Adam, AdamW and AMSGrad, one element at a time, every element read once and written once.
//
// One formula covers the three conventions the crate reproduces; the host fills `hp`:
//   PyTorch Adam/AdamW: denom = sqrt(v) / sqrt(1 - beta2^t) + eps,
//                       step_size = lr / (1 - beta1^t)
//   ONNX, DirectML:     denom = sqrt(v) + eps,
//                       step_size = R * sqrt(1 - beta2^T) / (1 - beta1^T) (ONNX: R when T = 0)
// The prelude supplies R (the value type: a scalar, or vec4 when an invocation updates four
// elements at once), S (the uniform's scalar type) and the load_/store_ functions;
// store_param_copy writes the model's low-precision copy in master-weight mode and is a
// no-op otherwise. Every operation is componentwise, so one body serves both widths.

// The prelude declares the override constants and `struct Hyper` from the step contract
// (src/family/adam/contract.rs):
//   MAXIMIZE               negate the gradient (PyTorch `maximize`).
//   DECOUPLED_WEIGHT_DECAY true: `p *= decay` before the update (AdamW). false: L2,
//                          `g += weight_decay * p`, skipped at run time when the coefficient
//                          is 0 (as PyTorch does, so a schedule that reaches 0 compiles nothing).
//   EPS_AFTER_CORRECTION   true: eps is added after dividing sqrt(v) by sqrt(1 - beta2^t)
//                          (PyTorch). false: eps is added to sqrt(v) itself and the bias
//                          correction is in step_size (ONNX, DirectML).
//   DECAY_AFTER_UPDATE     with DECOUPLED_WEIGHT_DECAY: `p *= decay` after the update
//                          instead of before it (bitsandbytes' Adam kernels, 8-bit state).
//   L2_AT_ZERO             without DECOUPLED_WEIGHT_DECAY: `g += weight_decay * p` at a
//                          coefficient of 0 too (torchao's 4-bit Adam, where a NaN or
//                          infinite p makes g NaN).
//   AMSGRAD                keep the running maximum of the second moment and divide by it.
//   FIRST_MOMENT           one of the constants the prelude declares with it (from the
//                          Rust enum `FirstMoment`):
//                          FIRST_MOMENT_LINEAR: `beta1 * m + (1 - beta1) * g` as ONNX and
//                          DirectML write it.
//                          FIRST_MOMENT_LERP_FROM_MOMENT and FIRST_MOMENT_LERP_FROM_GRAD:
//                          PyTorch's `exp_avg.lerp_(grad, 1 - beta1)`, whose form depends on
//                          the weight (the first below 0.5, the second otherwise); the forms
//                          differ where values are infinite. A compile-time choice keeps the
//                          per-element loop free of the test.

// Updates element i. The entry point calls it for every element of the segment. (The whole
// prelude interface: the module doc of src/gpu/kernel/mod.rs.)
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
    if DECOUPLED_WEIGHT_DECAY {
        if !DECAY_AFTER_UPDATE {
            p = p * hp.decay;
        }
    } else if L2_AT_ZERO || hp.weight_decay != S(0) {
        g = g + hp.weight_decay * p;
    }
    var m: R;
    if FIRST_MOMENT == FIRST_MOMENT_LERP_FROM_MOMENT {
        m = m_prev + hp.one_minus_beta1 * (g - m_prev);
    } else if FIRST_MOMENT == FIRST_MOMENT_LERP_FROM_GRAD {
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
    var p_new = (p - hp.step_size * (m / denom)) * hp.post_scale;
    if DECOUPLED_WEIGHT_DECAY && DECAY_AFTER_UPDATE {
        p_new = p_new * hp.decay;
    }
    store_param(i, p_new);
    store_param_copy(i, p_new);
    store_exp_avg(i, m);
    store_exp_avg_sq(i, v);
    store_max_exp_avg_sq(i, v_hat);
}
