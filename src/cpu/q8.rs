//! Steps over blockwise 8-bit state ([`crate::q8`]): each block of 256 elements is
//! dequantized into registers-sized scratch, updated by the same f32 loop as f32 state
//! ([`Kernel`]), and requantized under its new absmax, so every state byte is read once and
//! written once and the update formula is the one every other storage type runs.

use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
mod lanes;

use super::kernels::{Kernel, Operands};
use crate::q8::lut::{CodeTable, INFINITY};
use crate::q8::{StoredState, BLOCK_SIZE};
use crate::StateKind;

/// Blocks per work item: 128 Ki elements, as the f32 path's chunks.
const CHUNK_BLOCKS: usize = 512;

/// The most states an 8-bit optimizer keeps (AdEMAMix's two EMAs and its second moment).
const MAX_STATES: usize = 3;

/// One state tensor's share of a work item.
#[derive(Default)]
enum Slot<'a> {
    Q8 {
        codes: &'a mut [u8],
        absmax: &'a mut [f32],
        table: &'static CodeTable,
    },
    F32(&'a mut [f32]),
    /// A state the algorithm does not keep.
    #[default]
    Absent,
}

impl<'a> Slot<'a> {
    /// The slot of `state`, quantized with the map of `kind`.
    fn of(state: &'a mut StoredState, kind: StateKind) -> Self {
        match state {
            StoredState::Q8 { codes, absmax } => Slot::Q8 { codes, absmax, table: CodeTable::for_kind(kind) },
            StoredState::F32(values) => Slot::F32(values),
        }
    }

    /// This slot's first `elements` (a whole number of blocks) and the rest.
    fn split_at(self, elements: usize) -> (Self, Self) {
        match self {
            Slot::Q8 { codes, absmax, table } => {
                let (codes, codes_rest) = codes.split_at_mut(elements);
                let (absmax, absmax_rest) = absmax.split_at_mut(elements / BLOCK_SIZE);
                (
                    Slot::Q8 { codes, absmax, table },
                    Slot::Q8 { codes: codes_rest, absmax: absmax_rest, table },
                )
            }
            Slot::F32(values) => {
                let (head, tail) = values.split_at_mut(elements);
                (Slot::F32(head), Slot::F32(tail))
            }
            Slot::Absent => (Slot::Absent, Slot::Absent),
        }
    }
}

/// A run of whole blocks of one tensor.
struct Job<'a> {
    param: &'a mut [f32],
    grad: &'a [f32],
    slots: [Slot<'a>; MAX_STATES],
}

/// Runs `kernel` over every tensor: `states[i]` holds tensor i's state in the kernel's slot
/// order (`kinds`). The lengths have been checked. The one allocation is the list of work
/// items, as the f32 path's.
pub(super) fn run<'a>(
    kernel: &Kernel,
    kinds: &[StateKind],
    params: impl Iterator<Item = &'a mut [f32]>,
    grads: impl Iterator<Item = &'a [f32]>,
    states: &'a mut [Vec<StoredState>],
) {
    let chunk = CHUNK_BLOCKS * BLOCK_SIZE;
    let mut jobs = Vec::new();
    for ((param, grad), state) in params.zip(grads).zip(states.iter_mut()) {
        let mut states = state.iter_mut().zip(kinds);
        let slots =
            std::array::from_fn(|_| states.next().map_or(Slot::Absent, |(s, kind)| Slot::of(s, *kind)));
        let mut rest = Job { param, grad, slots };
        while rest.param.len() > chunk {
            let (param, param_rest) = rest.param.split_at_mut(chunk);
            let (grad, grad_rest) = rest.grad.split_at(chunk);
            let mut split = rest.slots.map(|s| <[Slot; 2]>::from(s.split_at(chunk)));
            let slots = std::array::from_fn(|k| std::mem::take(&mut split[k][0]));
            let slots_rest = std::array::from_fn(|k| std::mem::take(&mut split[k][1]));
            jobs.push(Job { param, grad, slots });
            rest = Job { param: param_rest, grad: grad_rest, slots: slots_rest };
        }
        jobs.push(rest);
    }
    jobs.into_par_iter().for_each(|job| run_job(kernel, job));
}

/// Updates a job block by block.
fn run_job(kernel: &Kernel, job: Job<'_>) {
    let Job { param, grad, mut slots } = job;
    let mut scratch = [[0.0f32; BLOCK_SIZE]; MAX_STATES];
    let lanes = Lanes::new();
    for (b, (param, grad)) in param.chunks_mut(BLOCK_SIZE).zip(grad.chunks(BLOCK_SIZE)).enumerate() {
        let (n, at) = (param.len(), b * BLOCK_SIZE);
        update_block(kernel, lanes, &mut slots, &mut scratch, param, grad, b);
        let mut updated = scratch.iter();
        for slot in slots.iter_mut() {
            if let Slot::Q8 { codes, absmax, table } = slot {
                let values = &updated.next().map(|s| &s[..n]).unwrap_or_default();
                absmax[b] = block_absmax(values);
                lanes.quantize(values, absmax[b], table, &mut codes[at..at + n]);
            }
        }
    }
}

