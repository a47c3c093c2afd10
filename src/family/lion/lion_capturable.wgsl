// Capturable mode: the device's learning rate, and the decoupled decay derived from it.
fn at_step(base: Hyper, t: f32, lr: f32) -> Hyper {
    var h = base;
    h.lr = lr;
    h.decay = 1.0 - lr * base.weight_decay;
    return h;
}
