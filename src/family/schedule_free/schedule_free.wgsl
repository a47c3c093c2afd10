// Schedule-Free AdamW (the `schedulefree` package's AdamWScheduleFree), one element at a time.
// The parameter holds y in train mode; the state keeps z and exp_avg_sq. The host computes,
// per group, the rate lr (warmup folded in), the averaging weight c = ckp1 and
// y_rate = lr (beta1 (1 - c) - 1) from the group's k, weight_sum and lr_max:
//   v' = beta2 v + (1 - beta2) g^2
//   u  = g / (sqrt(v' / (1 - beta2^(k+1))) + eps) + weight_decay y   (decay at y)
//   y' = lerp(y, z, c) + y_rate u
//   z' = z - lr u
// in the package's order (`p.lerp_(z, ckp1)`, `p.add_(u, alpha=adaptive_y_lr)`,
// `z.sub_(u, alpha=lr)`). At the group's first step z is the parameter itself (`first`).
//
// SWAP (eval()/train()): only param = lerp(param, z, swap_weight); the gradient is not read
// and the state is not written.

// The prelude declares SWAP and `struct Hyper` from the step contract
// (src/family/schedule_free/contract.rs).

// Updates element i. The entry point calls it for every element of the segment. (The whole
// prelude interface: the module doc of src/gpu/kernel/mod.rs.)
fn update(i: u32) {
    let y = load_param(i);
    var z = load_z(i);
    if SWAP {
        let p_swapped = y + hp.swap_weight * (z - y);
        store_param(i, p_swapped);
        store_param_copy(i, p_swapped);
        return;
    }
    let g = load_grad(i);
    let v_prev = load_exp_avg_sq(i);
    if hp.first != S(0) {
        z = y;
    }

    let v = v_prev * hp.beta2 + hp.one_minus_beta2 * g * g;
    let denom = sqrt(v / hp.bias_correction2) + hp.eps;
    var u = g / denom;
    if hp.weight_decay != S(0) {
        u = u + hp.weight_decay * y;
    }
    let y_mid = y + hp.ckp1 * (z - y);
    let y_new = y_mid + hp.y_rate * u;
    let z_new = z - hp.lr * u;
    store_param(i, y_new);
    store_param_copy(i, y_new);
    store_z(i, z_new);
    store_exp_avg_sq(i, v);
}
