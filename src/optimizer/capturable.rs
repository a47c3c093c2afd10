//! Capturable mode and AMP: device learning rates and step counter, the unscale pass, and
//! the readbacks of the device's scalars (step, gradient norm, found-inf flag).

use super::device;
use super::Optimizer;
#[cfg(doc)]
use super::OptimizerBuilder;
use crate::gpu::plan::Arg;
use crate::{DType, Error, Result, StepProblem, Tensor};

impl Optimizer {
    /// Capturable mode: group `g`'s learning rate on the device, an f32 tensor of one
    /// element that a trainer's scheduler may write from its own shaders or the queue.
    pub fn lr_tensor(&self, g: usize) -> Option<Tensor> {
        let device = self.device.as_ref()?;
        (g < self.groups.len()).then(|| device.lr_tensor(g))
    }

    /// Capturable mode: reads the device's step counter (steps taken, AMP skips excluded).
    pub fn read_device_step(&self) -> Result<u64> {
        let device = self.device.as_ref().ok_or_else(not_capturable)?;
        let bytes = self.ctx.read_bytes(&device.step_bytes())?;
        Ok(u64::from(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])))
    }

    /// With [`OptimizerBuilder::grad_clip`]: reads the global gradient norm of the last
    /// submitted step (PyTorch's `clip_grad_norm_` return value, before clipping). Waits for
    /// that one value; the step path itself never reads anything back.
    ///
    /// The same name as [`CpuOptimizer::grad_norm`](crate::cpu::CpuOptimizer::grad_norm)
    /// for the same value; this one returns a `Result` because it reads the device (refused
    /// without clipping, [`Error::NeedsOption`]), where the CPU's has the norm at hand.
    ///
    /// Each call is a round trip: it copies 4 bytes to a staging buffer, submits, and blocks
    /// until the device has finished every submitted step and the copy is mapped. A trainer
    /// that logs the norm of every step should not call it per step (that serializes host
    /// and device, and recording several steps per submit would keep only the last norm):
    /// [`Self::record_grad_norm_copy`] keeps each step's norm on the device, to be read back
    /// in one readback every N steps.
    pub fn grad_norm(&self) -> Result<f64> {
        let clip = self
            .clip
            .as_ref()
            .ok_or(Error::NeedsOption { what: "a gradient norm".into(), option: "grad_clip" })?;
        let bytes = self.ctx.read_bytes(&clip.total_norm())?;
        Ok(f64::from(f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])))
    }

    /// With [`OptimizerBuilder::grad_clip`]: records into `encoder` a copy of the gradient
    /// norm of the step recorded last (the value [`Self::grad_norm`] would read after
    /// it: the f32 norm before clipping, 4 little-endian bytes) into `dst` at byte `offset`.
    /// Recorded after each step, into consecutive slots of a trainer's buffer, it keeps every
    /// step's norm on the device, so N steps (recorded in one encoder or several) are read
    /// back with one readback instead of N. Refused, with nothing recorded, without clipping
    /// ([`Error::NeedsOption`]), for a `dst` without `COPY_DST` ([`Error::MissingUsage`]), or
    /// for an `offset` that is not a multiple of 4 or leaves no 4 bytes in `dst`
    /// ([`Error::BadRange`]).
    pub fn record_grad_norm_copy(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        dst: &wgpu::Buffer,
        offset: u64,
    ) -> Result<()> {
        let clip = self
            .clip
            .as_ref()
            .ok_or(Error::NeedsOption { what: "a gradient norm".into(), option: "grad_clip" })?;
        crate::gpu::transfer::check_writable(&Arg::new("dst", &Tensor::new(dst, offset, 1, DType::F32)))?;
        let norm = clip.total_norm();
        encoder.copy_buffer_to_buffer(&norm.buffer, norm.offset, dst, offset, norm.byte_len());
        Ok(())
    }

    /// Capturable mode: reads the AMP flag of the last unscale (true: that step was skipped).
    pub fn read_found_inf(&self) -> Result<bool> {
        let device = self.device.as_ref().ok_or_else(not_capturable)?;
        let bytes = self.ctx.read_bytes(&device.found_inf_bytes())?;
        Ok(bytes != [0, 0, 0, 0])
    }

    /// [`Self::read_device_step`] as a future, for callers that must not block (a browser's
    /// main thread, where the blocking form returns [`Error::Readback`]).
    pub async fn read_device_step_async(&self) -> Result<u64> {
        let device = self.device.as_ref().ok_or_else(not_capturable)?;
        let bytes = self.ctx.read_bytes_async(&device.step_bytes()).await?;
        Ok(u64::from(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])))
    }

    /// [`Self::grad_norm`] as a future, for callers that must not block.
    pub async fn grad_norm_async(&self) -> Result<f64> {
        let clip = self
            .clip
            .as_ref()
            .ok_or(Error::NeedsOption { what: "a gradient norm".into(), option: "grad_clip" })?;
        let bytes = self.ctx.read_bytes_async(&clip.total_norm()).await?;
        Ok(f64::from(f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])))
    }

    /// [`Self::read_found_inf`] as a future, for callers that must not block.
    pub async fn read_found_inf_async(&self) -> Result<bool> {
        let device = self.device.as_ref().ok_or_else(not_capturable)?;
        let bytes = self.ctx.read_bytes_async(&device.found_inf_bytes()).await?;
        Ok(bytes != [0, 0, 0, 0])
    }

    /// Sets the step count (on the host, and on the device in capturable mode, landing at
    /// the next submit), e.g. to resume a schedule.
    pub fn set_step_count(&mut self, step: u64) -> Result<()> {
        if let Some(device) = &self.device {
            let device_step = u32::try_from(step).map_err(|_| Error::BadStep {
                argument: "step",
                step: step as f64,
                problem: StepProblem::TooLargeForDevice,
            })?;
            device.write_step(&self.ctx, device_step);
        }
        self.step = step;
        for group in &mut self.groups {
            group.dirty = true;
        }
        Ok(())
    }

    /// AMP (capturable mode): records PyTorch's unscale of `grads` by the device scalar
    /// `inv_scale` (an f32 tensor of one element with `COPY_SRC`), setting the device's
    /// `found_inf` flag when any gradient is NaN or infinite. The next [`Self::record_step`]
    /// then leaves parameters, state and the device step counter untouched if the flag is
    /// set, with no host round trip. Call it once per step, before the step.
    ///
    /// With [`OptimizerBuilder::grad_clip`] and f32 gradients the same pass also takes the
    /// gradient norm (of the unscaled gradients), so the gradients are read once for both
    /// and the step only combines the partial norms.
    pub fn record_unscale(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        grads: &[Tensor],
        inv_scale: &Tensor,
    ) -> Result<()> {
        // The unscale rewrites the gradients, so one inside another tensor would corrupt it,
        // and two that share memory would be unscaled twice.
        self.check_grads(grads)?;
        self.check_grads_disjoint(grads)?;
        let ctx = self.ctx.clone();
        if self.device.is_none() {
            return Err(not_capturable());
        }
        if self.clip.is_none() || grads.iter().any(|g| g.dtype != DType::F32) {
            let device = self.device.as_mut().ok_or_else(not_capturable)?;
            return device.record_unscale(&ctx, encoder, grads, inv_scale);
        }
        device::check_inv_scale(inv_scale)?;
        self.bind(grads)?;
        let (Some(device), Some(clip), Some(bound)) = (&mut self.device, &self.clip, self.bound.first_mut())
        else {
            return Err(not_capturable());
        };
        if bound.unscale_norm.is_none() {
            bound.unscale_norm = Some(clip.bind(&ctx, grads, Some(device.buffer()))?);
        }
        device.record_scale(encoder, inv_scale);
        if let Some(taken) = &bound.unscale_norm {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("wgpu-optim unscale and gradient norm"),
                timestamp_writes: None,
            });
            taken.record_partials(&mut pass);
        }
        self.norm_taken_by_unscale = true;
        Ok(())
    }
}

