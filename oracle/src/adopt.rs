//! ADOPT (Taniguchi et al., "ADOPT: Modified Adam Can Converge with Any beta2 with the
//! Optimal Rate", NeurIPS 2024) in f64, for one parameter group: the official
//! iShohei220/adopt `src/adopt/adopt.py` (commit 6468572, PyPI `torch-adopt` 0.1.0),
//! `_single_tensor_adopt`, transcribed line for line from that source and the format page's
//! rule of `adopt.ADOPT`, not from the kernels.
//!
//! The first step only initializes `exp_avg_sq = g^2`; from the second on, the gradient is
//! normalized by the previous second moment (never by its own square), clipped, and averaged.

use super::dtype::{round, DType};

/// The hyperparameters of `adopt.ADOPT`, under the official names, with its defaults
/// (`adopt.py` lines 33-47 of `ADOPT.__init__`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdoptHyperparameters {
    /// `lr`.
    pub lr: f64,
    /// `betas[0]`: the old first moment's weight.
    pub beta1: f64,
    /// `betas[1]`: the old second moment's weight.
    pub beta2: f64,
    /// `eps`: the floor of `sqrt(exp_avg_sq)` (a clamp, not an addition).
    pub eps: f64,
    /// The exponent `q` of the official `clip_lambda = lambda step: step ** q` (default
    /// 0.25), called with the number of earlier steps; `None`: no clipping.
    pub clip_lambda: Option<f64>,
    /// `weight_decay`.
    pub weight_decay: f64,
    /// `decouple`: decay the parameter (`true`) rather than add the decay to the gradient.
    pub decouple: bool,
    /// `maximize`: ascend the gradient.
    pub maximize: bool,
}

impl Default for AdoptHyperparameters {
    fn default() -> Self {
        AdoptHyperparameters {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.9999,
            eps: 1e-6,
            clip_lambda: Some(0.25),
            weight_decay: 0.0,
            decouple: false,
            maximize: false,
        }
    }
}

/// One parameter group of `adopt.ADOPT`: its step count and each tensor's state, under the
/// official names.
#[derive(Clone, Debug, PartialEq)]
pub struct AdoptOracle {
    /// The hyperparameters (may change between steps, as a schedule would).
    pub config: AdoptHyperparameters,
    /// `state['step']`: the number of steps taken (the same for every tensor of the group).
    pub step: u64,
    /// Each tensor's `exp_avg`.
    pub exp_avg: Vec<Vec<f64>>,
    /// Each tensor's `exp_avg_sq`.
    pub exp_avg_sq: Vec<Vec<f64>>,
    param_dtype: DType,
    state_dtype: DType,
}

/// `x` clamped to `[-bound, bound]`, a NaN staying NaN (as `Tensor.clamp_`).
fn clamp_symmetric(x: f64, bound: f64) -> f64 {
    if x > bound {
        bound
    } else if x < -bound {
        -bound
    } else {
        x
    }
}

/// `torch.lerp(start, end, weight)` in the two forms ATen picks by the weight.
fn lerp(start: f64, end: f64, weight: f64) -> f64 {
    if weight.abs() < 0.5 {
        start + weight * (end - start)
    } else {
        end - (end - start) * (1.0 - weight)
    }
}

impl AdoptOracle {
    /// A fresh group of `count` tensors (zero state, step 0).
    pub fn new(config: AdoptHyperparameters, count: usize) -> Self {
        AdoptOracle {
            config,
            step: 0,
            exp_avg: vec![Vec::new(); count],
            exp_avg_sq: vec![Vec::new(); count],
            param_dtype: DType::F64,
            state_dtype: DType::F64,
        }
    }

    /// Rounds, after every step, the parameters to `param` and the state to `state`.
    pub fn storing(mut self, param: DType, state: DType) -> Self {
        self.param_dtype = param;
        self.state_dtype = state;
        self
    }

