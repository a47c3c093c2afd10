//! Blockwise 4-bit optimizer state, as torchao 0.18's `AdamW4bit` and `Adam4bit` keep it
//! (Li et al. 2023, "Memory Efficient Optimizers with 4-bit States"): a state tensor is cut
//! into blocks of `block_size` (128) consecutive elements, each block keeps a scale (its
//! largest magnitude, at least 1e-12) as an f32, and each element keeps the index of the
//! entry of a 16-entry map nearest to `value / scale`, two indices per byte (element 2j in
//! the high nibble, as torchao packs them). Adam's first moment uses torchao's signed
//! dynamic map (`qmap1`), its second moment the linear map `k/16`, `k = 1..16` (`qmap2`,
//! without 0). A tensor keeps 4-bit state when it has at least `min_size` (4096) elements
//! and a whole number of blocks, as torchao decides; any other keeps f32 state.
//!
//! The maps are built as torchao builds them (`create_dynamic_map(signed=True,
//! max_exponent_bits=3, total_bits=4)` and `linspace(0, 1, 17)[1:]`), float operation for
//! float operation, and the code of a value is found as torchao finds it
//! (`quantize_4bit_with_qmap`: a branchless binary search for the last entry not above the
//! value, then up one code where the value is at least halfway to the next entry, so a tie
//! goes to the larger entry).
//!
//! A NaN or infinite state value (from a non-finite gradient) is left out of its block's
//! scale and stored as the code of 0 (signed map) or of the smallest entry, 1/16 (the
//! unsigned map has no 0), so it spoils its own parameter only. torchao instead lets it
//! make the whole block's scale NaN (`amax` propagates NaN); 8-bit state here follows the
//! same rule as this one ([`crate::q8`]).
//!
//! # In an optimizer
//!
//! 4-bit blockwise state for Adam and AdamW (torchao 0.18's `AdamW4bit`/`Adam4bit` format,
//! Li et al. 2023): `OptimizerBuilder::state_storage(StateStorage::Q4(q4::Q4States { block_size, min_size }))`
//! (torchao's defaults: 128 and 4096; `CpuOptimizerBuilder::state_storage` the same) keeps both
//! moments as half a byte per element (two codes per byte, element 2j in the high nibble, as
//! torchao packs them) plus one f32 scale per block: 1.06 bytes per parameter for both
//! moments at block 128, against 8 for f32 state and 2.03 for 8-bit. A tensor keeps 4-bit
//! state when it has at least `min_size` elements in whole blocks, else f32 state, as torchao
//! decides. `exp_avg` uses torchao's signed 16-entry dynamic map (`create_dynamic_map(signed=True,
//! max_exponent_bits=3, total_bits=4)`), `exp_avg_sq` the linear map `k/16` without 0, both
//! built as torchao builds them (`wgpu_optim::q4::signed_map`, `unsigned_map`); a block's
//! scale is its largest magnitude (at least 1e-12) and a value's code is found by torchao's
//! search (the nearest entry, a tie going up). Each step dequantizes a block's moments, runs
//! Adam's own f32 update (the same shader body and CPU loop as f32 state: the parameter takes
//! the unquantized new moments, as torchao's does) and requantizes, in one pass, nothing read
//! back: on GPUs a workgroup owns a group of blocks (each invocation a `u32` of eight codes
//! per moment, each block's scale a tree reduction in the workgroup), on CPU adapters an
//! invocation owns a block; multi-tensor dispatches, chunking past a storage binding and
//! global clipping work as for 8-bit state. A NaN or infinite state value is left out of its
//! block's scale and stored as the code of 0 (for `exp_avg_sq`, whose map has no 0, the code
//! of 1/16), so it spoils its own parameter only (torchao lets it turn the block's scale
//! NaN). Refused by name: other algorithms, AMSGrad (torchao's 4-bit `max_exp_avg_sq` is not
//! implemented), `maximize`, `capturable`, master
//! weights, model copies, 16-bit rounding, non-F32 parameters, and block sizes other than a
//! power of two from 8 to 256. `state` and `set_state` of either backend hand states over
//! as `q4::Q4State` (packed codes and scales, or f32; `StateView::Q4`, `QuantizedState::Q4`). Checkpoints (either backend, loadable by the other, byte-identical)
//! keep them under torchao's `OptimState4bit` names: `state.{i}.exp_avg.codes` (U8, packed),
//! `state.{i}.exp_avg.scale`, `state.{i}.exp_avg.qmap` (checked on load), or
//! `state.{i}.exp_avg` in f32, with `q4_block_size` and `q4_min_size` in the metadata.
//! torchao's vectors (`ao4_*`) pass on the oracle, the CPU backend and the GPU with every
//! code equal. `train_mlp --states q4` takes torchao's defaults and twice Adam's rate (`--lr`
//! overrides it): 4-bit moments take smaller steps on that small model trained from scratch,
//! for a reason of the format's (`exp_avg_sq`'s linear map), which the repository's `PERF.md`
//! ("8-bit and 4-bit state") measures, with the step's speed.