pub(super) fn not_capturable() -> Error {
    Error::NeedsOption {
        what: "device step counters, device learning rates and AMP skipping".into(),
        option: "capturable",
    }
}

#[cfg(test)]
mod tests {
    use crate::{Adam, DType, GpuContext, GradClip, Optimizer, Tensor};

    /// `tests/integration/clip.rs`'s AMP case (capturable, clipping, f32 gradients whose lengths are
    /// whole vec4s): one pass unscales and takes the norm, one updates, and no separate
    /// unscale or norm pipeline is ever compiled.
    #[test]
    fn amp_with_clipping_compiles_one_update_and_one_unscale_norm_pipeline() {
        // A device of its own, so the pipeline count is this optimizer's alone.
        let ctx = GpuContext::headless_blocking().unwrap_or_else(|e| panic!("{e}"));
        let lengths = [700u64, 36, 4];
        let params: Vec<Tensor> =
            lengths.iter().map(|&n| ctx.upload("param", &vec![0.5; n as usize], DType::F32)).collect();
        let options = Optimizer::builder().capturable(true).grad_clip(GradClip::l2(1.0));
        let adam = Adam { lr: 1e-2, ..Adam::default() };
        let mut optimizer = options.build(&ctx, adam, &params).unwrap_or_else(|e| panic!("{e}"));
        let inv_scale = ctx.upload("inv_scale", &[1.0 / 1024.0], DType::F32);
        for step in 0..3 {
            let grads: Vec<Tensor> = lengths
                .iter()
                .map(|&n| ctx.upload("grad", &vec![64.0 * (step + 1) as f64; n as usize], DType::F32))
                .collect();
            ctx.submit("amp step", |e| {
                optimizer.record_unscale(e, &grads, &inv_scale)?;
                optimizer.record_step(e, &grads)
            })
            .unwrap_or_else(|e| panic!("{e}"));
            assert!(!optimizer.read_found_inf().unwrap_or_else(|e| panic!("{e}")));
        }
        assert_eq!(optimizer.step_count(), 3);
        assert_eq!(ctx.compiled_pipelines(), 2);
    }
}
