//! The CPU's one engine for blockwise low-bit state, generic over a [`Codec`]: the 8-bit
//! format's (`super::q8`, bitsandbytes') and the 4-bit one's (`super::q4`, torchao's). The
//! GPU's engine has the same shape (`crate::gpu::blockwise`, its `Format` trait).
//!
//! The engine owns what the formats share:
//! - a state tensor's share of a work item ([`Slot`]: its codes, one scale per block and the
//!   map its kind codes with; f32 state for a tensor the format leaves unquantized; or
//!   absent), and a work item of whole blocks of one tensor ([`Job`]);
//! - cutting every tensor into work items of whole blocks and running them on rayon ([`run`]);
//! - the one-pass loop through f32 scratch ([`blocked`]): a group of blocks of each quantized
//!   state dequantized into scratch, the family's f32 loop (the one f32 state runs) on the
//!   group, each block requantized under its new scale. Every state byte is read once and
//!   written once, and the update formula is the one every other storage type runs.
//!
//! A codec brings the format: its block size, the bytes `n` codes take, a block's dequantizing
//! and requantizing (which returns the block's new scale; the AVX-512 loops live beside the
//! format, `q8/lanes.rs` and `q4/lanes.rs`, and the codec picks them), the map a state's
//! [`StateKind`] takes, and how many elements one call of the f32 loop takes
//! ([`Codec::GROUP`]). What else differs stays with the format and the caller: bitsandbytes'
//! restart on a non-finite gradient ([`NonFinite`], asked for by the family's 8-bit loop),
//! q8's 32-bit kernel for tensors below `min_8bit_size` and its fused AVX-512 pass
//! (`q8::each`), which take jobs from [`run`] like the scratch loop does.

use rayon::prelude::*;

use super::kernels::{Operands, MAX_STATE};
use crate::StateKind;

/// Elements per work item, as the f32 path's chunks: a whole number of blocks of every
/// format's every block size, and of every codec's group.
const CHUNK: usize = 128 * 1024;

/// The scratch's length per state: the most elements any codec's f32 call takes
/// ([`Codec::GROUP`]).
const SCRATCH: usize = 4 * crate::q4::MAX_BLOCK_SIZE;

/// A blockwise low-bit format as the engine runs it: what it stores, how a block becomes
/// values and back. A value of it carries what is configured per optimizer (q4's block size).
pub(crate) trait Codec: Copy + Send + Sync {
    /// One tensor's stored state: quantized, or f32 for a tensor the format leaves so.
    type State;
    /// What a quantized slot codes with: the map its state's kind takes.
    type Map: Copy + Send + Sync;
    /// A map made ready for this CPU's loops (AVX-512's registers, or the portable loops),
    /// once per work item and state.
    type Lanes;
    /// Elements per call of the f32 loop in [`blocked`], a whole number of blocks of every
    /// block size and at most [`SCRATCH`]: fewer calls cost less dispatch, more elements more
    /// scratch out of the first cache.
    const GROUP: usize;
    /// Elements per block (and per scale).
    fn block_size(self) -> usize;
    /// The bytes the codes of `elements` elements take (whole bytes: `elements` is a whole
    /// number of blocks, or a tensor's last elements).
    fn code_bytes(elements: usize) -> usize;
    /// The slot of `state`, whose kind is `kind`.
    fn slot(state: &mut Self::State, kind: StateKind) -> Slot<'_, Self>;
    /// `map` made ready for this CPU's loops.
    fn lanes(map: &Self::Map) -> Self::Lanes;
    /// One block's values from its codes under `scale`.
    fn dequantize(lanes: &Self::Lanes, codes: &[u8], scale: f32, values: &mut [f32]);
    /// One block's codes for `values`, under the scale it returns (the format's rule for it).
    fn requantize(lanes: &Self::Lanes, values: &[f32], codes: &mut [u8]) -> f32;
}

