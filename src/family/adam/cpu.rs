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

// The forms of the first moment as a const generic: `beta1 m + (1 - beta1) g`, or ATen's
// lerp in either of its forms (`Hyper::lerp_from_grad` picks which at run time).
const LINEAR: u32 = 0;
const LERP: u32 = 1;

/// What Adam's CPU loops read of a step: the kernel's uniform in f32, with `maximize`
/// applied at run time (the shader compiles it: `MAXIMIZE`), and the two switches whose
/// forms differ by an operand, not by an operation: eps's placement and the lerp's form.
pub(crate) struct Hyper {
    uniform: Signed<AdamUniform>,
    /// What the root is divided by before eps is added: `sqrt(1 - beta2^t)` where eps comes
    /// after the correction (PyTorch), 1 where it is added to the root itself.
    root_divisor: f32,
    /// ATen's lerp from the gradient (`w >= 0.5`) rather than from the moment.
    lerp_from_grad: bool,
    /// The lerp's multiplier of `g - m`: `w`, or `w - 1` from the gradient.
    lerp_weight: f32,
}

impl Hyper {
    fn new(switches: &AdamSwitches, uniform: AdamUniform) -> Self {
        let lerp_from_grad = switches.first_moment == FirstMoment::LerpFromGrad;
        Hyper {
            root_divisor: match switches.eps {
                EpsPlacement::AfterCorrection => uniform.sqrt_bias_correction2,
                EpsPlacement::OnRoot => 1.0,
            },
            lerp_from_grad,
            lerp_weight: if lerp_from_grad {
                -(1.0 - uniform.one_minus_beta1)
            } else {
                uniform.one_minus_beta1
            },
            uniform: Signed::new(uniform, switches.maximize),
        }
    }
}

impl std::ops::Deref for Hyper {
    type Target = Signed<AdamUniform>;
    fn deref(&self) -> &Self::Target {
        &self.uniform
    }
}

/// One element of `src/family/adam/adam.wgsl`: returns `(p_new, m, v, v_hat)`.
#[inline(always)]
pub(crate) fn adam_element<const AMSGRAD: bool, const DECAY: u8, const MOMENT: u32>(
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
    let m = if MOMENT == LERP {
        // ATen's lerp in the form its weight picks, at run time: `m + w (g - m)` from the
        // moment, or `g - (g - m) (1 - w)` from the gradient, written `g + (g - m) (w - 1)`
        // (the same bits: negating a product or an addend is exact).
        let base = if hp.lerp_from_grad { g } else { m_prev };
        base + (g - m_prev) * hp.lerp_weight
    } else {
        hp.beta1 * m_prev + hp.one_minus_beta1 * g
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
    // Where eps is added to the root itself the divisor is 1, and `x / 1` is `x`, NaN and
    // infinities included.
    let denom = v_hat.sqrt() / hp.root_divisor + hp.eps;
    let p_new = (p - hp.step_size * (m / denom)) * hp.post_scale;
    let p_new = if DECAY == DECOUPLED_AFTER { p_new * hp.decay } else { p_new };
    (p_new, m, v, v_hat)
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
pub(crate) fn adam<
    E: Element,
    const AMSGRAD: bool,
    const DECAY: u8,
    const MOMENT: u32,
>(
    hp: &Hyper,
    scale: f32,
    o: Operands<'_, E>,
) {
    let update = adam_element::<AMSGRAD, DECAY, MOMENT>;
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
    const DECAY: u8,
    const MOMENT: u32,
>(
    hp: &Hyper,
    scale: f32,
    o: Operands<'_, f16>,
) {
    let update = adam_element::<AMSGRAD, DECAY, MOMENT>;
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
    const DECAY: u8,
    const MOMENT: u32,
>(
    hp: &Hyper,
    scale: f32,
    job: q8::Job<'_>,
) {
    let update = adam_element::<AMSGRAD, DECAY, MOMENT>;
    let blocked = |o: Operands<'_, f32>| {
        adam::<f32, AMSGRAD, DECAY, MOMENT>(hp, scale, o)
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
    fn moment<T: AdamLeaf, const A: bool, const D: u8>(s: &AdamSwitches) -> Loop<Hyper, T> {
        match s.first_moment {
            FirstMoment::Linear => T::adam::<A, D, LINEAR>(),
            FirstMoment::LerpFromMoment | FirstMoment::LerpFromGrad => T::adam::<A, D, LERP>(),
        }
    }
    fn decay<T: AdamLeaf, const A: bool>(s: &AdamSwitches, u: &AdamUniform) -> Loop<Hyper, T> {
        if s.decoupled_weight_decay {
            moment::<T, A, DECOUPLED>(s)
        } else if u.weight_decay != 0.0 || s.l2_at_zero {
            moment::<T, A, L2>(s)
        } else {
            moment::<T, A, NO_DECAY>(s)
        }
    }
    if s.decoupled_weight_decay && s.decay_after_update {
        // bitsandbytes' form (`q8::kernel_step`), which has neither AMSGrad nor a lerp: its
        // loop alone, rather than every other switch's loops once more.
        debug_assert!(!s.amsgrad && s.first_moment == FirstMoment::Linear, "{s:?}");
        T::adam::<false, DECOUPLED_AFTER, LINEAR>()
    } else if s.amsgrad {
        decay::<T, true>(s, u)
    } else {
        decay::<T, false>(s, u)
    }
}

/// The loop of one storage leaf for each of the family's switches, so that one selection
/// tree ([`adam_loop`]) serves every storage type.
pub(crate) trait AdamLeaf: Leaf {
    fn adam<const A: bool, const D: u8, const F: u32>() -> Loop<Hyper, Self>;
}

impl<T: Element> AdamLeaf for T {
    fn adam<const A: bool, const D: u8, const F: u32>() -> Loop<Hyper, Self> {
        adam::<T, A, D, F>
    }
}

impl AdamLeaf for f16 {
    fn adam<const A: bool, const D: u8, const F: u32>() -> Loop<Hyper, Self> {
        adam_f16::<A, D, F>
    }
}

impl AdamLeaf for Q8 {
    fn adam<const A: bool, const D: u8, const F: u32>() -> Loop<Hyper, Self> {
        adam_q8::<A, D, F>
    }
}

/// The family's CPU update for a step: the loops its switches and uniform select, for every
/// storage type, with the uniform in f32.
pub(crate) fn loops(switches: &AdamSwitches, uniform: &AdamUniform64) -> Bound<Hyper> {
    let uniform = uniform.to_f32();
    every_storage!(adam_loop(switches, &uniform)).with_uniform(Hyper::new(switches, uniform))
}
