// Capturable mode: the step counter, the AMP flag and the unscale factor live in one small
// device buffer (`DeviceHeader`, declared from src/step/device.rs), so a trainer never reads
// back or rewrites them per step.

// 1 - beta^t = -expm1(t ln beta), accurate in f32 at small t: a series where t ln beta is
// small (1 - exp(x) would cancel), 1 - exp(x) elsewhere.
fn bias_correction(ln_beta: f32, t: f32) -> f32 {
    let x = t * ln_beta;
    if x > -0.25 {
        let series = 1.0 + x * (0.5 + x * (1.0 / 6.0 + x * (1.0 / 24.0 + x * (1.0 / 120.0 + x * (1.0 / 720.0 + x / 5040.0)))));
        return -x * series;
    }
    return 1.0 - exp(x);
}
