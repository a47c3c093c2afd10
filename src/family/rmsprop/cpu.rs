//! RMSprop's CPU loops: the update of `rmsprop.wgsl` in f32, operation for operation, so the
//! CPU rounds where the GPU does, for each storage leaf ([`RmsPropLeaf`]), and the
//! family's CPU update for a step ([`loops`]).

use half::f16;

use crate::cpu::kernels::{every_storage, Bound, Element, Leaf, Loop, Operands, Signed, Q8};
use crate::cpu::{f16_lanes, q8};
use super::contract::{RmsPropSwitches, RmsPropUniform, RmsPropUniform64};

// Whether RMSprop keeps `grad_avg` (a const generic cannot be an enum): not at all, or
// updated by ATen's lerp, in the form `Hyper::lerp_from_grad` picks at run time.
const UNCENTERED: u8 = 0;
const CENTERED: u8 = 1;

/// One element of `src/family/rmsprop/rmsprop.wgsl`: returns `(p_new, square_avg, momentum_buffer,
/// grad_avg)`.
#[inline(always)]
pub(crate) fn rmsprop_element<
    const WEIGHT_DECAY: bool,
    const CENTER: u8,
    const MOMENTUM: bool,
>(
    hp: &Hyper,
    p: f32,
    mut g: f32,
    s_prev: f32,
    b_prev: f32,
    a_prev: f32,
) -> (f32, f32, f32, f32) {
    let loaded = g;
    g = hp.signed(g);
    if WEIGHT_DECAY {
        g += hp.weight_decay * p;
    }
    let s = s_prev * hp.alpha + hp.one_minus_alpha * g * g;
    let (a, root) = if CENTER == CENTERED {
        // ATen's lerp: `a + w (g - a)` from the average, or `g - (g - a) (1 - w)` from the
        // gradient, written `g + (g - a) (w - 1)` (the same bits).
        let base = if hp.lerp_from_grad { g } else { a_prev };
        let a = base + (g - a_prev) * hp.lerp_weight;
        (a, (s - a * a).sqrt())
    } else {
        (a_prev, s.sqrt())
    };
    let avg = root + hp.eps;
    if MOMENTUM {
        let b = b_prev * hp.momentum + g / avg;
        (p - hp.lr * b, s, b, a)
    } else {
        // bitsandbytes' form steps with the gradient as given, the state with the decayed
        // one (`RmsPropSwitches::step_with_raw_grad`).
        let step_grad = if hp.step_with_raw_grad { loaded } else { g };
        (p - hp.lr * (step_grad / avg), s, b_prev, a)
    }
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
pub(crate) fn rmsprop<
    E: Element,
    const WEIGHT_DECAY: bool,
    const CENTER: u8,
    const MOMENTUM: bool,
>(
    hp: &Hyper,
    scale: f32,
    o: Operands<'_, E>,
) {
    let update = rmsprop_element::<WEIGHT_DECAY, CENTER, MOMENTUM>;
    // The slots follow `Algorithm::state_kinds`: square_avg, then momentum_buffer where it
    // is kept, then grad_avg where it is kept.
    let [square_avg, second, third, ..] = o.state;
    let rows = o.param.iter_mut().zip(o.grad).zip(square_avg.iter_mut());
    match (MOMENTUM, CENTER != UNCENTERED) {
        (true, true) => {
            for ((((p, g), s), b), a) in rows.zip(second.iter_mut()).zip(third.iter_mut()) {
                let new = update(hp, p.widen(), g.widen() * scale, s.widen(), b.widen(), a.widen());
                (*p, *s, *b, *a) = (E::narrow(new.0), E::narrow(new.1), E::narrow(new.2), E::narrow(new.3));
            }
        }
        (true, false) => {
            for (((p, g), s), b) in rows.zip(second.iter_mut()) {
                let new = update(hp, p.widen(), g.widen() * scale, s.widen(), b.widen(), 0.0);
                (*p, *s, *b) = (E::narrow(new.0), E::narrow(new.1), E::narrow(new.2));
            }
        }
        (false, true) => {
            for (((p, g), s), a) in rows.zip(second.iter_mut()) {
                let new = update(hp, p.widen(), g.widen() * scale, s.widen(), 0.0, a.widen());
                (*p, *s, *a) = (E::narrow(new.0), E::narrow(new.1), E::narrow(new.3));
            }
        }
        (false, false) => {
            for ((p, g), s) in rows {
                let new = update(hp, p.widen(), g.widen() * scale, s.widen(), 0.0, 0.0);
                (*p, *s) = (E::narrow(new.0), E::narrow(new.1));
            }
        }
    }
}

/// [`rmsprop`] on f16 operands, a register (sixteen or eight elements) at a time.
pub(crate) fn rmsprop_f16<
    const WEIGHT_DECAY: bool,
    const CENTER: u8,
    const MOMENTUM: bool,
>(
    hp: &Hyper,
    scale: f32,
    o: Operands<'_, f16>,
) {
    let update = rmsprop_element::<WEIGHT_DECAY, CENTER, MOMENTUM>;
    let [square_avg, second, third, ..] = o.state;
    match (MOMENTUM, CENTER != UNCENTERED) {
        (true, true) => f16_lanes::each(
            [o.param, square_avg, second, third],
            o.grad,
            #[inline(always)]
            |g, [p, s, b, a]| {
                let new = update(hp, p, g * scale, s, b, a);
                [new.0, new.1, new.2, new.3]
            },
        ),
        (true, false) => f16_lanes::each(
            [o.param, square_avg, second],
            o.grad,
            #[inline(always)]
            |g, [p, s, b]| {
                let new = update(hp, p, g * scale, s, b, 0.0);
                [new.0, new.1, new.2]
            },
        ),
        (false, true) => f16_lanes::each(
            [o.param, square_avg, second],
            o.grad,
            #[inline(always)]
            |g, [p, s, a]| {
                let new = update(hp, p, g * scale, s, 0.0, a);
                [new.0, new.1, new.3]
            },
        ),
        (false, false) => f16_lanes::each(
            [o.param, square_avg],
            o.grad,
            #[inline(always)]
            |g, [p, s]| {
                let new = update(hp, p, g * scale, s, 0.0, 0.0);
                [new.0, new.1]
            },
        ),
    }
}

/// [`rmsprop`] over 8-bit state: bitsandbytes' one 8-bit form (one state, uncentered,
/// without momentum) in one pass per block, the others block by block.
pub(crate) fn rmsprop_q8<
    const WEIGHT_DECAY: bool,
    const CENTER: u8,
    const MOMENTUM: bool,
>(
    hp: &Hyper,
    scale: f32,
    job: q8::Job<'_>,
) {
    let blocked =
        |o: Operands<'_, f32>| rmsprop::<f32, WEIGHT_DECAY, CENTER, MOMENTUM>(hp, scale, o);
    if MOMENTUM || CENTER != UNCENTERED {
        return q8::blocked(job, q8::NonFinite::Update, blocked);
    }
    let update = rmsprop_element::<WEIGHT_DECAY, CENTER, MOMENTUM>;
    q8::each::<_, false>(
        job,
        #[inline(always)]
        |g, p, [s]| {
            let new = update(hp, p, g * scale, s, 0.0, 0.0);
            (new.0, [new.1])
        },
        blocked,
    );
}

pub(crate) fn rmsprop_loop<E: RmsPropLeaf>(
    s: &RmsPropSwitches,
    u: &RmsPropUniform,
) -> Loop<Hyper, E> {
    // The shader's run-time test of a zero L2 coefficient is the same for every element:
    // here it picks the loop.
    fn momentum<E: RmsPropLeaf, const W: bool, const C: u8>(
        s: &RmsPropSwitches,
    ) -> Loop<Hyper, E> {
        if s.momentum {
            E::rmsprop::<W, C, true>()
        } else {
            E::rmsprop::<W, C, false>()
        }
    }
    fn center<E: RmsPropLeaf, const W: bool>(s: &RmsPropSwitches) -> Loop<Hyper, E> {
        if s.centered {
            momentum::<E, W, CENTERED>(s)
        } else {
            momentum::<E, W, UNCENTERED>(s)
        }
    }
    debug_assert!(!s.step_with_raw_grad || !(s.maximize || s.centered || s.momentum), "{s:?}");
    if u.weight_decay != 0.0 {
        center::<E, true>(s)
    } else {
        center::<E, false>(s)
    }
}

/// The loop of one storage leaf for each of the family's switches, so that one selection
/// tree ([`rmsprop_loop`]) serves every storage type.
pub(crate) trait RmsPropLeaf: Leaf {
    fn rmsprop<const W: bool, const C: u8, const B: bool>(
    ) -> Loop<Hyper, Self>;
}

impl<T: Element> RmsPropLeaf for T {
    fn rmsprop<const W: bool, const C: u8, const B: bool>(
    ) -> Loop<Hyper, Self> {
        rmsprop::<T, W, C, B>
    }
}

impl RmsPropLeaf for f16 {
    fn rmsprop<const W: bool, const C: u8, const B: bool>(
    ) -> Loop<Hyper, Self> {
        rmsprop_f16::<W, C, B>
    }
}

impl RmsPropLeaf for Q8 {
    fn rmsprop<const W: bool, const C: u8, const B: bool>(
    ) -> Loop<Hyper, Self> {
        rmsprop_q8::<W, C, B>
    }
}

/// What the family's CPU loops read of a step: the kernel's uniform in f32, with
/// `maximize` applied at run time (the shader compiles it: `MAXIMIZE`), and the switches
/// whose forms differ by an operand, not by an operation: the lerp's form and which gradient
/// the parameter steps with.
pub(crate) struct Hyper {
    uniform: Signed<RmsPropUniform>,
    /// ATen's lerp of `grad_avg` from the gradient (`w >= 0.5`) rather than from the average.
    lerp_from_grad: bool,
    /// The lerp's multiplier of `g - a`: `w`, or `w - 1` from the gradient.
    lerp_weight: f32,
    /// The parameter steps with the gradient as given (bitsandbytes' 8-bit RMSprop).
    step_with_raw_grad: bool,
}

impl Hyper {
    fn new(switches: &RmsPropSwitches, uniform: RmsPropUniform) -> Self {
        Hyper {
            lerp_from_grad: switches.lerp_from_grad,
            lerp_weight: if switches.lerp_from_grad {
                -(1.0 - uniform.one_minus_alpha)
            } else {
                uniform.one_minus_alpha
            },
            step_with_raw_grad: switches.step_with_raw_grad,
            uniform: Signed::new(uniform, switches.maximize),
        }
    }
}

impl std::ops::Deref for Hyper {
    type Target = Signed<RmsPropUniform>;
    fn deref(&self) -> &Self::Target {
        &self.uniform
    }
}

/// The family's CPU update for a step: the loops its switches and uniform select, for every
/// storage type, with the uniform in f32.
pub(crate) fn loops(
    switches: &RmsPropSwitches,
    uniform: &RmsPropUniform64,
) -> Bound<Hyper> {
    let uniform = uniform.to_f32();
    every_storage!(rmsprop_loop(switches, &uniform)).with_uniform(Hyper::new(switches, uniform))
}
