//! Steps over blockwise 4-bit state ([`crate::q4`]), as `cpu/q8.rs` runs 8-bit state: each
//! block is dequantized into scratch, updated by the same f32 loop as f32 state
//! ([`Kernel`]; the parameter takes the unquantized new moments, as torchao's step does),
//! and requantized under its new scale, so every state byte is read once and written once.

use rayon::prelude::*;

use super::kernels::{Kernel, Operands, MAX_STATE};
use crate::q4::{self, Q4State, CODES, MAX_BLOCK_SIZE};
use crate::StateKind;

/// Elements per work item (whole blocks of every allowed size): as the f32 path's chunks.
const CHUNK: usize = 128 * 1024;

/// One state tensor's share of a work item.
#[derive(Default)]
enum Slot<'a> {
    Q4 {
        codes: &'a mut [u8],
        scale: &'a mut [f32],
        map: [f32; CODES],
    },
    F32(&'a mut [f32]),
    /// A state the algorithm does not keep.
    #[default]
    Absent,
}

impl<'a> Slot<'a> {
    fn of(state: &'a mut Q4State, kind: StateKind) -> Self {
        match state {
            Q4State::Q4 { codes, scale } => Slot::Q4 { codes, scale, map: q4::map_for(kind) },
            Q4State::F32(values) => Slot::F32(values),
        }
    }

    /// This slot's first `elements` (whole blocks of `block_size`) and the rest.
    fn split_at(self, elements: usize, block_size: usize) -> [Self; 2] {
        match self {
            Slot::Q4 { codes, scale, map } => {
                let (codes, codes_rest) = codes.split_at_mut(elements / 2);
                let (scale, scale_rest) = scale.split_at_mut(elements / block_size);
                [Slot::Q4 { codes, scale, map }, Slot::Q4 { codes: codes_rest, scale: scale_rest, map }]
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
        let quantized = state.iter().any(|s| matches!(s, Q4State::Q4 { .. }));
        let mut states = state.iter_mut().zip(kinds);
        let slots =
            std::array::from_fn(|_| states.next().map_or(Slot::Absent, |(s, kind)| Slot::of(s, *kind)));
        let mut rest = Job { param, grad, slots };
        // f32 state (a tensor without 4-bit state) is one job: it need not be whole blocks.
        while quantized && rest.param.len() > CHUNK {
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

/// Updates a job block by block (an f32-state job in one go).
fn run_job(kernel: &Kernel, block_size: usize, job: Job<'_>) {
    let Job { param, grad, mut slots } = job;
    if !slots.iter().any(|s| matches!(s, Slot::Q4 { .. })) {
        let mut state: [&mut [f32]; MAX_STATE] = [&mut [], &mut [], &mut []];
        for (slot, out) in slots.iter_mut().zip(state.iter_mut()) {
            if let Slot::F32(values) = slot {
                *out = values;
            }
        }
        kernel.run::<f32>(Operands { param, grad, state });
        return;
    }
    let mut scratch = [[0.0f32; MAX_BLOCK_SIZE]; MAX_STATE];
    for (b, (param, grad)) in param.chunks_mut(block_size).zip(grad.chunks(block_size)).enumerate() {
        let bytes = b * block_size / 2..(b + 1) * block_size / 2;
        let mut state: [&mut [f32]; MAX_STATE] = [&mut [], &mut [], &mut []];
        for ((slot, out), scratch) in slots.iter_mut().zip(state.iter_mut()).zip(scratch.iter_mut()) {
            if let Slot::Q4 { codes, scale, map } = slot {
                let values = &mut scratch[..block_size];
                q4::dequantize_into(&codes[bytes.clone()], &scale[b..=b], map, block_size, values);
                *out = values;
            }
        }
        kernel.run::<f32>(Operands { param, grad, state });
        for (slot, scratch) in slots.iter_mut().zip(scratch.iter()) {
            if let Slot::Q4 { codes, scale, map } = slot {
                let values = &scratch[..block_size];
                q4::quantize_into(values, map, block_size, &mut codes[bytes.clone()], &mut scale[b..=b]);
            }
        }
    }
}
