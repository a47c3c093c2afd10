// ADOPT (Taniguchi et al. 2024; the official adopt.py's _single_tensor_adopt), one element at
// a time, with t the step from 1:
//   g'  = grad_sign * g + l2 * p                    maximize; coupled decay (also at t = 1)
//   t = 1 (first_step): v' = v + g' * g'            exp_avg_sq.addcmul_(grad, grad); nothing else
//   t > 1: p  = p * decay                           decouple: param.add_(param, alpha=-lr*wd)
//          x  = g' / max(sqrt(v), eps)              clamped to [-clip_bound, clip_bound]
//          m' = lerp(m, x, 1 - beta1)               exp_avg.lerp_(normed_grad, 1 - beta1)
//          p' = p - lr * m'
//          v' = v * beta2 + (1 - beta2) * g' * g'   after the update: x never sees g' itself
// The prelude declares `struct Hyper` from the step contract (src/family/adopt/contract.rs);
// ADOPT has no override constants: its modes are uniform values, tested at run time.

// Updates element i. The entry point calls it for every element of the segment. (The whole
// prelude interface: the module doc of src/gpu/kernel/mod.rs.)
fn update(i: u32) {
    // Every input is loaded before any output is stored: an output may alias any input.
    let p = load_param(i);
    var g = hp.grad_sign * load_grad(i);
    let m_prev = load_exp_avg(i);
    let v_prev = load_exp_avg_sq(i);

    if hp.l2 != S(0) {
        g = g + hp.l2 * p;
    }
    if hp.first_step != 0u {
        // The outputs may be other buffers than the inputs: the unchanged values are stored.
        store_param(i, p);
        store_param_copy(i, p);
        store_exp_avg(i, m_prev);
        store_exp_avg_sq(i, v_prev + g * g);
        return;
    }
    // torch.clamp(sqrt(v), eps) keeps a NaN root; WGSL's max need not.
    let denom = max_propagating_nan(sqrt(v_prev), R(hp.eps));
    var x = g / denom;
    // torch.clamp keeps a NaN; WGSL's clamp, and a compare-and-select that a compiler may
    // fold into min and max (Mesa's GL does), need not: the NaN is put back by its bits. An
    // infinite bound clips nothing.
    x = select(clamp(x, R(-hp.clip_bound), R(hp.clip_bound)), x, is_nan(x));
    // ATen's lerp takes another form for weights of 0.5 and more.
    var m: R;
    if abs(hp.one_minus_beta1) < S(0.5) {
        m = m_prev + hp.one_minus_beta1 * (x - m_prev);
    } else {
        m = x - (x - m_prev) * (S(1) - hp.one_minus_beta1);
    }
    let p_new = p * hp.decay - hp.lr * m;
    let v = v_prev * hp.beta2 + hp.one_minus_beta2 * g * g;
    store_param(i, p_new);
    store_param_copy(i, p_new);
    store_exp_avg(i, m);
    store_exp_avg_sq(i, v);
}
