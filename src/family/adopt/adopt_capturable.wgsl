// Capturable mode: the device's learning rate and step give the decoupled decay, the first
// step's flag and the clipping bound (t - 1)^q (pow in f32; the host's is f64).
fn at_step(base: Hyper, t: f32, lr: f32) -> Hyper {
    var h = base;
    h.lr = lr;
    h.decay = 1.0 - lr * base.weight_decay;
    h.first_step = select(0u, 1u, t <= 1.0);
    if base.clips != 0u && t > 1.0 {
        h.clip_bound = pow(t - 1.0, base.clip_exponent);
    }
    return h;
}
