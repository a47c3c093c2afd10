//! Muon's elementwise end's CPU loops: the update of `muon.wgsl` in f32, operation for operation, so the
//! CPU rounds where the GPU does, for each storage leaf ([`MuonLeaf`]), and the
//! family's CPU update for a step ([`loops`]).

use half::f16;

use crate::cpu::kernels::{every_storage, Bound, Element, Leaf, Loop, Operands, Q8};
use crate::cpu::{f16_lanes, q8};
use super::contract::{MuonSwitches, MuonUniform, MuonUniform64};

/// One element of `src/family/muon/muon.wgsl`: the new parameter from `o`, the orthogonalized
/// update (already scaled by the shape's ratio) that Muon's pass put in the gradient slot.
#[inline(always)]
pub(crate) fn muon_element(hp: &MuonUniform, p: f32, o: f32) -> f32 {
    p * hp.decay - hp.lr * o
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
pub(crate) fn muon<E: Element>(hp: &MuonUniform, scale: f32, o: Operands<'_, E>) {
    for (p, g) in o.param.iter_mut().zip(o.grad) {
        *p = E::narrow(muon_element(hp, p.widen(), g.widen() * scale));
    }
}

/// [`muon`] on f16 operands, a register (sixteen or eight elements) at a time.
pub(crate) fn muon_f16(hp: &MuonUniform, scale: f32, o: Operands<'_, f16>) {
    f16_lanes::each(
        [o.param],
        o.grad,
        #[inline(always)]
        |g, [p]| [muon_element(hp, p, g * scale)],
    );
}

pub(crate) fn muon_loop<E: MuonLeaf>(_: &MuonSwitches, _: &MuonUniform) -> Loop<MuonUniform, E> {
    E::muon()
}

/// The loop of one storage leaf for each of the family's switches, so that one selection
/// tree ([`muon_loop`]) serves every storage type.
pub(crate) trait MuonLeaf: Leaf {
    fn muon() -> Loop<MuonUniform, Self>;
}

impl<T: Element> MuonLeaf for T {
    fn muon() -> Loop<MuonUniform, Self> {
        muon::<T>
    }
}

impl MuonLeaf for f16 {
    fn muon() -> Loop<MuonUniform, Self> {
        muon_f16
    }
}

impl MuonLeaf for Q8 {
    fn muon() -> Loop<MuonUniform, Self> {
        |hp, scale, job| q8::blocked(job, q8::NonFinite::Update, |o| muon::<f32>(hp, scale, o))
    }
}

/// What the family's CPU loops read of a step: the kernel's uniform, in f32.
pub(crate) type Hyper = super::contract::Uniform;

/// The family's CPU update for a step: the loops its switches and uniform select, for every
/// storage type, with the uniform in f32.
pub(crate) fn loops(switches: &MuonSwitches, uniform: &MuonUniform64) -> Bound<Hyper> {
    let uniform = uniform.to_f32();
    every_storage!(muon_loop(switches, &uniform)).with_uniform(uniform)
}
