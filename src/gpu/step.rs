//! What one dispatch of a family needs besides its tensors: the compile-time switches
//! (pipeline-overridable constants) and the per-step hyperparameters (one uniform).

use crate::gpu::kernel::Family;
use crate::DType;

/// The most scalars any family's hyperparameter uniform holds.
pub(crate) const MAX_HYPER: usize = 12;
/// The most override constants any family declares.
pub(crate) const MAX_OVERRIDES: usize = 5;
/// Bytes reserved for one hyperparameter uniform (a multiple of every adapter's
/// `min_uniform_buffer_offset_alignment`, which WebGPU caps at 256).
pub(crate) const HYPER_SLOT_BYTES: u64 = 256;

/// One family's switches and hyperparameters for one step, computed on the host in f64.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct KernelStep {
    pub(crate) family: Family,
    /// Values of `family.override_names()`, in that order (bools as 0/1).
    pub(crate) overrides: [u32; MAX_OVERRIDES],
    /// Values of the family's uniform struct fields, in declaration order.
    pub(crate) hyper: [f64; MAX_HYPER],
}

impl KernelStep {
    /// A step of `family` with its override values and uniform fields, in declaration order.
    pub(crate) fn new(family: Family, overrides: &[u32], hyper: &[f64]) -> Self {
        debug_assert_eq!(overrides.len(), family.override_names().len());
        debug_assert_eq!(hyper.len(), family.hyper_len());
        let mut step = KernelStep { family, overrides: [0; MAX_OVERRIDES], hyper: [0.0; MAX_HYPER] };
        step.overrides[..overrides.len()].copy_from_slice(overrides);
        step.hyper[..hyper.len()].copy_from_slice(hyper);
        step
    }

    /// The uniform's bytes in the math type, zero-padded to a whole slot.
    pub(crate) fn hyper_bytes(&self, math: DType) -> [u8; HYPER_SLOT_BYTES as usize] {
        let mut out = [0u8; HYPER_SLOT_BYTES as usize];
        let values = &self.hyper[..self.family.hyper_len()];
        match math {
            DType::F32 | DType::F16 | DType::BF16 => {
                for (chunk, v) in out.chunks_exact_mut(4).zip(values) {
                    chunk.copy_from_slice(&(*v as f32).to_le_bytes());
                }
            }
            DType::F64 => {
                for (chunk, v) in out.chunks_exact_mut(8).zip(values) {
                    chunk.copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        out
    }

    /// The override constants as wgpu takes them.
    pub(crate) fn constants(family: Family, overrides: &[u32; MAX_OVERRIDES]) -> Vec<(&'static str, f64)> {
        family.override_names().iter().zip(overrides).map(|(name, v)| (*name, f64::from(*v))).collect()
    }
}
