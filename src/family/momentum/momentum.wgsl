// SGD with momentum (standard or Nesterov), and plain SGD, one element at a time.
//
// One formula covers ONNX Momentum and PyTorch SGD; the host fills `hp`:
//   g'  = (MAXIMIZE ? -g : g) + weight_decay * p            (ONNX norm_coefficient, torch L2)
//   v'  = restart ? g' : velocity_decay * v + grad_scale * g'
//         ONNX: velocity_decay = alpha, grad_scale = beta (1 when T = 0), restart = 0
//         torch: velocity_decay = momentum, grad_scale = 1 - dampening; restart on step 1,
//                where PyTorch sets the buffer to the gradient itself
//   p'  = p - lr * (NESTEROV ? g' + nesterov_scale * v' : v')
// Without VELOCITY (PyTorch momentum = 0) there is no buffer at all: p' = p - lr * g'.

// The prelude declares MAXIMIZE, NESTEROV, VELOCITY and `struct Hyper` from the step
// contract (src/family/momentum/contract.rs). L2 weight decay is skipped at run time when its
// coefficient is 0 (as PyTorch does, so a schedule that reaches 0 compiles nothing).

// Updates element i. The entry point calls it for every element of the segment. (The whole
// prelude interface: the module doc of src/gpu/kernel/mod.rs.)
fn update(i: u32) {
    // Every input is loaded before any output is stored: an output may alias any input.
    let p = load_param(i);
    var g = load_grad(i);
    let v_prev = load_momentum_buffer(i);

    if MAXIMIZE {
        g = -g;
    }
    if hp.weight_decay != S(0) {
        g = g + hp.weight_decay * p;
    }
    var direction = g;
    if VELOCITY {
        var v = hp.velocity_decay * v_prev + hp.grad_scale * g;
        if hp.restart != 0u {
            v = g;
        }
        store_momentum_buffer(i, v);
        if NESTEROV {
            direction = g + hp.nesterov_scale * v;
        } else {
            direction = v;
        }
    }
    let p_new = p - hp.lr * direction;
    store_param(i, p_new);
    store_param_copy(i, p_new);
}
