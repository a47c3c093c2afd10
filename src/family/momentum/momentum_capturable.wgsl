// Capturable mode: the device's learning rate, and PyTorch's buffer creation on step 1.
fn at_step(base: Hyper, t: f32, lr: f32) -> Hyper {
    var h = base;
    h.lr = lr;
    h.restart = select(0u, 1u, t == 1.0);
    return h;
}
