//! bitsandbytes' blockwise 8-bit optimizers (Dettmers et al. 2022) as its CUDA kernels run
//! them (`kOptimizerStatic8bit2StateBlockwise`, `kOptimizerStatic8bit1StateBlockwise` and
//! `quantize_2D` in `csrc/kernels.cu`, bitsandbytes 0.50.x; tensors below `min_8bit_size`
//! as `kOptimizer32bit2State` and `kOptimizer32bit1State`), with the dynamic maps built from
//! bitsandbytes' `create_dynamic_map`. The update runs in f64; the states are narrowed to f32
//! and quantized as the kernels quantize (the binary search of `quantize_2D`, transcribed
//! line for line, then the sign fix). Written here apart from wgpu-optim's own `q8` module
//! (which finds codes through thresholds and tables) so that the tests compare two
//! implementations.
//!
//! Where the kernels differ from bitsandbytes' pure-PyTorch reference
//! (`optimizer_update_8bit_blockwise_pytorch`): the sign fix, exact ties to the even code,
//! decoupled decay after the update in the 2-state kernel, and a non-finite gradient there
//! leaving its parameter untouched and restarting its states from 0. Line numbers below are
//! `csrc/kernels.cu`'s on bitsandbytes' main branch of 2026-08-19 (0.50.x): `quantize_2D`
//! 221-262; the 2-state kernel's gradient test 1017 and 1092, its states' restart 1035, its
//! decay after the update 1103-1104, its sign fix 1118-1125 (and AdEMAMix's slow EMA's
//! 1127-1133); the 1-state kernel's decay 1226-1236, its RMSprop 1254 and 1290-1292 (the
//! parameter's step takes `g_vals[j]`, the raw gradient), its sign fix 1311-1318; the
//! 32-bit kernels' decay 865 (1-state) and 696 and 708 (2-state, after the update).
//!
//! Two rules are wgpu-optim's, not the kernels': a non-finite state value is stored as the
//! code of 0 and left out of its block's absmax (the 1-state kernel lets it spoil its block),
//! and an all-zero block stores absmax 1 (the kernel's absmax 0 reads back the same zeros).

use super::ademamix::AdEMAMix;
use super::algorithm::Algorithm;
use super::error::{Error, Result};
use super::lion::Lion;
use super::onnx::one_minus_pow;

/// One tensor's optimizer state as bitsandbytes keeps it: 8-bit codes (`state1` or
/// `state2`) with one absmax per block (`absmax1` or `absmax2`), or, for a tensor below
/// `min_8bit_size`, f32 values.
#[derive(Clone, Debug, PartialEq)]
pub enum State8bit {
    /// One code per element, one absmax per block of [`BLOCK_SIZE`].
    Q8 {
        /// The codes: indices into a 256-entry map.
        codes: Vec<u8>,
        /// Each block's largest finite magnitude.
        absmax: Vec<f32>,
    },
    /// A tensor below `min_8bit_size`.
    F32(Vec<f32>),
}

impl State8bit {
    /// The zero state of `len` elements as bitsandbytes creates it: codes 0 and absmax 0
    /// where `quantized` (the tensor has at least `min_8bit_size` elements), f32 zeros
    /// otherwise.
    pub fn zeros(len: usize, quantized: bool) -> Self {
        if quantized {
            State8bit::Q8 { codes: vec![0; len], absmax: vec![0.0; len.div_ceil(BLOCK_SIZE)] }
        } else {
            State8bit::F32(vec![0.0; len])
        }
    }
}

/// Elements per block, each block with one f32 absmax (bitsandbytes' `blocksize=256` for
/// optimizer states).
pub const BLOCK_SIZE: usize = 256;

/// `bitsandbytes.functional.create_dynamic_map(signed=True)`: the map of signed states
/// (Adam's first moment, SGD's momentum buffer), bitsandbytes' `qmap1`.
pub fn signed_map() -> [f32; 256] {
    create_dynamic_map(true)
}

/// `create_dynamic_map(signed=False)`: the map of Adam's second moment, `qmap2`.
pub fn unsigned_map() -> [f32; 256] {
    create_dynamic_map(false)
}

