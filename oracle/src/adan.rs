//! Adan (Xie et al., "Adan: Adaptive Nesterov Momentum Algorithm for Faster Optimizing Deep
//! Models", 2022) in f64, for one parameter group: the official sail-sg/Adan `adan.py`
//! (commit 2c65bea), `Adan.step` and `_single_tensor_adan`, transcribed line for line from
//! that source and the format page's rule of `adan.Adan`, not from the kernels.
//!
//! The official `betas` are each the weight of the OLD value (default `(0.98, 0.92, 0.99)`);
//! the paper's Algorithm 1 writes `1 -` them, has no bias correction and puts `eps` inside
//! the root: the code, which the conformance vectors follow, is what this file transcribes.

use super::dtype::{round, DType};

/// The hyperparameters of `adan.Adan`, under the official names, with its defaults
/// (`adan.py` lines 47-55 of `Adan.__init__`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdanHyperparameters {
    /// `lr`.
    pub lr: f64,
    /// `betas[0]`: the old first moment's weight.
    pub beta1: f64,
    /// `betas[1]`: the old gradient-difference moment's weight.
    pub beta2: f64,
    /// `betas[2]`: the old second moment's weight.
    pub beta3: f64,
    /// `eps`: added to the denominator outside the root, and to the global norm when clipping.
    pub eps: f64,
    /// `weight_decay`.
    pub weight_decay: f64,
    /// `max_grad_norm`: the global gradient norm's bound (0: no clipping).
    pub max_grad_norm: f64,
    /// `no_prox`: decay the parameter before the update (`true`) rather than the proximal
    /// division after it (`false`, the default).
    pub no_prox: bool,
}

impl Default for AdanHyperparameters {
    fn default() -> Self {
        AdanHyperparameters {
            lr: 1e-3,
            beta1: 0.98,
            beta2: 0.92,
            beta3: 0.99,
            eps: 1e-8,
            weight_decay: 0.0,
            max_grad_norm: 0.0,
            no_prox: false,
        }
    }
}

/// One parameter group of `adan.Adan`: its step count and each tensor's state, under the
/// official names.
#[derive(Clone, Debug, PartialEq)]
pub struct AdanOracle {
    /// The hyperparameters (may change between steps, as a schedule would).
    pub config: AdanHyperparameters,
    /// `group['step']`: the number of steps taken.
    pub step: u64,
    /// Each tensor's `exp_avg` (m).
    pub exp_avg: Vec<Vec<f64>>,
    /// Each tensor's `exp_avg_diff` (v, the moment of gradient differences).
    pub exp_avg_diff: Vec<Vec<f64>>,
    /// Each tensor's `exp_avg_sq` (n).
    pub exp_avg_sq: Vec<Vec<f64>>,
    /// Each tensor's `neg_pre_grad`: minus the last step's clipped gradient.
    pub neg_pre_grad: Vec<Vec<f64>>,
    /// The factor the last step's gradients were scaled by (1 when not clipped).
    pub clip_coefficient: f64,
    param_dtype: DType,
    state_dtype: DType,
}

impl AdanOracle {
    /// A fresh group of `count` tensors (zero state, step 0).
    pub fn new(config: AdanHyperparameters, count: usize) -> Self {
        AdanOracle {
            config,
            step: 0,
            exp_avg: vec![Vec::new(); count],
            exp_avg_diff: vec![Vec::new(); count],
            exp_avg_sq: vec![Vec::new(); count],
            neg_pre_grad: vec![Vec::new(); count],
            clip_coefficient: 1.0,
            param_dtype: DType::F64,
            state_dtype: DType::F64,
        }
    }

    /// Rounds, after every step, the parameters (and the clipped gradients, which the
    /// official code scales in place in the gradients' storage) to `param`, and the state to
    /// `state`.
    pub fn storing(mut self, param: DType, state: DType) -> Self {
        self.param_dtype = param;
        self.state_dtype = state;
        self
    }

    /// The factor `step()` scales every gradient by: `min(1, max_grad_norm / (norm + eps))`
    /// with `norm` the L2 norm of all the group's gradients together, or 1 without clipping
    /// (`adan.py` lines 133-152).
    pub fn clip_coefficient_of(config: &AdanHyperparameters, grads: &[Vec<f64>]) -> f64 {
        if config.max_grad_norm > 0.0 {
            // global_grad_norm.add_(grad.pow(2).sum()), over every tensor; then its sqrt
            let global_grad_norm = grads.iter().flatten().map(|g| g * g).sum::<f64>().sqrt();
            // torch.clamp(max_grad_norm / (global_grad_norm + group['eps']), max=1.0)
            (config.max_grad_norm / (global_grad_norm + config.eps)).min(1.0)
        } else {
            1.0
        }
    }

