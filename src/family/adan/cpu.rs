//! Adan's CPU loops: the update of `adan.wgsl` in f32, operation for operation, so the CPU
//! rounds where the GPU does, for each storage leaf ([`AdanLeaf`]), and the family's CPU
//! update for a step ([`loops`]).

use half::f16;

use crate::cpu::kernels::{every_storage, Bound, Element, Leaf, Loop, Operands, Q8};
use crate::cpu::{f16_lanes, q8};
use super::contract::{AdanSwitches, AdanUniform, AdanUniform64};

/// One element of `src/family/adan/adan.wgsl`: returns `[p_new, m, n, v, neg_pre_grad]`
/// (the states in the kernels' slot order). `FIRST`, the shader's run-time test of the first
/// step, is a const generic here: the previous gradient is the gradient itself.
#[inline(always)]
pub(crate) fn adan_element<const FIRST: bool>(
    hp: &AdanUniform,
    p: f32,
    g: f32,
    [m_prev, n_prev, v_prev, neg_prev]: [f32; 4],
) -> [f32; 5] {
    let neg_prev = if FIRST { -g } else { neg_prev };
    let d = neg_prev + g;
    let m = m_prev * hp.beta1 + hp.one_minus_beta1 * g;
    let v = v_prev * hp.beta2 + hp.one_minus_beta2 * d;
    let z = d * hp.beta2 + g;
    let n = n_prev * hp.beta3 + hp.one_minus_beta3 * z * z;
    let denom = n.sqrt() / hp.sqrt_bias_correction3 + hp.eps;
    let mut p_new = p * hp.decay;
    p_new -= hp.step_size * (m / denom);
    p_new -= hp.step_size_diff * (v / denom);
    p_new /= hp.prox_divisor;
    [p_new, m, n, v, -g]
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
pub(crate) fn adan<E: Element, const FIRST: bool>(hp: &AdanUniform, scale: f32, o: Operands<'_, E>) {
    let [exp_avg, exp_avg_sq, exp_avg_diff, neg_pre_grad, ..] = o.state;
    let states = exp_avg.iter_mut().zip(exp_avg_sq.iter_mut()).zip(exp_avg_diff.iter_mut()).zip(neg_pre_grad);
    for ((p, g), (((m, n), v), q)) in o.param.iter_mut().zip(o.grad).zip(states) {
        let old = [m.widen(), n.widen(), v.widen(), q.widen()];
        let new = adan_element::<FIRST>(hp, p.widen(), g.widen() * scale, old);
        (*p, *m, *n, *v, *q) =
            (E::narrow(new[0]), E::narrow(new[1]), E::narrow(new[2]), E::narrow(new[3]), E::narrow(new[4]));
    }
}

/// [`adan`] on f16 operands, a register (sixteen or eight elements) at a time.
pub(crate) fn adan_f16<const FIRST: bool>(hp: &AdanUniform, scale: f32, o: Operands<'_, f16>) {
    let [exp_avg, exp_avg_sq, exp_avg_diff, neg_pre_grad, ..] = o.state;
    f16_lanes::each(
        [o.param, exp_avg, exp_avg_sq, exp_avg_diff, neg_pre_grad],
        o.grad,
        #[inline(always)]
        |g, [p, m, n, v, q]| adan_element::<FIRST>(hp, p, g * scale, [m, n, v, q]),
    );
}

pub(crate) fn adan_loop<E: AdanLeaf>(_: &AdanSwitches, u: &AdanUniform) -> Loop<AdanUniform, E> {
    // The shader's run-time test of the first step is the same for every element: here it
    // picks the loop.
    if u.first_step != 0 {
        E::adan::<true>()
    } else {
        E::adan::<false>()
    }
}

/// The loop of one storage leaf for each of the family's run-time modes, so that one
/// selection tree ([`adan_loop`]) serves every storage type.
pub(crate) trait AdanLeaf: Leaf {
    fn adan<const F: bool>() -> Loop<AdanUniform, Self>;
}

impl<T: Element> AdanLeaf for T {
    fn adan<const F: bool>() -> Loop<AdanUniform, Self> {
        adan::<T, F>
    }
}

impl AdanLeaf for f16 {
    fn adan<const F: bool>() -> Loop<AdanUniform, Self> {
        adan_f16::<F>
    }
}

impl AdanLeaf for Q8 {
    fn adan<const F: bool>() -> Loop<AdanUniform, Self> {
        adan_q8::<F>
    }
}

/// What the family's CPU loops read of a step: the kernel's uniform, in f32.
pub(crate) type Hyper = super::contract::Uniform;

/// [`adan`] over 8-bit state, one pass per block. A non-finite gradient runs the update as
/// any other ([`q8::NonFinite::Update`]): bitsandbytes has no Adan whose kernel to follow.
pub(crate) fn adan_q8<const FIRST: bool>(hp: &AdanUniform, scale: f32, job: q8::Job<'_>) {
    q8::each::<_, false>(
        job,
        #[inline(always)]
        |g, p, states| {
            let [p, m, n, v, q] = adan_element::<FIRST>(hp, p, g * scale, states);
            (p, [m, n, v, q])
        },
        |o| adan::<f32, FIRST>(hp, scale, o),
    );
}

/// The family's CPU update for a step: the loops its uniform selects, for every storage
/// type, with the uniform in f32.
pub(crate) fn loops(switches: &AdanSwitches, uniform: &AdanUniform64) -> Bound<Hyper> {
    let uniform = uniform.to_f32();
    every_storage!(adan_loop(switches, &uniform)).with_uniform(uniform)
}
