//! Storage types around the loops. f32 operands, and bf16 or f16 operands when every
//! operand has that type, are updated where they lie (bf16 converted in registers by
//! integer operations the compiler vectorizes with the update, f16 by AVX-512 sixteen or
//! F16C eight at a time); mixed operands, stochastic and Kahan stores, and f16 on CPUs without F16C pass
//! through f32 scratch a block at a time, so the loops stay the same and each element is
//! still read once from memory and written once.
//!
//! A block's 16-bit runs are read in bursts, one operand after another, and the f32 loop
//! that follows reads no memory; the hardware prefetcher, which keeps the f32 loops'
//! steady streams ahead of them, does not keep up with that pattern (widening waited on
//! memory for a large part of an f16 step). So loading each operand's block first asks for
//! the same operand's next block, whose lines arrive while this block is updated (the
//! measurements are in PERF.md).

use std::cell::RefCell;

use half::{bf16, f16};

use super::convert::{
    bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_bf16_stochastic, f32_to_f16, f32_to_f16_stochastic,
};
use super::f16_lanes;
use super::host::{HostElement, HostSlice, HostSliceMut};
use super::kernels::{Kernel, Operands, MAX_STATE};
use crate::step::rounding;

/// Elements per conversion block: the scratch of all five operands (10 KiB) stays in L1.
/// Smaller blocks pay for more calls per element, larger ones wait longer on memory
/// (PERF.md).
const BLOCK: usize = 512;

/// How a step's 16-bit stores round (`Rounding` as the CPU loops take it).
#[derive(Clone, Debug, Default)]
pub(crate) struct Stores {
    /// Stochastic rounding: the seed and the step being taken.
    pub(crate) stochastic: Option<(u64, u64)>,
    /// Whether the state stores round stochastically too.
    pub(crate) state: bool,
    /// The hash stream of each state slot (`step::rounding::stream`).
    pub(crate) streams: [u32; MAX_STATE],
    /// [`crate::OptimizerOptions::origins`]: empty, or each parameter's ordinal and first
    /// element for the hash (shared, so that a step's stores copy no list).
    pub(crate) origins: std::sync::Arc<[(u32, u64)]>,
}

/// A run of one tensor's elements with the same run of its gradient and state.
pub(crate) struct Job<'a> {
    pub(crate) param: HostSliceMut<'a>,
    pub(crate) grad: HostSlice<'a>,
    /// In the kernels' slot order; slots the algorithm does not keep are empty.
    pub(crate) state: [HostSliceMut<'a>; MAX_STATE],
    /// Kahan rounding's compensation; empty without it.
    pub(crate) compensation: HostSliceMut<'a>,
    /// The tensor's ordinal and the job's first element in it: stochastic rounding's counter.
    pub(crate) ordinal: u32,
    pub(crate) first: u64,
}

impl<'a> Job<'a> {
    pub(crate) fn is_empty(&self) -> bool {
        self.param.is_empty()
    }

    /// The first `mid` elements of every operand, and the rest.
    pub(crate) fn split_at(self, mid: usize) -> (Self, Self) {
        let (param, param_rest) = self.param.split_at(mid);
        let (grad, grad_rest) = self.grad.split_at(mid);
        let [(s0, r0), (s1, r1), (s2, r2), (s3, r3)] = self.state.map(|s| s.split_at(mid));
        let (compensation, compensation_rest) = self.compensation.split_at(mid);
        let (ordinal, first) = (self.ordinal, self.first);
        let rest_first = first + mid.min(param.len()) as u64;
        (
            Job { param, grad, state: [s0, s1, s2, s3], compensation, ordinal, first },
            Job {
                param: param_rest,
                grad: grad_rest,
                state: [r0, r1, r2, r3],
                compensation: compensation_rest,
                ordinal,
                first: rest_first,
            },
        )
    }

    /// The operands themselves when every one is stored as `E` (slots the algorithm does
    /// not keep are empty, of any type) and no Kahan compensation is kept.
    fn operands<E: HostElement>(&mut self) -> Option<Operands<'_, E>> {
        let direct = self.compensation.is_empty()
            && self.state.iter_mut().all(|slot| slot.is_empty() || E::of_mut(slot).is_some());
        let (Some(grad), true) = (E::of(self.grad), direct) else {
            return None;
        };
        let param = E::of_mut(&mut self.param)?;
        let state = self.state.each_mut().map(|slot| E::of_mut(slot).unwrap_or_default());
        Some(Operands { param, grad, state })
    }
}

