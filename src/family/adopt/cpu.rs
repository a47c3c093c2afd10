//! ADOPT's CPU loops: the update of `adopt.wgsl` in f32, operation for operation, so the
//! CPU rounds where the GPU does, for each storage leaf ([`AdoptLeaf`]), and the family's
//! CPU update for a step ([`loops`]).

use half::f16;

use crate::cpu::kernels::{every_storage, Bound, Element, Leaf, Loop, Operands, Q8};
use crate::cpu::{f16_lanes, q8};
use super::contract::{AdoptSwitches, AdoptUniform, AdoptUniform64};

/// One element of `src/family/adopt/adopt.wgsl`: returns `[p_new, m, v]`. The shader's
/// run-time tests of the uniform are const generics here: `FIRST`, the first step (only
/// `v` changes); `L2`, a coupled decay to add; `LERP_FROM_X`, ATen's lerp in its form for
/// weights of 0.5 and more.
#[inline(always)]
pub(crate) fn adopt_element<const FIRST: bool, const L2: bool, const LERP_FROM_X: bool>(
    hp: &AdoptUniform,
    p: f32,
    g: f32,
    m_prev: f32,
    v_prev: f32,
) -> [f32; 3] {
    let mut g = hp.grad_sign * g;
    if L2 {
        g += hp.l2 * p;
    }
    if FIRST {
        return [p, m_prev, v_prev + g * g];
    }
    // torch.clamp(sqrt(v), eps) keeps a NaN root; f32::max would drop it.
    let root = v_prev.sqrt();
    let denom = if root.is_nan() { root } else { root.max(hp.eps) };
    let mut x = g / denom;
    if x > hp.clip_bound {
        x = hp.clip_bound;
    } else if x < -hp.clip_bound {
        x = -hp.clip_bound;
    }
    let m = if LERP_FROM_X {
        x - (x - m_prev) * (1.0 - hp.one_minus_beta1)
    } else {
        m_prev + hp.one_minus_beta1 * (x - m_prev)
    };
    let p_new = p * hp.decay - hp.lr * m;
    let v = v_prev * hp.beta2 + hp.one_minus_beta2 * g * g;
    [p_new, m, v]
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
pub(crate) fn adopt<E: Element, const FIRST: bool, const L2: bool, const LERP_FROM_X: bool>(
    hp: &AdoptUniform,
    scale: f32,
    o: Operands<'_, E>,
) {
    let [exp_avg, exp_avg_sq, ..] = o.state;
    let rows = o.param.iter_mut().zip(o.grad).zip(exp_avg.iter_mut()).zip(exp_avg_sq.iter_mut());
    for (((p, g), m), v) in rows {
        let new =
            adopt_element::<FIRST, L2, LERP_FROM_X>(hp, p.widen(), g.widen() * scale, m.widen(), v.widen());
        (*p, *m, *v) = (E::narrow(new[0]), E::narrow(new[1]), E::narrow(new[2]));
    }
}

/// [`adopt`] on f16 operands, a register (sixteen or eight elements) at a time.
pub(crate) fn adopt_f16<const FIRST: bool, const L2: bool, const LERP_FROM_X: bool>(
    hp: &AdoptUniform,
    scale: f32,
    o: Operands<'_, f16>,
) {
    let [exp_avg, exp_avg_sq, ..] = o.state;
    f16_lanes::each(
        [o.param, exp_avg, exp_avg_sq],
        o.grad,
        #[inline(always)]
        |g, [p, m, v]| adopt_element::<FIRST, L2, LERP_FROM_X>(hp, p, g * scale, m, v),
    );
}

/// [`adopt`] over 8-bit state, one pass per block. A non-finite gradient runs the update
/// as any other ([`q8::NonFinite::Update`]): bitsandbytes has no ADOPT whose kernel to follow.
pub(crate) fn adopt_q8<const FIRST: bool, const L2: bool, const LERP_FROM_X: bool>(
    hp: &AdoptUniform,
    scale: f32,
    job: q8::Job<'_>,
) {
    q8::each::<_, false>(
        job,
        #[inline(always)]
        |g, p, [m, v]| {
            let [p, m, v] = adopt_element::<FIRST, L2, LERP_FROM_X>(hp, p, g * scale, m, v);
            (p, [m, v])
        },
        |o| adopt::<f32, FIRST, L2, LERP_FROM_X>(hp, scale, o),
    );
}

pub(crate) fn adopt_loop<E: AdoptLeaf>(_: &AdoptSwitches, u: &AdoptUniform) -> Loop<AdoptUniform, E> {
    // The shader's run-time tests of the uniform are the same for every element: here they
    // pick the loop.
    fn lerp<E: AdoptLeaf, const F: bool, const L: bool>(u: &AdoptUniform) -> Loop<AdoptUniform, E> {
        if u.one_minus_beta1.abs() < 0.5 {
            E::adopt::<F, L, false>()
        } else {
            E::adopt::<F, L, true>()
        }
    }
    match (u.first_step != 0, u.l2 != 0.0) {
        (false, false) => lerp::<E, false, false>(u),
        (false, true) => lerp::<E, false, true>(u),
        (true, false) => lerp::<E, true, false>(u),
        (true, true) => lerp::<E, true, true>(u),
    }
}

/// The loop of one storage leaf for each of the family's run-time modes, so that one
/// selection tree ([`adopt_loop`]) serves every storage type.
pub(crate) trait AdoptLeaf: Leaf {
    fn adopt<const F: bool, const L: bool, const X: bool>() -> Loop<AdoptUniform, Self>;
}

impl<T: Element> AdoptLeaf for T {
    fn adopt<const F: bool, const L: bool, const X: bool>() -> Loop<AdoptUniform, Self> {
        adopt::<T, F, L, X>
    }
}

impl AdoptLeaf for f16 {
    fn adopt<const F: bool, const L: bool, const X: bool>() -> Loop<AdoptUniform, Self> {
        adopt_f16::<F, L, X>
    }
}

impl AdoptLeaf for Q8 {
    fn adopt<const F: bool, const L: bool, const X: bool>() -> Loop<AdoptUniform, Self> {
        adopt_q8::<F, L, X>
    }
}

/// What the family's CPU loops read of a step: the kernel's uniform, in f32.
pub(crate) type Hyper = super::contract::Uniform;

/// The family's CPU update for a step: the loops its uniform selects, for every storage
/// type, with the uniform in f32.
pub(crate) fn loops(switches: &AdoptSwitches, uniform: &AdoptUniform64) -> Bound<Hyper> {
    let uniform = uniform.to_f32();
    every_storage!(adopt_loop(switches, &uniform)).with_uniform(uniform)
}
