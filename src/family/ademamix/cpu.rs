//! AdEMAMix's CPU loops: the update of `ademamix.wgsl` in f32, operation for operation, so the
//! CPU rounds where the GPU does, for each storage leaf ([`AdemamixLeaf`]), and the
//! family's CPU update for a step ([`loops`]).

use half::f16;

use crate::cpu::kernels::{every_storage, Bound, Element, Leaf, Loop, Operands, Q8};
use crate::cpu::{f16_lanes, q8};
use super::contract::{AdemamixSwitches, AdemamixUniform, AdemamixUniform64};

/// One element of `src/family/ademamix/ademamix.wgsl`: returns `[p_new, m1, m2, nu]`. `DECAY_AFTER`:
/// the decay after the update (`AdemamixSwitches::decay_after_update`).
#[inline(always)]
pub(crate) fn ademamix_element<const DECAY_AFTER: bool>(
    hp: &AdemamixUniform,
    p: f32,
    g: f32,
    m1_prev: f32,
    m2_prev: f32,
    nu_prev: f32,
) -> [f32; 4] {
    let m1 = hp.beta1 * m1_prev + hp.one_minus_beta1 * g;
    let m2 = hp.beta3_t * m2_prev + hp.one_minus_beta3_t * g;
    let nu = hp.beta2 * nu_prev + hp.one_minus_beta2 * g * g;
    let denom = nu.sqrt() / hp.sqrt_bias_correction2 + hp.eps;
    let u = (m1 / hp.bias_correction1 + hp.alpha_t * m2) / denom;
    let p_new = if DECAY_AFTER { (p - hp.lr * u) * hp.decay } else { p * hp.decay - hp.lr * u };
    [p_new, m1, m2, nu]
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
pub(crate) fn ademamix<E: Element, const DECAY_AFTER: bool>(
    hp: &AdemamixUniform,
    scale: f32,
    o: Operands<'_, E>,
) {
    let [exp_avg, exp_avg_slow, exp_avg_sq, ..] = o.state;
    let rows = o.param.iter_mut().zip(o.grad).zip(exp_avg.iter_mut()).zip(exp_avg_slow.iter_mut());
    for ((((p, g), m1), m2), nu) in rows.zip(exp_avg_sq.iter_mut()) {
        let new = ademamix_element::<DECAY_AFTER>(
            hp,
            p.widen(),
            g.widen() * scale,
            m1.widen(),
            m2.widen(),
            nu.widen(),
        );
        (*p, *m1, *m2, *nu) = (E::narrow(new[0]), E::narrow(new[1]), E::narrow(new[2]), E::narrow(new[3]));
    }
}

/// [`ademamix`] on f16 operands, a register (sixteen or eight elements) at a time.
pub(crate) fn ademamix_f16<const DECAY_AFTER: bool>(hp: &AdemamixUniform, scale: f32, o: Operands<'_, f16>) {
    let [exp_avg, exp_avg_slow, exp_avg_sq, ..] = o.state;
    f16_lanes::each(
        [o.param, exp_avg, exp_avg_slow, exp_avg_sq],
        o.grad,
        #[inline(always)]
        |g, [p, m1, m2, nu]| ademamix_element::<DECAY_AFTER>(hp, p, g * scale, m1, m2, nu),
    );
}

/// [`ademamix`] over 8-bit state, one pass per block; a non-finite gradient restarts its
/// element, as bitsandbytes' 2-state kernel does ([`q8::NonFinite::Restart`]).
pub(crate) fn ademamix_q8<const DECAY_AFTER: bool>(hp: &AdemamixUniform, scale: f32, job: q8::Job<'_>) {
    q8::each::<_, true>(
        job,
        #[inline(always)]
        |g, p, [m1, m2, nu]| {
            let [p, m1, m2, nu] = ademamix_element::<DECAY_AFTER>(hp, p, g * scale, m1, m2, nu);
            (p, [m1, m2, nu])
        },
        |o| ademamix::<f32, DECAY_AFTER>(hp, scale, o),
    );
}

pub(crate) fn ademamix_loop<E: AdemamixLeaf>(
    s: &AdemamixSwitches,
    _: &AdemamixUniform,
) -> Loop<AdemamixUniform, E> {
    if s.decay_after_update {
        E::ademamix::<true>()
    } else {
        E::ademamix::<false>()
    }
}

/// The loop of one storage leaf for each of the family's switches, so that one selection
/// tree ([`ademamix_loop`]) serves every storage type.
pub(crate) trait AdemamixLeaf: Leaf {
    fn ademamix<const A: bool>() -> Loop<AdemamixUniform, Self>;
}

impl<T: Element> AdemamixLeaf for T {
    fn ademamix<const A: bool>() -> Loop<AdemamixUniform, Self> {
        ademamix::<T, A>
    }
}

impl AdemamixLeaf for f16 {
    fn ademamix<const A: bool>() -> Loop<AdemamixUniform, Self> {
        ademamix_f16::<A>
    }
}

impl AdemamixLeaf for Q8 {
    fn ademamix<const A: bool>() -> Loop<AdemamixUniform, Self> {
        ademamix_q8::<A>
    }
}

/// What the family's CPU loops read of a step: the kernel's uniform, in f32.
pub(crate) type Hyper = super::contract::Uniform;

/// The family's CPU update for a step: the loops its switches and uniform select, for every
/// storage type, with the uniform in f32.
pub(crate) fn loops(
    switches: &AdemamixSwitches,
    uniform: &AdemamixUniform64,
) -> Bound<Hyper> {
    let uniform = uniform.to_f32();
    every_storage!(ademamix_loop(switches, &uniform)).with_uniform(uniform)
}