/// Updates every element of `job`.
pub(crate) fn run(kernel: &Kernel, stores: &Stores, mut job: Job<'_>) {
    // f32 throughout: no store rounds.
    if let Some(operands) = job.operands::<f32>() {
        return kernel.run::<f32>(operands);
    }
    // bf16 throughout, rounded to nearest: one pass, converting in registers (faster than
    // the blocked path, PERF.md).
    if stores.stochastic.is_none() {
        if let Some(operands) = job.operands::<bf16>() {
            return kernel.run::<bf16>(operands);
        }
        // f16 throughout: one pass too, a register per conversion, F16C's eight lanes or
        // AVX-512's sixteen (each faster than the one before, PERF.md).
        if f16_lanes::available() {
            if let Some(operands) = job.operands::<f16>() {
                return kernel.run::<f16>(operands);
            }
        }
    }
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut scratch) => scratch.run(kernel, stores, job),
        // Unreachable (a job never starts another on its thread), but a fresh scratch is a
        // safe answer.
        Err(_) => Scratch::new().run(kernel, stores, job),
    })
}

thread_local! {
    // One per worker, kept: zeroing a fresh 10 KiB per job costs about as much as
    // updating a hundred 16-bit elements, and models have many tensors of a few hundred
    // (biases, norms).
    static SCRATCH: RefCell<Box<Scratch>> = RefCell::new(Scratch::new());
}

/// f32 copies of one block of each operand.
struct Scratch {
    param: [f32; BLOCK],
    grad: [f32; BLOCK],
    state: [[f32; BLOCK]; MAX_STATE],
    compensation: [f32; BLOCK],
}

impl Scratch {
    fn new() -> Box<Self> {
        Box::new(Scratch {
            param: [0.0; BLOCK],
            grad: [0.0; BLOCK],
            state: [[0.0; BLOCK]; MAX_STATE],
            compensation: [0.0; BLOCK],
        })
    }

    fn run(&mut self, kernel: &Kernel, stores: &Stores, job: Job<'_>) {
        // The hash state after (seed, step, tensor ordinal), once per job.
        let (ordinal, base) = stores.origins.get(job.ordinal as usize).copied().unwrap_or((job.ordinal, 0));
        let key = stores.stochastic.map(|(seed, step)| rounding::key(seed, step, ordinal));
        let mut rest = job;
        while !rest.is_empty() {
            let (mut block, tail) = rest.split_at(BLOCK);
            let [s0, s1, s2, s3] = &mut self.state;
            let [b0, b1, b2, b3] = &mut block.state;
            let [n0, n1, n2, n3] = &tail.state;
            let operands = Operands {
                param: load(&mut block.param, tail.param.as_slice(), &mut self.param),
                grad: load_grad(block.grad, tail.grad, &mut self.grad),
                state: [
                    load(b0, n0.as_slice(), s0),
                    load(b1, n1.as_slice(), s1),
                    load(b2, n2.as_slice(), s2),
                    load(b3, n3.as_slice(), s3),
                ],
            };
            kernel.run::<f32>(operands);
            if !block.compensation.is_empty() {
                store_kahan(
                    &mut block.param,
                    &mut self.param,
                    &mut block.compensation,
                    &mut self.compensation,
                );
            } else if let Some(key) = key {
                store_stochastic(
                    &mut block.param,
                    &self.param,
                    key,
                    rounding::stream(None),
                    base + block.first,
                );
            } else {
                store(&mut block.param, &self.param);
            }
            for ((slot, scratch), stream) in block.state.iter_mut().zip(&self.state).zip(stores.streams) {
                match key {
                    Some(key) if stores.state => {
                        store_stochastic(slot, scratch, key, stream, base + block.first)
                    }
                    _ => store(slot, scratch),
                }
            }
            rest = tail;
        }
    }
}

/// The block as f32: itself, or widened into `scratch`. Asks for the lines of `next` (the
/// same operand's next block) first.
fn load<'s>(
    values: &'s mut HostSliceMut<'_>,
    next: HostSlice<'_>,
    scratch: &'s mut [f32; BLOCK],
) -> &'s mut [f32] {
    prefetch_block(next);
    let n = values.len().min(BLOCK);
    match values {
        HostSliceMut::F32(v) => v,
        HostSliceMut::F16(v) => {
            f16_to_f32(&v[..n], &mut scratch[..n]);
            &mut scratch[..n]
        }
        HostSliceMut::BF16(v) => {
            bf16_to_f32(&v[..n], &mut scratch[..n]);
            &mut scratch[..n]
        }
    }
}

/// As [`load`], for the gradient.
fn load_grad<'s>(values: HostSlice<'s>, next: HostSlice<'_>, scratch: &'s mut [f32; BLOCK]) -> &'s [f32] {
    prefetch_block(next);
    let n = values.len().min(BLOCK);
    match values {
        HostSlice::F32(v) => v,
        HostSlice::F16(v) => {
            f16_to_f32(&v[..n], &mut scratch[..n]);
            &scratch[..n]
        }
        HostSlice::BF16(v) => {
            bf16_to_f32(&v[..n], &mut scratch[..n]);
            &scratch[..n]
        }
    }
}

