//! One pass over 8-bit state with AVX-512: a chunk of four registers of each state's codes
//! dequantized (`lanes::Dequantizer`), the family's element update run on those registers
//! and the parameters' and gradients', each state's new absmax raised as the values are
//! made, and the previous block's same chunk requantized under its absmax, known by then
//! (`lanes::Requantizer`). Everything runs inside one function compiled for AVX-512, each
//! map's registers built once per call rather than once per block, so the update is inlined
//! and vectorized between the code loops. The results are the blocked path's
//! (`super::blocked`) bit for bit: the same element function, the same absmax rule, the
//! same codes.

use fearless_simd::{Avx512, Simd};

use super::lanes::{self, Dequantizer, Requantizer, B, Q};
use super::{absmax_key, largest_finite, NO_KEY};
use crate::q8::lut::CodeTable;
use crate::q8::BLOCK_SIZE;

/// Lanes per register.
const L: usize = 16;

/// Registers per block.
const REGISTERS: usize = BLOCK_SIZE / L;

/// One 8-bit state tensor's share of the elements `each` updates.
pub(super) struct Slot<'a> {
    pub(super) codes: &'a mut [u8],
    pub(super) absmax: &'a mut [f32],
    pub(super) table: &'static CodeTable,
}

/// How a block's values are requantized once its absmax is known.
#[derive(Clone, Copy)]
enum Scale {
    /// By the arithmetic, under this absmax.
    Arithmetic(f32),
    /// By the exact rule alone: an absmax whose reciprocal the arithmetic cannot take.
    Exact(f32),
    /// A block without a finite value but 0 (absmax 1): every code the code of 0, -0.0's too
    /// (`crate::q8::quantize`).
    Zero,
}

impl Scale {
    /// The scale of a block whose largest finite magnitude is `largest`, which `requantizer`
    /// now takes; and the absmax stored.
    #[inline(always)]
    fn of(level: Avx512, requantizer: &mut Requantizer, largest: f32) -> (Self, f32) {
        if largest == 0.0 {
            (Scale::Zero, 1.0)
        } else if requantizer.set_absmax(level, largest) {
            (Scale::Arithmetic(largest), largest)
        } else {
            (Scale::Exact(largest), largest)
        }
    }

    /// `values`' codes under this scale.
    #[inline(always)]
    fn requantize(self, level: Avx512, requantizer: &mut Requantizer, values: &[f32], codes: &mut [u8]) {
        match self {
            Scale::Arithmetic(absmax) | Scale::Exact(absmax) => {
                requantizer.quantize(level, values, absmax, codes)
            }
            Scale::Zero => codes.fill(requantizer.zero()),
        }
    }
}

/// An empty slot, which `each` is never given (its caller checks every slot is 8-bit).
impl Default for Slot<'_> {
    fn default() -> Self {
        Slot { codes: &mut [], absmax: &mut [], table: CodeTable::signed() }
    }
}

