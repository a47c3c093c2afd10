//! What the sharded optimizer (`crate::shard`) needs of an optimizer over one rank's shard:
//! the gradient norm of its own tensors alone, and a step clipped by a norm taken over
//! every rank's.

use super::record::Bound;
use super::{Optimizer, BOUND_GRADIENT_SETS};
use crate::step::clip::ClipHeader;
use crate::{NormType, Result, Tensor};

impl Optimizer {
    /// With clipping: the norm of `grads` over this optimizer's tensors alone (a shard's
    /// part of the global norm) and which norm it is, computed by the clipping passes now
    /// and read back. `None` without clipping. The step that follows is
    /// [`Self::step_with_norm`], given the norm combined over every rank.
    pub(crate) fn local_grad_norm(&mut self, grads: &[Tensor]) -> Result<Option<(f32, NormType)>> {
        if self.clip.is_none() {
            return Ok(None);
        }
        if self.q8.is_none() && self.q4.is_none() {
            self.bind(grads)?;
        } else {
            // The low-bit engines hold their own dispatches: `bound` holds only norm passes.
            self.check_grads(grads)?;
            match self.bound.iter().position(|b| b.grads == grads) {
                Some(k) => {
                    let hit = self.bound.remove(k);
                    self.bound.insert(0, hit);
                }
                None => {
                    self.bound.truncate(BOUND_GRADIENT_SETS - 1);
                    let bound =
                        Bound { grads: grads.to_vec(), batches: Vec::new(), norm: None, unscale_norm: None };
                    self.bound.insert(0, bound);
                }
            }
        }
        let Some(clip) = &self.clip else { return Ok(None) };
        let bound = &mut self.bound[0];
        if bound.norm.is_none() {
            bound.norm = Some(clip.bind(&self.ctx, grads, None)?);
        }
        if let Some(norm) = &bound.norm {
            self.ctx.submit("wgpu-optim shard norm", |encoder| {
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("wgpu-optim shard norm"),
                    timestamp_writes: None,
                });
                clip.record(&mut pass, norm);
                Ok(())
            })?;
        }
        let norm = self.ctx.read_f32(&clip.total_norm())?;
        Ok(Some((norm.first().copied().unwrap_or(0.0), clip.clip().clip.norm_type)))
    }

    /// One step, as [`Self::step`], whose clipping (when the optimizer clips) uses
    /// `total_norm`, the norm of every rank's gradients, instead of a norm pass over its
    /// own: every rank multiplies its gradients by the same coefficient.
    pub(crate) fn step_with_norm(&mut self, grads: &[Tensor], total_norm: Option<f32>) -> Result<()> {
        self.check_train_mode("step")?;
        let given = match (&self.clip, total_norm) {
            (Some(clip), Some(norm)) => {
                let fused = clip.clip();
                let header = ClipHeader {
                    total_norm: norm,
                    coefficient: fused.coefficient(norm),
                    max_norm: fused.clip.max_norm as f32,
                    reserved: 0,
                };
                // Lands before the step's commands, which the next submit carries.
                self.ctx.queue().write_buffer(clip.buffer(), 0, bytemuck::bytes_of(&header));
                true
            }
            _ => false,
        };
        let ctx = self.ctx.clone();
        ctx.submit("wgpu-optim step", |encoder| self.record_uncommitted(encoder, grads, given))?;
        self.commit_step();
        Ok(())
    }
}
