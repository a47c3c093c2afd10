// RMSprop (PyTorch's `_single_tensor_rmsprop`), one element at a time.
//   g'   = (MAXIMIZE ? -g : g) + weight_decay * p
//   s'   = s * alpha + (1 - alpha) * g' * g'                 square_avg.mul_(alpha).addcmul_(g, g, 1 - alpha)
//   CENTERED: a' = lerp(a, g', 1 - alpha)                    grad_avg.lerp_(g, 1 - alpha)
//             avg = sqrt(s' - a' * a') + eps                 square_avg.addcmul(a, a, value=-1).sqrt_().add_(eps)
//   else:     avg = sqrt(s') + eps
//   MOMENTUM: b' = b * momentum + g' / avg,  p' = p - lr * b'
//   else:     p' = p - lr * (g' / avg), or with STEP_WITH_RAW_GRAD (bitsandbytes' 8-bit
//             kernel) p' = p - lr * (g / avg): the state takes the decayed gradient, the
//             parameter the gradient as loaded.

// The prelude declares MAXIMIZE, CENTERED, MOMENTUM, LERP_FROM_GRAD, STEP_WITH_RAW_GRAD and
// `struct Hyper` from the step contract (src/family/rmsprop/contract.rs). LERP_FROM_GRAD picks the form
// ATen's lerp takes for weights of 0.5 and more. L2 weight decay is skipped at run time when
// its coefficient is 0. The absent slots (grad_avg when not centered, momentum_buffer without
// momentum) load 0 and are never stored.

// Updates element i. The entry point calls it for every element of the segment. (The whole
// prelude interface: the module doc of src/gpu/kernel/mod.rs.)
fn update(i: u32) {
    // Every input is loaded before any output is stored: an output may alias any input.
    let p = load_param(i);
    var g = load_grad(i);
    // bitsandbytes' 8-bit kernel steps the parameter with the gradient as loaded.
    let g_loaded = g;
    let s_prev = load_square_avg(i);
    let b_prev = load_momentum_buffer(i);
    let a_prev = load_grad_avg(i);

    if MAXIMIZE {
        g = -g;
    }
    if hp.weight_decay != S(0) {
        g = g + hp.weight_decay * p;
    }
    let s = s_prev * hp.alpha + hp.one_minus_alpha * g * g;
    var avg: R;
    if CENTERED {
        var a: R;
        if LERP_FROM_GRAD {
            a = g - (g - a_prev) * (S(1) - hp.one_minus_alpha);
        } else {
            a = a_prev + hp.one_minus_alpha * (g - a_prev);
        }
        store_grad_avg(i, a);
        avg = sqrt(s - a * a);
    } else {
        avg = sqrt(s);
    }
    avg = avg + hp.eps;
    var p_new: R;
    if MOMENTUM {
        let b = b_prev * hp.momentum + g / avg;
        store_momentum_buffer(i, b);
        p_new = p - hp.lr * b;
    } else {
        // PyTorch's addcdiv divides first.
        var step_grad = g;
        if STEP_WITH_RAW_GRAD {
            step_grad = g_loaded;
        }
        p_new = p - hp.lr * (step_grad / avg);
    }
    store_square_avg(i, s);
    store_param(i, p_new);
    store_param_copy(i, p_new);
}