/// Rounds the updated f32 block back into 16-bit storage (nearest even); an f32 operand
/// was updated in place.
fn store(values: &mut HostSliceMut<'_>, scratch: &[f32; BLOCK]) {
    let n = values.len().min(BLOCK);
    match values {
        HostSliceMut::F32(_) => {}
        HostSliceMut::F16(v) => f32_to_f16(&scratch[..n], &mut v[..n]),
        HostSliceMut::BF16(v) => f32_to_bf16(&scratch[..n], &mut v[..n]),
    }
}

/// As [`store`], rounding stochastically with the bits of `stream` for elements from
/// `first` on.
fn store_stochastic(
    values: &mut HostSliceMut<'_>,
    scratch: &[f32; BLOCK],
    key: u32,
    stream: u32,
    first: u64,
) {
    let n = values.len().min(BLOCK);
    match values {
        HostSliceMut::F32(_) => {}
        HostSliceMut::F16(v) => f32_to_f16_stochastic(&scratch[..n], &mut v[..n], key, stream, first),
        HostSliceMut::BF16(v) => f32_to_bf16_stochastic(&scratch[..n], &mut v[..n], key, stream, first),
    }
}

/// Kahan rounding of a parameter block, as the shaders' generated `store_param`:
/// `t = p_new + c; p = round(t); c = round(t - p)`, with `c = 0` where `t - p` is not
/// finite. `param` holds `p_new` and is left holding `t`.
fn store_kahan(
    values: &mut HostSliceMut<'_>,
    param: &mut [f32; BLOCK],
    compensation: &mut HostSliceMut<'_>,
    scratch: &mut [f32; BLOCK],
) {
    let n = values.len().min(BLOCK);
    let c = load(compensation, HostSlice::F32(&[]), scratch);
    for (t, c) in param[..n].iter_mut().zip(c.iter()) {
        *t += *c;
    }
    store(values, param);
    // The stored values, widened exactly.
    match values {
        HostSliceMut::F32(v) => scratch[..n].copy_from_slice(&v[..n]),
        HostSliceMut::F16(v) => f16_to_f32(&v[..n], &mut scratch[..n]),
        HostSliceMut::BF16(v) => bf16_to_f32(&v[..n], &mut scratch[..n]),
    }
    for (kept, t) in scratch[..n].iter_mut().zip(&param[..n]) {
        let d = *t - *kept;
        *kept = if d.is_finite() { d } else { 0.0 };
    }
    store(compensation, scratch);
}

/// Asks for the cache lines of the first block of `values`, which the next block will
/// read: they arrive while this one is converted, updated and stored.
fn prefetch_block(values: HostSlice<'_>) {
    let bytes: &[u8] = match values.split_at(BLOCK).0 {
        HostSlice::F32(v) => bytemuck::cast_slice(v),
        HostSlice::F16(v) => bytemuck::cast_slice(v),
        HostSlice::BF16(v) => bytemuck::cast_slice(v),
    };
    #[cfg(target_arch = "x86_64")]
    if let Some(sse2) = fearless_simd::Level::new().as_sse2() {
        x86::prefetch(sse2, bytes);
    }
    // Elsewhere the hardware prefetcher alone.
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};

    /// A cache line in bytes, on every x86-64 CPU so far.
    const LINE: usize = 64;

    fearless_simd::kernel!(
        /// Asks for every cache line of `bytes` (a prefetch never faults and changes no
        /// value; `kernel!` only supplies the SSE context the intrinsic asks for).
        pub(crate) fn prefetch(sse2: Sse2, bytes: &[u8]) {
            for line in bytes.chunks(LINE) {
                _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast::<i8>());
            }
        }
    );
}

#[cfg(test)]
mod tests {
    use super::BLOCK;
    use crate::cpu::{CpuOptimizer, HostSlice, HostSliceMut, HostTensor};
    use crate::{Adagrad, Adam, Algorithm, DType, Sgd};

    /// Deterministic values in [-scale, scale].
    fn values(n: usize, seed: u32, scale: f64) -> Vec<f64> {
        (0..n).map(|i| ((i as f64 + 1.0) * (f64::from(seed) + 0.37)).sin() * scale).collect()
    }

    /// Panics naming the first few indices where `got` and `want` differ in their bits.
    fn assert_bits_eq(what: &str, got: &[f64], want: &[f64]) {
        let bad: Vec<String> = (0..got.len().max(want.len()))
            .filter(|&i| got.get(i).map(|v| v.to_bits()) != want.get(i).map(|v| v.to_bits()))
            .take(5)
            .map(|i| format!("[{i}] got {:?} want {:?}", got.get(i), want.get(i)))
            .collect();
        assert!(bad.is_empty(), "{what}: {bad:?}");
    }

