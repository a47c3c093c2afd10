//! LAMB (You et al. 2019), torch-optimizer 0.3.0's `Lamb.step()`, in f64, for one parameter
//! group: transcribed from the package's source (and the format page's rule), not from the
//! kernels.

use super::dtype::{round, DType};

/// torch-optimizer's `Lamb` hyperparameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lamb {
    /// `lr`.
    pub lr: f64,
    /// `betas[0]`.
    pub beta1: f64,
    /// `betas[1]`.
    pub beta2: f64,
    /// `eps`: added to the root of `exp_avg_sq`.
    pub eps: f64,
    /// `weight_decay`: added to the Adam step.
    pub weight_decay: f64,
    /// `clamp_value`: the weight norm's upper bound.
    pub clamp_value: f64,
    /// `adam`: a trust ratio of 1 (plain Adam's step).
    pub adam: bool,
    /// `debias`: bias-correct the step size.
    pub debias: bool,
}

/// The norms `Lamb.step()` keeps in a tensor's state at its last step.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LambOracleNorms {
    /// `state['weight_norm']`: `p.pow(2).sum().sqrt().clamp(0, clamp_value)`.
    pub weight_norm: f64,
    /// `state['adam_norm']`: `adam_step.pow(2).sum().sqrt()`.
    pub adam_norm: f64,
    /// `state['trust_ratio']`, as computed (also where `adam` makes the step use 1).
    pub trust_ratio: f64,
}

/// One parameter group of `torch_optimizer.Lamb`: its step count and each tensor's
/// `exp_avg`, `exp_avg_sq` and last norms.
#[derive(Clone, Debug, PartialEq)]
pub struct LambOracle {
    /// The hyperparameters (may change between steps, as a schedule would).
    pub config: Lamb,
    /// `state['step']` (the same for every tensor of the group).
    pub step: u64,
    /// Each tensor's `exp_avg`.
    pub exp_avg: Vec<Vec<f64>>,
    /// Each tensor's `exp_avg_sq`.
    pub exp_avg_sq: Vec<Vec<f64>>,
    /// Each tensor's norms at the last step.
    pub norms: Vec<LambOracleNorms>,
    param_dtype: DType,
    state_dtype: DType,
}

impl LambOracle {
    /// A fresh group of `count` tensors (zero state, step 0).
    pub fn new(config: Lamb, count: usize) -> Self {
        LambOracle {
            config,
            step: 0,
            exp_avg: vec![Vec::new(); count],
            exp_avg_sq: vec![Vec::new(); count],
            norms: vec![LambOracleNorms::default(); count],
            param_dtype: DType::F64,
            state_dtype: DType::F64,
        }
    }

    /// Rounds, after every step, the parameters to `param` and the state to `state` (the
    /// norms are taken of the stored state, as a storage of that dtype would give them).
    pub fn storing(mut self, param: DType, state: DType) -> Self {
        self.param_dtype = param;
        self.state_dtype = state;
        self
    }

    /// `step()`: every tensor of the group takes its gradient.
    pub fn step(&mut self, params: &mut [Vec<f64>], grads: &[Vec<f64>]) {
        let c = self.config;
        let (beta1, beta2) = (c.beta1, c.beta2);
        self.step += 1;
        let t = self.step as i32;
        // bias_correction = sqrt(1 - beta2^t) / (1 - beta1^t) if debias else 1
        let bias_correction =
            if c.debias { (1.0 - beta2.powi(t)).sqrt() / (1.0 - beta1.powi(t)) } else { 1.0 };
        let step_size = c.lr * bias_correction;
        let (pd, sd) = (self.param_dtype, self.state_dtype);
        for (i, (p, g)) in params.iter_mut().zip(grads).enumerate() {
            if self.exp_avg[i].is_empty() {
                self.exp_avg[i] = vec![0.0; p.len()];
                self.exp_avg_sq[i] = vec![0.0; p.len()];
            }
            let (m, v) = (&mut self.exp_avg[i], &mut self.exp_avg_sq[i]);
            for e in 0..p.len() {
                // exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                m[e] = round(sd, m[e] * beta1 + (1.0 - beta1) * g[e]);
                // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                v[e] = round(sd, v[e] * beta2 + (1.0 - beta2) * g[e] * g[e]);
            }
            // weight_norm = p.data.pow(2).sum().sqrt().clamp(0, clamp_value)
            let weight_norm = p.iter().map(|x| x * x).sum::<f64>().sqrt().clamp(0.0, c.clamp_value);
            // adam_step = exp_avg / exp_avg_sq.sqrt().add(eps); adam_step.add_(p, alpha=wd)
            let adam_step: Vec<f64> = (0..p.len())
                .map(|e| {
                    let s = m[e] / (v[e].sqrt() + c.eps);
                    if c.weight_decay != 0.0 {
                        s + c.weight_decay * p[e]
                    } else {
                        s
                    }
                })
                .collect();
            let adam_norm = adam_step.iter().map(|x| x * x).sum::<f64>().sqrt();
            let trust_ratio =
                if weight_norm == 0.0 || adam_norm == 0.0 { 1.0 } else { weight_norm / adam_norm };
            self.norms[i] = LambOracleNorms { weight_norm, adam_norm, trust_ratio };
            // if self.adam: trust_ratio = 1
            let applied = if c.adam { 1.0 } else { trust_ratio };
            // p.data.add_(adam_step, alpha=-step_size * trust_ratio)
            for (x, s) in p.iter_mut().zip(&adam_step) {
                *x = round(pd, *x - step_size * applied * s);
            }
        }
    }
}
