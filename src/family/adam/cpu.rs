//! Adam's CPU loops: the update of `adam.wgsl` in f32, operation for operation, so the
//! CPU rounds where the GPU does, for each storage leaf ([`AdamLeaf`]), and the
//! family's CPU update for a step ([`loops`]).

use half::f16;

use crate::cpu::kernels::{every_storage, Bound, Element, Leaf, Loop, Operands, Signed, Q8};
use crate::cpu::{f16_lanes, q8};
use super::contract::{AdamSwitches, AdamUniform, AdamUniform64, EpsPlacement, FirstMoment};

// How weight decay enters an Adam update (a const generic cannot be an enum). The shader
// tests the L2 coefficient against 0 at run time; here that test picks the loop. No decay at
// all keeps its own loop: running the decoupled one with `decay` 1 (the same bits) made
// PyTorch's default Adam 1.2-1.7x slower on f32 (PERF.md, "Run-time switches").
const NO_DECAY: u8 = 0;
const L2: u8 = 1;
const DECOUPLED: u8 = 2;
/// Decoupled decay after the update (bitsandbytes' kernels: `AdamSwitches::decay_after_update`).
const DECOUPLED_AFTER: u8 = 3;

// The forms of the first moment, `FirstMoment` as a const generic (the shader's values).
const LINEAR: u32 = FirstMoment::Linear.code();
const LERP_FROM_MOMENT: u32 = FirstMoment::LerpFromMoment.code();
const LERP_FROM_GRAD: u32 = FirstMoment::LerpFromGrad.code();

/// What Adam's CPU loops read of a step: the kernel's uniform in f32, with `maximize`
/// applied at run time (the shader compiles it: `MAXIMIZE`).
pub(crate) type Hyper = Signed<AdamUniform>;

/// One element of `src/family/adam/adam.wgsl`: returns `(p_new, m, v, v_hat)`.
#[inline(always)]
pub(crate) fn adam_element<const AMSGRAD: bool, const EPS_AFTER_CORRECTION: bool, const DECAY: u8, const MOMENT: u32>(
    hp: &Hyper,
    mut p: f32,
    g: f32,
    m_prev: f32,
    v_prev: f32,
    v_max_prev: f32,
) -> (f32, f32, f32, f32) {
    let mut g = hp.signed(g);
    if DECAY == L2 {
        g += hp.weight_decay * p;
    } else if DECAY == DECOUPLED {
        p *= hp.decay;
    }
    let m = match MOMENT {
        LERP_FROM_MOMENT => m_prev + hp.one_minus_beta1 * (g - m_prev),
        LERP_FROM_GRAD => g - (g - m_prev) * (1.0 - hp.one_minus_beta1),
        _ => hp.beta1 * m_prev + hp.one_minus_beta1 * g,
    };
    let v = hp.beta2 * v_prev + hp.one_minus_beta2 * g * g;
    // torch.maximum propagates NaN; f32::max would drop it.
    let v_hat = if !AMSGRAD {
        v
    } else if v_max_prev.is_nan() || v.is_nan() {
        v_max_prev + v
    } else {
        v_max_prev.max(v)
    };
    let denom = if EPS_AFTER_CORRECTION {
        v_hat.sqrt() / hp.sqrt_bias_correction2 + hp.eps
    } else {
        v_hat.sqrt() + hp.eps
    };
    let p_new = (p - hp.step_size * (m / denom)) * hp.post_scale;
    let p_new = if DECAY == DECOUPLED_AFTER { p_new * hp.decay } else { p_new };
    (p_new, m, v, v_hat)
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
pub(crate) fn adam<
    E: Element,
    const AMSGRAD: bool,
    const EPS_AFTER_CORRECTION: bool,
    const DECAY: u8,
    const MOMENT: u32,
>(
    hp: &Hyper,
    scale: f32,
    o: Operands<'_, E>,
) {
    let update = adam_element::<AMSGRAD, EPS_AFTER_CORRECTION, DECAY, MOMENT>;
    let [exp_avg, exp_avg_sq, max_exp_avg_sq, ..] = o.state;
    let rows = o.param.iter_mut().zip(o.grad).zip(exp_avg.iter_mut()).zip(exp_avg_sq.iter_mut());
    if AMSGRAD {
        for ((((p, g), m), v), v_max) in rows.zip(max_exp_avg_sq.iter_mut()) {
            let new = update(hp, p.widen(), g.widen() * scale, m.widen(), v.widen(), v_max.widen());
            (*p, *m, *v, *v_max) = (E::narrow(new.0), E::narrow(new.1), E::narrow(new.2), E::narrow(new.3));
        }
    } else {
        // No maximum is kept: the slot is empty and the shader's absent load reads 0.
        for (((p, g), m), v) in rows {
            let new = update(hp, p.widen(), g.widen() * scale, m.widen(), v.widen(), 0.0);
            (*p, *m, *v) = (E::narrow(new.0), E::narrow(new.1), E::narrow(new.2));
        }
    }
}

/// [`adam`] on f16 operands, a register (sixteen or eight elements) at a time.
pub(crate) fn adam_f16<
    const AMSGRAD: bool,
    const EPS_AFTER_CORRECTION: bool,
    const DECAY: u8,
    const MOMENT: u32,
>(
    hp: &Hyper,
    scale: f32,
    o: Operands<'_, f16>,
) {
    let update = adam_element::<AMSGRAD, EPS_AFTER_CORRECTION, DECAY, MOMENT>;
    let [exp_avg, exp_avg_sq, max_exp_avg_sq, ..] = o.state;
    if AMSGRAD {
        f16_lanes::each(
            [o.param, exp_avg, exp_avg_sq, max_exp_avg_sq],
            o.grad,
            #[inline(always)]
            |g, [p, m, v, v_max]| {
                let new = update(hp, p, g * scale, m, v, v_max);
                [new.0, new.1, new.2, new.3]
            },
        );
    } else {
        f16_lanes::each(
            [o.param, exp_avg, exp_avg_sq],
            o.grad,
            #[inline(always)]
            |g, [p, m, v]| {
                let new = update(hp, p, g * scale, m, v, 0.0);
                [new.0, new.1, new.2]
            },
        );
    }
}

/// [`adam`] over 8-bit state, one pass per block.
pub(crate) fn adam_q8<
    const AMSGRAD: bool,
    const EPS_AFTER_CORRECTION: bool,
    const DECAY: u8,
    const MOMENT: u32,
>(
    hp: &Hyper,
    scale: f32,
    job: q8::Job<'_>,
) {
    let update = adam_element::<AMSGRAD, EPS_AFTER_CORRECTION, DECAY, MOMENT>;
    let blocked = |o: Operands<'_, f32>| {
        adam::<f32, AMSGRAD, EPS_AFTER_CORRECTION, DECAY, MOMENT>(hp, scale, o)
    };
    if AMSGRAD {
        q8::each::<_, true>(
            job,
            #[inline(always)]
            |g, p, [m, v, v_max]| {
                let new = update(hp, p, g * scale, m, v, v_max);
                (new.0, [new.1, new.2, new.3])
            },
            blocked,
        );
    } else {
        q8::each::<_, true>(
            job,
            #[inline(always)]
            |g, p, [m, v]| {
                let new = update(hp, p, g * scale, m, v, 0.0);
                (new.0, [new.1, new.2])
            },
            blocked,
        );
    }
}

