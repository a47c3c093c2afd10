//! Steps over blockwise 4-bit state ([`crate::q4`]), as `cpu/q8.rs` runs 8-bit state: each
//! block is dequantized into scratch, updated by the same f32 loop as f32 state
//! ([`Kernel`]; the parameter takes the unquantized new moments, as torchao's step does),
//! and requantized under its new scale, so every state byte is read once and written once.
//! Where the CPU has AVX-512 the codes are read and found in registers (`lanes`), without
//! gathers; elsewhere by the portable loops here. Both give the same codes bit for bit.

use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
mod lanes;

use super::kernels::{Kernel, Operands, MAX_STATE};
use super::magnitude_key::{key, largest_finite, NO_KEY};
use crate::q4::{self, Q4State, CODES, MAX_BLOCK_SIZE, MIN_SCALE};
use crate::StateKind;

/// Elements per work item (whole blocks of every allowed size): as the f32 path's chunks.
const CHUNK: usize = 128 * 1024;

/// Elements the f32 update takes per call (whole blocks of every allowed size): a call per
/// block of 128 made a 16 Mi-element 4-bit Adam step about 6 % slower.
const GROUP: usize = 4 * MAX_BLOCK_SIZE;

/// How a state's values become codes and back: its map, the map's thresholds
/// ([`q4::thresholds`]) and the code a non-finite value takes.
#[derive(Clone, Copy)]
struct Coding {
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
struct Codec {
    coding: Coding,
    #[cfg(target_arch = "x86_64")]
    avx512: Option<(fearless_simd::Avx512, lanes::Registers)>,
}

impl Codec {
    fn new(coding: Coding) -> Self {
        Codec {
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

/// One state tensor's share of a work item.
#[derive(Default)]
enum Slot<'a> {
    Q4 {
        codes: &'a mut [u8],
        scale: &'a mut [f32],
        coding: Coding,
    },
    F32(&'a mut [f32]),
    /// A state the algorithm does not keep.
    #[default]
    Absent,
}

impl<'a> Slot<'a> {
    fn of(state: &'a mut Q4State, kind: StateKind) -> Self {
        match state {
            Q4State::Q4 { codes, scale } => Slot::Q4 { codes, scale, coding: Coding::of(kind) },
            Q4State::F32(values) => Slot::F32(values),
        }
    }

    /// This slot's first `elements` (whole blocks of `block_size`) and the rest.
    fn split_at(self, elements: usize, block_size: usize) -> [Self; 2] {
        match self {
            Slot::Q4 { codes, scale, coding } => {
                let (codes, codes_rest) = codes.split_at_mut(elements / 2);
                let (scale, scale_rest) = scale.split_at_mut(elements / block_size);
                [Slot::Q4 { codes, scale, coding }, Slot::Q4 { codes: codes_rest, scale: scale_rest, coding }]
            }
            Slot::F32(values) => {
                let (head, tail) = values.split_at_mut(elements);
                [Slot::F32(head), Slot::F32(tail)]
            }
            Slot::Absent => [Slot::Absent, Slot::Absent],
        }
    }
}

/// A run of whole blocks of one tensor.
struct Job<'a> {
    param: &'a mut [f32],
    grad: &'a [f32],
    slots: [Slot<'a>; MAX_STATE],
}

/// Runs `kernel` over every tensor: `states[i]` holds tensor i's state in the kernel's slot
/// order (`kinds`). The lengths have been checked, and a 4-bit state's tensor is a whole
/// number of blocks of `block_size`.
pub(super) fn run<'a>(
    kernel: &Kernel,
    kinds: &[StateKind],
    block_size: usize,
    params: impl Iterator<Item = &'a mut [f32]>,
    grads: impl Iterator<Item = &'a [f32]>,
    states: &'a mut [Vec<Q4State>],
) {
    let mut jobs = Vec::new();
    for ((param, grad), state) in params.zip(grads).zip(states.iter_mut()) {
        let mut states = state.iter_mut().zip(kinds);
        let slots =
            std::array::from_fn(|_| states.next().map_or(Slot::Absent, |(s, kind)| Slot::of(s, *kind)));
        let mut rest = Job { param, grad, slots };
        // Whole blocks of 4-bit state (CHUNK is a multiple of every block size); f32 state
        // splits anywhere.
        while rest.param.len() > CHUNK {
            let (param, param_rest) = rest.param.split_at_mut(CHUNK);
            let (grad, grad_rest) = rest.grad.split_at(CHUNK);
            let mut split = rest.slots.map(|s| s.split_at(CHUNK, block_size));
            let slots = std::array::from_fn(|k| std::mem::take(&mut split[k][0]));
            let slots_rest = std::array::from_fn(|k| std::mem::take(&mut split[k][1]));
            jobs.push(Job { param, grad, slots });
            rest = Job { param: param_rest, grad: grad_rest, slots: slots_rest };
        }
        jobs.push(rest);
    }
    jobs.into_par_iter().for_each(|job| run_job(kernel, block_size, job));
}

/// Updates a job a group of blocks at a time (a job of f32 state in one go).
fn run_job(kernel: &Kernel, block_size: usize, job: Job<'_>) {
    let Job { param, grad, mut slots } = job;
    if !slots.iter().any(|s| matches!(s, Slot::Q4 { .. })) {
        let mut state: [&mut [f32]; MAX_STATE] = Default::default();
        for (slot, out) in slots.iter_mut().zip(state.iter_mut()) {
            if let Slot::F32(values) = slot {
                *out = values;
            }
        }
        kernel.run::<f32>(Operands { param, grad, state });
        return;
    }
    let codecs = slots.each_ref().map(|slot| match slot {
        Slot::Q4 { coding, .. } => Some(Codec::new(*coding)),
        _ => None,
    });
    let mut scratch = [[0.0f32; GROUP]; MAX_STATE];
    for (g, (param, grad)) in param.chunks_mut(GROUP).zip(grad.chunks(GROUP)).enumerate() {
        // A job is whole blocks, so a group is too, its last one included.
        let (n, first_block) = (param.len(), g * GROUP / block_size);
        let bytes = g * GROUP / 2..g * GROUP / 2 + n / 2;
        let mut state: [&mut [f32]; MAX_STATE] = Default::default();
        for (((slot, codec), out), scratch) in
            slots.iter_mut().zip(&codecs).zip(state.iter_mut()).zip(scratch.iter_mut())
        {
            if let (Slot::Q4 { codes, scale, .. }, Some(codec)) = (slot, codec) {
                let values = &mut scratch[..n];
                let blocks = codes[bytes.clone()].chunks(block_size / 2).zip(values.chunks_mut(block_size));
                for ((codes, values), scale) in blocks.zip(&scale[first_block..]) {
                    codec.dequantize(codes, *scale, values);
                }
                *out = values;
            }
        }
        kernel.run::<f32>(Operands { param, grad, state });
        for ((slot, codec), scratch) in slots.iter_mut().zip(&codecs).zip(scratch.iter()) {
            if let (Slot::Q4 { codes, scale, .. }, Some(codec)) = (slot, codec) {
                let blocks =
                    scratch[..n].chunks(block_size).zip(codes[bytes.clone()].chunks_mut(block_size / 2));
                for ((values, codes), scale) in blocks.zip(&mut scale[first_block..]) {
                    *scale = block_scale(values);
                    codec.quantize(values, *scale, codes);
                }
            }
        }
    }
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
