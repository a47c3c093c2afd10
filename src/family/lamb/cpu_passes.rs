//! LAMB on the CPU backend: two reads of each tensor per step.
//!
//! The moments pass updates `exp_avg` and `exp_avg_sq` and sums `p^2` and `s^2` (`s` from
//! the moments as stored, so the norm is that of the `s` applied); each tensor's sums give
//! its norms and trust ratio; the apply pass recomputes `s` from the stored moments and
//! writes `p -= step_size trust_ratio s` through the storage layer every family uses
//! (`crate::cpu::storage`: 16-bit and mixed storage, Kahan compensation), with the family's apply
//! loop (`crate::family::lamb::cpu::lamb_apply`).
//!
//! The sums are deterministic: each tensor is cut into the same chunks and blocks whatever
//! the thread count; a block sums in [`LANES`] f32 lanes (which the compiler vectorizes),
//! folded in a fixed order; blocks and chunks add up in f64, in order.

use std::any::Any;

use half::bf16;
use rayon::prelude::*;

use crate::cpu::convert::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use crate::cpu::host::{HostElement, HostSlice, HostSliceMut};
use crate::cpu::kernels::{Element, Kernel};
use crate::cpu::passes::{CpuPasses, CpuStep, TensorSums};
use crate::cpu::state_memory::StateTensor;
use crate::cpu::storage::{self, Job, Stores};
use crate::cpu::work;
use crate::cpu::CpuOptimizer;

use crate::family::lamb::cpu::lamb_direction;
use super::contract::{LambSwitches, LambUniform};
use crate::step::KernelStep;
use crate::{Algorithm, Lamb, LambNorms};

/// LAMB's passes on the CPU: each tensor's norms at the last step (none before it).
#[derive(Clone, Debug, Default)]
pub(crate) struct LambPasses {
    pub(crate) norms: Vec<LambNorms>,
}

impl CpuPasses for LambPasses {
    fn clone_box(&self) -> Box<dyn CpuPasses> {
        Box::new(self.clone())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    /// The moments pass, the norms and the apply pass replace the elementwise loop.
    fn step(&mut self, s: CpuStep<'_, '_, '_>) -> bool {
        let Algorithm::Lamb(config) = s.algorithm else { return false };
        let tensors = Tensors { params: s.params, grads: s.grads, state: s.state, compensation: s.compensation };
        self.norms = step(config, s.t, s.stores, tensors, s.sums);
        true
    }
}

/// The tensors a step reads and writes.
struct Tensors<'s, 'p, 'g> {
    params: &'s mut [HostSliceMut<'p>],
    grads: &'s [HostSlice<'g>],
    state: &'s mut [Vec<StateTensor>],
    compensation: &'s mut [StateTensor],
}

/// Elements per block of the moments pass: the f32 scratch of the blocked path stays in L1.
const BLOCK: usize = 512;

/// Accumulators per sum within a block: independent f32 lanes the compiler keeps in
/// vector registers (one f32 accumulator would make the pass wait on each add).
const LANES: usize = 16;

