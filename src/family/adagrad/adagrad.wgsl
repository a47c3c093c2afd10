// Adagrad, one element at a time (ONNX Adagrad and PyTorch Adagrad).
//   g' = (MAXIMIZE ? -g : g) + weight_decay * p
//   h' = h + g' * g'
//   p' = p - lr * (g' / (sqrt(h') + eps))
// The host folds the learning-rate decay into `lr`:
//   ONNX:  R / (1 + T * decay_factor)        torch: lr / (1 + (step - 1) * lr_decay)

// The prelude declares MAXIMIZE and `struct Hyper` from the step contract
// (src/family/adagrad/contract.rs). L2 weight decay is skipped at run time when its coefficient is 0.

// Updates element i. The entry point calls it for every element of the segment. (The whole
// prelude interface: the module doc of src/gpu/kernel/mod.rs.)
fn update(i: u32) {
    let p = load_param(i);
    var g = load_grad(i);
    let h_prev = load_sum(i);

    if MAXIMIZE {
        g = -g;
    }
    if hp.weight_decay != S(0) {
        g = g + hp.weight_decay * p;
    }
    let h = h_prev + g * g;
    store_sum(i, h);
    // PyTorch's addcdiv divides first.
    let p_new = p - hp.lr * (g / (sqrt(h) + hp.eps));
    store_param(i, p_new);
    store_param_copy(i, p_new);
}
