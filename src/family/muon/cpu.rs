//! Muon's elementwise end's CPU loops: the update of `muon.wgsl` in f32, operation for operation, so the
//! CPU rounds where the GPU does, for each storage leaf (`crate::cpu::kernels::Leaves`).

use half::f16;

use crate::cpu::f16_lanes;
use crate::cpu::kernels::{Element, Leaves, Loop, Operands};
use crate::step::{MuonSwitches, MuonUniform};

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

pub(crate) fn muon_loop<E: Leaves>(_: &MuonSwitches, _: &MuonUniform) -> Loop<MuonUniform, E> {
    E::muon()
}