pub(crate) fn adam_loop<T: AdamLeaf>(s: &AdamSwitches, u: &AdamUniform) -> Loop<Hyper, T> {
    fn moment<T: AdamLeaf, const A: bool, const E: bool, const D: u8>(s: &AdamSwitches) -> Loop<Hyper, T> {
        match s.first_moment {
            FirstMoment::Linear => T::adam::<A, E, D, LINEAR>(),
            FirstMoment::LerpFromMoment => T::adam::<A, E, D, LERP_FROM_MOMENT>(),
            FirstMoment::LerpFromGrad => T::adam::<A, E, D, LERP_FROM_GRAD>(),
        }
    }
    fn decay<T: AdamLeaf, const A: bool, const E: bool>(s: &AdamSwitches, u: &AdamUniform) -> Loop<Hyper, T> {
        if s.decoupled_weight_decay {
            moment::<T, A, E, DECOUPLED>(s)
        } else if u.weight_decay != 0.0 || s.l2_at_zero {
            moment::<T, A, E, L2>(s)
        } else {
            moment::<T, A, E, NO_DECAY>(s)
        }
    }
    fn eps<T: AdamLeaf, const A: bool>(s: &AdamSwitches, u: &AdamUniform) -> Loop<Hyper, T> {
        match s.eps {
            EpsPlacement::AfterCorrection => decay::<T, A, true>(s, u),
            EpsPlacement::OnRoot => decay::<T, A, false>(s, u),
        }
    }
    // bitsandbytes' form (`q8::kernel_step`), which has neither AMSGrad nor a lerp: its two
    // loops alone, rather than every other switch's loops once more.
    fn bitsandbytes<T: AdamLeaf>(s: &AdamSwitches) -> Loop<Hyper, T> {
        debug_assert!(!s.amsgrad && s.first_moment == FirstMoment::Linear, "{s:?}");
        match s.eps {
            EpsPlacement::AfterCorrection => T::adam::<false, true, DECOUPLED_AFTER, LINEAR>(),
            EpsPlacement::OnRoot => T::adam::<false, false, DECOUPLED_AFTER, LINEAR>(),
        }
    }
    if s.decoupled_weight_decay && s.decay_after_update {
        bitsandbytes::<T>(s)
    } else if s.amsgrad {
        eps::<T, true>(s, u)
    } else {
        eps::<T, false>(s, u)
    }
}

/// The loop of one storage leaf for each of the family's switches, so that one selection
/// tree ([`adam_loop`]) serves every storage type.
pub(crate) trait AdamLeaf: Leaf {
    fn adam<const A: bool, const E: bool, const D: u8, const F: u32>() -> Loop<Hyper, Self>;
}

impl<T: Element> AdamLeaf for T {
    fn adam<const A: bool, const E: bool, const D: u8, const F: u32>() -> Loop<Hyper, Self> {
        adam::<T, A, E, D, F>
    }
}

impl AdamLeaf for f16 {
    fn adam<const A: bool, const E: bool, const D: u8, const F: u32>() -> Loop<Hyper, Self> {
        adam_f16::<A, E, D, F>
    }
}

impl AdamLeaf for Q8 {
    fn adam<const A: bool, const E: bool, const D: u8, const F: u32>() -> Loop<Hyper, Self> {
        adam_q8::<A, E, D, F>
    }
}

/// The family's CPU update for a step: the loops its switches and uniform select, for every
/// storage type, with the uniform in f32.
pub(crate) fn loops(switches: &AdamSwitches, uniform: &AdamUniform64) -> Bound<Hyper> {
    let uniform = uniform.to_f32();
    every_storage!(adam_loop(switches, &uniform)).with_uniform(Signed::new(uniform, switches.maximize))
}
