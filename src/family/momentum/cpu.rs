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
        // Both tests are the same for every element (the first step restarts the buffer at
        // `g`); each picks between two values the element has anyway.
        let decayed = hp.velocity_decay * v_prev + hp.grad_scale * g;
        v = if hp.restart { g } else { decayed };
        let nesterov = g + hp.nesterov_scale * v;
        direction = if hp.nesterov { nesterov } else { v };
    }
    (p - hp.lr * direction, v)
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
pub(crate) fn momentum<
    E: Element,
    const WEIGHT_DECAY: bool,
    const VELOCITY: bool,
>(
    hp: &Hyper,
    scale: f32,
    o: Operands<'_, E>,
) {
    let update = momentum_element::<WEIGHT_DECAY, VELOCITY>;
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
>(
    hp: &Hyper,
    scale: f32,
    job: q8::Job<'_>,
) {
    let update = momentum_element::<WEIGHT_DECAY, VELOCITY>;
    q8::each::<_, false>(
        job,
        #[inline(always)]
        |g, p, [v]| {
            let (p, v) = update(hp, p, g * scale, v);
            (p, [v])
        },
        |o| momentum::<f32, WEIGHT_DECAY, VELOCITY>(hp, scale, o),
    );
}

/// [`momentum`] on f16 operands, a register (sixteen or eight elements) at a time.
pub(crate) fn momentum_f16<
    const WEIGHT_DECAY: bool,
    const VELOCITY: bool,
>(
    hp: &Hyper,
    scale: f32,
    o: Operands<'_, f16>,
) {
    let update = momentum_element::<WEIGHT_DECAY, VELOCITY>;
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
    // Without a buffer neither Nesterov nor the restart has any effect.
    fn velocity<E: MomentumLeaf, const W: bool>(s: &MomentumSwitches) -> Loop<Hyper, E> {
        if s.velocity {
            E::momentum::<W, true>()
        } else {
            E::momentum::<W, false>()
        }
    }
    // The shader's run-time test of a zero L2 coefficient is the same for every element:
    // here it picks the loop.
    if u.weight_decay != 0.0 {
        velocity::<E, true>(s)
    } else {
        velocity::<E, false>(s)
    }
}

/// The loop of one storage leaf for each of the family's switches, so that one selection
/// tree ([`momentum_loop`]) serves every storage type.
pub(crate) trait MomentumLeaf: Leaf {
    fn momentum<const W: bool, const V: bool>(
    ) -> Loop<Hyper, Self>;
}

impl<T: Element> MomentumLeaf for T {
    fn momentum<const W: bool, const V: bool>(
    ) -> Loop<Hyper, Self> {
        momentum::<T, W, V>
    }
}

impl MomentumLeaf for f16 {
    fn momentum<const W: bool, const V: bool>(
    ) -> Loop<Hyper, Self> {
        momentum_f16::<W, V>
    }
}

impl MomentumLeaf for Q8 {
    fn momentum<const W: bool, const V: bool>(
    ) -> Loop<Hyper, Self> {
        momentum_q8::<W, V>
    }
}

/// What the family's CPU loops read of a step: the kernel's uniform in f32, with
/// `maximize` applied at run time (the shader compiles it: `MAXIMIZE`), and the two tests
/// the shader makes of every element alike: the buffer's restart and Nesterov's direction.
pub(crate) struct Hyper {
    uniform: Signed<MomentumUniform>,
    /// The first step: the buffer starts at the gradient (`MomentumUniform::restart`).
    restart: bool,
    /// Nesterov's direction, `g + nesterov_scale v`, rather than `v`.
    nesterov: bool,
}

impl std::ops::Deref for Hyper {
    type Target = Signed<MomentumUniform>;
    fn deref(&self) -> &Self::Target {
        &self.uniform
    }
}

/// The family's CPU update for a step: the loops its switches and uniform select, for every
/// storage type, with the uniform in f32.
pub(crate) fn loops(
    switches: &MomentumSwitches,
    uniform: &MomentumUniform64,
) -> Bound<Hyper> {
    let uniform = uniform.to_f32();
    let hyper = Hyper {
        restart: uniform.restart != 0,
        nesterov: switches.nesterov,
        uniform: Signed::new(uniform, switches.maximize),
    };
    every_storage!(momentum_loop(switches, &uniform)).with_uniform(hyper)
}