use crate::{Error, Result, StateKind};

/// torchao's default block size: elements per block, each block with one f32 scale.
pub const BLOCK_SIZE: usize = 128;

/// torchao's smallest tensor with 4-bit state (torchao's `min_size` default, 4096): smaller tensors keep f32 state.
pub const MIN_SIZE: u64 = 4096;

/// The smallest scale torchao gives a block (`clip(1e-12)`): a block of zeros keeps it.
pub const MIN_SCALE: f32 = 1e-12;

/// Entries of a 4-bit map.
pub const CODES: usize = 16;

/// The largest block size taken: the GPU's kernel for CPU adapters keeps a block's new
/// states in private memory until its scale is known, which larger blocks make slow to
/// compile and run there (torchao's default is 128).
pub const MAX_BLOCK_SIZE: usize = 256;

/// Blockwise 4-bit state for Adam and AdamW
/// ([`StateStorage::Q4`](crate::StateStorage::Q4)), as
/// torchao's `Adam4bit`/`AdamW4bit` keep it: half a byte plus 4/`block_size` bytes per
/// element and moment (0.53 bytes at the default 128), instead of 4.
///
/// Each step dequantizes both moments of a block, runs Adam's f32 update with them (the
/// parameter is updated from the unquantized new moments, as torchao's `single_param_adam`
/// does), takes each moment's new scale and requantizes, in one pass. Parameters and
/// gradients stay f32. Refused by name ([`Error::ConflictingOptions`]): every algorithm but
/// Adam, AMSGrad (torchao's 4-bit `max_exp_avg_sq` is not implemented here), `maximize`
/// (torchao has none), `capturable`,
/// `master_weights`, `model_copies` and a rounding other than nearest; parameters other
/// than F32 ([`Error::DTypeMismatch`]).
///
/// ```
/// # fn main() -> wgpu_optim::Result<()> {
/// use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut, StateView};
/// use wgpu_optim::q4::{Q4State, Q4States};
/// use wgpu_optim::{Adam, StateKind, StateStorage};
///
/// let (mut weights, grads) = (vec![0.5f32; 8192], vec![0.01f32; 8192]);
/// let options = CpuOptimizer::builder().state_storage(StateStorage::Q4(Q4States::default()));
/// let mut opt = options.build(Adam::adamw(), &[HostSlice::F32(&weights)])?;
/// opt.step(&mut [HostSliceMut::F32(&mut weights)], &[HostSlice::F32(&grads)])?;
/// let Some(StateView::Q4(Q4State::Q4 { codes, scale })) = opt.state(0, StateKind::ExpAvg) else { unreachable!() };
/// assert_eq!((codes.len(), scale.len()), (4096, 64));
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Q4States {
    /// Elements per block (torchao's `block_size`, default [`BLOCK_SIZE`]): a power of two
    /// from 8 to [`MAX_BLOCK_SIZE`].
    pub block_size: usize,
    /// Tensors with fewer elements keep f32 state (torchao's `min_size`, default [`MIN_SIZE`]).
    pub min_size: u64,
}

