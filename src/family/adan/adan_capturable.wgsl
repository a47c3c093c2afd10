// Capturable mode: the bias corrections, the step sizes, the decay and the first step's flag
// from the device's step counter and learning rate, in f32 (the host's in f64 otherwise).
fn at_step(base: Hyper, t: f32, lr: f32) -> Hyper {
    var h = base;
    h.lr = lr;
    h.step_size = lr / bias_correction(base.ln_beta1, t);
    h.step_size_diff = lr * base.beta2 / bias_correction(base.ln_beta2, t);
    h.sqrt_bias_correction3 = sqrt(bias_correction(base.ln_beta3, t));
    if base.no_prox != 0u {
        h.decay = 1.0 - lr * base.weight_decay;
    } else {
        h.prox_divisor = 1.0 + lr * base.weight_decay;
    }
    h.first_step = select(0u, 1u, t <= 1.0);
    return h;
}
