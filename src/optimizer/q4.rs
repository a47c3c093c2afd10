//! The GPU optimizer's 4-bit state ([`OptimizerBuilder::q4_states`]): recording its step and
//! reading or replacing its states, as `record.rs` and `accessors.rs` do for 8-bit state.
//!
//! [`OptimizerBuilder::q4_states`]: crate::OptimizerBuilder::q4_states

use super::record::{Bound, BOUND_GRADIENT_SETS};
use super::Optimizer;
use crate::q4::Q4State;
use crate::step::UNIFORM_SLOT_BYTES;
use crate::{Error, Result, StateKind, Tensor};

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

    /// With [`OptimizerBuilder::q4_states`](crate::OptimizerBuilder::q4_states): parameter
    /// `index`'s state of `kind` as stored, packed 4-bit codes and scales (or f32 values for
    /// a tensor that keeps f32 state), read back after every submitted step; `None` where
    /// the parameter keeps no such state. Refused without 4-bit state ([`Error::NeedsOption`]).
    pub fn q4_state(&self, index: usize, kind: StateKind) -> Result<Option<Q4State>> {
        let engine = self.q4.as_ref().ok_or_else(|| needs_q4("q4_state"))?;
        engine.read(&self.ctx, index, kind)
    }

    /// [`Self::q4_state`] as a future, for callers that must not block.
    pub async fn q4_state_async(&self, index: usize, kind: StateKind) -> Result<Option<Q4State>> {
        let engine = self.q4.as_ref().ok_or_else(|| needs_q4("q4_state"))?;
        engine.read_async(&self.ctx, index, kind).await
    }

    /// With [`OptimizerBuilder::q4_states`](crate::OptimizerBuilder::q4_states): replaces
    /// parameter `index`'s state of `kind` (queued, so it lands before the next submitted
    /// step). Refused, with nothing written, without 4-bit state ([`Error::NeedsOption`]),
    /// for a parameter or kind the optimizer does not have, or when `state` is not stored as
    /// this tensor's is, has another length, or a scale that is NaN, infinite or negative.
    pub fn set_q4_state(&self, index: usize, kind: StateKind, state: &Q4State) -> Result<()> {
        let engine = self.q4.as_ref().ok_or_else(|| needs_q4("set_q4_state"))?;
        engine.write(&self.ctx, index, kind, state)
    }

    /// The 4-bit state's engine, for tests that pick its kernel.
    #[cfg(test)]
    pub(crate) fn q4_engine_mut(&mut self) -> Option<&mut crate::gpu::q4::Q4Engine> {
        self.q4.as_mut()
    }
}

/// The error of a 4-bit-state method called without `q4_states`.
fn needs_q4(what: &str) -> Error {
    Error::NeedsOption { what: format!("`{what}`"), option: "q4_states" }
}
