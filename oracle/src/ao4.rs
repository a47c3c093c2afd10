//! torchao 0.18's `AdamW4bit` and `Adam4bit` (Li et al. 2023, "Memory Efficient Optimizers
//! with 4-bit States") as its source runs them: `_AdamBase.step` with
//! `single_param_adam` over `OptimState4bit` states, transcribed from torchao's code and
//! FORMAT.md's rules, apart from wgpu-optim's own `q4` module so that the tests compare two
//! implementations.
//!
//! The maps are built as torchao builds them (`create_dynamic_map(signed=True,
//! max_exponent_bits=3, total_bits=4)` for `exp_avg`, `linspace(0, 1, 17)[1:]` for
//! `exp_avg_sq`), in f32. A value's code is the entry nearest by f32 distance, the larger
//! one on a tie, found by looking at all 16 (not torchao's binary search, which the crate
//! follows). The step runs in f64 from the dequantized f32 states; the new moments are
//! rounded to f32 (torchao's are f32 tensors) before they are quantized, while the
//! parameter takes the unrounded ones.

use super::error::{Error, Result};
use super::onnx::one_minus_pow;
use super::torch::Adam;

/// One tensor's 4-bit state as torchao keeps it: an `OptimState4bit` (packed `codes`, one
/// `scale` per block), or a plain f32 tensor below `min_size`.
#[derive(Clone, Debug, PartialEq)]
pub enum State4bit {
    /// `OptimState4bit`: two codes per byte, one scale per block.
    Q4 {
        /// `codes`, packed: byte j holds element 2j in its high nibble, 2j + 1 in its low one.
        codes: Vec<u8>,
        /// `scale`: each block's largest finite magnitude (0 before the first step).
        scale: Vec<f32>,
    },
    /// A tensor that keeps f32 state.
    F32(Vec<f32>),
}

/// torchao's default `block_size`.
pub const BLOCK_SIZE: usize = 128;

/// torchao's smallest tensor with 4-bit state (`min_size`).
pub const MIN_SIZE: usize = 4096;

/// `create_dynamic_map(signed=True, max_exponent_bits=3, total_bits=4)`: 3 non-sign bits,
/// so no additional items; for `i` in 0..3, `2^i + 1` points of `torch.linspace(0.1, 1, n)`
/// (f32), the means of neighbouring points, times the Python float `10 ** (i - 2)` (rounded
/// to f32 by PyTorch for an f32 tensor) and its negation; then 0 and 1, sorted.
pub fn signed_map() -> [f32; 16] {
    let mut data: Vec<f32> = Vec::with_capacity(16);
    for i in 0..3i32 {
        let boundaries = torch_linspace(0.1, 1.0, (1usize << i) + 1);
        let scale = 10f64.powi(i - 2) as f32;
        let means: Vec<f32> = boundaries.windows(2).map(|b| (b[0] + b[1]) / 2.0).collect();
        data.extend(means.iter().map(|m| scale * m));
        data.extend(means.iter().map(|m| -scale * m));
    }
    data.push(0.0);
    data.push(1.0);
    data.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let mut map = [0.0; 16];
    map.copy_from_slice(&data);
    map
}

/// `torch.linspace(0, 1, 17)[1:]`: `k/16` for `k = 1..16`, without 0.
pub fn unsigned_map() -> [f32; 16] {
    let grid = torch_linspace(0.0, 1.0, 17);
    let mut map = [0.0; 16];
    map.copy_from_slice(&grid[1..]);
    map
}

/// `torch.linspace(start, end, steps, dtype=torch.float32)` on the CPU: the first half
/// `start + step * i`, the second `end - step * (steps - i - 1)`, each one fused
/// multiply-add.
fn torch_linspace(start: f32, end: f32, steps: usize) -> Vec<f32> {
    let step = (end - start) / (steps - 1) as f32;
    (0..steps)
        .map(|i| {
            if i < steps / 2 {
                step.mul_add(i as f32, start)
            } else {
                (-step).mul_add((steps - i - 1) as f32, end)
            }
        })
        .collect()
}

/// The index of the entry of `map` nearest to `x` by f32 distance, the larger on a tie,
/// by looking at all 16. NaN and the infinities take the code of 0 (the first code of a
/// map without 0), as wgpu-optim documents for its 4-bit state.
pub fn nearest_code(map: &[f32; 16], x: f32) -> u8 {
    if !x.is_finite() {
        return map.iter().position(|&c| c == 0.0).unwrap_or(0) as u8;
    }
    let mut best = 0;
    for (code, c) in map.iter().enumerate() {
        if (x - c).abs() <= (x - map[best]).abs() {
            best = code;
        }
    }
    best as u8
}

/// Quantizes `values` (a whole number of blocks of `block_size`) as torchao's
/// `scale_tensor` and `quantize_4bit_with_qmap` do: each block's scale is its largest
/// finite magnitude clipped below at 1e-12, each value the [`nearest_code`] of
/// `value / scale`. Codes unpacked, one per value.
pub fn quantize(values: &[f32], map: &[f32; 16], block_size: usize) -> (Vec<u8>, Vec<f32>) {
    let mut codes = Vec::with_capacity(values.len());
    let mut scales = Vec::with_capacity(values.len() / block_size);
    for block in values.chunks(block_size) {
        let largest = block.iter().filter(|v| v.is_finite()).fold(0.0f32, |m, v| m.max(v.abs()));
        let scale = largest.max(1e-12);
        scales.push(scale);
        codes.extend(block.iter().map(|v| nearest_code(map, v / scale)));
    }
    (codes, scales)
}

