//! Schedule-Free AdamW (Defazio et al. 2024), the `schedulefree` package's
//! `AdamWScheduleFree.step()`, `eval()` and `train()`, in f64, for one parameter group.

use super::dtype::{round, DType};

/// schedulefree's `AdamWScheduleFree` hyperparameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWScheduleFree {
    /// `lr`.
    pub lr: f64,
    /// `betas[0]`: the interpolation between `z` and the average.
    pub beta1: f64,
    /// `betas[1]`: the second moment's old weight.
    pub beta2: f64,
    /// `eps`.
    pub eps: f64,
    /// `weight_decay`: added to the normalized gradient, at `y`.
    pub weight_decay: f64,
    /// `warmup_steps`: the learning rate's linear warmup.
    pub warmup_steps: u64,
    /// `r`: the power of the step in the average's weight.
    pub r: f64,
    /// `weight_lr_power`: the power of `lr_max` in the average's weight.
    pub weight_lr_power: f64,
}

/// One parameter group of `AdamWScheduleFree`: the group's `k`, `weight_sum`, `lr_max` and
/// `train_mode`, and each tensor's `z` and `exp_avg_sq`.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduleFreeOracle {
    /// The hyperparameters (may change between steps, as a schedule would).
    pub config: AdamWScheduleFree,
    /// `group['k']`: steps taken.
    pub k: u64,
    /// `group['weight_sum']`.
    pub weight_sum: f64,
    /// `group['lr_max']` (-1 before the first step).
    pub lr_max: f64,
    /// `group['train_mode']`.
    pub train_mode: bool,
    /// Each tensor's `z` (empty before its first step: the package creates it then).
    pub z: Vec<Vec<f64>>,
    /// Each tensor's `exp_avg_sq`.
    pub exp_avg_sq: Vec<Vec<f64>>,
    param_dtype: DType,
    state_dtype: DType,
}

impl ScheduleFreeOracle {
    /// A fresh group of `count` tensors (`k = 0`, `lr_max = -1`, `weight_sum = 0`, train mode).
    pub fn new(config: AdamWScheduleFree, count: usize) -> Self {
        ScheduleFreeOracle {
            config,
            k: 0,
            weight_sum: 0.0,
            lr_max: -1.0,
            train_mode: true,
            z: vec![Vec::new(); count],
            exp_avg_sq: vec![Vec::new(); count],
            param_dtype: DType::F64,
            state_dtype: DType::F64,
        }
    }

    /// Rounds, after every step and swap, the parameters to `param` and the state to `state`.
    pub fn storing(mut self, param: DType, state: DType) -> Self {
        self.param_dtype = param;
        self.state_dtype = state;
        self
    }

    /// `step()`: every tensor of the group takes its gradient (all tensors have one).
    pub fn step(&mut self, params: &mut [Vec<f64>], grads: &[Vec<f64>]) {
        assert!(self.train_mode, "the package's step() assumes train mode");
        let c = &self.config;
        let (beta1, beta2) = (c.beta1, c.beta2);
        let k = self.k;
        let sched = if k < c.warmup_steps { (k + 1) as f64 / c.warmup_steps as f64 } else { 1.0 };
        let bias_correction2 = 1.0 - beta2.powi((k + 1) as i32);
        let lr = c.lr * sched;
        self.lr_max = lr.max(self.lr_max);
        let weight = ((k + 1) as f64).powf(c.r) * self.lr_max.powf(c.weight_lr_power);
        self.weight_sum += weight;
        // Python's ZeroDivisionError, caught by the package.
        let ckp1 = if self.weight_sum == 0.0 { 0.0 } else { weight / self.weight_sum };
        let adaptive_y_lr = lr * (beta1 * (1.0 - ckp1) - 1.0);
        for (i, (p, g)) in params.iter_mut().zip(grads).enumerate() {
            if self.z[i].is_empty() {
                self.z[i] = p.clone();
                self.exp_avg_sq[i] = vec![0.0; p.len()];
            }
            let (z, v) = (&mut self.z[i], &mut self.exp_avg_sq[i]);
            for e in 0..p.len() {
                v[e] = v[e] * beta2 + (1.0 - beta2) * g[e] * g[e];
                let denom = (v[e] / bias_correction2).sqrt() + c.eps;
                let mut u = g[e] / denom;
                if c.weight_decay != 0.0 {
                    u += c.weight_decay * p[e];
                }
                p[e] += ckp1 * (z[e] - p[e]);
                p[e] += adaptive_y_lr * u;
                z[e] -= lr * u;
                p[e] = round(self.param_dtype, p[e]);
                z[e] = round(self.state_dtype, z[e]);
                v[e] = round(self.state_dtype, v[e]);
            }
        }
        self.k = k + 1;
    }

    /// `eval()`: in train mode, each parameter with state becomes `lerp(y, z, 1 - 1/beta1)`.
    pub fn eval(&mut self, params: &mut [Vec<f64>]) {
        if self.train_mode {
            let weight = 1.0 - 1.0 / self.config.beta1;
            self.swap(params, weight);
        }
        self.train_mode = false;
    }

    /// `train()`: in eval mode, each parameter with state becomes `lerp(x, z, 1 - beta1)`.
    pub fn train(&mut self, params: &mut [Vec<f64>]) {
        if !self.train_mode {
            let weight = 1.0 - self.config.beta1;
            self.swap(params, weight);
        }
        self.train_mode = true;
    }

    fn swap(&self, params: &mut [Vec<f64>], weight: f64) {
        for (p, z) in params.iter_mut().zip(&self.z).filter(|(_, z)| !z.is_empty()) {
            for (p, z) in p.iter_mut().zip(z) {
                *p = round(self.param_dtype, *p + weight * (z - *p));
            }
        }
    }
}
