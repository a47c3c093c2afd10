//! Blockwise 4-bit state ([`crate::q4`], torchao's) on the CPU: the 4-bit codec of the shared
//! engine ([`super::blockwise`]). Each group of blocks is dequantized into scratch, updated by
//! the same f32 loop as f32 state ([`Kernel`]; the parameter takes the unquantized new
//! moments, as torchao's step does), and requantized under its new scale.
//!
//! What the format brings to the engine ([`Q4Codec`]): the configured block size, two codes
//! a byte, the map of each state's kind with its thresholds ([`Coding`]), the scale rule
//! (`q4::block_scale`: the largest finite magnitude, at least [`MIN_SCALE`]), and
//! [`Q4Codec::GROUP`] elements per call of the f32 loop. Where the CPU has AVX-512 the codes
//! are read and found in registers (`lanes`), without gathers; elsewhere by the portable loops
//! here. Both give the same codes bit for bit.

#[cfg(target_arch = "x86_64")]
mod lanes;

use super::blockwise::{self, Codec, NonFinite, Slot};
use super::kernels::Kernel;
use super::magnitude_key::{key, largest_finite, NO_KEY};
use crate::q4::{self, Q4State, CODES, MAX_BLOCK_SIZE, MIN_SCALE};
use crate::StateKind;

/// torchao's blockwise 4-bit format as the engine runs it, with the optimizer's block size.
#[derive(Clone, Copy)]
pub(super) struct Q4Codec {
    pub(super) block_size: usize,
}

impl Codec for Q4Codec {
    type State = Q4State;
    type Map = Coding;
    type Lanes = Prepared;
    /// Whole blocks of every allowed size: a call per block of 128 made a 16 Mi-element 4-bit
    /// Adam step about 6 % slower.
    const GROUP: usize = 4 * MAX_BLOCK_SIZE;

    fn block_size(self) -> usize {
        self.block_size
    }

    fn code_bytes(elements: usize) -> usize {
        elements / 2
    }

    fn slot(state: &mut Q4State, kind: StateKind) -> Slot<'_, Self> {
        match state {
            Q4State::Q4 { codes, scale } => Slot::Quantized { codes, scales: scale, map: Coding::of(kind) },
            Q4State::F32(values) => Slot::F32(values),
        }
    }

    fn lanes(coding: &Coding) -> Prepared {
        Prepared::new(*coding)
    }

    fn dequantize(lanes: &Prepared, codes: &[u8], scale: f32, values: &mut [f32]) {
        lanes.dequantize(codes, scale, values)
    }

    fn requantize(lanes: &Prepared, values: &[f32], codes: &mut [u8]) -> f32 {
        let scale = block_scale(values);
        lanes.quantize(values, scale, codes);
        scale
    }
}

/// How a state's values become codes and back: its map, the map's thresholds
/// ([`q4::thresholds`]) and the code a non-finite value takes.
#[derive(Clone, Copy)]
pub(super) struct Coding {
    map: [f32; CODES],
    thresholds: [f32; CODES - 1],
    zero: u8,
}

impl Coding {
    fn of(kind: StateKind) -> Self {
        Coding::from_map(q4::map_for(kind))
    }

    fn from_map(map: [f32; CODES]) -> Self {
        Coding { map, thresholds: q4::thresholds(&map), zero: q4::zero_code(&map) }
    }
}

/// One state's coding with the vector loops this CPU runs, found once per work item:
/// AVX-512's, with the coding's registers, or the portable ones.
pub(super) struct Prepared {
    coding: Coding,
    #[cfg(target_arch = "x86_64")]
    avx512: Option<(fearless_simd::Avx512, lanes::Registers)>,
}

impl Prepared {
    fn new(coding: Coding) -> Self {
        Prepared {
            coding,
            #[cfg(target_arch = "x86_64")]
            avx512: lanes::level().map(|level| (level, lanes::registers(level, &coding))),
        }
    }

    fn dequantize(&self, codes: &[u8], scale: f32, values: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if let Some((level, registers)) = &self.avx512 {
            return lanes::dequantize(*level, registers, codes, scale, &self.coding.map, values);
        }
        dequantize(codes, scale, &self.coding.map, values)
    }

    fn quantize(&self, values: &[f32], scale: f32, codes: &mut [u8]) {
        #[cfg(target_arch = "x86_64")]
        if let Some((level, registers)) = &self.avx512 {
            return lanes::quantize(*level, registers, values, scale, &self.coding, codes);
        }
        quantize(values, scale, &self.coding, codes)
    }
}

/// Runs `kernel` over every tensor through the engine's scratch loop: `states[i]` holds
/// tensor i's state in the kernel's slot order (`kinds`). The lengths have been checked, and
/// a 4-bit state's tensor is a whole number of blocks of `block_size`.
pub(super) fn run<'a>(
    kernel: &Kernel,
    kinds: &[StateKind],
    block_size: usize,
    params: impl Iterator<Item = &'a mut [f32]>,
    grads: impl Iterator<Item = &'a [f32]>,
    states: &'a mut [Vec<Q4State>],
) {
    blockwise::run(Q4Codec { block_size }, kinds, params, grads, states, |job| {
        blockwise::blocked(job, NonFinite::Update, |o| kernel.run::<f32>(o))
    });
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn dequantize(codes: &[u8], scale: f32, map: &[f32; CODES], values: &mut [f32]) {
    for (pair, byte) in values.chunks_exact_mut(2).zip(codes) {
        pair[0] = map[usize::from(byte >> 4)] * scale;
        pair[1] = map[usize::from(byte & 0xf)] * scale;
    }
}

/// The block's largest finite magnitude, at least [`MIN_SCALE`] (`q4::block_scale`), as a
/// max of integer keys (`magnitude_key`), which vectorizes where a float max or a max of a
/// select does not.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn block_scale(values: &[f32]) -> f32 {
    largest_finite(values.iter().fold(NO_KEY, |m, v| m.max(key(*v)))).max(MIN_SCALE)
}

/// Each value's code under `scale` (`q4::code_by_thresholds`, torchao's code), packed two
/// per byte with the even element high. The codes are found in a loop of their own, over
/// a block at a time, so that it vectorizes.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn quantize(values: &[f32], scale: f32, coding: &Coding, codes: &mut [u8]) {
    let mut unpacked = [0u8; MAX_BLOCK_SIZE];
    let unpacked = &mut unpacked[..values.len()];
    for (code, v) in unpacked.iter_mut().zip(values) {
        let x = v / scale;
        let count = coding.thresholds.iter().fold(0u8, |c, &t| c + u8::from(x >= t));
        *code = if (x.to_bits() & 0x7fff_ffff) < 0x7f80_0000 { count } else { coding.zero };
    }
    for (byte, pair) in codes.iter_mut().zip(unpacked.chunks_exact(2)) {
        *byte = (pair[0] << 4) | pair[1];
    }
}
