//! LAMB's apply pass's CPU loops: the update of `lamb.wgsl` in f32, operation for operation, so the
//! CPU rounds where the GPU does, for each storage leaf ([`LambLeaf`]), and the
//! family's CPU update for a step ([`loops`]).

use half::f16;

use crate::cpu::kernels::{every_storage, Bound, Element, Leaf, Loop, Operands, Q8};
use crate::cpu::{f16_lanes, q8};
use super::contract::{LambSwitches, LambUniform, LambUniform64};

/// `lamb_direction` of `src/family/lamb/lamb.wgsl`: `m / (sqrt(v) + eps)`, plus `weight_decay p`
/// with `WEIGHT_DECAY`.
#[inline(always)]
pub(crate) fn lamb_direction<const WEIGHT_DECAY: bool>(hp: &LambUniform, p: f32, m: f32, v: f32) -> f32 {
    let s = m / (v.sqrt() + hp.eps);
    if WEIGHT_DECAY {
        s + hp.weight_decay * p
    } else {
        s
    }
}

/// The apply pass of `src/family/lamb/lamb.wgsl` on one tensor: `p -= rate s`, with `s` from the
/// stored moments and `rate` (the uniform's `step_size`) already multiplied by the tensor's
/// trust ratio (`cpu_passes`). The moments pass, which also sums, is `cpu_passes`'s own.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
pub(crate) fn lamb_apply<E: Element, const WEIGHT_DECAY: bool>(
    hp: &LambUniform,
    _scale: f32,
    o: Operands<'_, E>,
) {
    let [exp_avg, exp_avg_sq, ..] = o.state;
    for ((p, m), v) in o.param.iter_mut().zip(exp_avg.iter()).zip(exp_avg_sq.iter()) {
        let p_old = p.widen();
        let s = lamb_direction::<WEIGHT_DECAY>(hp, p_old, m.widen(), v.widen());
        *p = E::narrow(p_old - hp.step_size * s);
    }
}

/// [`lamb_apply`] on f16 operands, a register at a time (the moments are written back as
/// they were: an f16 value survives the round trip through f32 exactly).
pub(crate) fn lamb_apply_f16<const WEIGHT_DECAY: bool>(hp: &LambUniform, _scale: f32, o: Operands<'_, f16>) {
    let [exp_avg, exp_avg_sq, ..] = o.state;
    f16_lanes::each(
        [o.param, exp_avg, exp_avg_sq],
        o.grad,
        #[inline(always)]
        |_, [p, m, v]| [p - hp.step_size * lamb_direction::<WEIGHT_DECAY>(hp, p, m, v), m, v],
    );
}

pub(crate) fn lamb_loop<E: LambLeaf>(_: &LambSwitches, u: &LambUniform) -> Loop<LambUniform, E> {
    if u.weight_decay != 0.0 {
        E::lamb_apply::<true>()
    } else {
        E::lamb_apply::<false>()
    }
}

/// The loop of one storage leaf for each of the family's switches, so that one selection
/// tree ([`lamb_loop`]) serves every storage type.
pub(crate) trait LambLeaf: Leaf {
    fn lamb_apply<const W: bool>() -> Loop<LambUniform, Self>;
}

impl<T: Element> LambLeaf for T {
    fn lamb_apply<const W: bool>() -> Loop<LambUniform, Self> {
        lamb_apply::<T, W>
    }
}

impl LambLeaf for f16 {
    fn lamb_apply<const W: bool>() -> Loop<LambUniform, Self> {
        lamb_apply_f16::<W>
    }
}

impl LambLeaf for Q8 {
    fn lamb_apply<const W: bool>() -> Loop<LambUniform, Self> {
        |hp, scale, job| q8::blocked(job, q8::NonFinite::Update, |o| lamb_apply::<f32, W>(hp, scale, o))
    }
}

/// What the family's CPU loops read of a step: the kernel's uniform, in f32.
pub(crate) type Hyper = super::contract::Uniform;

/// The family's CPU update for a step: the loops its switches and uniform select, for every
/// storage type, with the uniform in f32.
pub(crate) fn loops(switches: &LambSwitches, uniform: &LambUniform64) -> Bound<Hyper> {
    let uniform = uniform.to_f32();
    every_storage!(lamb_loop(switches, &uniform)).with_uniform(uniform)
}