/// The vector loops this CPU runs, found once per job: AVX-512's, which need no gathers
/// (`lanes`), or the portable ones.
#[derive(Clone, Copy)]
struct Lanes {
    #[cfg(target_arch = "x86_64")]
    avx512: Option<fearless_simd::Avx512>,
}

impl Lanes {
    fn new() -> Self {
        Lanes {
            #[cfg(target_arch = "x86_64")]
            avx512: lanes::level(),
        }
    }

    fn dequantize(self, codes: &[u8], absmax: f32, table: &CodeTable, values: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if let Some(level) = self.avx512 {
            return lanes::dequantize(level, codes, absmax, table, values);
        }
        dequantize(codes, absmax, table.map(), values)
    }

    fn quantize(self, values: &[f32], absmax: f32, table: &CodeTable, codes: &mut [u8]) {
        #[cfg(target_arch = "x86_64")]
        if let Some(level) = self.avx512 {
            return lanes::quantize(level, values, absmax, table, codes);
        }
        quantize(values, absmax, table, codes)
    }
}

/// Block `b`'s update: its 8-bit slots dequantized into `scratch`, then the f32 loop.
fn update_block(
    kernel: &Kernel,
    lanes: Lanes,
    slots: &mut [Slot<'_>],
    scratch: &mut [[f32; BLOCK_SIZE]; MAX_STATES],
    param: &mut [f32],
    grad: &[f32],
    b: usize,
) {
    let (n, at) = (param.len(), b * BLOCK_SIZE);
    let mut scratch_slices = scratch.iter_mut().map(|s| &mut s[..n]);
    let mut state: [&mut [f32]; 3] = [&mut [], &mut [], &mut []];
    for (slot, out) in slots.iter_mut().zip(state.iter_mut()) {
        match slot {
            Slot::Q8 { codes, absmax, table } => {
                let values = scratch_slices.next().unwrap_or_default();
                lanes.dequantize(&codes[at..at + n], absmax[b], table, values);
                *out = values;
            }
            Slot::F32(values) => *out = &mut values[at..at + n],
            Slot::Absent => {}
        }
    }
    kernel.run::<f32>(Operands { param, grad, state });
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn dequantize(codes: &[u8], absmax: f32, map: &[f32; 256], values: &mut [f32]) {
    for (value, code) in values.iter_mut().zip(codes) {
        *value = map[usize::from(*code)] * absmax;
    }
}

/// The block's largest finite magnitude, 1 for a block without one (all zero, or all NaN or
/// infinite). A non-finite value is left out, as `q8::quantize` leaves it: it takes the code
/// of 0, and the block's other values keep their scale.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn block_absmax(values: &[f32]) -> f32 {
    // Bits of magnitudes order as the magnitudes do, infinity and NaN (from `INFINITY` up)
    // above every finite one. Shifted up by `SHIFT`, the finite ones stay below 2^31 and the
    // others wrap to negative i32s, which a signed max leaves out: a plain max, which
    // vectorizes (a max of a select does not).
    const SHIFT: u32 = (1 << 31) - INFINITY;
    let key = values.iter().fold(SHIFT as i32, |m, v| m.max(((v.to_bits() & 0x7fff_ffff) + SHIFT) as i32));
    let largest = key as u32 - SHIFT;
    if largest == 0 {
        1.0
    } else {
        f32::from_bits(largest)
    }
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn quantize(values: &[f32], absmax: f32, table: &CodeTable, codes: &mut [u8]) {
    for (code, value) in codes.iter_mut().zip(values) {
        *code = table.code(value / absmax);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loops this CPU picks and the portable ones give the same codes and values, block by
    /// block, for both maps (on a CPU without AVX-512 both are the portable ones).
    #[test]
    fn the_chosen_loops_and_the_portable_ones_agree() {
        let portable = Lanes {
            #[cfg(target_arch = "x86_64")]
            avx512: None,
        };
        let chosen = Lanes::new();
        let mut state = 0x1234_5678u32;
        let mut values = vec![0f32; 4 * BLOCK_SIZE + 100];
        for (i, v) in values.iter_mut().enumerate() {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            // Magnitudes over nine decades, both signs, and now and then a zero or a NaN.
            let magnitude = 10f32.powf(-9.0 * (state >> 8) as f32 / (1 << 24) as f32);
            *v = match i % 97 {
                0 => 0.0,
                1 => f32::NAN,
                _ if state & 1 == 1 => -magnitude,
                _ => magnitude,
            };
        }
        for table in [CodeTable::signed(), CodeTable::unsigned()] {
            for block in values.chunks(BLOCK_SIZE) {
                let absmax = block_absmax(block);
                let (mut a, mut b) = (vec![0u8; block.len()], vec![1u8; block.len()]);
                portable.quantize(block, absmax, table, &mut a);
                chosen.quantize(block, absmax, table, &mut b);
                assert_eq!(a, b);
                let (mut x, mut y) = (vec![0f32; block.len()], vec![1f32; block.len()]);
                portable.dequantize(&a, absmax, table, &mut x);
                chosen.dequantize(&a, absmax, table, &mut y);
                assert_eq!(x, y);
            }
        }
    }
}