/// The map bitsandbytes quantizes the state PyTorch names `state` with: [`unsigned_map`] for
/// the second moment `exp_avg_sq` (`state2`), [`signed_map`] for the others (`state1`: the
/// first moments, the momentum buffer, RMSprop's `square_avg`).
pub fn map_for(state: &str) -> [f32; 256] {
    if state == "exp_avg_sq" {
        unsigned_map()
    } else {
        signed_map()
    }
}

/// `create_dynamic_map(signed, max_exponent_bits=7, total_bits=8)` as bitsandbytes defines
/// it: 7 non-sign bits (for either sign), so no additional items; for each exponent
/// `i` in 0..7, `2^i + 1` points (signed) or `2^(i+1) + 1` points (unsigned) of
/// `torch.linspace(0.1, 1, n)` in f32, the means of neighbouring points (f32 tensor
/// arithmetic), each multiplied by the Python float `10 ** (i - 6)` (and, when signed, by
/// its negation too; PyTorch rounds the scale to f32 for an f32 tensor); then 0 and 1
/// appended and the 256 values sorted.
fn create_dynamic_map(signed: bool) -> [f32; 256] {
    const MAX_EXPONENT_BITS: i32 = 7;
    const NON_SIGN_BITS: i32 = 7;
    let mut data: Vec<f32> = Vec::with_capacity(256);
    for i in 0..MAX_EXPONENT_BITS {
        let power = i + NON_SIGN_BITS - MAX_EXPONENT_BITS;
        let fraction_items = if signed { (1usize << power) + 1 } else { (1usize << (power + 1)) + 1 };
        let boundaries = torch_linspace(0.1, 1.0, fraction_items);
        let scale = 10f64.powf(f64::from(-(MAX_EXPONENT_BITS - 1) + i)) as f32;
        let means: Vec<f32> = boundaries.windows(2).map(|b| (b[0] + b[1]) / 2.0).collect();
        data.extend(means.iter().map(|m| scale * m));
        if signed {
            data.extend(means.iter().map(|m| -scale * m));
        }
    }
    data.push(0.0);
    data.push(1.0);
    data.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let mut map = [0.0; 256];
    map.copy_from_slice(&data);
    map
}

/// `torch.linspace(start, end, steps, dtype=torch.float32)` on the CPU: ATen's kernel
/// computes the first half as `start + step * i` and the second half as
/// `end - step * (steps - i - 1)`, in f32, and its compiler contracts each into one fused
/// multiply-add.
fn torch_linspace(start: f32, end: f32, steps: usize) -> Vec<f32> {
    let step = (end - start) / (steps - 1) as f32;
    let halfway = steps / 2;
    (0..steps)
        .map(|i| {
            if i < halfway {
                step.mul_add(i as f32, start)
            } else {
                (-step).mul_add((steps - i - 1) as f32, end)
            }
        })
        .collect()
}

/// `quantize_2D<SIGNED>` of `csrc/kernels.cu`, line for line: a binary search for `x` over
/// the 256 codes from pivot 127 in steps of 64, 32, ..., 1 (the kernel reads the first two
/// levels' codes from `quadrants`, which hold `map[63]`, `map[127]` and `map[191]`: the same
/// values), then the midpoint test against the last codes above and below, in f32. A value
/// exactly at a midpoint keeps the final pivot, which is always even.
pub fn quantize_2d(map: &[f32; 256], signed: bool, x: f32) -> u8 {
    let mut pivot: i32 = 127;
    let mut upper_pivot: i32 = 255;
    let mut lower_pivot: i32 = 0;
    let mut lower: f32 = if signed { -1.0 } else { 0.0 };
    let mut upper: f32 = 1.0;
    let mut val = map[127];
    let mut i = 64;
    while i > 0 {
        if x > val {
            lower_pivot = pivot;
            lower = val;
            pivot += i;
        } else {
            upper_pivot = pivot;
            upper = val;
            pivot -= i;
        }
        val = map[pivot as usize];
        i >>= 1;
    }
    let code = if x > val {
        let midpoint = (upper + val) * 0.5;
        if x > midpoint {
            upper_pivot
        } else {
            pivot
        }
    } else {
        let midpoint = (lower + val) * 0.5;
        if x < midpoint {
            lower_pivot
        } else {
            pivot
        }
    };
    code as u8
}

