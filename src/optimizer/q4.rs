//! The GPU optimizer's 4-bit state ([`StateStorage::Q4`]): recording its step, as
//! `record.rs` does for 8-bit state.
//!
//! [`StateStorage::Q4`]: crate::StateStorage::Q4

use super::record::{Bound, BOUND_GRADIENT_SETS};
use super::Optimizer;
use crate::step::UNIFORM_SLOT_BYTES;
use crate::{Result, Tensor};

impl Optimizer {
    /// With 4-bit state: the step, one dispatch per variant, group and set of buffers, after
    /// the norm pass when clipping. Nothing is read back.
    pub(super) fn record_q4_step(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        grads: &[Tensor],
    ) -> Result<()> {
        self.check_grads(grads)?;
        let Some(engine) = &mut self.q4 else { return Ok(()) };
        engine.bind(&self.ctx, &self.params, grads)?;
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
                    lamb: Vec::new(),
                };
                self.bound.insert(0, bound);
            }
        }
        let t = self.step + 1;
        let slots = self.uniform_bytes.chunks_exact_mut(UNIFORM_SLOT_BYTES as usize);
        for (group, bytes) in self.groups.iter().zip(slots) {
            crate::q4::kernel_step(&group.algorithm, t).write_uniform(self.math, bytes);
        }
        self.uniforms.record_write(encoder, &self.uniform_bytes)?;
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("wgpu-optim 4-bit step"),
            timestamp_writes: None,
        });
        if let (Some(clip), Some(norm)) = (&self.clip, self.bound.first().and_then(|b| b.norm.as_ref())) {
            clip.record(&mut pass, norm);
        }
        engine.record(&mut pass, &self.uniforms.bind_groups);
        Ok(())
    }

    /// The 4-bit state's engine, for tests that pick its kernel.
    #[cfg(test)]
    pub(crate) fn q4_engine_mut(&mut self) -> Option<&mut crate::gpu::q4::Q4Engine> {
        self.q4.as_mut()
    }
}
