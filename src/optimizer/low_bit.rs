//! The GPU optimizer's step with low-bit state ([`StateStorage::Q8`], [`StateStorage::Q4`]):
//! one record path for both formats, whose engines hold the update's dispatches.
//!
//! [`StateStorage::Q8`]: crate::StateStorage::Q8
//! [`StateStorage::Q4`]: crate::StateStorage::Q4

use super::record::{Bound, BOUND_GRADIENT_SETS};
use super::Optimizer;
use crate::step::{KernelStep, UNIFORM_SLOT_BYTES};
use crate::{Algorithm, Result, Tensor};

impl Optimizer {
    /// With 8-bit or 4-bit state: the step, one dispatch per variant, group and set of
    /// buffers, after the norm pass when clipping. Nothing is read back. Without low-bit
    /// state it records nothing. `norm_given`: as in `record_uncommitted`, no norm pass.
    pub(super) fn record_low_bit_step(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        grads: &[Tensor],
        norm_given: bool,
    ) -> Result<()> {
        self.check_grads(grads)?;
        // Each format's kernels take the step in their library's form (bitsandbytes',
        // torchao's).
        let (kernel_step, label): (fn(&Algorithm, u64) -> KernelStep, &str) =
            match (&mut self.q8, &mut self.q4) {
                (Some(engine), _) => {
                    engine.bind(&self.ctx, &self.params, grads)?;
                    (crate::q8::kernel_step, "wgpu-optim 8-bit step")
                }
                (None, Some(engine)) => {
                    engine.bind(&self.ctx, &self.params, grads)?;
                    (crate::q4::kernel_step, "wgpu-optim 4-bit step")
                }
                (None, None) => return Ok(()),
            };
        // `bound` holds only the norm passes: the engine holds the update's dispatches.
        if let Some(clip) = &self.clip {
            if let Some(k) = self.bound.iter().position(|b| b.grads == grads) {
                let hit = self.bound.remove(k);
                self.bound.insert(0, hit);
            } else {
                let norm = clip.bind(&self.ctx, grads, None)?;
                self.bound.truncate(BOUND_GRADIENT_SETS - 1);
                let bound = Bound {
                    grads: grads.to_vec(),
                    batches: Vec::new(),
                    norm: Some(norm),
                    unscale_norm: None,
                };
                self.bound.insert(0, bound);
            }
        }
        let t = self.step + 1;
        let slots = self.uniform_bytes.chunks_exact_mut(UNIFORM_SLOT_BYTES as usize);
        for (group, bytes) in self.groups.iter().zip(slots) {
            kernel_step(&group.algorithm, t).write_uniform(self.math, bytes);
        }
        self.uniforms.record_write(encoder, &self.uniform_bytes)?;
        let mut pass = encoder
            .begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(label), timestamp_writes: None });
        let norm = self.bound.first().and_then(|b| b.norm.as_ref()).filter(|_| !norm_given);
        if let (Some(clip), Some(norm)) = (&self.clip, norm) {
            clip.record(&mut pass, norm);
        }
        if let Some(engine) = &self.q8 {
            engine.record(&mut pass, &self.uniforms.bind_groups);
        }
        if let Some(engine) = &self.q4 {
            engine.record(&mut pass, &self.uniforms.bind_groups);
        }
        Ok(())
    }

    /// The 4-bit state's engine, for tests that pick its kernel.
    #[cfg(test)]
    pub(crate) fn q4_engine_mut(&mut self) -> Option<&mut crate::gpu::q4::Q4Engine> {
        self.q4.as_mut()
    }
}
