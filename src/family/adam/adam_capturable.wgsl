// Capturable mode: the fields that depend on the step and the learning rate, from the
// device's step counter and learning rate (PyTorch's convention).
fn at_step(base: Hyper, t: f32, lr: f32) -> Hyper {
    var h = base;
    h.step_size = lr / bias_correction(base.ln_beta1, t);
    h.sqrt_bias_correction2 = sqrt(bias_correction(base.ln_beta2, t));
    if DECOUPLED_WEIGHT_DECAY {
        h.decay = 1.0 - lr * base.weight_decay;
    }
    return h;
}
