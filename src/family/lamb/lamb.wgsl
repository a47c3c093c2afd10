// LAMB (You et al. 2019; torch-optimizer's Lamb), both passes of one step:
//   moments pass (APPLY false), per element:
//     m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2     (never bias-corrected)
//     s = m / (sqrt(v) + eps) + weight_decay p                        from the stored m and v
//     the invocation's sums of p^2 and s^2, which the entry point folds into its workgroup's
//     partial (src/family/lamb/lamb_entry.wgsl)
//   the combine pass (src/family/lamb/lamb_combine.wgsl) turns each tensor's partials into its
//   weight_norm, adam_norm and trust_ratio;
//   apply pass (APPLY true), per element:
//     s as above, recomputed from the stored moments exactly as the moments pass did
//     p = p - step_size trust_ratio s                                  (lamb_rate)
// The prelude declares `struct Hyper` from the step contract (src/family/lamb/contract.rs) and
// `sum_squares(x) -> f32`. Every operation is componentwise (R may be a vec4).

// The moments pass: this invocation's sums of p^2 and s^2.
var<private> lamb_sums: vec2<f32>;
// The apply pass: step_size times the trust ratio of the invocation's tensor.
var<private> lamb_rate: f32;

// torch-optimizer's adam_step: exp_avg / (sqrt(exp_avg_sq) + eps), plus weight_decay p
// where the decay is not 0.
fn lamb_direction(p: R, m: R, v: R) -> R {
    var s = m / (sqrt(v) + hp.eps);
    if hp.weight_decay != S(0) {
        s += hp.weight_decay * p;
    }
    return s;
}

// Updates element i (or four). The entry point calls it for every element of the segment.
// (The whole prelude interface: the module doc of src/gpu/kernel/mod.rs.)
fn update(i: u32) {
    let p = load_param(i);
    if APPLY {
        let s = lamb_direction(p, load_exp_avg(i), load_exp_avg_sq(i));
        let p_new = p - S(lamb_rate) * s;
        store_param(i, p_new);
        store_param_copy(i, p_new);
        return;
    }
    // Every input is loaded before any output is stored: an output may alias an input.
    let g = load_grad(i);
    let m = hp.beta1 * load_exp_avg(i) + hp.one_minus_beta1 * g;
    let v = hp.beta2 * load_exp_avg_sq(i) + hp.one_minus_beta2 * (g * g);
    store_exp_avg(i, m);
    store_exp_avg_sq(i, v);
    // Read back as stored (rounded where the state is 16-bit), as the apply pass reads them,
    // so that the norm is the norm of the s that pass applies.
    let s = lamb_direction(p, load_exp_avg(i), load_exp_avg_sq(i));
    lamb_sums += vec2(sum_squares(p), sum_squares(s));
}