impl Default for Q4States {
    fn default() -> Self {
        Q4States { block_size: BLOCK_SIZE, min_size: MIN_SIZE }
    }
}

impl Q4States {
    /// Whether a tensor of `len` elements keeps 4-bit state: at least `min_size` elements
    /// in whole blocks, as torchao decides.
    pub fn quantizes(&self, len: u64) -> bool {
        len >= self.min_size && self.block_size > 0 && len.is_multiple_of(self.block_size as u64)
    }

    /// Refuses a block size the kernels cannot take: not a power of two from 8 (one `u32`
    /// word of codes) to [`MAX_BLOCK_SIZE`]. Building an optimizer checks it; a front end
    /// that builds its optimizer later checks it when it is given.
    pub fn validate(&self) -> Result<()> {
        let b = self.block_size;
        if !b.is_power_of_two() || !(8..=MAX_BLOCK_SIZE).contains(&b) {
            return Err(Error::BadValue {
                argument: "state_storage.block_size".into(),
                problem: format!("is {b}; expected a power of two from 8 to {MAX_BLOCK_SIZE}"),
            });
        }
        Ok(())
    }
}

/// Whether a state of `kind` uses the signed map (Adam's first moment) rather than the
/// unsigned one (its second moment).
pub(crate) fn is_signed(kind: StateKind) -> bool {
    kind != StateKind::ExpAvgSq
}

/// [`signed_map`] or [`unsigned_map`] for a state of `kind`.
pub fn map_for(kind: StateKind) -> [f32; CODES] {
    if is_signed(kind) {
        signed_map()
    } else {
        unsigned_map()
    }
}

/// torchao's `qmap1`: `create_dynamic_map(signed=True, max_exponent_bits=3, total_bits=4)`.
/// For `i = 0, 1, 2`, the midpoints of `linspace(0.1, 1, 2^i + 1)` (f32) times `10^(i - 2)`
/// (the f64 power rounded to f32, as PyTorch takes a Python scalar into an f32 product), and
/// their negatives; then 0 and 1, sorted.
pub fn signed_map() -> [f32; CODES] {
    const SCALES: [f64; 3] = [1e-2, 1e-1, 1.0];
    let mut data: Vec<f32> = Vec::with_capacity(CODES);
    for (i, scale) in SCALES.iter().enumerate() {
        let grid = linspace(0.1, 1.0, (1 << i) + 1);
        for pair in grid.windows(2) {
            let mean = (pair[0] + pair[1]) / 2.0;
            data.push(*scale as f32 * mean);
            data.push(-*scale as f32 * mean);
        }
    }
    data.extend([0.0, 1.0]);
    data.sort_by(f32::total_cmp);
    let mut map = [0.0; CODES];
    map.copy_from_slice(&data);
    map
}

/// torchao's `qmap2`: `linspace(0, 1, 17)[1:]`, that is `k/16` for `k = 1..16` (each exact
/// in f32). It has no 0.
pub fn unsigned_map() -> [f32; CODES] {
    let grid = linspace(0.0, 1.0, CODES + 1);
    std::array::from_fn(|k| grid[k + 1])
}

/// `torch.linspace(start, end, steps, dtype=torch.float32)` as PyTorch's CPU kernel computes
/// it: the first half up from `start`, the second half down from `end`, each point one fused
/// multiply-add (as `crate::q8`'s, which reproduces bitsandbytes' 8-bit maps bit for bit).
fn linspace(start: f32, end: f32, steps: usize) -> Vec<f32> {
    let step = (end - start) / (steps - 1) as f32;
    (0..steps)
        .map(|i| {
            if i < steps / 2 {
                step.mul_add(i as f32, start)
            } else {
                (-step).mul_add((steps - 1 - i) as f32, end)
            }
        })
        .collect()
}