/// `qmap[code] * scale` of each code's block (codes unpacked).
pub fn dequantize(codes: &[u8], scales: &[f32], map: &[f32; 16], block_size: usize) -> Vec<f32> {
    codes.iter().enumerate().map(|(i, &c)| map[usize::from(c)] * scales[i / block_size]).collect()
}

/// torchao's packing: `(codes[::2] << 4) | codes[1::2]`.
pub fn pack(codes: &[u8]) -> Vec<u8> {
    codes.chunks(2).map(|p| (p[0] << 4) | p.get(1).copied().unwrap_or(0)).collect()
}

/// torchao's unpacking: `stack([codes >> 4, codes & 0b1111], dim=-1)`, flattened.
pub fn unpack(packed: &[u8]) -> Vec<u8> {
    packed.iter().flat_map(|b| [b >> 4, b & 0xf]).collect()
}

/// The zero state torchao starts from: `OptimState4bit.zeros` (codes 0, scale 0) for a
/// tensor of at least `min_size` elements in whole blocks, f32 zeros otherwise.
pub fn zeros(len: usize, block_size: usize, min_size: usize) -> State4bit {
    if len >= min_size && len.is_multiple_of(block_size) {
        State4bit::Q4 { codes: vec![0; len / 2], scale: vec![0.0; len / block_size] }
    } else {
        State4bit::F32(vec![0.0; len])
    }
}

fn load(state: &State4bit, map: &[f32; 16], block_size: usize) -> Vec<f64> {
    match state {
        State4bit::Q4 { codes, scale } => {
            dequantize(&unpack(codes), scale, map, block_size).into_iter().map(f64::from).collect()
        }
        State4bit::F32(values) => values.iter().map(|&v| f64::from(v)).collect(),
    }
}

fn store(state: &mut State4bit, values: &[f64], map: &[f32; 16], block_size: usize) {
    let rounded: Vec<f32> = values.iter().map(|&v| v as f32).collect();
    *state = match state {
        State4bit::Q4 { .. } => {
            let (codes, scale) = quantize(&rounded, map, block_size);
            State4bit::Q4 { codes: pack(&codes), scale }
        }
        State4bit::F32(_) => State4bit::F32(rounded),
    };
}

/// Step `step` (from 1) of torchao's `AdamW4bit` (`config.decoupled_weight_decay`) or
/// `Adam4bit` on one tensor, `single_param_adam` line by line: the decay (`p -= lr wd p`,
/// or `g += wd p`), `m = lerp(m, g, 1 - beta1)` and `v = lerp(v, g^2, 1 - beta2)` from the
/// dequantized states, `p -= lr (m / bc1) / (sqrt(v) / sqrt(bc2) + eps)` with those m, v,
/// then both states quantized and stored; the parameter rounded to f32. AMSGrad and
/// `maximize` (which torchao's 4-bit Adam does not run here) are refused, as is a state of
/// another length; nothing changes then.
pub fn ao4_adam_step(
    config: &Adam,
    step: u64,
    block_size: usize,
    param: &mut [f64],
    grad: &[f64],
    exp_avg: &mut State4bit,
    exp_avg_sq: &mut State4bit,
) -> Result<()> {
    if config.amsgrad || config.maximize {
        return Err(Error::Unsupported("the oracle runs torchao's 4-bit Adam without AMSGrad or maximize"));
    }
    let (signed, unsigned) = (signed_map(), unsigned_map());
    let (mut m, mut v) = (load(exp_avg, &signed, block_size), load(exp_avg_sq, &unsigned, block_size));
    if grad.len() != param.len() || m.len() != param.len() || v.len() != param.len() {
        return Err(Error::LengthMismatch {
            argument: "grad or state".into(),
            got: grad.len().min(m.len()).min(v.len()),
            expected: param.len(),
        });
    }
    let bias_correction1 = one_minus_pow(config.beta1, step);
    let bias_correction2 = one_minus_pow(config.beta2, step);
    let (lr, wd) = (config.lr, config.weight_decay);
    for (((p, &g), m), v) in param.iter_mut().zip(grad).zip(&mut m).zip(&mut v) {
        let mut g = g;
        if config.decoupled_weight_decay {
            // p_f32 = p_f32 - lr * weight_decay * p_f32
            *p -= lr * wd * *p;
        } else {
            // grad_f32 = grad_f32 + weight_decay * p_f32
            g += wd * *p;
        }
        // exp_avg_f32 = exp_avg.float().lerp(grad_f32, 1 - beta1)
        *m += (1.0 - config.beta1) * (g - *m);
        // exp_avg_sq_f32 = exp_avg_sq.float().lerp(grad_f32.square(), 1 - beta2)
        *v += (1.0 - config.beta2) * (g * g - *v);
        // denom = (exp_avg_sq_f32.sqrt() / bias_correction2.sqrt()) + eps
        let denom = v.sqrt() / bias_correction2.sqrt() + config.eps;
        // p_f32 = p_f32 - lr * (exp_avg_f32 / bias_correction1) / denom
        *p -= lr * (*m / bias_correction1) / denom;
        *p = f64::from(*p as f32);
    }
    store(exp_avg, &m, &signed, block_size);
    store(exp_avg_sq, &v, &unsigned, block_size);
    Ok(())
}