/// One LAMB step of `config` (step `t`) over every tensor: the tensors' norms at this step.
/// `state[i]` holds tensor i's `[exp_avg, exp_avg_sq]`; `compensation` each tensor's Kahan
/// compensation, or nothing. The slices have been checked against each other.
/// `sums`: a sharded step's, which replaces the tensors' sums by those of every rank's pieces.
fn step(
    config: &Lamb,
    t: u64,
    stores: &Stores,
    tensors: Tensors<'_, '_, '_>,
    sums: Option<&mut TensorSums<'_>>,
) -> Vec<LambNorms> {
    let Tensors { params, grads, state, compensation } = tensors;
    let mut uniform = config.uniform(t).to_f32();
    // The moments pass: per chunk, its two sums, in chunk order.
    // Chunked as every family's pass (`work::jobs`), so each tensor's partition is the same.
    let chunk_sums: Vec<(usize, [f64; 2])> = work::jobs(params, grads.iter().copied(), slices(state), &mut [])
        .into_par_iter()
        .map(|job| (job.ordinal as usize, moments(&uniform, job)))
        .collect();
    let mut totals = vec![[0f64; 2]; params.len()];
    for (i, [p, s]) in chunk_sums {
        totals[i][0] += p;
        totals[i][1] += s;
    }
    if let Some(combine) = sums {
        combine(&mut totals);
    }
    let norms: Vec<LambNorms> =
        totals.iter().map(|[p, s]| LambNorms::from_sums(config, *p as f32, *s as f32)).collect();
    // The apply pass: each tensor's rate, `step_size * trust_ratio` in f32 as the device
    // computes it, as the uniform's step size of its kernel.
    let step_size = uniform.step_size;
    let kernels: Vec<Kernel> = norms
        .iter()
        .map(|n| {
            uniform.step_size = step_size * n.applied(config);
            let mut wide = config.uniform(t);
            wide.step_size = f64::from(uniform.step_size);
            Kernel::new(&KernelStep::Lamb(LambSwitches { apply: true }, wide))
        })
        .collect();
    work::jobs(params, grads.iter().copied(), slices(state), compensation)
        .into_par_iter()
        .for_each(|job| storage::run(&kernels[job.ordinal as usize], stores, job));
    norms
}

/// Each tensor's state list as a slice.
fn slices(state: &mut [Vec<StateTensor>]) -> impl Iterator<Item = &mut [StateTensor]> {
    state.iter_mut().map(Vec::as_mut_slice)
}

/// The moments pass over one chunk: its sums of `p^2` and `s^2`.
fn moments(hp: &LambUniform, mut job: Job<'_>) -> [f64; 2] {
    let decay = hp.weight_decay != 0.0;
    if let Some(sums) = direct::<f32>(hp, decay, &mut job) {
        return sums;
    }
    if let Some(sums) = direct::<bf16>(hp, decay, &mut job) {
        return sums;
    }
    blocked(hp, decay, job)
}

/// The pass on operands all stored as `E`, where they lie; `None` where they are not.
fn direct<E: Element + HostElement>(hp: &LambUniform, decay: bool, job: &mut Job<'_>) -> Option<[f64; 2]> {
    let [m, v, ..] = &mut job.state;
    let (p, g) = (E::of(job.param.as_slice())?, E::of(job.grad)?);
    let (m, v) = (E::of_mut(m)?, E::of_mut(v)?);
    let mut total = [0f64; 2];
    for start in (0..p.len()).step_by(BLOCK) {
        let end = (start + BLOCK).min(p.len());
        let (p, g, m, v) = (&p[start..end], &g[start..end], &mut m[start..end], &mut v[start..end]);
        let [sp, ss] =
            if decay { block::<E, true>(hp, p, g, m, v) } else { block::<E, false>(hp, p, g, m, v) };
        total[0] += f64::from(sp);
        total[1] += f64::from(ss);
    }
    Some(total)
}

/// The moments of one block updated in place, and the block's sums. `s` is computed from
/// the moments as stored (`E::narrow`, then widened back).
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn block<E: Element, const WEIGHT_DECAY: bool>(
    hp: &LambUniform,
    p: &[E],
    g: &[E],
    m: &mut [E],
    v: &mut [E],
) -> [f32; 2] {
    let mut acc = [[0f32; LANES]; 2];
    let mut one = |k: usize, p: E, g: E, m: &mut E, v: &mut E| {
        let g = g.widen();
        *m = E::narrow(hp.beta1 * m.widen() + hp.one_minus_beta1 * g);
        *v = E::narrow(hp.beta2 * v.widen() + hp.one_minus_beta2 * (g * g));
        let p = p.widen();
        let s = lamb_direction::<WEIGHT_DECAY>(hp, p, m.widen(), v.widen());
        acc[0][k] += p * p;
        acc[1][k] += s * s;
    };
    let (pc, pr) = p.as_chunks::<LANES>();
    let (gc, gr) = g.as_chunks::<LANES>();
    let (mc, mr) = m.as_chunks_mut::<LANES>();
    let (vc, vr) = v.as_chunks_mut::<LANES>();
    for (((p, g), m), v) in pc.iter().zip(gc).zip(mc.iter_mut()).zip(vc.iter_mut()) {
        for k in 0..LANES {
            one(k, p[k], g[k], &mut m[k], &mut v[k]);
        }
    }
    for (k, (((p, g), m), v)) in pr.iter().zip(gr).zip(mr.iter_mut()).zip(vr.iter_mut()).enumerate() {
        one(k, *p, *g, m, v);
    }
    acc.map(fold)
}

