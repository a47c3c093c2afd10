//! Lion's CPU loops: the update of `lion.wgsl` in f32, operation for operation, so the
//! CPU rounds where the GPU does, for each storage leaf ([`LionLeaf`]), and the
//! family's CPU update for a step ([`loops`]).

use half::f16;

use crate::cpu::kernels::{every_storage, Bound, Element, Leaf, Loop, Operands, Q8};
use crate::cpu::{f16_lanes, q8};
use super::contract::{LionSwitches, LionUniform, LionUniform64};

/// One element of `src/family/lion/lion.wgsl`: returns `(p_new, m)`.
#[inline(always)]
pub(crate) fn lion_element(hp: &LionUniform, p: f32, g: f32, m_prev: f32) -> (f32, f32) {
    let c = hp.beta1 * m_prev + hp.one_minus_beta1 * g;
    // torch.sign and bitsandbytes' `sgn`, `(0 < c) - (c < 0)`: 0 for 0 (f32::signum gives 1)
    // and for NaN, so a NaN gradient leaves its parameter to the decay.
    let direction = if c > 0.0 {
        1.0
    } else if c < 0.0 {
        -1.0
    } else {
        0.0
    };
    let p_new = p * hp.decay - hp.lr * direction;
    let m = hp.beta2 * m_prev + hp.one_minus_beta2 * g;
    (p_new, m)
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
pub(crate) fn lion<E: Element>(hp: &LionUniform, scale: f32, o: Operands<'_, E>) {
    let [exp_avg, ..] = o.state;
    for ((p, g), m) in o.param.iter_mut().zip(o.grad).zip(exp_avg.iter_mut()) {
        let (new_p, new_m) = lion_element(hp, p.widen(), g.widen() * scale, m.widen());
        (*p, *m) = (E::narrow(new_p), E::narrow(new_m));
    }
}

/// [`lion`] on f16 operands, a register (sixteen or eight elements) at a time.
pub(crate) fn lion_f16(hp: &LionUniform, scale: f32, o: Operands<'_, f16>) {
    let [exp_avg, ..] = o.state;
    f16_lanes::each(
        [o.param, exp_avg],
        o.grad,
        #[inline(always)]
        |g, [p, m]| {
            let (p, m) = lion_element(hp, p, g * scale, m);
            [p, m]
        },
    );
}

/// [`lion`] over 8-bit state, one pass per block.
pub(crate) fn lion_q8(hp: &LionUniform, scale: f32, job: q8::Job<'_>) {
    q8::each::<_, false>(
        job,
        #[inline(always)]
        |g, p, [m]| {
            let (p, m) = lion_element(hp, p, g * scale, m);
            (p, [m])
        },
        |o| lion::<f32>(hp, scale, o),
    );
}

pub(crate) fn lion_loop<E: LionLeaf>(_: &LionSwitches, _: &LionUniform) -> Loop<LionUniform, E> {
    E::lion()
}

/// The loop of one storage leaf for each of the family's switches, so that one selection
/// tree ([`lion_loop`]) serves every storage type.
pub(crate) trait LionLeaf: Leaf {
    fn lion() -> Loop<LionUniform, Self>;
}

impl<T: Element> LionLeaf for T {
    fn lion() -> Loop<LionUniform, Self> {
        lion::<T>
    }
}

impl LionLeaf for f16 {
    fn lion() -> Loop<LionUniform, Self> {
        lion_f16
    }
}

impl LionLeaf for Q8 {
    fn lion() -> Loop<LionUniform, Self> {
        lion_q8
    }
}

/// What the family's CPU loops read of a step: the kernel's uniform, in f32.
pub(crate) type Hyper = super::contract::Uniform;

/// The family's CPU update for a step: the loops its switches and uniform select, for every
/// storage type, with the uniform in f32.
pub(crate) fn loops(switches: &LionSwitches, uniform: &LionUniform64) -> Bound<Hyper> {
    let uniform = uniform.to_f32();
    every_storage!(lion_loop(switches, &uniform)).with_uniform(uniform)
}