/// torchao's `quantize_4bit_with_qmap` for one value `x` (already divided by its block's
/// scale): a branchless binary search for the last entry not above `x` (code 0 below the
/// first entry), then the next code where `x - map[c] >= (map[c + 1] - map[c]) * 0.5` (a
/// tie goes to the larger entry). NaN and the infinities take [`zero_code`].
pub fn nearest_code(map: &[f32; CODES], x: f32) -> u8 {
    if !x.is_finite() {
        return zero_code(map);
    }
    let mut c = 0usize;
    for step in [8, 4, 2, 1] {
        // c + step <= 8 + 4 + 2 + 1 = 15: always a code.
        if x >= map[c + step] {
            c += step;
        }
    }
    let up = (c + 1).min(CODES - 1);
    let (down_value, up_value) = (map[c], map[up]);
    if x - down_value >= (up_value - down_value) * 0.5 {
        up as u8
    } else {
        c as u8
    }
}

/// The thresholds of [`nearest_code`]'s rounding: `thresholds(map)[j]` is the smallest f32
/// `x` with `x - map[j] >= (map[j + 1] - map[j]) * 0.5` in f32. That test is monotone in
/// `x`, and each threshold lies in `(map[j], map[j + 1]]`, so for a finite `x` the code
/// torchao's search finds is the number of thresholds `<= x` ([`code_by_thresholds`]): 15
/// comparisons with constants, no table lookup, which the kernels vectorize.
pub(crate) fn thresholds(map: &[f32; CODES]) -> [f32; CODES - 1] {
    // f32s in their order as integers: negatives reversed below the positives.
    let key = |x: f32| if x.is_sign_negative() { !x.to_bits() } else { x.to_bits() | 0x8000_0000 };
    let value = |k: u32| f32::from_bits(if k & 0x8000_0000 != 0 { k & 0x7fff_ffff } else { !k });
    std::array::from_fn(|j| {
        let (down, up) = (map[j], map[j + 1]);
        let half = (up - down) * 0.5;
        // The smallest key in (key(down), key(up)] whose value passes (key(up)'s does).
        let (mut lo, mut hi) = (key(down), key(up));
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if value(mid) - down >= half {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        value(hi)
    })
}

/// [`nearest_code`] from the map's [`thresholds`] and its [`zero_code`].
#[cfg(test)]
pub(crate) fn code_by_thresholds(thresholds: &[f32; CODES - 1], zero: u8, x: f32) -> u8 {
    let count = thresholds.iter().map(|&t| u8::from(x >= t)).sum::<u8>();
    if (x.to_bits() & 0x7fff_ffff) < f32::INFINITY.to_bits() {
        count
    } else {
        zero
    }
}

/// The code a NaN or infinite value takes: that of 0 in the signed map, of the smallest
/// entry (1/16) in the unsigned one, which has no 0.
pub fn zero_code(map: &[f32; CODES]) -> u8 {
    map.iter().position(|&c| c == 0.0).unwrap_or(0) as u8
}

/// A block's scale: its largest finite magnitude, at least [`MIN_SCALE`] (torchao's
/// `amax().clip(1e-12)`; non-finite values are left out, see the [module](self) docs).
pub fn block_scale(values: &[f32]) -> f32 {
    values.iter().filter(|v| v.is_finite()).fold(0.0f32, |m, v| m.max(v.abs())).max(MIN_SCALE)
}

/// Packs codes two per byte, element 2j in the high nibble (torchao's
/// `(codes[::2] << 4) | codes[1::2]`); an odd count's last byte has a zero low nibble.
pub fn pack(codes: &[u8]) -> Vec<u8> {
    codes.chunks(2).map(|p| (p[0] << 4) | p.get(1).map_or(0, |c| c & 0xf)).collect()
}

/// Unpacks `len` codes from bytes of two (element 2j in the high nibble).
pub fn unpack(packed: &[u8], len: usize) -> Vec<u8> {
    (0..len).map(|e| code_at(packed, e)).collect()
}

/// Element `e`'s code in packed bytes.
pub(crate) fn code_at(packed: &[u8], e: usize) -> u8 {
    let byte = packed[e / 2];
    if e.is_multiple_of(2) {
        byte >> 4
    } else {
        byte & 0xf
    }
}

/// The plain form of the rule the kernels follow (`cpu/q4.rs` and the GPU's count
/// [`thresholds`] instead of searching), for the unit tests.
///
/// Quantizes `values` block by block into packed `codes` (half a byte per value) and
/// `scale` (one per block of `block_size`). The lengths have been checked: `values` is a
/// whole number of blocks.
#[cfg(test)]
pub(crate) fn quantize_into(
    values: &[f32],
    map: &[f32; CODES],
    block_size: usize,
    codes: &mut [u8],
    scale: &mut [f32],
) {
    let blocks = values.chunks(block_size).zip(codes.chunks_mut(block_size / 2));
    for ((block, block_codes), block_scale_out) in blocks.zip(scale.iter_mut()) {
        let s = block_scale(block);
        *block_scale_out = s;
        for (byte, pair) in block_codes.iter_mut().zip(block.chunks(2)) {
            *byte = (nearest_code(map, pair[0] / s) << 4) | nearest_code(map, pair[1] / s);
        }
    }
}

/// The values of packed `codes` under their blocks' `scale`: `map[code] * scale`.
pub(crate) fn dequantize_into(
    codes: &[u8],
    scale: &[f32],
    map: &[f32; CODES],
    block_size: usize,
    values: &mut [f32],
) {
    let blocks = codes.chunks(block_size / 2).zip(values.chunks_mut(block_size));
    for ((block_codes, block_values), s) in blocks.zip(scale) {
        for (pair, byte) in block_values.chunks_mut(2).zip(block_codes) {
            pair[0] = map[usize::from(byte >> 4)] * s;
            pair[1] = map[usize::from(byte & 0xf)] * s;
        }
    }
}

/// One state tensor under [`Q4States`], as either backend hands it back: blockwise 4-bit
/// for a tensor that keeps it, f32 otherwise (torchao's `OptimState4bit` with its `codes`
/// and `scale`, or a plain f32 tensor).
#[derive(Clone, Debug, PartialEq)]
pub enum Q4State {
    /// Two codes per byte, one scale per block.
    Q4 {
        /// The codes (torchao's `codes`), packed: byte j holds element 2j in its high
        /// nibble and element 2j + 1 in its low one. Every byte is valid.
        codes: Vec<u8>,
        /// Each block's scale (torchao's `scale`): a finite number >= 0 (0 only before the
        /// first step, as torchao's zeros). Any other value is refused where a state is
        /// written or loaded ([`Error::BadValue`]).
        scale: Vec<f32>,
    },
    /// A tensor that keeps f32 state.
    F32(Vec<f32>),
}

impl Q4State {
    /// The zero state torchao starts from for `len` elements: codes 0 under scale 0 where
    /// `quantized` (every value dequantizes to 0), f32 zeros otherwise.
    pub fn zeros(len: usize, quantized: bool, block_size: usize) -> Self {
        if quantized {
            Q4State::Q4 { codes: vec![0; len.div_ceil(2)], scale: vec![0.0; len / block_size.max(1)] }
        } else {
            Q4State::F32(vec![0.0; len])
        }
    }

    /// The values it stands for as a state of `kind`, in f32: `map[code] * scale` with the
    /// map of `kind`, or the f32 values. A state whose codes or scales do not fit
    /// `block_size` blocks is refused ([`Error::CountMismatch`]).
    pub fn values(&self, kind: StateKind, block_size: usize) -> Result<Vec<f32>> {
        match self {
            Q4State::Q4 { codes, scale } => {
                let len = scale.len() * block_size;
                if codes.len() * 2 != len {
                    return Err(Error::CountMismatch {
                        argument: "codes".into(),
                        got: codes.len(),
                        expected: len / 2,
                    });
                }
                let mut values = vec![0.0f32; len];
                dequantize_into(codes, scale, &map_for(kind), block_size, &mut values);
                Ok(values)
            }
            Q4State::F32(values) => Ok(values.clone()),
        }
    }
}

/// Refuses, naming it `argument`, a `state` that cannot replace the state of a tensor of
/// `len` elements under `config`: another storage, another length (a packed byte per two
/// elements, a scale per block), or a scale that is not a finite number >= 0.
pub(crate) fn check_replacement(state: &Q4State, config: Q4States, len: usize, argument: &str) -> Result<()> {
    let quantized = config.quantizes(len as u64);
    match (state, quantized) {
        (Q4State::F32(values), false) => check_len(argument, values.len(), len),
        (Q4State::Q4 { codes, scale }, true) => {
            check_len(&format!("{argument} codes"), codes.len() * 2, len)?;
            let blocks = len / config.block_size;
            if scale.len() != blocks {
                return Err(Error::CountMismatch {
                    argument: format!("{argument} scale"),
                    got: scale.len(),
                    expected: blocks,
                });
            }
            check_scale(scale, &format!("{argument} scale"))
        }
        _ => {
            let (got, expected) =
                if quantized { ("f32", "4-bit codes and scales") } else { ("4-bit", "f32 values") };
            Err(Error::BadRange {
                argument: argument.into(),
                problem: format!(
                    "{got} state for a tensor of {len} elements, expected {expected} (min_size {}, block_size {})",
                    config.min_size, config.block_size
                ),
            })
        }
    }
}

fn check_len(argument: &str, got: usize, len: usize) -> Result<()> {
    if got == len {
        Ok(())
    } else {
        Err(Error::LengthMismatch {
            argument: argument.into(),
            got: got as u64,
            expected: len as u64,
            reference: "param".into(),
        })
    }
}

/// Refuses a scale that cannot scale a block: NaN, infinite or negative. `argument` names
/// the scales; the error names the first bad block.
pub(crate) fn check_scale(scale: &[f32], argument: &str) -> Result<()> {
    match scale.iter().position(|a| !a.is_finite() || *a < 0.0) {
        None => Ok(()),
        Some(j) => Err(Error::BadValue {
            argument: format!("{argument}[{j}]"),
            problem: format!(
                "is {}; a block's scale is its largest magnitude, a finite number >= 0",
                scale[j]
            ),
        }),
    }
}

/// The step of `algorithm` at `t` (from 1) as torchao's `single_param_adam` runs it (each
/// family gives its own: `FamilyLowBit::q4_kernel_step`, in its folder).
pub(crate) fn kernel_step(algorithm: &crate::Algorithm, t: u64) -> crate::step::KernelStep {
    algorithm.q4_kernel_step(t)
}

/// Refuses an algorithm that has no 4-bit form here: anything but Adam/AdamW, AMSGrad and
/// `maximize` (each family says which: `FamilyLowBit::q4_refusal`, in its folder). Building
/// checks every group's, a schedule's change of a group the new one.
pub(crate) fn check_algorithm(algorithm: &crate::Algorithm) -> Result<()> {
    match algorithm.q4_refusal() {
        Some(reason) => {
            Err(Error::ConflictingOptions { first: "state_storage", second: "algorithm", reason })
        }
        None => Ok(()),
    }
}

/// Refuses what [`Q4States`] cannot run (see its docs). Both backends call it before
/// creating anything.
pub(crate) fn check_options(
    config: &Q4States,
    algorithms: &[crate::Algorithm],
    options: &crate::OptimizerOptions,
    dtypes: impl Iterator<Item = crate::DType>,
) -> Result<()> {
    config.validate()?;
    for algorithm in algorithms {
        check_algorithm(algorithm)?;
    }
    crate::state_storage::check_low_bit_options(crate::state_storage::LowBit::Q4, options, dtypes)
}

#[cfg(test)]
mod tests;