/// One state tensor's share of a work item.
#[derive(Default)]
pub(crate) enum Slot<'a, C: Codec> {
    /// Blockwise codes, one scale per block (the 8-bit format's absmax).
    Quantized { codes: &'a mut [u8], scales: &'a mut [f32], map: C::Map },
    /// A tensor the format leaves in f32.
    F32(&'a mut [f32]),
    /// A state the algorithm does not keep.
    #[default]
    Absent,
}

impl<'a, C: Codec> Slot<'a, C> {
    /// This slot's first `elements` (whole blocks of `block_size`) and the rest.
    fn split_at(self, elements: usize, block_size: usize) -> [Self; 2] {
        match self {
            Slot::Quantized { codes, scales, map } => {
                let (codes, codes_rest) = codes.split_at_mut(C::code_bytes(elements));
                let (scales, scales_rest) = scales.split_at_mut(elements / block_size);
                [
                    Slot::Quantized { codes, scales, map },
                    Slot::Quantized { codes: codes_rest, scales: scales_rest, map },
                ]
            }
            Slot::F32(values) => {
                let (head, tail) = values.split_at_mut(elements);
                [Slot::F32(head), Slot::F32(tail)]
            }
            Slot::Absent => [Slot::Absent, Slot::Absent],
        }
    }
}

/// A run of whole blocks of one tensor (the last may be partial where the format allows it):
/// what a family's low-bit loop updates.
pub(crate) struct Job<'a, C: Codec> {
    pub(super) param: &'a mut [f32],
    pub(super) grad: &'a [f32],
    /// The states in the kernels' slot order.
    pub(super) slots: [Slot<'a, C>; MAX_STATE],
    pub(super) codec: C,
}

/// What a non-finite gradient does to its element on low-bit state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NonFinite {
    /// The update runs on it as on any gradient (a NaN or infinite state it makes is stored
    /// as the code of 0: `crate::q8::nearest_code`).
    Update,
    /// The element's parameter is left as it was and its states restart from 0, as
    /// bitsandbytes' 2-state kernel (Adam, AdEMAMix) does. Where the state is f32 (a tensor
    /// below `min_8bit_size`: bitsandbytes' 32-bit kernel) the update runs as `Update`.
    Restart,
}

/// Cuts every tensor into work items of whole blocks and runs `update` on each, in parallel:
/// `states[i]` holds tensor i's state in the kernels' slot order (`kinds`). The lengths have
/// been checked, and a quantized state's scales are one per block. The one allocation is the
/// list of work items, as the f32 path's.
pub(super) fn run<'a, C: Codec>(
    codec: C,
    kinds: &[StateKind],
    params: impl Iterator<Item = &'a mut [f32]>,
    grads: impl Iterator<Item = &'a [f32]>,
    states: &'a mut [Vec<C::State>],
    update: impl Fn(Job<'a, C>) + Sync + Send,
) {
    const { assert!(CHUNK.is_multiple_of(SCRATCH)) };
    let block_size = codec.block_size();
    let mut jobs = Vec::new();
    for ((param, grad), state) in params.zip(grads).zip(states.iter_mut()) {
        let mut states = state.iter_mut().zip(kinds);
        let slots =
            std::array::from_fn(|_| states.next().map_or(Slot::Absent, |(s, kind)| C::slot(s, *kind)));
        let mut rest = Job { param, grad, slots, codec };
        // Whole blocks of quantized state (CHUNK is a multiple of every block size); f32
        // state splits anywhere.
        while rest.param.len() > CHUNK {
            let (param, param_rest) = rest.param.split_at_mut(CHUNK);
            let (grad, grad_rest) = rest.grad.split_at(CHUNK);
            let mut split = rest.slots.map(|s| s.split_at(CHUNK, block_size));
            let slots = std::array::from_fn(|k| std::mem::take(&mut split[k][0]));
            let slots_rest = std::array::from_fn(|k| std::mem::take(&mut split[k][1]));
            jobs.push(Job { param, grad, slots, codec });
            rest = Job { param: param_rest, grad: grad_rest, slots: slots_rest, codec };
        }
        jobs.push(rest);
    }
    jobs.into_par_iter().for_each(update);
}