    /// `step()`: every tensor of the group takes its gradient.
    pub fn step(&mut self, params: &mut [Vec<f64>], grads: &[Vec<f64>]) {
        let c = self.config;
        let (beta1, beta2, beta3) = (c.beta1, c.beta2, c.beta3);
        let clip = AdanOracle::clip_coefficient_of(&c, grads);
        self.clip_coefficient = clip;
        // group['step'] += 1 (lines 166-169)
        self.step += 1;
        let t = self.step as i32;
        // lines 171-173 and 211
        let bias_correction1 = 1.0 - beta1.powi(t);
        let bias_correction2 = 1.0 - beta2.powi(t);
        let bias_correction3_sqrt = (1.0 - beta3.powi(t)).sqrt();
        // lines 281-282
        let step_size_diff = c.lr * beta2 / bias_correction2;
        let step_size = c.lr / bias_correction1;
        let (pd, sd) = (self.param_dtype, self.state_dtype);
        for (i, (p, grad)) in params.iter_mut().zip(grads).enumerate() {
            // grad.mul_(clip_global_grad_norm) (line 265), in the gradient's own storage.
            let grad: Vec<f64> = grad.iter().map(|g| round(pd, g * clip)).collect();
            if self.exp_avg[i].is_empty() {
                // state['exp_avg'], ['exp_avg_sq'], ['exp_avg_diff'] = zeros (lines 182-185)
                self.exp_avg[i] = vec![0.0; p.len()];
                self.exp_avg_diff[i] = vec![0.0; p.len()];
                self.exp_avg_sq[i] = vec![0.0; p.len()];
            }
            if self.step == 1 {
                // state['neg_pre_grad'] = p.grad.clone().mul_(-clip_global_grad_norm) (lines
                // 187-189): minus the clipped gradient, so the first difference is 0.
                self.neg_pre_grad[i] = grad.iter().map(|g| -g).collect();
            }
            let (m, v, n) = (&mut self.exp_avg[i], &mut self.exp_avg_diff[i], &mut self.exp_avg_sq[i]);
            let neg_pre_grad = &mut self.neg_pre_grad[i];
            for e in 0..p.len() {
                let g = grad[e];
                // neg_grad_or_diff.add_(grad): the difference d = g - g_prev (line 269)
                let d = neg_pre_grad[e] + g;
                // exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1) (line 271)
                m[e] = round(sd, m[e] * beta1 + (1.0 - beta1) * g);
                // exp_avg_diff.mul_(beta2).add_(neg_grad_or_diff, alpha=1 - beta2) (272-273)
                v[e] = round(sd, v[e] * beta2 + (1.0 - beta2) * d);
                // neg_grad_or_diff.mul_(beta2).add_(grad) (line 275)
                let z = d * beta2 + g;
                // exp_avg_sq.mul_(beta3).addcmul_(z, z, value=1 - beta3) (lines 276-278)
                n[e] = round(sd, n[e] * beta3 + (1.0 - beta3) * z * z);
                // denom = ((exp_avg_sq).sqrt() / bias_correction3_sqrt).add_(eps) (line 280)
                let denom = n[e].sqrt() / bias_correction3_sqrt + c.eps;
                let mut x = p[e];
                if c.no_prox {
                    // param.mul_(1 - lr * weight_decay), then both addcdiv_ (lines 284-287)
                    x *= 1.0 - c.lr * c.weight_decay;
                    x += -step_size * (m[e] / denom);
                    x += -step_size_diff * (v[e] / denom);
                } else {
                    // both addcdiv_, then param.div_(1 + lr * weight_decay) (lines 288-291)
                    x += -step_size * (m[e] / denom);
                    x += -step_size_diff * (v[e] / denom);
                    x /= 1.0 + c.lr * c.weight_decay;
                }
                p[e] = round(pd, x);
                // neg_grad_or_diff.zero_().add_(grad, alpha=-1.0) (line 293)
                neg_pre_grad[e] = round(sd, -g);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_difference_is_zero_and_the_first_step_is_bias_corrected_sign_like() {
        let config = AdanHyperparameters::default();
        let mut oracle = AdanOracle::new(config, 1);
        let mut params = vec![vec![1.0, -2.0, 0.5]];
        oracle.step(&mut params, &[vec![0.5, -0.25, 0.0]]);
        // d = g - g = 0: exp_avg_diff stays 0 and n = 0.01 g^2.
        assert_eq!(oracle.exp_avg_diff[0], [0.0, 0.0, 0.0]);
        assert_eq!(oracle.neg_pre_grad[0], [-0.5, 0.25, -0.0]);
        let n0 = 0.01 * 0.5 * 0.5;
        assert!((oracle.exp_avg_sq[0][0] - n0).abs() < 1e-16);
        // Bias-corrected, m / (1 - 0.98) = g and sqrt(n) / sqrt(1 - 0.99) = |g|: the update
        // is g / (|g| + eps), one lr towards minus the gradient's sign (0 for a 0 gradient).
        let expected = [1.0 - 1e-3 * 0.5 / (0.5 + 1e-8), -2.0 + 1e-3 * 0.25 / (0.25 + 1e-8), 0.5];
        for (got, want) in params[0].iter().zip(expected) {
            assert!((got - want).abs() < 1e-15, "{got} vs {want}");
        }
    }

    /// Step 2 on one element, by hand: g1 = 1, g2 = 3 (d = 2), lr 0.1, weight decay 0.5.
    fn second_step(no_prox: bool) -> f64 {
        let config = AdanHyperparameters { lr: 0.1, weight_decay: 0.5, no_prox, ..Default::default() };
        let mut oracle = AdanOracle::new(config, 1);
        let mut params = vec![vec![2.0]];
        oracle.step(&mut params, &[vec![1.0]]);
        let after_first = params[0][0];
        oracle.step(&mut params, &[vec![3.0]]);
        // m = 0.98 * 0.02 + 0.02 * 3 = 0.0796; v = 0.08 * 2 = 0.16;
        // n = 0.99 * 0.01 * 1 + 0.01 * (3 + 0.92 * 2)^2 = 0.0099 + 0.234256 = 0.244156.
        assert!((oracle.exp_avg[0][0] - 0.0796).abs() < 1e-15);
        assert!((oracle.exp_avg_diff[0][0] - 0.16).abs() < 1e-15);
        assert!((oracle.exp_avg_sq[0][0] - 0.244156).abs() < 1e-15);
        assert_eq!(oracle.neg_pre_grad[0][0], -3.0);
        let denom = (0.244156f64).sqrt() / (1.0 - 0.99f64 * 0.99).sqrt() + 1e-8;
        let update = (0.0796 / (1.0 - 0.98f64 * 0.98) + 0.92 * 0.16 / (1.0 - 0.92f64 * 0.92)) / denom;
        let want = if no_prox {
            after_first * (1.0 - 0.1 * 0.5) - 0.1 * update
        } else {
            (after_first - 0.1 * update) / (1.0 + 0.1 * 0.5)
        };
        assert!((params[0][0] - want).abs() < 1e-14, "{} vs {want}", params[0][0]);
        params[0][0]
    }

    #[test]
    fn proximal_and_no_prox_decay_follow_their_formulas_and_differ() {
        let (prox, no_prox) = (second_step(false), second_step(true));
        assert!((prox - no_prox).abs() > 1e-3, "{prox} vs {no_prox}");
    }

    #[test]
    fn clipping_scales_by_the_global_norm_with_adans_eps() {
        let config = AdanHyperparameters { max_grad_norm: 1.0, eps: 1e-3, ..Default::default() };
        // Norm 5 over both tensors together: factor 1 / (5 + 1e-3).
        let grads = [vec![3.0], vec![0.0, 4.0]];
        let factor = 1.0 / (5.0 + 1e-3);
        assert_eq!(AdanOracle::clip_coefficient_of(&config, &grads), factor);
        let mut oracle = AdanOracle::new(config, 2);
        let mut params = vec![vec![0.0], vec![0.0, 0.0]];
        oracle.step(&mut params, &grads);
        assert_eq!(oracle.clip_coefficient, factor);
        assert_eq!(oracle.neg_pre_grad[1], [-0.0, -4.0 * factor]);
        // Below the bound, nothing is scaled.
        let small = [vec![0.3], vec![0.4]];
        assert_eq!(AdanOracle::clip_coefficient_of(&config, &small), 1.0);
        let unclipped = AdanHyperparameters::default();
        assert_eq!(AdanOracle::clip_coefficient_of(&unclipped, &grads), 1.0);
    }
}
