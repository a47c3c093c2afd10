// Adan (Xie et al. 2022; the official adan.py's _single_tensor_adan), one element at a time,
// with t the step from 1 and g the (clipped) gradient:
//   d   = g + neg_pre_grad                       t = 1 (first_step): neg_pre_grad = -g, so d = 0
//   m'  = beta1 * m + (1 - beta1) * g            exp_avg
//   v'  = beta2 * v + (1 - beta2) * d            exp_avg_diff
//   n'  = beta3 * n + (1 - beta3) * (g + beta2 * d)^2
//   den = sqrt(n') / sqrt(1 - beta3^t) + eps
//   p'  = (p * decay - step_size * m' / den - step_size_diff * v' / den) / prox_divisor
//   neg_pre_grad' = -g
// with no_prox decay = 1 - lr * wd and prox_divisor = 1, else decay = 1 and
// prox_divisor = 1 + lr * wd. The prelude declares `struct Hyper` from the step contract
// (src/family/adan/contract.rs); the host fills the bias corrections (capturable:
// adan_capturable.wgsl).

// Updates element i. The entry point calls it for every element of the segment. (The whole
// prelude interface: the module doc of src/gpu/kernel/mod.rs.)
fn update(i: u32) {
    // Every input is loaded before any output is stored: an output may alias any input.
    let p = load_param(i);
    let g = load_grad(i);
    let m_prev = load_exp_avg(i);
    let n_prev = load_exp_avg_sq(i);
    let v_prev = load_exp_avg_diff(i);
    var neg_prev = load_neg_pre_grad(i);
    if hp.first_step != 0u {
        neg_prev = -g;
    }

    let d = neg_prev + g;
    let m = m_prev * hp.beta1 + hp.one_minus_beta1 * g;
    let v = v_prev * hp.beta2 + hp.one_minus_beta2 * d;
    let z = d * hp.beta2 + g;
    let n = n_prev * hp.beta3 + hp.one_minus_beta3 * z * z;
    let denom = sqrt(n) / hp.sqrt_bias_correction3 + hp.eps;
    var p_new = p * hp.decay;
    p_new = p_new - hp.step_size * (m / denom);
    p_new = p_new - hp.step_size_diff * (v / denom);
    p_new = p_new / hp.prox_divisor;
    store_param(i, p_new);
    store_param_copy(i, p_new);
    store_exp_avg(i, m);
    store_exp_avg_sq(i, n);
    store_exp_avg_diff(i, v);
    store_neg_pre_grad(i, -g);
}