/// Updates `job` a group of [`Codec::GROUP`] elements at a time: each quantized state's
/// blocks dequantized into f32 scratch, `f32_loop` on the group, each block requantized
/// under its new scale. A job without quantized state runs `f32_loop` once. `non_finite`
/// says what a non-finite gradient does on quantized state.
pub(crate) fn blocked<C: Codec>(
    job: Job<'_, C>,
    non_finite: NonFinite,
    f32_loop: impl Fn(Operands<'_, f32>),
) {
    const { assert!(C::GROUP <= SCRATCH) };
    let Job { param, grad, mut slots, codec } = job;
    if !slots.iter().any(|slot| matches!(slot, Slot::Quantized { .. })) {
        let mut state: [&mut [f32]; MAX_STATE] = Default::default();
        for (slot, out) in slots.into_iter().zip(state.iter_mut()) {
            if let Slot::F32(values) = slot {
                *out = values;
            }
        }
        return f32_loop(Operands { param, grad, state });
    }
    let restart = non_finite == NonFinite::Restart && matches!(slots[0], Slot::Quantized { .. });
    let lanes = slots.each_ref().map(|slot| match slot {
        Slot::Quantized { map, .. } => Some(C::lanes(map)),
        _ => None,
    });
    let (block, group) = (codec.block_size(), C::GROUP);
    debug_assert!(group.is_multiple_of(block), "a group of {group} is not whole blocks of {block}");
    let mut scratch = [[0.0f32; SCRATCH]; MAX_STATE];
    // Zeroed only where a gradient may restart its element.
    let mut kept = restart.then_some([0.0f32; SCRATCH]);
    for (g, (param, grad)) in param.chunks_mut(group).zip(grad.chunks(group)).enumerate() {
        // A job is whole blocks, so a group is too, but for a tensor's last partial block.
        let (n, at) = (param.len(), g * group);
        let (first_block, bytes) = (at / block, C::code_bytes(at)..C::code_bytes(at + n));
        // The parameters a non-finite gradient leaves as they were (rare: kept only then).
        let restarts = match &mut kept {
            Some(kept) if grad.iter().any(|g| !g.is_finite()) => {
                kept[..n].copy_from_slice(param);
                Some(&*kept)
            }
            _ => None,
        };
        let mut state: [&mut [f32]; MAX_STATE] = Default::default();
        for (((slot, lanes), out), scratch) in
            slots.iter_mut().zip(&lanes).zip(state.iter_mut()).zip(scratch.iter_mut())
        {
            match (slot, lanes) {
                (Slot::Quantized { codes, scales, .. }, Some(lanes)) => {
                    let values = &mut scratch[..n];
                    let blocks =
                        codes[bytes.clone()].chunks(C::code_bytes(block)).zip(values.chunks_mut(block));
                    for ((codes, values), scale) in blocks.zip(&scales[first_block..]) {
                        C::dequantize(lanes, codes, *scale, values);
                    }
                    *out = values;
                }
                (Slot::F32(values), _) => *out = &mut values[at..at + n],
                _ => {}
            }
        }
        f32_loop(Operands { param, grad, state });
        if let Some(kept) = restarts {
            for (j, _) in grad.iter().enumerate().filter(|(_, g)| !g.is_finite()) {
                param[j] = kept[j];
                for state in scratch.iter_mut() {
                    state[j] = 0.0;
                }
            }
        }
        for ((slot, lanes), scratch) in slots.iter_mut().zip(&lanes).zip(scratch.iter()) {
            if let (Slot::Quantized { codes, scales, .. }, Some(lanes)) = (slot, lanes) {
                let blocks =
                    scratch[..n].chunks(block).zip(codes[bytes.clone()].chunks_mut(C::code_bytes(block)));
                for ((values, codes), scale) in blocks.zip(&mut scales[first_block..]) {
                    *scale = C::requantize(lanes, values, codes);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::q4::Q4State;
    use crate::q8::StoredState;

    /// An elementwise update of two states, as a family's f32 loop is.
    fn f32_loop(o: Operands<'_, f32>) {
        let Operands { param, grad, state: [m, v, ..] } = o;
        for (((p, g), m), v) in param.iter_mut().zip(grad).zip(m.iter_mut()).zip(v.iter_mut()) {
            *m = 0.9 * *m + 0.1 * g;
            *v = 0.99 * *v + 0.01 * g * g;
            *p -= 0.01 * *m / (v.sqrt() + 1e-8);
        }
    }

    /// Runs `codec` over one tensor of `n` elements: cut into work items on rayon by [`run`],
    /// or as one job, with two states made by `state(seed)`; the parameters and states after.
    fn step<C: Codec>(
        codec: C,
        n: usize,
        state: impl Fn(u32) -> C::State,
        cut: bool,
    ) -> (Vec<u32>, Vec<C::State>) {
        let mut seed = 0x9e37_79b9u32;
        let mut next = move || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1 << 24) as f32 - 0.5
        };
        let mut param: Vec<f32> = (0..n).map(|_| next()).collect();
        let grad: Vec<f32> = (0..n).map(|_| next() * 0.1).collect();
        let kinds = [StateKind::ExpAvg, StateKind::ExpAvgSq];
        let mut states = vec![vec![state(1), state(2)]];
        if cut {
            let params = std::iter::once(&mut param[..]);
            let grads = std::iter::once(&grad[..]);
            run(codec, &kinds, params, grads, &mut states, |job| blocked(job, NonFinite::Update, f32_loop));
        } else {
            let mut slots = states[0].iter_mut().zip(&kinds).map(|(s, kind)| C::slot(s, *kind));
            let slots = std::array::from_fn(|_| slots.next().unwrap_or_default());
            blocked(Job { param: &mut param, grad: &grad, slots, codec }, NonFinite::Update, f32_loop);
        }
        (param.iter().map(|p| p.to_bits()).collect(), states.remove(0))
    }

    /// Cutting a tensor of several work items (and, for 8-bit state, a last partial block)
    /// into jobs on rayon leaves the parameters, codes and scales of one job over it all, for
    /// both codecs and every 4-bit block size's extreme.
    #[test]
    fn work_items_give_the_one_jobs_results() {
        let codes = |seed: u32, len: usize| -> Vec<u8> {
            (0..len)
                .map(|i| (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed).to_le_bytes()[3])
                .collect()
        };
        let scales = |seed: u32, len: usize| -> Vec<f32> {
            (0..len).map(|i| 0.01 + ((i as u32 ^ seed) % 97) as f32 / 97.0).collect()
        };
        let n = 2 * CHUNK + 5 * crate::q8::BLOCK_SIZE + 77;
        let q8 = |seed| StoredState::Q8 {
            codes: codes(seed, n),
            absmax: scales(seed, n.div_ceil(crate::q8::BLOCK_SIZE)),
        };
        let codec = super::super::q8::Q8Codec;
        assert!(step(codec, n, q8, true) == step(codec, n, q8, false), "8-bit state");
        for block_size in [8, crate::q4::MAX_BLOCK_SIZE] {
            let n = 2 * CHUNK + 3 * crate::q4::MAX_BLOCK_SIZE;
            let q4 = |seed| Q4State::Q4 { codes: codes(seed, n / 2), scale: scales(seed, n / block_size) };
            let codec = super::super::q4::Q4Codec { block_size };
            assert!(
                step(codec, n, q4, true) == step(codec, n, q4, false),
                "4-bit state, blocks of {block_size}"
            );
        }
    }
}
