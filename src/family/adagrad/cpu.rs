//! Adagrad's CPU loops: the update of `adagrad.wgsl` in f32, operation for operation, so the
//! CPU rounds where the GPU does, for each storage leaf ([`AdagradLeaf`]), and the
//! family's CPU update for a step ([`loops`]).

use half::f16;

use crate::cpu::kernels::{every_storage, Bound, Element, Leaf, Loop, Operands, Signed, Q8};
use crate::cpu::{f16_lanes, q8};
use super::contract::{AdagradSwitches, AdagradUniform, AdagradUniform64};

/// One element of `src/family/adagrad/adagrad.wgsl`: returns `(p_new, h)`.
#[inline(always)]
pub(crate) fn adagrad_element<const WEIGHT_DECAY: bool>(
    hp: &Hyper,
    p: f32,
    mut g: f32,
    h_prev: f32,
) -> (f32, f32) {
    g = hp.signed(g);
    if WEIGHT_DECAY {
        g += hp.weight_decay * p;
    }
    let h = h_prev + g * g;
    let p_new = p - hp.lr * (g / (h.sqrt() + hp.eps));
    (p_new, h)
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
pub(crate) fn adagrad<E: Element, const WEIGHT_DECAY: bool>(
    hp: &Hyper,
    scale: f32,
    o: Operands<'_, E>,
) {
    let update = adagrad_element::<WEIGHT_DECAY>;
    let [sum, ..] = o.state;
    for ((p, g), h) in o.param.iter_mut().zip(o.grad).zip(sum.iter_mut()) {
        let (new_p, new_h) = update(hp, p.widen(), g.widen() * scale, h.widen());
        (*p, *h) = (E::narrow(new_p), E::narrow(new_h));
    }
}

/// [`adagrad`] on f16 operands, a register (sixteen or eight elements) at a time.
pub(crate) fn adagrad_f16<const WEIGHT_DECAY: bool>(
    hp: &Hyper,
    scale: f32,
    o: Operands<'_, f16>,
) {
    let update = adagrad_element::<WEIGHT_DECAY>;
    let [sum, ..] = o.state;
    f16_lanes::each(
        [o.param, sum],
        o.grad,
        #[inline(always)]
        |g, [p, h]| {
            let (p, h) = update(hp, p, g * scale, h);
            [p, h]
        },
    );
}

/// Adagrad's switches are all run-time tests here (`maximize` in [`Hyper`]); the zero L2
/// coefficient the shader tests picks the loop.
pub(crate) fn adagrad_loop<E: AdagradLeaf>(_: &AdagradSwitches, u: &AdagradUniform) -> Loop<Hyper, E> {
    if u.weight_decay != 0.0 {
        E::adagrad::<true>()
    } else {
        E::adagrad::<false>()
    }
}

/// The loop of one storage leaf for each of the family's switches, so that one selection
/// tree ([`adagrad_loop`]) serves every storage type.
pub(crate) trait AdagradLeaf: Leaf {
    fn adagrad<const W: bool>() -> Loop<Hyper, Self>;
}

impl<T: Element> AdagradLeaf for T {
    fn adagrad<const W: bool>() -> Loop<Hyper, Self> {
        adagrad::<T, W>
    }
}

impl AdagradLeaf for f16 {
    fn adagrad<const W: bool>() -> Loop<Hyper, Self> {
        adagrad_f16::<W>
    }
}

impl AdagradLeaf for Q8 {
    fn adagrad<const W: bool>() -> Loop<Hyper, Self> {
        |hp, scale, job| q8::blocked(job, q8::NonFinite::Update, |o| adagrad::<f32, W>(hp, scale, o))
    }
}

/// What the family's CPU loops read of a step: the kernel's uniform in f32, with
/// `maximize` applied at run time (the shader compiles it: `MAXIMIZE`).
pub(crate) type Hyper = Signed<AdagradUniform>;

/// The family's CPU update for a step: the loops its switches and uniform select, for every
/// storage type, with the uniform in f32.
pub(crate) fn loops(
    switches: &AdagradSwitches,
    uniform: &AdagradUniform64,
) -> Bound<Hyper> {
    let uniform = uniform.to_f32();
    every_storage!(adagrad_loop(switches, &uniform)).with_uniform(Signed::new(uniform, switches.maximize))
}