/// The code the kernels store for the state value `s` under `absmax` with `map`:
/// [`quantize_2d`] of `s / absmax`, then, for the signed map, the kernels' sign fix ("make
/// sure state1 term has still the same sign after quantization"): where the code's sign bit
/// differs from `s`'s, one code up for a positive `s`, one down otherwise (on an unsigned
/// char). The unsigned map's state (Adam's second moment) gets no fix, as in the kernel. NaN
/// and the infinities take the code of 0 (wgpu-optim's rule, see the module docs).
pub fn kernel_code(map: &[f32; 256], s: f32, absmax: f32) -> u8 {
    if !s.is_finite() {
        return zero_code(map);
    }
    let signed = map[0] < 0.0;
    let code = quantize_2d(map, signed, s / absmax);
    if signed && map[usize::from(code)].is_sign_negative() != s.is_sign_negative() {
        return if s > 0.0 { code.wrapping_add(1) } else { code.wrapping_sub(1) };
    }
    code
}

/// The code of a value `x` already divided by its absmax: [`kernel_code`] under absmax 1.
pub fn nearest_code(map: &[f32; 256], x: f32) -> u8 {
    kernel_code(map, x, 1.0)
}

/// The index of the code of 0 in `map`.
pub fn zero_code(map: &[f32; 256]) -> u8 {
    map.iter().position(|&c| c == 0.0).unwrap_or(0) as u8
}

/// Quantizes `values` block by block: each block's absmax is its largest finite magnitude
/// (1 where there is none or it is 0, so that a step never divides by 0), each value its
/// [`kernel_code`] under it, and every value of a block without a finite non-zero one the
/// code of 0 (-0.0 included: the kernel's block of zeros reads back zeros). `codes` holds
/// one code per value, `absmax` one entry per block (the last block possibly partial).
///
/// # Panics
///
/// Where `codes` or `absmax` has another length.
pub fn quantize(values: &[f32], map: &[f32; 256], codes: &mut [u8], absmax: &mut [f32]) {
    assert_eq!(codes.len(), values.len(), "one code per value");
    assert_eq!(absmax.len(), values.len().div_ceil(BLOCK_SIZE), "one absmax per block");
    for (b, block) in values.chunks(BLOCK_SIZE).enumerate() {
        let largest = block.iter().filter(|v| v.is_finite()).fold(0.0f32, |m, v| m.max(v.abs()));
        absmax[b] = if largest == 0.0 { 1.0 } else { largest };
        for (j, v) in block.iter().enumerate() {
            codes[b * BLOCK_SIZE + j] =
                if largest == 0.0 { zero_code(map) } else { kernel_code(map, *v, absmax[b]) };
        }
    }
}

/// `map[code] * absmax` of each code's block.
pub fn dequantize(codes: &[u8], absmax: &[f32], map: &[f32; 256]) -> Vec<f32> {
    codes.iter().enumerate().map(|(i, &c)| map[usize::from(c)] * absmax[i / BLOCK_SIZE]).collect()
}

/// Refuses a state of another length than the parameter's, or 8-bit codes without one
/// absmax per block, naming the state `argument`.
fn check_state(state: &State8bit, argument: &str, len: usize) -> Result<()> {
    let held = match state {
        State8bit::Q8 { codes, .. } => codes.len(),
        State8bit::F32(values) => values.len(),
    };
    if held != len {
        return Err(Error::LengthMismatch { argument: argument.into(), got: held, expected: len });
    }
    if let State8bit::Q8 { codes, absmax } = state {
        let blocks = codes.len().div_ceil(BLOCK_SIZE);
        if absmax.len() != blocks {
            return Err(Error::CountMismatch {
                argument: format!("{argument} absmax"),
                got: absmax.len(),
                expected: blocks,
            });
        }
    }
    Ok(())
}