    /// The clipping bound of the step after `earlier` steps: `clip_lambda(earlier)` (line
    /// 312, which passes the step count before this step's increment), or `None`.
    pub fn clip_bound(config: &AdoptHyperparameters, earlier: u64) -> Option<f64> {
        config.clip_lambda.map(|q| (earlier as f64).powf(q))
    }

    /// `step()`: every tensor of the group takes its gradient.
    pub fn step(&mut self, params: &mut [Vec<f64>], grads: &[Vec<f64>]) {
        let storing = (self.param_dtype, self.state_dtype);
        for (i, (p, grad)) in params.iter_mut().zip(grads).enumerate() {
            if self.exp_avg[i].is_empty() {
                // state['exp_avg'], state['exp_avg_sq'] = zeros (_init_group)
                self.exp_avg[i] = vec![0.0; p.len()];
                self.exp_avg_sq[i] = vec![0.0; p.len()];
            }
            let (m, v) = (&mut self.exp_avg[i], &mut self.exp_avg_sq[i]);
            adopt_step(&self.config, self.step, p, grad, m, v, storing);
        }
        // step_t += 1 (lines 303, 321)
        self.step += 1;
    }
}

/// One tensor's update in `_single_tensor_adopt` after `step` earlier steps (the official
/// `step`, read before its increment), rounding as it stores the parameter to `storing.0` and each
/// state to `storing.1` (`DType::F64`: no rounding).
pub fn adopt_step(
    config: &AdoptHyperparameters,
    step: u64,
    p: &mut [f64],
    grad: &[f64],
    m: &mut [f64],
    v: &mut [f64],
    storing: (DType, DType),
) {
    // step = _get_value(step_t), read before `step_t += 1` (lines 287, 303, 321)
    let c = *config;
    let bound = AdoptOracle::clip_bound(&c, step);
    let (pd, sd) = storing;
    for e in 0..p.len() {
        // grad = grads[i] if not maximize else -grads[i] (line 274)
        let mut g = if c.maximize { -grad[e] } else { grad[e] };
        if c.weight_decay != 0.0 && !c.decouple {
            // grad = grad.add(param, alpha=weight_decay) (lines 289-290), step 1 too
            g += c.weight_decay * p[e];
        }
        if step == 0 {
            // exp_avg_sq.addcmul_(grad, grad.conj()); continue (lines 300-304)
            v[e] = round(sd, v[e] + g * g);
            continue;
        }
        let mut x = p[e];
        if c.weight_decay != 0.0 && c.decouple {
            // param.add_(param, alpha=-lr*weight_decay) (lines 306-307)
            x += -c.lr * c.weight_decay * x;
        }
        // denom = torch.clamp(exp_avg_sq.sqrt(), eps) (line 309); clamp keeps a NaN
        // root, which f64::max would drop.
        let root = v[e].sqrt();
        let denom = if root.is_nan() { root } else { root.max(c.eps) };
        // normed_grad = grad.div(denom) (line 310)
        let mut normed = g / denom;
        if let Some(bound) = bound {
            // normed_grad.clamp_(-clip, clip) (lines 311-313)
            normed = clamp_symmetric(normed, bound);
        }
        // exp_avg.lerp_(normed_grad, 1 - beta1) (line 315)
        m[e] = round(sd, lerp(m[e], normed, 1.0 - c.beta1));
        // param.add_(exp_avg, alpha=-lr) (line 317)
        p[e] = round(pd, x + -c.lr * m[e]);
        // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2) (line 318)
        v[e] = round(sd, v[e] * c.beta2 + (1.0 - c.beta2) * g * g);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_step_only_sets_the_second_moment() {
        // Even with coupled decay (in the gradient) the parameter and exp_avg stay put.
        let config = AdoptHyperparameters { weight_decay: 0.5, ..Default::default() };
        let mut oracle = AdoptOracle::new(config, 2);
        let mut params = vec![vec![1.0, -2.0], vec![3.0]];
        oracle.step(&mut params, &[vec![0.5, 0.0], vec![-1.0]]);
        assert_eq!(params, [vec![1.0, -2.0], vec![3.0]]);
        assert_eq!(oracle.exp_avg, [vec![0.0, 0.0], vec![0.0]]);
        // g + 0.5 p, squared: (0.5 + 0.5)^2, (0 - 1)^2, (-1 + 1.5)^2.
        assert_eq!(oracle.exp_avg_sq, [vec![1.0, 1.0], vec![0.25]]);
        assert_eq!(oracle.step, 1);
    }

    #[test]
    fn decoupled_decay_waits_for_the_second_step() {
        let config =
            AdoptHyperparameters { weight_decay: 0.5, decouple: true, lr: 0.1, ..Default::default() };
        let mut oracle = AdoptOracle::new(config, 1);
        let mut params = vec![vec![2.0]];
        oracle.step(&mut params, &[vec![4.0]]);
        assert_eq!(params[0], [2.0]);
        assert_eq!(oracle.exp_avg_sq[0], [16.0]);
        // Step 2: x = 1 / sqrt(16) = 0.25 (below the bound 1^0.25 = 1); m = 0.1 * 0.25;
        // p = 2 (1 - 0.05) - 0.1 m; v = 0.9999 * 16 + 0.0001 * 1.
        oracle.step(&mut params, &[vec![1.0]]);
        let m = 0.1 * 0.25;
        assert!((oracle.exp_avg[0][0] - m).abs() < 1e-17);
        assert!((params[0][0] - (2.0 * 0.95 - 0.1 * m)).abs() < 1e-15);
        assert!((oracle.exp_avg_sq[0][0] - (0.9999 * 16.0 + 0.0001)).abs() < 1e-13);
    }

    #[test]
    fn the_normalized_gradient_is_clipped_at_the_earlier_steps_to_the_q() {
        // A tiny first gradient makes the second one's normalized value huge: clipped at
        // 1^0.25 = 1 on step 2, 2^0.25 on step 3; without clip_lambda, not at all.
        let run = |clip_lambda| {
            let config = AdoptHyperparameters { clip_lambda, lr: 1.0, ..Default::default() };
            let mut oracle = AdoptOracle::new(config, 1);
            let mut params = vec![vec![0.0]];
            oracle.step(&mut params, &[vec![1e-3]]);
            oracle.step(&mut params, &[vec![1.0]]);
            let first = oracle.exp_avg[0][0];
            oracle.step(&mut params, &[vec![-5.0]]);
            (first, oracle.exp_avg[0][0], params[0][0])
        };
        let (first, second, param) = run(Some(0.25));
        assert!((first - 0.1).abs() < 1e-16, "{first}");
        let want_second = 0.9 * first + 0.1 * -(2f64.powf(0.25));
        assert!((second - want_second).abs() < 1e-15, "{second} vs {want_second}");
        assert!((param - -(first + second)).abs() < 1e-15);
        let (first, _, _) = run(None);
        // x = 1 / max(1e-3, 1e-6) = 1000.
        assert!((first - 100.0).abs() < 1e-12, "{first}");
        assert_eq!(AdoptOracle::clip_bound(&AdoptHyperparameters::default(), 16), Some(2.0));
    }

    #[test]
    fn eps_is_a_floor_of_the_root_and_maximize_flips_the_gradient() {
        let config =
            AdoptHyperparameters { maximize: true, clip_lambda: None, lr: 1.0, ..Default::default() };
        let mut oracle = AdoptOracle::new(config, 1);
        let mut params = vec![vec![0.0]];
        oracle.step(&mut params, &[vec![0.0]]);
        oracle.step(&mut params, &[vec![-2e-6]]);
        // sqrt(0) = 0 is floored at 1e-6: x = 2e-6 / 1e-6 = 2 (maximize flips -2e-6); m = 0.2.
        assert!((oracle.exp_avg[0][0] - 0.2).abs() < 1e-15);
        assert!((params[0][0] - -0.2).abs() < 1e-15);
    }
}
