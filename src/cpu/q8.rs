//! Blockwise 8-bit state ([`crate::q8`], bitsandbytes') on the CPU: the 8-bit codec of the
//! shared engine ([`super::blockwise`]), and the 8-bit fast path. Each block of 256 elements
//! is dequantized, updated by the same f32 element function as f32 state, and requantized
//! under its new absmax. Where the CPU has AVX-512, the steps of the families whose leaf says
//! so (Adam, momentum, Lion, RMSprop, AdEMAMix, ADOPT, Adan) do all three in one pass per
//! block ([`each`], `fused`); elsewhere, and for the rest, each block's state goes through
//! the engine's f32 scratch and the family's f32 loop ([`blocked`]).
//!
//! What the format brings to the engine ([`Q8Codec`]): blocks of 256, a code byte per
//! element, the map of each state's kind ([`CodeTable`]), the absmax rule (a block's largest
//! finite magnitude; 1 and every code the code of 0 where it has none), one block per call of
//! the f32 loop. Besides: bitsandbytes' restart on a non-finite gradient
//! ([`NonFinite::Restart`], asked for by the families' 8-bit loops), and tensors below
//! `min_8bit_size` on a kernel of their own ([`run`]).

#[cfg(target_arch = "x86_64")]
mod fused;
#[cfg(target_arch = "x86_64")]
mod lanes;

use super::blockwise::{self, Codec, Slot};
use super::kernels::{Kernel, Operands, MAX_STATE, Q8};
use super::magnitude_key::{key as absmax_key, largest_finite, NO_KEY};
use crate::q8::lut::CodeTable;
use crate::q8::{StoredState, BLOCK_SIZE};
use crate::StateKind;

pub(crate) use super::blockwise::{blocked, NonFinite};

/// bitsandbytes' blockwise 8-bit format as the engine runs it.
#[derive(Clone, Copy)]
pub(crate) struct Q8Codec;

impl Codec for Q8Codec {
    type State = StoredState;
    type Map = &'static CodeTable;
    type Lanes = (Lanes, &'static CodeTable);
    /// One block: the fused path leaves the blocked one for the families without it and for
    /// CPUs without AVX-512, where grouping has not been measured.
    const GROUP: usize = BLOCK_SIZE;

    fn block_size(self) -> usize {
        BLOCK_SIZE
    }

    fn code_bytes(elements: usize) -> usize {
        elements
    }

    fn slot(state: &mut StoredState, kind: StateKind) -> Slot<'_, Self> {
        match state {
            StoredState::Q8 { codes, absmax } => {
                Slot::Quantized { codes, scales: absmax, map: CodeTable::for_kind(kind) }
            }
            StoredState::F32(values) => Slot::F32(values),
        }
    }

    fn lanes(table: &&'static CodeTable) -> Self::Lanes {
        (Lanes::new(), *table)
    }

    fn dequantize((lanes, table): &Self::Lanes, codes: &[u8], absmax: f32, values: &mut [f32]) {
        lanes.dequantize(codes, absmax, table, values)
    }

    fn requantize((lanes, table): &Self::Lanes, values: &[f32], codes: &mut [u8]) -> f32 {
        requantize(*lanes, values, table, codes)
    }
}

/// A run of whole blocks of one tensor (the last may be partial): what a family's 8-bit
/// loop updates.
pub(crate) type Job<'a> = blockwise::Job<'a, Q8Codec>;

/// Runs `kernel` over every tensor with 8-bit state and `f32_kernel` over those below
/// `min_8bit_size` (bitsandbytes' 32-bit kernel, which differs in places:
/// `crate::q8::f32_state_step`): `states[i]` holds tensor i's state in the kernels' slot
/// order (`kinds`). The lengths have been checked.
pub(super) fn run<'a>(
    kernel: &Kernel,
    f32_kernel: &Kernel,
    kinds: &[StateKind],
    params: impl Iterator<Item = &'a mut [f32]>,
    grads: impl Iterator<Item = &'a [f32]>,
    states: &'a mut [Vec<StoredState>],
) {
    blockwise::run(Q8Codec, kinds, params, grads, states, |job| {
        if matches!(job.slots[0], Slot::F32(_)) {
            f32_kernel.run::<Q8>(job)
        } else {
            kernel.run::<Q8>(job)
        }
    });
}

