//! `torch.optim.Adafactor` (Shazeer & Stern 2018, as torch 2.15's `_single_tensor_adafactor`
//! runs it), in f64, for one parameter group: transcribed from the source and the rules of
//! `tests/vectors/FORMAT.md`, not from the kernels.
//!
//! Non-finite values go through IEEE arithmetic as in torch: its `clamp` keeps a NaN, while
//! the host's Python `max` (of `alpha` and of the clipping denominator) drops one.

use super::dtype::{round, DType};

/// `torch.optim.Adafactor`'s hyperparameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adafactor {
    /// `lr`: the relative step size's bound.
    pub lr: f64,
    /// `beta2_decay`: the exponent of `t` in the second moment's weight.
    pub beta2_decay: f64,
    /// `eps[0]`: the variance estimate's floor (`None`: the parameter dtype's machine
    /// epsilon).
    pub eps1: Option<f64>,
    /// `eps[1]`: the parameter scale's floor.
    pub eps2: f64,
    /// `d`: the update's clipping threshold.
    pub d: f64,
    /// `weight_decay`: decoupled.
    pub weight_decay: f64,
    /// `maximize`: ascend the gradient.
    pub maximize: bool,
}

/// One tensor's Adafactor state: `step`, and `row_var`/`col_var` (2 or more dimensions,
/// flat, in torch's shapes `[.., rows, 1]` and `[.., 1, cols]`) or `variance` (a vector).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AdafactorTensorState {
    /// `state["step"]`.
    pub step: u64,
    /// `state["row_var"]`, `batches * rows` values (empty for a vector).
    pub row_var: Vec<f64>,
    /// `state["col_var"]`, `batches * cols` values (empty for a vector).
    pub col_var: Vec<f64>,
    /// `state["variance"]` (empty for a tensor of 2 or more dimensions).
    pub variance: Vec<f64>,
}

/// One parameter group of `torch.optim.Adafactor`.
#[derive(Clone, Debug, PartialEq)]
pub struct AdafactorOracle {
    /// The hyperparameters (may change between steps, as a schedule would).
    pub config: Adafactor,
    /// Each tensor's shape.
    pub shapes: Vec<Vec<usize>>,
    /// Each tensor's state.
    pub state: Vec<AdafactorTensorState>,
    /// The parameters' storage dtype: each parameter is rounded to it after every step, and
    /// `eps1 = None` is its machine epsilon.
    pub param_dtype: DType,
}

/// torch's `lerp(start, end, weight)` (`at::lerp`): two forms, for weights below and above
/// one half.
fn lerp(start: f64, end: f64, weight: f64) -> f64 {
    if weight.abs() < 0.5 {
        start + weight * (end - start)
    } else {
        end - (end - start) * (1.0 - weight)
    }
}

/// `torch.clamp(x, min=lo)`: a NaN stays NaN, as torch's clamp keeps it (`f64::max` would
/// return `lo`).
fn clamp_min(x: f64, lo: f64) -> f64 {
    if x.is_nan() {
        x
    } else {
        x.max(lo)
    }
}

/// Python's `max(a, b)` of two floats, which torch takes on the host for `alpha` and the
/// clipping denominator: `b` only where `b > a`, so a NaN `b` gives `a`.
fn py_max(a: f64, b: f64) -> f64 {
    if b > a {
        b
    } else {
        a
    }
}

/// `torch.finfo(dtype).eps`.
fn finfo_eps(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2f64.powi(-10),
        DType::BF16 => 2f64.powi(-7),
        DType::F64 => f64::EPSILON,
        _ => 2f64.powi(-23),
    }
}

