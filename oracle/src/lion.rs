//! lion-pytorch's `Lion` (Chen et al. 2023, Algorithm 2), in f64: the rule of its
//! `update_fn`, transcribed from the paper and the source, not from the kernels.

/// lion-pytorch's `Lion` hyperparameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lion {
    /// `lr`.
    pub lr: f64,
    /// `betas[0]`: the old average's weight in the update's direction.
    pub beta1: f64,
    /// `betas[1]`: the old average's weight in the new average.
    pub beta2: f64,
    /// `weight_decay`: `p *= 1 - lr * weight_decay`.
    pub weight_decay: f64,
}

/// `torch.sign`: -1, 0 or 1, and 0 for NaN (ATen computes `(0 < x) - (x < 0)`, as
/// bitsandbytes' `sgn` does), so a NaN direction leaves the parameter to its decay.
pub(super) fn sign(x: f64) -> f64 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        0.0
    }
}

/// One step of `lion_pytorch.Lion` (its default `decoupled_weight_decay=False`: the weight
/// decay is used as given) on one parameter and its `exp_avg`.
pub fn lion_step(config: &Lion, param: &mut [f64], grad: &[f64], exp_avg: &mut [f64]) {
    let (lr, wd, beta1, beta2) = (config.lr, config.weight_decay, config.beta1, config.beta2);
    for ((p, &g), m) in param.iter_mut().zip(grad).zip(exp_avg.iter_mut()) {
        // p.data.mul_(1 - lr * wd)
        *p *= 1.0 - lr * wd;
        // update = exp_avg * beta1 + grad * (1 - beta1), then its sign
        let c = *m * beta1 + g * (1.0 - beta1);
        // p.add_(sign(update), alpha=-lr)
        *p += -lr * sign(c);
        // exp_avg.mul_(beta2).add_(grad, alpha=1 - beta2)
        *m = *m * beta2 + g * (1.0 - beta2);
    }
}
