// Capturable mode: PyTorch's decayed rate from the device's step and learning rate.
fn at_step(base: Hyper, t: f32, lr: f32) -> Hyper {
    var h = base;
    h.lr = lr / (1.0 + (t - 1.0) * base.lr_decay);
    return h;
}