impl AdafactorOracle {
    /// A fresh group of tensors of `shapes`, stored as `param_dtype`.
    pub fn new(config: Adafactor, shapes: Vec<Vec<usize>>, param_dtype: DType) -> Self {
        let state = shapes
            .iter()
            .map(|shape| {
                let mut s = AdafactorTensorState::default();
                if shape.len() >= 2 {
                    let (rows, cols) = (shape[shape.len() - 2], shape[shape.len() - 1]);
                    let batches: usize = shape[..shape.len() - 2].iter().product();
                    s.row_var = vec![0.0; batches * rows];
                    s.col_var = vec![0.0; batches * cols];
                } else {
                    s.variance = vec![0.0; shape.iter().product()];
                }
                s
            })
            .collect();
        AdafactorOracle { config, shapes, state, param_dtype }
    }

    /// One `step()` over every tensor of the group.
    pub fn step(&mut self, params: &mut [Vec<f64>], grads: &[Vec<f64>]) {
        let c = self.config;
        // `if eps1 is None: eps1 = torch.finfo(param.dtype).eps`, set at the first tensor and
        // kept for the rest of the group.
        let eps1 = c.eps1.unwrap_or(finfo_eps(self.param_dtype));
        for (i, (param, grad)) in params.iter_mut().zip(grads).enumerate() {
            let grad: Vec<f64> = grad.iter().map(|g| if c.maximize { -g } else { *g }).collect();
            let state = &mut self.state[i];
            state.step += 1;
            let t = state.step as f64;
            let one_minus_beta2_t = t.powf(c.beta2_decay);
            let rho_t = c.lr.min(1.0 / t.sqrt());
            let n = param.len() as f64;
            let norm_p = param.iter().map(|p| p * p).sum::<f64>().sqrt();
            let alpha = py_max(c.eps2, norm_p / n.sqrt()) * rho_t;
            if c.weight_decay != 0.0 {
                for p in param.iter_mut() {
                    *p *= 1.0 - c.lr * c.weight_decay;
                }
            }
            let shape = &self.shapes[i];
            let var_estimate: Vec<f64> = if shape.len() >= 2 {
                let (rows, cols) = (shape[shape.len() - 2], shape[shape.len() - 1]);
                let batches = grad.len() / (rows * cols).max(1);
                let mut v = vec![0.0; grad.len()];
                for b in 0..batches {
                    let g = |r: usize, col: usize| grad[(b * rows + r) * cols + col];
                    for r in 0..rows {
                        let mean = (0..cols).map(|col| g(r, col) * g(r, col)).sum::<f64>() / cols as f64;
                        let rv = &mut state.row_var[b * rows + r];
                        *rv = lerp(*rv, mean, one_minus_beta2_t);
                    }
                    for col in 0..cols {
                        let mean = (0..rows).map(|r| g(r, col) * g(r, col)).sum::<f64>() / rows as f64;
                        let cv = &mut state.col_var[b * cols + col];
                        *cv = lerp(*cv, mean, one_minus_beta2_t);
                    }
                    // var_estimate = row_var @ col_var / row_var.mean(dim=-2).clamp(min=eps1)
                    let row_mean = state.row_var[b * rows..(b + 1) * rows].iter().sum::<f64>() / rows as f64;
                    let denom = clamp_min(row_mean, eps1);
                    for r in 0..rows {
                        for col in 0..cols {
                            v[(b * rows + r) * cols + col] =
                                state.row_var[b * rows + r] * state.col_var[b * cols + col] / denom;
                        }
                    }
                }
                v
            } else {
                for (var, g) in state.variance.iter_mut().zip(&grad) {
                    *var = lerp(*var, g * g, one_minus_beta2_t);
                }
                state.variance.clone()
            };
            // update = var_estimate.clamp(min=eps1 * eps1).rsqrt() * grad
            let update: Vec<f64> =
                var_estimate.iter().zip(&grad).map(|(v, g)| g / clamp_min(*v, eps1 * eps1).sqrt()).collect();
            let norm_u = update.iter().map(|u| u * u).sum::<f64>().sqrt();
            let denom = py_max(1.0, norm_u / (n.sqrt() * c.d));
            for (p, u) in param.iter_mut().zip(&update) {
                *p = round(self.param_dtype, *p - alpha / denom * u);
            }
        }
    }
}