/// A block's lanes, summed in a fixed order (pairwise).
fn fold(mut lanes: [f32; LANES]) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        for k in 0..width {
            lanes[k] += lanes[k + width];
        }
        width /= 2;
    }
    lanes[0]
}

/// The pass on mixed or f16 operands, a block at a time through f32 scratch: the f32
/// block update, the moments rounded into their storage and read back, then the sums.
fn blocked(hp: &LambUniform, decay: bool, job: Job<'_>) -> [f64; 2] {
    let mut scratch = Box::new([[0f32; BLOCK]; 4]);
    let mut total = [0f64; 2];
    let mut rest = job;
    while !rest.is_empty() {
        let (mut part, tail) = rest.split_at(BLOCK);
        let n = part.param.len();
        let [p, g, m, v] = &mut *scratch;
        let (p, g, m, v) = (&mut p[..n], &mut g[..n], &mut m[..n], &mut v[..n]);
        widen(part.param.as_slice(), p);
        widen(part.grad, g);
        let [ms, vs, ..] = &mut part.state;
        widen(ms.as_slice(), m);
        widen(vs.as_slice(), v);
        // Updates m and v in f32; its sums are of the unrounded moments, so not used.
        let _ = block::<f32, false>(hp, p, g, m, v);
        narrow(m, ms);
        narrow(v, vs);
        widen(ms.as_slice(), m);
        widen(vs.as_slice(), v);
        let [sp, ss] = if decay { sums::<true>(hp, p, m, v) } else { sums::<false>(hp, p, m, v) };
        total[0] += f64::from(sp);
        total[1] += f64::from(ss);
        rest = tail;
    }
    total
}

/// The sums of `p^2` and `s^2` over a block of f32 values, in [`LANES`] lanes as [`block`].
fn sums<const WEIGHT_DECAY: bool>(hp: &LambUniform, p: &[f32], m: &[f32], v: &[f32]) -> [f32; 2] {
    let mut acc = [[0f32; LANES]; 2];
    for (i, ((p, m), v)) in p.iter().zip(m).zip(v).enumerate() {
        let s = lamb_direction::<WEIGHT_DECAY>(hp, *p, *m, *v);
        acc[0][i % LANES] += p * p;
        acc[1][i % LANES] += s * s;
    }
    acc.map(fold)
}

/// `values` as f32 into `out` (of the same length).
fn widen(values: HostSlice<'_>, out: &mut [f32]) {
    match values {
        HostSlice::F32(v) => out.copy_from_slice(v),
        HostSlice::F16(v) => f16_to_f32(v, out),
        HostSlice::BF16(v) => bf16_to_f32(v, out),
    }
}

/// `values` rounded to nearest even into `out`'s storage (of the same length).
fn narrow(values: &[f32], out: &mut HostSliceMut<'_>) {
    match out {
        HostSliceMut::F32(o) => o.copy_from_slice(values),
        HostSliceMut::F16(o) => f32_to_f16(values, o),
        HostSliceMut::BF16(o) => f32_to_bf16(values, o),
    }
}

impl CpuOptimizer {
    /// Tensor `i`'s norms at the last step, when the optimizer runs LAMB and has stepped
    /// (torch-optimizer's `state['weight_norm']`, `['adam_norm']`, `['trust_ratio']`).
    pub fn lamb_norms(&self, i: usize) -> Option<LambNorms> {
        self.passes_of::<LambPasses>()?.norms.get(i).copied()
    }
}
