//! `torch.optim.Muon` (PyTorch 2.9 and later), in f64: `Muon.step()` and
//! `_zeropower_via_newtonschulz` transcribed from torch's source (FORMAT.md states the rule),
//! with the bfloat16 variant rounding every Newton-Schulz tensor op's result to bfloat16 as
//! torch's bfloat16 tensors do.

use super::dtype::{round, DType};

/// `torch.optim.Muon`'s `adjust_lr_fn`: how the learning rate scales with the matrix's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdjustLrFn {
    /// `None` or `"original"`: `sqrt(max(1, rows / cols))` (Keller Jordan's).
    Original,
    /// `"match_rms_adamw"`: `0.2 sqrt(max(rows, cols))` (Moonlight's).
    MatchRmsAdamW,
    /// `"spectral_unclamped"`: `sqrt(rows / cols)`.
    SpectralUnclamped,
}

impl AdjustLrFn {
    /// The learning rate's factor for a `rows` x `cols` matrix (`_adjust_lr`).
    pub fn ratio(self, rows: usize, cols: usize) -> f64 {
        let (a, b) = (rows as f64, cols as f64);
        match self {
            AdjustLrFn::Original => (a / b).max(1.0).sqrt(),
            AdjustLrFn::MatchRmsAdamW => 0.2 * a.max(b).sqrt(),
            AdjustLrFn::SpectralUnclamped => (a / b).sqrt(),
        }
    }
}

/// The dtype the Newton-Schulz iterations run in: torch's is bfloat16.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NsPrecision {
    /// torch's `ortho_grad = grad.bfloat16()`: every op's result rounded to bfloat16.
    BF16,
    /// The same iterations with every op's result rounded to f32.
    F32,
}

/// `torch.optim.Muon`'s hyperparameters, and the Newton-Schulz dtype.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Muon {
    /// `lr`.
    pub lr: f64,
    /// `weight_decay`: decoupled.
    pub weight_decay: f64,
    /// `momentum`.
    pub momentum: f64,
    /// `nesterov`.
    pub nesterov: bool,
    /// `ns_coefficients`: `(a, b, c)`.
    pub ns_coefficients: (f64, f64, f64),
    /// `eps`: the Frobenius norm's floor.
    pub eps: f64,
    /// `ns_steps`.
    pub ns_steps: u32,
    /// `adjust_lr_fn`.
    pub adjust_lr_fn: AdjustLrFn,
    /// The Newton-Schulz iterations' dtype.
    pub ns_precision: NsPrecision,
}

/// torch's `lerp(start, end, weight)`: `start + weight (end - start)` for `weight < 0.5`,
/// else `end - (end - start) (1 - weight)`.
fn lerp(start: f64, end: f64, weight: f64) -> f64 {
    if weight < 0.5 {
        start + weight * (end - start)
    } else {
        end - (end - start) * (1.0 - weight)
    }
}

/// `a` (`n` x `k`, row-major) times `b` (`k` x `m`): `n` x `m`, in f64.
fn matmul(a: &[f64], b: &[f64], n: usize, k: usize, m: usize) -> Vec<f64> {
    let mut out = vec![0.0; n * m];
    for i in 0..n {
        for p in 0..k {
            let x = a[i * k + p];
            for j in 0..m {
                out[i * m + j] += x * b[p * m + j];
            }
        }
    }
    out
}

/// `x` (`n` x `m`, row-major) transposed.
fn transpose(x: &[f64], n: usize, m: usize) -> Vec<f64> {
    let mut out = vec![0.0; x.len()];
    for i in 0..n {
        for j in 0..m {
            out[j * n + i] = x[i * m + j];
        }
    }
    out
}

/// `_zeropower_via_newtonschulz(u, ns_coefficients, ns_steps, eps)` of a `rows` x `cols`
/// matrix, in `precision` (bfloat16: each op's result rounded to bfloat16).
pub fn newton_schulz(config: &Muon, u: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let r = |v: f64| match config.ns_precision {
        NsPrecision::BF16 => round(DType::BF16, v),
        NsPrecision::F32 => round(DType::F32, v),
    };
    let all = |v: Vec<f64>| -> Vec<f64> { v.into_iter().map(r).collect() };
    let (a, b, c) = config.ns_coefficients;
    // ortho_grad = grad.bfloat16(); if grad.size(0) > grad.size(1): ortho_grad = ortho_grad.T
    let tall = rows > cols;
    let mut x = all(u.to_vec());
    let (n, m) = if tall { (cols, rows) } else { (rows, cols) };
    if tall {
        x = transpose(&x, rows, cols);
    }
    // ortho_grad.div_(ortho_grad.norm().clamp(min=eps))
    let norm = r(r(x.iter().map(|v| v * v).sum::<f64>().sqrt()).max(r(config.eps)));
    x = all(x.into_iter().map(|v| v / norm).collect());
    for _ in 0..config.ns_steps {
        // gram_matrix = ortho_grad @ ortho_grad.T
        let gram = all(matmul(&x, &transpose(&x, n, m), n, m, n));
        // gram_update = torch.addmm(gram_matrix, gram_matrix, gram_matrix, beta=b, alpha=c)
        let mm = matmul(&gram, &gram, n, n, n);
        let update = all(gram.iter().zip(&mm).map(|(g, p)| b * g + c * p).collect());
        // ortho_grad = torch.addmm(ortho_grad, gram_update, ortho_grad, beta=a)
        let nx = matmul(&update, &x, n, n, m);
        x = all(x.iter().zip(&nx).map(|(x, p)| a * x + p).collect());
    }
    if tall {
        transpose(&x, n, m)
    } else {
        x
    }
}

/// One `Muon.step()` of one 2-D parameter (`rows` x `cols`): updates `param` and
/// `momentum_buffer` (zero before the first step, as torch's `zeros_like`).
pub fn muon_step(
    config: &Muon,
    param: &mut [f64],
    grad: &[f64],
    momentum_buffer: &mut [f64],
    rows: usize,
    cols: usize,
) {
    let mu = config.momentum;
    // buf.lerp_(grad, 1 - momentum)
    for (b, g) in momentum_buffer.iter_mut().zip(grad) {
        *b = lerp(*b, *g, 1.0 - mu);
    }
    // update = grad.lerp(buf, momentum) if nesterov else buf
    let u: Vec<f64> = if config.nesterov {
        grad.iter().zip(momentum_buffer.iter()).map(|(g, b)| lerp(*g, *b, mu)).collect()
    } else {
        momentum_buffer.to_vec()
    };
    let o = newton_schulz(config, &u, rows, cols);
    let adjusted_lr = config.lr * config.adjust_lr_fn.ratio(rows, cols);
    // param.mul_(1 - lr * weight_decay); param.add_(update, alpha=-adjusted_lr)
    for (p, o) in param.iter_mut().zip(&o) {
        *p *= 1.0 - config.lr * config.weight_decay;
        *p -= adjusted_lr * o;
    }
}