/// Dequantized, widened.
fn load(state: &State8bit, map: &[f32; 256]) -> Vec<f64> {
    let values = match state {
        State8bit::Q8 { codes, absmax } => dequantize(codes, absmax, map),
        State8bit::F32(values) => values.clone(),
    };
    values.into_iter().map(f64::from).collect()
}

/// Rounded to f32, then requantized block by block where 8-bit.
fn store(state: &mut State8bit, values: &[f64], map: &[f32; 256]) {
    let narrowed: Vec<f32> = values.iter().map(|&v| v as f32).collect();
    match state {
        State8bit::Q8 { codes, absmax } => quantize(&narrowed, map, codes, absmax),
        State8bit::F32(stored) => stored.copy_from_slice(&narrowed),
    }
}

/// Refuses a gradient of another length than the parameter's.
fn check_grad(param: &[f64], grad: &[f64]) -> Result<()> {
    if grad.len() != param.len() {
        return Err(Error::LengthMismatch {
            argument: "grad".into(),
            got: grad.len(),
            expected: param.len(),
        });
    }
    Ok(())
}

/// `bitsandbytes.optim.Adam8bit` and `AdamW8bit`'s hyperparameters. Both apply weight decay
/// decoupled (`p *= 1 - lr * weight_decay`), unlike `torch.optim.Adam`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BnbAdam {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Added to the bias-corrected root of the second moment.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
}

/// Step `step` (from 1) of bitsandbytes' 8-bit blockwise Adam on one tensor, as
/// `kOptimizerStatic8bit2StateBlockwise<ADAM>` runs it (`kOptimizer32bit2State<ADAM>` for a
/// tensor kept in f32): dequantize both moments; per element, where the gradient is finite,
/// `m = m beta1 + (1 - beta1) g`, `v = v beta2 + (1 - beta2) g^2`, then the parameter steps
/// by `-lr sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + sqrt(1 - beta2^t) eps)` and
/// only then decays (`p *= 1 - lr weight_decay`); requantize each moment (first with the
/// signed map and the sign fix, second with the unsigned one). On 8-bit state a non-finite
/// gradient leaves its parameter untouched (no decay either) and restarts both its moments
/// from 0; the 32-bit kernel has no such test. A gradient or state of another length than
/// `param` is refused and nothing changes.
pub fn bnb_adam8bit_step(
    config: &BnbAdam,
    step: u64,
    param: &mut [f64],
    grad: &[f64],
    exp_avg: &mut State8bit,
    exp_avg_sq: &mut State8bit,
) -> Result<()> {
    check_grad(param, grad)?;
    check_state(exp_avg, "exp_avg", param.len())?;
    check_state(exp_avg_sq, "exp_avg_sq", param.len())?;
    let restarts = matches!(exp_avg, State8bit::Q8 { .. });
    let (signed, unsigned) = (signed_map(), unsigned_map());
    let (mut m, mut v) = (load(exp_avg, &signed), load(exp_avg_sq, &unsigned));
    // correction1 = 1 - beta1^step; correction2 = sqrt(1 - beta2^step);
    // step_size = -lr * correction2 / correction1
    let correction1 = one_minus_pow(config.beta1, step);
    let correction2 = one_minus_pow(config.beta2, step).sqrt();
    let step_size = -config.lr * correction2 / correction1;
    for (((p, g), m), v) in param.iter_mut().zip(grad).zip(&mut m).zip(&mut v) {
        if restarts && !g.is_finite() {
            // s1_vals[j] = 0.0f; s2_vals[j] = 0.0f; and the parameter is not written.
            (*m, *v) = (0.0, 0.0);
            continue;
        }
        // s2 = (s2 * beta2) + ((1.0f - beta2) * g * g); s1 = (s1 * beta1) + ((1.0f - beta1) * g)
        *v = *v * config.beta2 + (1.0 - config.beta2) * g * g;
        *m = *m * config.beta1 + (1.0 - config.beta1) * g;
        // p + step_size * (s1 / (sqrt(s2) + correction2 * eps))
        *p += step_size * (*m / (v.sqrt() + correction2 * config.eps));
        // if (weight_decay > 0.0f) p *= (1.0f - lr * weight_decay), after the update.
        if config.weight_decay > 0.0 {
            *p *= 1.0 - config.lr * config.weight_decay;
        }
    }
    store(exp_avg, &m, &signed);
    store(exp_avg_sq, &v, &unsigned);
    Ok(())
}

