// AdEMAMix (Pagliardini et al. 2024; bitsandbytes' AdEMAMix), one element at a time:
//   m1' = beta1 * m1 + (1 - beta1) * g              the fast EMA
//   m2' = beta3_t * m2 + (1 - beta3_t) * g          the slow EMA (beta3 warmed up by the host)
//   nu' = beta2 * nu + (1 - beta2) * g * g
//   p'  = p * decay - lr * ((m1' / (1 - beta1^t) + alpha_t * m2') / (sqrt(nu') / sqrt(1 - beta2^t) + eps))
// or, with the override DECAY_AFTER_UPDATE (bitsandbytes' kernels, 8-bit state),
//   p'  = (p - lr * (...)) * decay.
// The prelude declares `struct Hyper` from the step contract (src/family/ademamix/contract.rs); the
// host fills the step's schedules and bias corrections (capturable: ademamix_capturable.wgsl).

// Updates element i. The entry point calls it for every element of the segment. (The whole
// prelude interface: the module doc of src/gpu/kernel/mod.rs.)
fn update(i: u32) {
    // Every input is loaded before any output is stored: an output may alias any input.
    let p = load_param(i);
    let g = load_grad(i);
    let m1_prev = load_exp_avg(i);
    let m2_prev = load_exp_avg_slow(i);
    let nu_prev = load_exp_avg_sq(i);

    let m1 = hp.beta1 * m1_prev + hp.one_minus_beta1 * g;
    let m2 = hp.beta3_t * m2_prev + hp.one_minus_beta3_t * g;
    let nu = hp.beta2 * nu_prev + hp.one_minus_beta2 * g * g;
    let denom = sqrt(nu) / hp.sqrt_bias_correction2 + hp.eps;
    let u = (m1 / hp.bias_correction1 + hp.alpha_t * m2) / denom;
    var p_new: R;
    if DECAY_AFTER_UPDATE {
        p_new = (p - hp.lr * u) * hp.decay;
    } else {
        p_new = p * hp.decay - hp.lr * u;
    }
    store_param(i, p_new);
    store_param_copy(i, p_new);
    store_exp_avg(i, m1);
    store_exp_avg_slow(i, m2);
    store_exp_avg_sq(i, nu);
}
