// Lion (Chen et al. 2023; lion-pytorch's update_fn), one element at a time:
//   c  = beta1 * m + (1 - beta1) * g        the update's direction
//   p' = p * decay - lr * sign(c)           decay = 1 - lr * weight_decay; sign(0) = 0
//   m' = beta2 * m + (1 - beta2) * g        the running average, after the update
// The prelude declares `struct Hyper` from the step contract (src/family/lion/contract.rs); Lion has
// no override constants. Every operation is componentwise (R may be a vec4).

// Updates element i. The entry point calls it for every element of the segment. (The whole
// prelude interface: the module doc of src/gpu/kernel/mod.rs.)
fn update(i: u32) {
    // Every input is loaded before any output is stored: an output may alias any input.
    let p = load_param(i);
    let g = load_grad(i);
    let m_prev = load_exp_avg(i);

    let c = hp.beta1 * m_prev + hp.one_minus_beta1 * g;
    // lion-pytorch: p.mul_(1 - lr * wd), then p.add_(sign(c), alpha=-lr).
    // sign(c) as torch.sign and bitsandbytes' `sgn`, `(0 < c) - (c < 0)`: 0 for 0 and for NaN,
    // so a NaN gradient leaves its parameter to the decay (WGSL's sign leaves NaN to the
    // implementation).
    let direction = select(select(R(0), R(-1), c < R(0)), R(1), c > R(0));
    let p_new = p * hp.decay - hp.lr * direction;
    let m = hp.beta2 * m_prev + hp.one_minus_beta2 * g;
    store_param(i, p_new);
    store_param_copy(i, p_new);
    store_exp_avg(i, m);
}
