// Capturable mode: the bias corrections, the schedules of alpha and beta3 and the decay from
// the device's step counter and learning rate, in f32 (the host's in f64 otherwise).
fn at_step(base: Hyper, t: f32, lr: f32) -> Hyper {
    var h = base;
    h.lr = lr;
    h.decay = 1.0 - lr * base.weight_decay;
    h.bias_correction1 = bias_correction(base.ln_beta1, t);
    h.sqrt_bias_correction2 = sqrt(bias_correction(base.ln_beta2, t));
    if base.t_alpha > 0.0 {
        h.alpha_t = min(t * base.alpha / base.t_alpha, base.alpha);
    }
    if base.t_beta3 > 0.0 {
        // exp(ln(beta1) ln(beta3) / ((1 - s) ln(beta3) + s ln(beta1))), capped at beta3;
        // 1 - beta3_t as bias_correction(x, 1) = -expm1(x), which keeps its digits.
        let s = t / base.t_beta3;
        let x = base.ln_beta1 * base.ln_beta3 / ((1.0 - s) * base.ln_beta3 + s * base.ln_beta1);
        if x < base.ln_beta3 {
            h.beta3_t = exp(x);
            h.one_minus_beta3_t = bias_correction(x, 1.0);
        } else {
            h.beta3_t = base.beta3;
            h.one_minus_beta3_t = base.one_minus_beta3;
        }
    }
    return h;
}
