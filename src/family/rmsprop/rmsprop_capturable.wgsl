// Capturable mode: the device's learning rate (RMSprop's update does not depend on the step).
fn at_step(base: Hyper, t: f32, lr: f32) -> Hyper {
    var h = base;
    h.lr = lr;
    return h;
}