    /// One step of each family (AMSGrad uses every state slot; plain SGD none) from the
    /// same state, on 16-bit storage and on exact f32 copies: the 16-bit results are the f32
    /// results rounded once, bit for bit, across whole blocks, a partial block and the
    /// prefetch of each next block (blocked path), and across whole registers and a padded
    /// last register (f16's and bf16's one-pass loops).
    #[test]
    fn a_16_bit_step_is_the_f32_step_rounded_once() {
        // 134 whole registers of eight (the one-pass f16 loop's four at a time and two
        // after them) and a padded last register.
        let n = 2 * BLOCK + 53;
        let algorithms: [Algorithm; 5] = [
            Adam { lr: 1e-2, weight_decay: 0.01, amsgrad: true, ..Adam::default() }.into(),
            Adam { lr: 1e-2, ..Adam::default() }.into(),
            Sgd { lr: 1e-2, momentum: 0.9, nesterov: true, weight_decay: 0.01, ..Sgd::default() }.into(),
            Sgd { lr: 1e-2, ..Sgd::default() }.into(),
            Adagrad { lr: 1e-2, weight_decay: 0.01, ..Adagrad::default() }.into(),
        ];
        // (parameter and state, gradient)
        let dtypes = [(DType::F16, DType::F16), (DType::BF16, DType::BF16), (DType::F16, DType::BF16)];
        for (algorithm, (dtype, grad_dtype)) in
            algorithms.iter().flat_map(|a| dtypes.iter().map(move |d| (a, *d)))
        {
            let rounded = |v: &[f64], d| HostTensor::from_f64(d, v).unwrap_or_else(|e| panic!("{e}"));
            let mut param = rounded(&values(n, 1, 1.0), dtype);
            let grad = rounded(&values(n, 2, 0.5), grad_dtype);
            let start: Vec<_> = algorithm
                .state_kinds()
                .iter()
                .copied()
                .zip([3, 4, 5])
                .map(|(kind, seed)| {
                    let v: Vec<f64> = values(n, seed, 0.1).iter().map(|x| x * x).collect();
                    (kind, rounded(&v, dtype).to_f64())
                })
                .collect();

            let mut param32 = rounded(&param.to_f64(), DType::F32);
            let grad32 = rounded(&grad.to_f64(), DType::F32);
            let new = |p: &HostTensor| {
                CpuOptimizer::builder().build(*algorithm, &[p.as_slice()]).unwrap_or_else(|e| panic!("{e}"))
            };
            let (mut half, mut full) = (new(&param), new(&param32));
            for opt in [&mut half, &mut full] {
                opt.set_step_count(4).unwrap_or_else(|e| panic!("{e}"));
                for (kind, v) in &start {
                    let Some(mut slot) = opt.state_mut(0, *kind) else { panic!("no {kind:?} slot") };
                    let d = slot.dtype();
                    copy(&mut slot, &rounded(v, d));
                }
            }
            let step = |opt: &mut CpuOptimizer, p: &mut HostTensor, g: &HostTensor| {
                opt.step(&mut [p.as_mut_slice()], &[g.as_slice()]).unwrap_or_else(|e| panic!("{e}"))
            };
            step(&mut half, &mut param, &grad);
            step(&mut full, &mut param32, &grad32);

            let what = format!("{algorithm:?}, {dtype:?} with {grad_dtype:?} gradients");
            let want = rounded(&param32.to_f64(), dtype).to_f64();
            assert_bits_eq(&format!("{what}: parameter"), &param.to_f64(), &want);
            for (kind, _) in &start {
                let (Some(got), Some(f32s)) = (
                    half.state(0, *kind).and_then(|s| s.dense()),
                    full.state(0, *kind).and_then(|s| s.dense()),
                ) else {
                    panic!()
                };
                let want = rounded(&f32s.to_f64(), dtype).to_f64();
                assert_bits_eq(&format!("{what}: {kind:?}"), &got.to_f64(), &want);
            }
        }
    }

    fn copy(slot: &mut HostSliceMut<'_>, values: &HostTensor) {
        match (slot, values.as_slice()) {
            (HostSliceMut::F32(s), HostSlice::F32(v)) => s.copy_from_slice(v),
            (HostSliceMut::F16(s), HostSlice::F16(v)) => s.copy_from_slice(v),
            (HostSliceMut::BF16(s), HostSlice::BF16(v)) => s.copy_from_slice(v),
            (slot, _) => panic!("{:?} slot for {:?} values", slot.dtype(), values.dtype()),
        }
    }
}
