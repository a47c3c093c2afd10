//! What the sharded optimizer (`crate::shard`) needs of an optimizer over one rank's shard:
//! a step clipped by a norm taken over every rank's gradients, and LAMB's step in two
//! halves around the sums combined across ranks.

use super::Optimizer;
use crate::family::lamb::gpu_passes::LambPasses;
use crate::step::clip::ClipHeader;
use crate::{Result, Tensor};

/// [`Optimizer::step_with_sums`]'s `combine`: given parameters' indices and their sums,
/// leaves the sums over every rank's pieces of their tensors in their place.
pub(crate) type CombineSums<'a> = dyn FnMut(&[usize], &mut [[f64; 2]]) -> Result<()> + 'a;

impl Optimizer {
    /// One step, as [`Self::step`], whose clipping (when the optimizer clips) uses
    /// `total_norm`, the norm of every rank's gradients (`ShardPlan::global_norm`), instead
    /// of a norm pass over its own: every rank multiplies its gradients by the same
    /// coefficient.
    pub(crate) fn step_with_norm(&mut self, grads: &[Tensor], total_norm: Option<f32>) -> Result<()> {
        self.check_train_mode("step")?;
        let given = self.give_norm(total_norm);
        let ctx = self.ctx.clone();
        ctx.submit("wgpu-optim step", |encoder| self.record_uncommitted(encoder, grads, given))?;
        self.commit_step();
        Ok(())
    }

    /// [`Self::step_with_norm`] in two halves around `combine` where a LAMB group takes
    /// sums over each tensor: the first half (every update but LAMB's, and LAMB's moments
    /// pass) is submitted, each LAMB parameter's sums of `p^2` and `s^2` are read back and
    /// handed to `combine` with the parameters' indices, which replaces them by the sums over
    /// every rank's pieces of their tensors, and the second half (LAMB's combine and apply
    /// passes) runs on those. Returns whether `combine` was called (no LAMB group: a plain
    /// step). A `combine` that fails leaves the first half done.
    pub(crate) fn step_with_sums(
        &mut self,
        grads: &[Tensor],
        total_norm: Option<f32>,
        combine: &mut CombineSums<'_>,
    ) -> Result<bool> {
        if self.passes_of::<LambPasses>().is_none() {
            self.step_with_norm(grads, total_norm)?;
            return Ok(false);
        }
        self.check_train_mode("step")?;
        let given = self.give_norm(total_norm);
        let ctx = self.ctx.clone();
        self.set_lamb_split(true);
        let first_half =
            ctx.submit("wgpu-optim step", |encoder| self.record_uncommitted(encoder, grads, given));
        self.set_lamb_split(false);
        first_half?;
        let lamb = self.passes_of::<LambPasses>();
        let sums = lamb.map(|l| l.sums(&ctx)).transpose()?.unwrap_or_default();
        let (indices, mut values): (Vec<usize>, Vec<[f64; 2]>) = sums.into_iter().unzip();
        combine(&indices, &mut values)?;
        let totals: Vec<(usize, [f64; 2])> = indices.into_iter().zip(values).collect();
        if let Some(lamb) = self.passes_of::<LambPasses>() {
            lamb.write_totals(&ctx, &totals);
            ctx.submit("wgpu-optim LAMB apply", |encoder| {
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("wgpu-optim LAMB apply"),
                    timestamp_writes: None,
                });
                lamb.record_finish(&mut pass);
                Ok(())
            })?;
        }
        self.commit_step();
        Ok(true)
    }

    fn set_lamb_split(&mut self, split: bool) {
        if let Some(lamb) = self.passes_of_mut::<LambPasses>() {
            lamb.split = split;
        }
    }

    /// Writes `total_norm` and its coefficient into the clip buffer where the optimizer
    /// clips; whether it did (the step then records no norm pass).
    fn give_norm(&self, total_norm: Option<f32>) -> bool {
        match (&self.clip, total_norm) {
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
        }
    }
}
