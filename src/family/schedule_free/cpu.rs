//! Schedule-Free AdamW's CPU loops: the update of `schedule_free.wgsl` in f32, operation for operation, so the
//! CPU rounds where the GPU does, for each storage leaf ([`ScheduleFreeLeaf`]), and the
//! family's CPU update for a step ([`loops`]).

use half::f16;

use crate::cpu::kernels::{every_storage, Bound, Element, Leaf, Loop, Operands, Q8};
use crate::cpu::{f16_lanes, q8};
use super::contract::{ScheduleFreeSwitches, ScheduleFreeUniform, ScheduleFreeUniform64};

/// One element of `src/family/schedule_free/schedule_free.wgsl`: returns `(y_new, z_new, v)`. The swap pass
/// (`SWAP`) returns `lerp(y, z, swap_weight)` and the state as it was.
#[inline(always)]
pub(crate) fn schedule_free_element<const SWAP: bool, const WEIGHT_DECAY: bool, const FIRST: bool>(
    hp: &ScheduleFreeUniform,
    y: f32,
    g: f32,
    mut z: f32,
    v_prev: f32,
) -> (f32, f32, f32) {
    if SWAP {
        return (y + hp.swap_weight * (z - y), z, v_prev);
    }
    if FIRST {
        z = y;
    }
    let v = v_prev * hp.beta2 + hp.one_minus_beta2 * g * g;
    let denom = (v / hp.bias_correction2).sqrt() + hp.eps;
    let mut u = g / denom;
    if WEIGHT_DECAY {
        u += hp.weight_decay * y;
    }
    let y_mid = y + hp.ckp1 * (z - y);
    let y_new = y_mid + hp.y_rate * u;
    let z_new = z - hp.lr * u;
    (y_new, z_new, v)
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
pub(crate) fn schedule_free<E: Element, const SWAP: bool, const WEIGHT_DECAY: bool, const FIRST: bool>(
    hp: &ScheduleFreeUniform,
    scale: f32,
    o: Operands<'_, E>,
) {
    let update = schedule_free_element::<SWAP, WEIGHT_DECAY, FIRST>;
    let [z, v, ..] = o.state;
    // The swap pass reads no gradient (the caller may lend any slice of the right length).
    for (((y, g), z), v) in o.param.iter_mut().zip(o.grad).zip(z.iter_mut()).zip(v.iter_mut()) {
        let (new_y, new_z, new_v) = update(hp, y.widen(), g.widen() * scale, z.widen(), v.widen());
        *y = E::narrow(new_y);
        if !SWAP {
            (*z, *v) = (E::narrow(new_z), E::narrow(new_v));
        }
    }
}

/// [`schedule_free`] on f16 operands, a register (sixteen or eight elements) at a time.
pub(crate) fn schedule_free_f16<const SWAP: bool, const WEIGHT_DECAY: bool, const FIRST: bool>(
    hp: &ScheduleFreeUniform,
    scale: f32,
    o: Operands<'_, f16>,
) {
    let update = schedule_free_element::<SWAP, WEIGHT_DECAY, FIRST>;
    let [z, v, ..] = o.state;
    f16_lanes::each(
        [o.param, z, v],
        o.grad,
        #[inline(always)]
        |g, [y, z, v]| {
            let (y, z, v) = update(hp, y, g * scale, z, v);
            [y, z, v]
        },
    );
}

pub(crate) fn schedule_free_loop<E: ScheduleFreeLeaf>(
    s: &ScheduleFreeSwitches,
    u: &ScheduleFreeUniform,
) -> Loop<ScheduleFreeUniform, E> {
    match (s.swap, u.weight_decay != 0.0, u.first != 0.0) {
        (true, _, _) => E::schedule_free::<true, false, false>(),
        (false, false, false) => E::schedule_free::<false, false, false>(),
        (false, false, true) => E::schedule_free::<false, false, true>(),
        (false, true, false) => E::schedule_free::<false, true, false>(),
        (false, true, true) => E::schedule_free::<false, true, true>(),
    }
}

/// The loop of one storage leaf for each of the family's switches, so that one selection
/// tree ([`schedule_free_loop`]) serves every storage type.
pub(crate) trait ScheduleFreeLeaf: Leaf {
    fn schedule_free<const S: bool, const W: bool, const F: bool>() -> Loop<ScheduleFreeUniform, Self>;
}

impl<T: Element> ScheduleFreeLeaf for T {
    fn schedule_free<const S: bool, const W: bool, const F: bool>() -> Loop<ScheduleFreeUniform, Self> {
        schedule_free::<T, S, W, F>
    }
}

impl ScheduleFreeLeaf for f16 {
    fn schedule_free<const S: bool, const W: bool, const F: bool>() -> Loop<ScheduleFreeUniform, Self> {
        schedule_free_f16::<S, W, F>
    }
}

impl ScheduleFreeLeaf for Q8 {
    fn schedule_free<const S: bool, const W: bool, const F: bool>() -> Loop<ScheduleFreeUniform, Self> {
        |hp, scale, job| {
            q8::blocked(job, q8::NonFinite::Update, |o| schedule_free::<f32, S, W, F>(hp, scale, o))
        }
    }
}

/// What the family's CPU loops read of a step: the kernel's uniform, in f32.
pub(crate) type Hyper = super::contract::Uniform;

/// The family's CPU update for a step: the loops its switches and uniform select, for every
/// storage type, with the uniform in f32.
pub(crate) fn loops(
    switches: &ScheduleFreeSwitches,
    uniform: &ScheduleFreeUniform64,
) -> Bound<Hyper> {
    let uniform = uniform.to_f32();
    every_storage!(schedule_free_loop(switches, &uniform)).with_uniform(uniform)
}