/// Runs `update(grad, param, states) -> (param, states)` on every element of `param` and
/// `grad` (whole blocks and a last partial one), with the `S` states held in `slots`.
/// `RESTART`: an element whose gradient is NaN or infinite keeps its parameter and its
/// states restart from 0 (`super::NonFinite::Restart`).
///
/// Block `b` is updated a chunk of four registers at a time, and after each chunk the same
/// chunk of block `b - 1`, whose absmax is known by then, is requantized: the update's
/// divisions and square roots and the requantizing's permutes take different ports, and
/// interleaved they run side by side instead of one after the other.
#[inline(always)]
pub(super) fn each<const S: usize, const RESTART: bool>(
    level: Avx512,
    param: &mut [f32],
    grad: &[f32],
    mut slots: [Slot<'_>; S],
    update: impl Fn(f32, f32, [f32; S]) -> (f32, [f32; S]),
) {
    level.vectorize(
        #[inline(always)]
        || {
            let mut requantizers = slots.each_ref().map(|slot| Requantizer::new(level, slot.table));
            let dequantizers = slots.each_ref().map(|slot| Dequantizer::new(level, slot.table));
            // The new states of the block being updated and of the one before it.
            let mut scratch = [[[0f32; BLOCK_SIZE]; S]; 2];
            // How the block before is requantized.
            let mut previous = [Scale::Zero; S];
            let (params, param_tail) = param.as_chunks_mut::<BLOCK_SIZE>();
            let (grads, grad_tail) = grad.as_chunks::<BLOCK_SIZE>();
            for (b, (param, grad)) in params.iter_mut().zip(grads).enumerate() {
                let (first, second) = scratch.split_at_mut(1);
                let (fresh, done) =
                    if b % 2 == 0 { (&mut first[0], &second[0]) } else { (&mut second[0], &first[0]) };
                let mut keys = [[NO_KEY; L]; S];
                for c in 0..BLOCK_SIZE / Q {
                    let chunk = b * BLOCK_SIZE + c * Q..b * BLOCK_SIZE + (c + 1) * Q;
                    for ((slot, dequantizer), values) in slots.iter().zip(&dequantizers).zip(fresh.iter_mut())
                    {
                        let codes = <&[u8; B]>::try_from(&slot.codes[chunk.clone()]);
                        let values = <&mut [f32; B]>::try_from(&mut values[c * Q..(c + 1) * Q]);
                        if let (Ok(codes), Ok(values)) = (codes, values) {
                            dequantizer.chunk(level, codes, slot.absmax[b], values);
                        }
                    }
                    update_chunk::<S, RESTART>(
                        &update,
                        param,
                        grad,
                        fresh,
                        c * Q / L..(c + 1) * Q / L,
                        &mut keys,
                    );
                    if b > 0 {
                        let before = chunk.start - BLOCK_SIZE..chunk.end - BLOCK_SIZE;
                        for ((slot, requantizer), (values, scale)) in
                            slots.iter_mut().zip(&mut requantizers).zip(done.iter().zip(previous))
                        {
                            let values = &values[c * Q..(c + 1) * Q];
                            let codes = &mut slot.codes[before.clone()];
                            match (<&[f32; Q]>::try_from(values), <&mut [u8; Q]>::try_from(codes), scale) {
                                (Ok(values), Ok(codes), Scale::Arithmetic(absmax)) => {
                                    requantizer.quantize_chunk(level, values, absmax, codes)
                                }
                                // A subnormal absmax (the exact rule, which `quantize` takes) or
                                // a block of zeros.
                                (Ok(values), Ok(codes), scale) => {
                                    scale.requantize(level, requantizer, values, codes)
                                }
                                // Unreachable: a whole block's chunk is `Q` long.
                                _ => {}
                            }
                        }
                    }
                }
                for ((slot, requantizer), (key, previous)) in
                    slots.iter_mut().zip(&mut requantizers).zip(keys.into_iter().zip(previous.iter_mut()))
                {
                    let (scale, absmax) = Scale::of(level, requantizer, largest(key));
                    slot.absmax[b] = absmax;
                    *previous = scale;
                }
            }
            if let Some(b) = params.len().checked_sub(1) {
                let done = &scratch[b % 2];
                for ((slot, requantizer), (values, scale)) in
                    slots.iter_mut().zip(&mut requantizers).zip(done.iter().zip(previous))
                {
                    let codes = &mut slot.codes[b * BLOCK_SIZE..(b + 1) * BLOCK_SIZE];
                    scale.requantize(level, requantizer, values, codes);
                }
            }
            if !param_tail.is_empty() {
                // The last partial block, padded with zeros that nothing reads back: its
                // absmax is taken over its own elements only.
                let (n, b) = (param_tail.len(), params.len());
                let codes = b * BLOCK_SIZE..b * BLOCK_SIZE + n;
                let (mut param, mut grad) = ([0f32; BLOCK_SIZE], [0f32; BLOCK_SIZE]);
                param[..n].copy_from_slice(param_tail);
                grad[..n].copy_from_slice(grad_tail);
                let values = &mut scratch[0];
                for (slot, values) in slots.iter().zip(values.iter_mut()) {
                    values.fill(0.0);
                    lanes::dequantize(
                        level,
                        &slot.codes[codes.clone()],
                        slot.absmax[b],
                        slot.table,
                        &mut values[..n],
                    );
                }
                let mut keys = [[NO_KEY; L]; S];
                update_chunk::<S, RESTART>(&update, &mut param, &grad, values, 0..REGISTERS, &mut keys);
                param_tail.copy_from_slice(&param[..n]);
                for ((slot, requantizer), values) in
                    slots.iter_mut().zip(&mut requantizers).zip(values.iter())
                {
                    // Over the block's own elements, not the padding's.
                    let (scale, absmax) =
                        Scale::of(level, requantizer, largest_finite(super::block_key(&values[..n])));
                    slot.absmax[b] = absmax;
                    scale.requantize(level, requantizer, &values[..n], &mut slot.codes[codes.clone()]);
                }
            }
        },
    )
}

/// [`update_registers`], and with `RESTART` (see [`each`]) the chunk's gradients tested at
/// once: a chunk with one that is not finite (rare) takes [`restart_chunk`], so the
/// update's loop has no per-lane select.
#[inline(always)]
fn update_chunk<const S: usize, const RESTART: bool>(
    update: &impl Fn(f32, f32, [f32; S]) -> (f32, [f32; S]),
    param: &mut [f32; BLOCK_SIZE],
    grad: &[f32; BLOCK_SIZE],
    states: &mut [[f32; BLOCK_SIZE]; S],
    registers: std::ops::Range<usize>,
    keys: &mut [[i32; L]; S],
) {
    let elements = registers.start * L..registers.end * L;
    if RESTART && grad[elements].iter().fold(false, |bad, g| bad | !g.is_finite()) {
        return restart_chunk(update, param, grad, states, registers, keys);
    }
    update_registers(update, param, grad, states, registers, keys)
}

/// [`update_registers`] on a chunk with a non-finite gradient: that element keeps its
/// parameter and its states restart from 0, and the absmax keys are raised from the states
/// as they are then.
#[cold]
fn restart_chunk<const S: usize>(
    update: &impl Fn(f32, f32, [f32; S]) -> (f32, [f32; S]),
    param: &mut [f32; BLOCK_SIZE],
    grad: &[f32; BLOCK_SIZE],
    states: &mut [[f32; BLOCK_SIZE]; S],
    registers: std::ops::Range<usize>,
    keys: &mut [[i32; L]; S],
) {
    let before = *param;
    let mut unused = [[NO_KEY; L]; S];
    update_registers(update, param, grad, states, registers.clone(), &mut unused);
    for j in registers.start * L..registers.end * L {
        if !grad[j].is_finite() {
            param[j] = before[j];
            for state in states.iter_mut() {
                state[j] = 0.0;
            }
        }
        for (state, keys) in states.iter().zip(keys.iter_mut()) {
            keys[j % L] = keys[j % L].max(absmax_key(state[j]));
        }
    }
}

/// Registers `registers` of one block through `update`: `states` holds the states in and
/// out, and each state's absmax key is raised lane by lane in `keys`.
#[inline(always)]
fn update_registers<const S: usize>(
    update: &impl Fn(f32, f32, [f32; S]) -> (f32, [f32; S]),
    param: &mut [f32; BLOCK_SIZE],
    grad: &[f32; BLOCK_SIZE],
    states: &mut [[f32; BLOCK_SIZE]; S],
    registers: std::ops::Range<usize>,
    keys: &mut [[i32; L]; S],
) {
    let params: &mut [[f32; L]; REGISTERS] = bytemuck::cast_mut(param);
    let grads: &[[f32; L]; REGISTERS] = bytemuck::cast_ref(grad);
    for r in registers {
        let (grad, mut param) = (grads[r], params[r]);
        let mut state: [[f32; L]; S] = std::array::from_fn(|s| *register(&states[s], r));
        for lane in 0..L {
            let (p, new) = update(grad[lane], param[lane], std::array::from_fn(|s| state[s][lane]));
            param[lane] = p;
            for (state, value) in state.iter_mut().zip(new) {
                state[lane] = value;
            }
        }
        params[r] = param;
        for s in 0..S {
            *register_mut(&mut states[s], r) = state[s];
            for lane in 0..L {
                keys[s][lane] = keys[s][lane].max(absmax_key(state[s][lane]));
            }
        }
    }
}

#[inline(always)]
fn register(block: &[f32; BLOCK_SIZE], r: usize) -> &[f32; L] {
    &bytemuck::cast_ref::<[f32; BLOCK_SIZE], [[f32; L]; REGISTERS]>(block)[r]
}

#[inline(always)]
fn register_mut(block: &mut [f32; BLOCK_SIZE], r: usize) -> &mut [f32; L] {
    &mut bytemuck::cast_mut::<[f32; BLOCK_SIZE], [[f32; L]; REGISTERS]>(block)[r]
}

/// The largest finite magnitude whose lanes' keys are `key` (0 where none is finite and
/// non-zero).
#[inline(always)]
fn largest(key: [i32; L]) -> f32 {
    largest_finite(key.into_iter().fold(NO_KEY, i32::max))
}
