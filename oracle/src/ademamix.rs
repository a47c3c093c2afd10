//! bitsandbytes' `AdEMAMix` (Pagliardini et al. 2024, Algorithm 1), in f64: the FORMAT.md
//! rule of `bnb.AdEMAMix`, transcribed from the paper and bitsandbytes' reference update,
//! not from the kernels.

/// bitsandbytes' `AdEMAMix` hyperparameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdEMAMix {
    /// `lr`.
    pub lr: f64,
    /// `betas[0]`: the fast EMA's old weight.
    pub beta1: f64,
    /// `betas[1]`: the second moment's old weight.
    pub beta2: f64,
    /// `betas[2]`: the slow EMA's old weight (after its warmup).
    pub beta3: f64,
    /// `alpha`: the slow EMA's weight in the update (after its warmup).
    pub alpha: f64,
    /// `t_alpha`: `alpha`'s warmup steps (`None`: none).
    pub t_alpha: Option<u64>,
    /// `t_beta3`: `beta3`'s warmup steps (`None`: none).
    pub t_beta3: Option<u64>,
    /// `eps`.
    pub eps: f64,
    /// `weight_decay`: decoupled.
    pub weight_decay: f64,
}

/// `alpha_t = min(t alpha / t_alpha, alpha)`, or `alpha` without a warmup.
pub fn ademamix_alpha(config: &AdEMAMix, t: u64) -> f64 {
    match config.t_alpha {
        Some(t_alpha) => (t as f64 * config.alpha / t_alpha as f64).min(config.alpha),
        None => config.alpha,
    }
}

/// `beta3_t = min(exp(ln(beta1) ln(beta3) / ((1 - s) ln(beta3) + s ln(beta1))), beta3)` with
/// `s = t / t_beta3`, or `beta3` without a warmup.
pub fn ademamix_beta3(config: &AdEMAMix, t: u64) -> f64 {
    match config.t_beta3 {
        Some(t_beta3) => {
            let s = t as f64 / t_beta3 as f64;
            let (ln1, ln3) = (config.beta1.ln(), config.beta3.ln());
            (ln1 * ln3 / ((1.0 - s) * ln3 + s * ln1)).exp().min(config.beta3)
        }
        None => config.beta3,
    }
}

/// One step `t` (from 1) of `bnb.optim.AdEMAMix` on one parameter and its states `m1` (the
/// fast EMA), `m2` (the slow EMA) and `nu`.
pub fn ademamix_step(
    config: &AdEMAMix,
    t: u64,
    param: &mut [f64],
    grad: &[f64],
    m1: &mut [f64],
    m2: &mut [f64],
    nu: &mut [f64],
) {
    let (beta1, beta2) = (config.beta1, config.beta2);
    let alpha = ademamix_alpha(config, t);
    let beta3 = ademamix_beta3(config, t);
    let correction1 = 1.0 - beta1.powf(t as f64);
    let correction2 = (1.0 - beta2.powf(t as f64)).sqrt();
    for i in 0..param.len() {
        let g = grad[i];
        m1[i] = m1[i] * beta1 + (1.0 - beta1) * g;
        m2[i] = m2[i] * beta3 + (1.0 - beta3) * g;
        nu[i] = nu[i] * beta2 + (1.0 - beta2) * g * g;
        param[i] *= 1.0 - config.lr * config.weight_decay;
        let update = (m1[i] / correction1 + alpha * m2[i]) / (nu[i].sqrt() / correction2 + config.eps);
        param[i] += -config.lr * update;
    }
}
