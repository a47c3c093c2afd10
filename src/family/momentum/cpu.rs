//! SGD (momentum)'s CPU loops: the update of `momentum.wgsl` in f32, operation for operation, so the
//! CPU rounds where the GPU does, for each storage leaf ([`MomentumLeaf`]), and the
//! family's CPU update for a step ([`loops`]).

use half::f16;

use crate::cpu::kernels::{every_storage, Bound, Element, Leaf, Loop, Operands, Signed, Q8};
use crate::cpu::{f16_lanes, q8};
use super::contract::{MomentumSwitches, MomentumUniform, MomentumUniform64};

/// One element of `src/family/momentum/momentum.wgsl`: returns `(p_new, v)`.
#[inline(always)]
pub(crate) fn momentum_element<
    const WEIGHT_DECAY: bool,
    const VELOCITY: bool,
    const NESTEROV: bool,
    const RESTART: bool,
>(
    hp: &Hyper,
    p: f32,
    mut g: f32,
    v_prev: f32,
) -> (f32, f32) {
    g = hp.signed(g);
    if WEIGHT_DECAY {
        g += hp.weight_decay * p;
    }
    let mut direction = g;
    let mut v = v_prev;
    if VELOCITY {
        v = if RESTART { g } else { hp.velocity_decay * v_prev + hp.grad_scale * g };
        direction = if NESTEROV { g + hp.nesterov_scale * v } else { v };
    }
    (p - hp.lr * direction, v)
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
pub(crate) fn momentum<
    E: Element,
    const WEIGHT_DECAY: bool,
    const VELOCITY: bool,
    const NESTEROV: bool,
    const RESTART: bool,
>(
    hp: &Hyper,
    scale: f32,
    o: Operands<'_, E>,
) {
    let update = momentum_element::<WEIGHT_DECAY, VELOCITY, NESTEROV, RESTART>;
    let [buffer, ..] = o.state;
    if VELOCITY {
        for ((p, g), v) in o.param.iter_mut().zip(o.grad).zip(buffer.iter_mut()) {
            let (new_p, new_v) = update(hp, p.widen(), g.widen() * scale, v.widen());
            (*p, *v) = (E::narrow(new_p), E::narrow(new_v));
        }
    } else {
        // Plain SGD keeps no buffer (PyTorch's momentum = 0).
        for (p, g) in o.param.iter_mut().zip(o.grad) {
            *p = E::narrow(update(hp, p.widen(), g.widen() * scale, 0.0).0);
        }
    }
}

/// [`momentum`] over 8-bit state, one pass per block.
pub(crate) fn momentum_q8<
    const WEIGHT_DECAY: bool,
    const VELOCITY: bool,
    const NESTEROV: bool,
    const RESTART: bool,
>(
    hp: &Hyper,
    scale: f32,
    job: q8::Job<'_>,
) {
    let update = momentum_element::<WEIGHT_DECAY, VELOCITY, NESTEROV, RESTART>;
    q8::each::<_, false>(
        job,
        #[inline(always)]
        |g, p, [v]| {
            let (p, v) = update(hp, p, g * scale, v);
            (p, [v])
        },
        |o| momentum::<f32, WEIGHT_DECAY, VELOCITY, NESTEROV, RESTART>(hp, scale, o),
    );
}

/// [`momentum`] on f16 operands, a register (sixteen or eight elements) at a time.
pub(crate) fn momentum_f16<
    const WEIGHT_DECAY: bool,
    const VELOCITY: bool,
    const NESTEROV: bool,
    const RESTART: bool,
>(
    hp: &Hyper,
    scale: f32,
    o: Operands<'_, f16>,
) {
    let update = momentum_element::<WEIGHT_DECAY, VELOCITY, NESTEROV, RESTART>;
    let [buffer, ..] = o.state;
    if VELOCITY {
        f16_lanes::each(
            [o.param, buffer],
            o.grad,
            #[inline(always)]
            |g, [p, v]| {
                let (p, v) = update(hp, p, g * scale, v);
                [p, v]
            },
        );
    } else {
        f16_lanes::each(
            [o.param],
            o.grad,
            #[inline(always)]
            |g, [p]| [update(hp, p, g * scale, 0.0).0],
        );
    }
}

pub(crate) fn momentum_loop<E: MomentumLeaf>(
    s: &MomentumSwitches,
    u: &MomentumUniform,
) -> Loop<Hyper, E> {
    // The shader's run-time tests of the uniform (`restart`, a zero L2 coefficient) are the
    // same for every element: here they pick the loop.
    fn restart<E: MomentumLeaf, const W: bool, const N: bool>(
        restart: bool,
    ) -> Loop<Hyper, E> {
        if restart {
            E::momentum::<W, true, N, true>()
        } else {
            E::momentum::<W, true, N, false>()
        }
    }
    fn velocity<E: MomentumLeaf, const W: bool>(
        s: &MomentumSwitches,
        u: &MomentumUniform,
    ) -> Loop<Hyper, E> {
        match (s.velocity, s.nesterov) {
            (true, true) => restart::<E, W, true>(u.restart != 0),
            (true, false) => restart::<E, W, false>(u.restart != 0),
            // Without a buffer neither Nesterov nor the restart has any effect.
            (false, _) => E::momentum::<W, false, false, false>(),
        }
    }
    if u.weight_decay != 0.0 {
        velocity::<E, true>(s, u)
    } else {
        velocity::<E, false>(s, u)
    }
}

/// The loop of one storage leaf for each of the family's switches, so that one selection
/// tree ([`momentum_loop`]) serves every storage type.
pub(crate) trait MomentumLeaf: Leaf {
    fn momentum<const W: bool, const V: bool, const N: bool, const R: bool>(
    ) -> Loop<Hyper, Self>;
}

impl<T: Element> MomentumLeaf for T {
    fn momentum<const W: bool, const V: bool, const N: bool, const R: bool>(
    ) -> Loop<Hyper, Self> {
        momentum::<T, W, V, N, R>
    }
}

impl MomentumLeaf for f16 {
    fn momentum<const W: bool, const V: bool, const N: bool, const R: bool>(
    ) -> Loop<Hyper, Self> {
        momentum_f16::<W, V, N, R>
    }
}

impl MomentumLeaf for Q8 {
    fn momentum<const W: bool, const V: bool, const N: bool, const R: bool>(
    ) -> Loop<Hyper, Self> {
        momentum_q8::<W, V, N, R>
    }
}

/// What the family's CPU loops read of a step: the kernel's uniform in f32, with
/// `maximize` applied at run time (the shader compiles it: `MAXIMIZE`).
pub(crate) type Hyper = Signed<MomentumUniform>;

/// The family's CPU update for a step: the loops its switches and uniform select, for every
/// storage type, with the uniform in f32.
pub(crate) fn loops(
    switches: &MomentumSwitches,
    uniform: &MomentumUniform64,
) -> Bound<Hyper> {
    let uniform = uniform.to_f32();
    every_storage!(momentum_loop(switches, &uniform)).with_uniform(Signed::new(uniform, switches.maximize))
}