/// Step `step` of `algorithm` as bitsandbytes' 8-bit optimizers run it, over `states` in
/// PyTorch's state order (as [`TorchState::tensors`](crate::TorchState::tensors) lists them): Adam and AdamW as
/// [`bnb_adam8bit_step`] (decoupled decay), SGD with momentum as [`bnb_sgd8bit_step`],
/// RMSprop, Lion and AdEMAMix as their own steps below; then the parameters rounded to f32,
/// as an optimizer with 8-bit state stores them. An algorithm or a setting bitsandbytes has
/// no 8-bit form of (AMSGrad, `maximize`, Adam's L2 decay, Nesterov, dampening), or a count
/// of states other than the algorithm's own, is refused and nothing changes.
pub fn bnb_8bit_step(
    algorithm: &Algorithm,
    step: u64,
    param: &mut [f64],
    grad: &[f64],
    states: &mut [State8bit],
) -> Result<()> {
    let kept = match algorithm {
        Algorithm::Adam(a) => 2 + usize::from(a.amsgrad),
        Algorithm::Sgd(s) => usize::from(s.momentum != 0.0),
        Algorithm::RmsProp(r) => 1 + usize::from(r.momentum > 0.0) + usize::from(r.centered),
        Algorithm::Lion(_) => 1,
        Algorithm::AdEMAMix(_) => 3,
        _ => states.len(),
    };
    if states.len() != kept {
        return Err(Error::CountMismatch { argument: "states".into(), got: states.len(), expected: kept });
    }
    match (algorithm, states) {
        (Algorithm::Adam(a), [m, v])
            if !a.amsgrad && !a.maximize && (a.decoupled_weight_decay || a.weight_decay == 0.0) =>
        {
            let config = BnbAdam {
                lr: a.lr,
                beta1: a.beta1,
                beta2: a.beta2,
                eps: a.eps,
                weight_decay: a.weight_decay,
            };
            bnb_adam8bit_step(&config, step, param, grad, m, v)?;
        }
        (Algorithm::Sgd(s), [buffer]) if !s.nesterov && s.dampening == 0.0 && !s.maximize => {
            let config = BnbSgd { lr: s.lr, momentum: s.momentum, weight_decay: s.weight_decay };
            bnb_sgd8bit_step(&config, step, param, grad, buffer)?;
        }
        (Algorithm::RmsProp(r), [square_avg]) if !r.centered && r.momentum == 0.0 && !r.maximize => {
            let config = BnbRmsProp { lr: r.lr, alpha: r.alpha, eps: r.eps, weight_decay: r.weight_decay };
            bnb_rmsprop8bit_step(&config, param, grad, square_avg)?;
        }
        (Algorithm::Lion(l), [exp_avg]) => {
            bnb_lion8bit_step(l, param, grad, exp_avg)?;
        }
        (Algorithm::AdEMAMix(a), [m1, m2, nu]) => {
            bnb_ademamix8bit_step(a, step, param, grad, m1, m2, nu)?;
        }
        _ => {
            return Err(Error::Unsupported(
                "bitsandbytes' 8-bit optimizers are Adam, AdamW, SGD with momentum, RMSprop, Lion and \
                 AdEMAMix, without AMSGrad, maximize, L2 decay in Adam, Nesterov or dampening",
            ))
        }
    }
    for p in param.iter_mut() {
        *p = f64::from(*p as f32);
    }
    Ok(())
}

/// `bitsandbytes.optim.SGD8bit`'s hyperparameters (its 8-bit update has no dampening and no
/// Nesterov form).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BnbSgd {
    /// Learning rate.
    pub lr: f64,
    /// Momentum.
    pub momentum: f64,
    /// L2 weight decay, added to the gradient.
    pub weight_decay: f64,
}