/// Runs `update(grad, param, states) -> (param, states)` on every element of `job` in one
/// pass per block, where the CPU has AVX-512 and the job's first `S` states are 8-bit and
/// it keeps no others; otherwise [`blocked`] with `f32_loop`, the same update's f32 loop.
/// `RESTART`: a non-finite gradient leaves its parameter and restarts its 8-bit states
/// ([`NonFinite::Restart`]), a constant so that the other families' loops stay the same.
#[inline(always)]
pub(crate) fn each<const S: usize, const RESTART: bool>(
    job: Job<'_>,
    update: impl Fn(f32, f32, [f32; S]) -> (f32, [f32; S]),
    f32_loop: impl Fn(Operands<'_, f32>),
) {
    let non_finite = if RESTART { NonFinite::Restart } else { NonFinite::Update };
    #[cfg(target_arch = "x86_64")]
    if let Some(level) = lanes::level() {
        let (kept, absent) = job.slots.split_at(S.min(MAX_STATE));
        if S <= MAX_STATE
            && kept.iter().all(|slot| matches!(slot, Slot::Quantized { .. }))
            && absent.iter().all(|slot| matches!(slot, Slot::Absent))
        {
            let blockwise::Job { param, grad, slots, .. } = job;
            let mut slots = slots.into_iter().filter_map(|slot| match slot {
                Slot::Quantized { codes, scales, map } => {
                    Some(fused::Slot { codes, absmax: scales, table: map })
                }
                _ => None,
            });
            let slots = std::array::from_fn(|_| slots.next().unwrap_or_default());
            return fused::each::<S, RESTART>(level, param, grad, slots, update);
        }
    }
    let _ = update;
    blocked(job, non_finite, f32_loop)
}

/// `values`' codes under their block's absmax, which it returns: the largest finite
/// magnitude, or 1 with every code the code of 0 for a block without a finite value but 0
/// (its -0.0 too, which the sign rule would store one code below: `crate::q8::quantize`).
fn requantize(lanes: Lanes, values: &[f32], table: &'static CodeTable, codes: &mut [u8]) -> f32 {
    let largest = largest_finite(block_key(values));
    if largest == 0.0 {
        codes.fill(table.zero());
        return 1.0;
    }
    lanes.quantize(values, largest, table, codes);
    largest
}

/// The vector loops this CPU runs, found once per job: AVX-512's, which need no gathers
/// (`lanes`), or the portable ones.
#[derive(Clone, Copy)]
pub(crate) struct Lanes {
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

    fn dequantize(self, codes: &[u8], absmax: f32, table: &'static CodeTable, values: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if let Some(level) = self.avx512 {
            return lanes::dequantize(level, codes, absmax, table, values);
        }
        dequantize(codes, absmax, table.map(), values)
    }

    fn quantize(self, values: &[f32], absmax: f32, table: &'static CodeTable, codes: &mut [u8]) {
        #[cfg(target_arch = "x86_64")]
        if let Some(level) = self.avx512 {
            return lanes::quantize(level, values, absmax, table, codes);
        }
        quantize(values, absmax, table, codes)
    }
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn dequantize(codes: &[u8], absmax: f32, map: &[f32; 256], values: &mut [f32]) {
    for (value, code) in values.iter_mut().zip(codes) {
        *value = map[usize::from(*code)] * absmax;
    }
}

/// The largest key of the block's values ([`absmax_key`]): its largest finite magnitude's. A
/// non-finite value is left out, as `q8::quantize` leaves it: it takes the code of 0, and
/// the block's other values keep their scale.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn block_key(values: &[f32]) -> i32 {
    values.iter().fold(NO_KEY, |m, v| m.max(absmax_key(*v)))
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

    /// Where the CPU has AVX-512, the one-pass loops ([`each`]) of Adam, momentum, Lion,
    /// RMSprop, AdEMAMix and Adan (four states) leave the parameters, codes and absmax of the blocked path bit
    /// for bit, for every switch each family has and bitsandbytes' forms: whole blocks, a
    /// partial last block, a block whose new absmax is subnormal (which only the exact rule
    /// requantizes), one of zeros, one of zeros and -0.0, one with NaN and infinite
    /// gradients, and tiny negative gradients. (Elsewhere both runs take the blocked path.)
    #[test]
    fn the_one_pass_loops_and_the_blocked_path_agree_bit_for_bit() {
        use crate::{AdEMAMix, Adam, DmlAdam, Lion, OnnxAdam, RmsProp, Sgd};
        let adam = |kind: &Adam| {
            let mut kinds = vec![StateKind::ExpAvg, StateKind::ExpAvgSq];
            if kind.amsgrad {
                kinds.push(StateKind::MaxExpAvgSq);
            }
            kinds
        };
        let mut steps = Vec::new();
        for amsgrad in [false, true] {
            for maximize in [false, true] {
                for decoupled_weight_decay in [false, true] {
                    for (beta1, weight_decay) in [(0.9, 0.0), (0.9, 0.01), (0.2, 0.05)] {
                        let a = Adam {
                            amsgrad,
                            maximize,
                            decoupled_weight_decay,
                            beta1,
                            weight_decay,
                            ..Adam::default()
                        };
                        for t in [1, 6] {
                            steps.push((format!("{a:?} t {t}"), a.kernel_step(t), adam(&a)));
                            if !amsgrad {
                                let bnb = crate::q8::kernel_step(&a.into(), t);
                                steps.push((format!("bitsandbytes' {a:?} t {t}"), bnb, adam(&a)));
                            }
                        }
                    }
                }
            }
        }
        let onnx = OnnxAdam { norm_coefficient: 0.01, norm_coefficient_post: 0.02, ..OnnxAdam::default() };
        steps.push((
            "ONNX Adam".into(),
            onnx.kernel_step(0.1, 3),
            vec![StateKind::ExpAvg, StateKind::ExpAvgSq],
        ));
        let dml = DmlAdam { learning_rate: 0.01, beta1: 0.9, beta2: 0.999, epsilon: 1e-8 };
        steps.push((
            "DirectML Adam".into(),
            dml.kernel_step(4),
            vec![StateKind::ExpAvg, StateKind::ExpAvgSq],
        ));
        for nesterov in [false, true] {
            for maximize in [false, true] {
                for (dampening, weight_decay) in [(0.0, 0.0), (0.1, 0.01)] {
                    let sgd = Sgd { lr: 0.01, momentum: 0.9, dampening, weight_decay, nesterov, maximize };
                    for t in [1, 3] {
                        steps.push((
                            format!("{sgd:?} t {t}"),
                            sgd.kernel_step(t),
                            vec![StateKind::MomentumBuffer],
                        ));
                    }
                }
            }
        }
        for weight_decay in [0.0, 0.1] {
            let lion = Lion { lr: 0.01, weight_decay, ..Lion::default() };
            steps.push((format!("{lion:?}"), lion.kernel_step(2), vec![StateKind::ExpAvg]));
        }
        for alpha in [0.99, 0.5] {
            let rmsprop = RmsProp { alpha, ..RmsProp::default() };
            steps.push((format!("{rmsprop:?}"), rmsprop.kernel_step(), vec![StateKind::SquareAvg]));
            let rmsprop = RmsProp { alpha, weight_decay: 0.1, ..RmsProp::default() };
            let bnb = crate::q8::kernel_step(&rmsprop.into(), 1);
            steps.push((format!("bitsandbytes' {rmsprop:?}"), bnb, vec![StateKind::SquareAvg]));
        }
        for (t_alpha, weight_decay) in [(None, 0.0), (Some(10), 0.01)] {
            let ademamix = AdEMAMix { t_alpha, t_beta3: t_alpha, weight_decay, ..AdEMAMix::default() };
            for t in [1, 4] {
                let kinds = vec![StateKind::ExpAvg, StateKind::ExpAvgSlow, StateKind::ExpAvgSq];
                steps.push((format!("{ademamix:?} t {t}"), ademamix.kernel_step(t), kinds.clone()));
                let bnb = crate::q8::kernel_step(&ademamix.into(), t);
                steps.push((format!("bitsandbytes' {ademamix:?} t {t}"), bnb, kinds));
            }
        }
        for (no_prox, weight_decay) in [(false, 0.0), (false, 0.5), (true, 0.25)] {
            let adan = crate::Adan { lr: 0.01, weight_decay, no_prox, ..crate::Adan::default() };
            for t in [1, 3] {
                let kinds = vec![
                    StateKind::ExpAvg,
                    StateKind::ExpAvgSq,
                    StateKind::ExpAvgDiff,
                    StateKind::NegPreGrad,
                ];
                steps.push((format!("{adan:?} t {t}"), adan.kernel_step(t), kinds));
            }
        }

        let n = 5 * BLOCK_SIZE + 77;
        let mut seed = 0x2545_f491u32;
        let mut next = move || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            seed
        };
        let param: Vec<f32> = (0..n).map(|_| (next() >> 8) as f32 / (1 << 24) as f32 - 0.5).collect();
        let mut grad: Vec<f32> =
            (0..n).map(|_| ((next() >> 8) as f32 / (1 << 24) as f32 - 0.5) * 0.1).collect();
        // Block 1 keeps tiny states and gets no gradient: its new absmax is subnormal.
        // Block 2's states are zero and so is its gradient.
        grad[BLOCK_SIZE..3 * BLOCK_SIZE].fill(0.0);
        // Block 3 gets a NaN and both infinities: its absmax is its largest finite
        // magnitude, so the block still takes the arithmetic, NaN and infinite states too.
        grad[3 * BLOCK_SIZE + 5] = f32::NAN;
        grad[3 * BLOCK_SIZE + 70] = f32::INFINITY;
        grad[3 * BLOCK_SIZE + 200] = f32::NEG_INFINITY;
        // Block 4's states are zero and its gradient -0.0: a block of zeros, some of them
        // -0.0, which store the code of 0 (the sign rule would move them below it).
        grad[4 * BLOCK_SIZE..5 * BLOCK_SIZE].fill(-0.0);
        // Block 0 has tiny negative gradients, whose first moments the sign rule stores
        // below the code of 0.
        for j in [3, 40, 41, 200] {
            grad[j] = -1e-12;
        }
        let codes: Vec<u8> = (0..n).map(|_| (next() >> 24) as u8).collect();
        let mut absmax: Vec<f32> =
            (0..n.div_ceil(BLOCK_SIZE)).map(|_| 0.01 + (next() >> 20) as f32 / 4096.0).collect();
        absmax[1] = 1e-39;
        absmax[2] = 0.0;
        absmax[4] = 0.0;

        for (name, step, kinds) in &steps {
            let kernel = Kernel::new(step);
            let non_finite = if crate::q8::restarts_non_finite(&step.switches()) {
                NonFinite::Restart
            } else {
                NonFinite::Update
            };
            let run = |one_pass: bool| {
                let mut param = param.clone();
                let mut state: Vec<(Vec<u8>, Vec<f32>)> =
                    kinds.iter().map(|_| (codes.clone(), absmax.clone())).collect();
                let mut slots = state.iter_mut().zip(kinds).map(|((codes, absmax), kind)| Slot::Quantized {
                    codes,
                    scales: absmax,
                    map: CodeTable::for_kind(*kind),
                });
                let slots = std::array::from_fn(|_| slots.next().unwrap_or_default());
                let job = Job { param: &mut param, grad: &grad, slots, codec: Q8Codec };
                if one_pass {
                    kernel.run::<Q8>(job);
                } else {
                    blocked(job, non_finite, |o| kernel.run::<f32>(o));
                }
                // Bit for bit, NaN for NaN: which NaN operand an operation passes on, and
                // so a NaN's sign, IEEE 754 leaves open, and an optimized build's vector
                // loop may order an operation's operands otherwise than the scalar one.
                let bits: Vec<u32> =
                    param.iter().map(|p| if p.is_nan() { f32::NAN.to_bits() } else { p.to_bits() }).collect();
                let state: Vec<(Vec<u8>, Vec<u32>)> =
                    state.into_iter().map(|(c, a)| (c, a.iter().map(|x| x.to_bits()).collect())).collect();
                (bits, state)
            };
            let (one_pass, blocked) = (run(true), run(false));
            assert!(one_pass.0 == blocked.0, "{name}: parameters differ");
            for (k, (a, b)) in one_pass.1.iter().zip(&blocked.1).enumerate() {
                assert!(a.0 == b.0, "{name}: state {k}'s codes differ");
                assert!(a.1 == b.1, "{name}: state {k}'s absmax differ");
            }
        }
    }

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
                let absmax = match largest_finite(block_key(block)) {
                    0.0 => 1.0,
                    largest => largest,
                };
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