/// Step `step` (from 1) of bitsandbytes' 8-bit blockwise SGD with momentum on one tensor, as
/// its reference does it: the first step's buffer is the gradient, later ones
/// `momentum * buffer + gradient`, requantized with the signed map. A gradient or buffer of
/// another length than `param` is refused and nothing changes.
pub fn bnb_sgd8bit_step(
    config: &BnbSgd,
    step: u64,
    param: &mut [f64],
    grad: &[f64],
    buffer: &mut State8bit,
) -> Result<()> {
    check_grad(param, grad)?;
    check_state(buffer, "momentum_buffer", param.len())?;
    let signed = signed_map();
    let mut b = load(buffer, &signed);
    for ((p, g), b) in param.iter_mut().zip(grad).zip(&mut b) {
        // grad.add_(p, alpha=weight_decay), only where there is a decay (as PyTorch's
        // `if weight_decay != 0`): 0 * p would make a NaN or infinite parameter's gradient NaN.
        let g = if config.weight_decay != 0.0 { g + config.weight_decay * *p } else { *g };
        *b = if step == 1 { g } else { *b * config.momentum + g };
        // p.add_(state1, alpha=-lr)
        *p += -config.lr * *b;
    }
    store(buffer, &b, &signed);
    Ok(())
}

/// `bitsandbytes.optim.RMSprop8bit`'s hyperparameters (its constructor refuses `centered` and
/// `alpha == 0`; its kernel ignores `momentum`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BnbRmsProp {
    /// Learning rate.
    pub lr: f64,
    /// Smoothing constant of `square_avg` (bitsandbytes' `beta1`).
    pub alpha: f64,
    /// Added to `sqrt(square_avg)`.
    pub eps: f64,
    /// L2 weight decay, added to the gradient of the state's update where it is > 0.
    pub weight_decay: f64,
}

/// One step of bitsandbytes' RMSprop8bit on one tensor, transcribed from its kernels: on
/// 8-bit state (`kOptimizerStatic8bit1StateBlockwise`) `g' = g + weight_decay * p` (where
/// `weight_decay > 0`), `s = s * alpha + (1 - alpha) * (g' * g')` from the dequantized state,
/// `p -= lr * g / (sqrt(s) + eps)` with the raw gradient `g`, then `s` is requantized with
/// the signed map; on f32 state (`kOptimizer32bit1State`, tensors below `min_8bit_size`) the
/// same with `g'` in the parameter's update too. A gradient or state of another length than
/// `param` is refused and nothing changes.
pub fn bnb_rmsprop8bit_step(
    config: &BnbRmsProp,
    param: &mut [f64],
    grad: &[f64],
    square_avg: &mut State8bit,
) -> Result<()> {
    check_grad(param, grad)?;
    check_state(square_avg, "square_avg", param.len())?;
    let raw_grad_step = matches!(square_avg, State8bit::Q8 { .. });
    let signed = signed_map();
    let mut s = load(square_avg, &signed);
    for ((p, g), s) in param.iter_mut().zip(grad).zip(&mut s) {
        let decayed = if config.weight_decay > 0.0 { g + *p * config.weight_decay } else { *g };
        *s = *s * config.alpha + (1.0 - config.alpha) * (decayed * decayed);
        let step_grad = if raw_grad_step { *g } else { decayed };
        *p -= config.lr * (step_grad / (s.sqrt() + config.eps));
    }
    store(square_avg, &s, &signed);
    Ok(())
}

/// Step of bitsandbytes' `Lion8bit` on one tensor, as `kOptimizerStatic8bit1StateBlockwise<LION>`
/// runs it: `exp_avg` dequantized with the signed map (or kept in f32 below
/// `min_8bit_size`), lion-pytorch's rule on it (`p *= 1 - lr weight_decay`,
/// `p -= lr sgn(beta1 m + (1 - beta1) g)`, `m = beta2 m + (1 - beta2) g`), then requantized
/// block by block; the parameter rounded to f32, as it is stored. The kernel's `sgn` is
/// `(0 < x) - (x < 0)`, as `torch.sign`: 0 for 0 and for NaN, so a NaN gradient only decays
/// its parameter. A gradient or state of another length than `param` is refused and nothing
/// changes.
pub fn bnb_lion8bit_step(
    config: &Lion,
    param: &mut [f64],
    grad: &[f64],
    exp_avg: &mut State8bit,
) -> Result<()> {
    check_grad(param, grad)?;
    check_state(exp_avg, "exp_avg", param.len())?;
    let map = signed_map();
    let mut m = load(exp_avg, &map);
    let (lr, wd, beta1, beta2) = (config.lr, config.weight_decay, config.beta1, config.beta2);
    for ((p, &g), m) in param.iter_mut().zip(grad).zip(&mut m) {
        *p *= 1.0 - lr * wd;
        let c = *m * beta1 + g * (1.0 - beta1);
        *p += -lr * super::lion::sign(c);
        *m = *m * beta2 + g * (1.0 - beta2);
        *p = f64::from(*p as f32);
    }
    store(exp_avg, &m, &map);
    Ok(())
}

/// Step `step` (from 1) of bitsandbytes' `AdEMAMix8bit` on one tensor, as
/// `kOptimizerStatic8bit2StateBlockwise<ADEMAMIX>` runs it (`kOptimizer32bit2State` for a
/// tensor kept in f32) with the schedules of FORMAT.md's `bnb.AdEMAMix` rule: m1 and m2 (the
/// halves of bitsandbytes' `state1`, each with its own absmax) dequantized with the signed
/// map, nu (`state2`) with the unsigned one; per element `m1 = beta1 m1 + (1 - beta1) g`,
/// `m2 = beta3_t m2 + (1 - beta3_t) g`, `nu = beta2 nu + (1 - beta2) g^2`,
/// `p -= lr (m1 / (1 - beta1^t) + alpha_t m2) / (sqrt(nu) / sqrt(1 - beta2^t) + eps)`, and only
/// then the decay `p *= 1 - lr weight_decay`; each state requantized block by block. On 8-bit
/// state a non-finite gradient leaves its parameter untouched (no decay either) and restarts
/// all three states from 0. A gradient or state of another length than `param` is refused and
/// nothing changes.
pub fn bnb_ademamix8bit_step(
    config: &AdEMAMix,
    step: u64,
    param: &mut [f64],
    grad: &[f64],
    m1: &mut State8bit,
    m2: &mut State8bit,
    nu: &mut State8bit,
) -> Result<()> {
    use super::ademamix::{ademamix_alpha, ademamix_beta3};
    check_grad(param, grad)?;
    check_state(m1, "exp_avg", param.len())?;
    check_state(m2, "exp_avg_slow", param.len())?;
    check_state(nu, "exp_avg_sq", param.len())?;
    let restarts = matches!(m1, State8bit::Q8 { .. });
    let (signed, unsigned) = (signed_map(), unsigned_map());
    let (mut fast, mut slow, mut second) = (load(m1, &signed), load(m2, &signed), load(nu, &unsigned));
    let (beta1, beta2) = (config.beta1, config.beta2);
    let (alpha, beta3) = (ademamix_alpha(config, step), ademamix_beta3(config, step));
    let correction1 = one_minus_pow(beta1, step);
    let correction2 = one_minus_pow(beta2, step).sqrt();
    for i in 0..param.len() {
        let g = grad[i];
        if restarts && !g.is_finite() {
            (fast[i], slow[i], second[i]) = (0.0, 0.0, 0.0);
            continue;
        }
        second[i] = second[i] * beta2 + (1.0 - beta2) * g * g;
        fast[i] = fast[i] * beta1 + (1.0 - beta1) * g;
        slow[i] = slow[i] * beta3 + (1.0 - beta3) * g;
        let update =
            (fast[i] / correction1 + alpha * slow[i]) / (second[i].sqrt() / correction2 + config.eps);
        param[i] -= config.lr * update;
        if config.weight_decay > 0.0 {
            param[i] *= 1.0 - config.lr * config.weight_decay;
        }
    }
    store(m1, &fast, &signed);
    store(m2, &slow, &signed);
    store(nu, &second, &unsigned);
    Ok(())
}
