//! Adafactor on the GPU optimizer: the options it refuses, its engine (`gpu::adafactor`)
//! built over the Adafactor groups' parameters, and the calls `record_step` makes.

use super::{Group, Optimizer, OptimizerOptions, ParamGroup};
use crate::gpu::adafactor::AdafactorEngine;
use crate::gpu::plan::{check_like, Arg};
use crate::{Algorithm, DType, Error, GpuContext, Result, Tensor};

/// Refuses, before anything is created, what Adafactor groups cannot run: the options its
/// passes do not implement, missing shapes, f64 parameters.
pub(super) fn check_options(groups: &[ParamGroup], options: &OptimizerOptions) -> Result<()> {
    let adafactor = groups.iter().any(|g| matches!(g.algorithm, Algorithm::Adafactor(_)));
    crate::algo::check_adafactor_options(adafactor, options)?;
    if !adafactor {
        return Ok(());
    }
    crate::algo::check_adafactor_shapes(&options.param_shapes)?;
    let params = groups.iter().flat_map(|g| g.params.iter().map(move |p| (g, p)));
    for (i, (group, p)) in params.enumerate() {
        if matches!(group.algorithm, Algorithm::Adafactor(_)) && p.dtype == DType::F64 {
            return Err(Error::DTypeMismatch {
                argument: format!("params[{i}]"),
                got: DType::F64,
                expected: "F32, F16 or BF16 for Adafactor (its passes compute in f32)".into(),
            });
        }
    }
    Ok(())
}

/// The engine over the Adafactor groups' parameters; `None` without such a group.
pub(super) fn engine(
    ctx: &GpuContext,
    groups: &[Group],
    params: &[Tensor],
    shapes: &[Vec<usize>],
) -> Result<Option<AdafactorEngine>> {
    let mut members = Vec::new();
    for (g, group) in groups.iter().enumerate() {
        if !matches!(group.algorithm, Algorithm::Adafactor(_)) || group.len == 0 {
            continue;
        }
        // torch's `eps1 = None` is the dtype of the group's first parameter.
        let first_dtype = params[group.first].dtype;
        let range = group.first..group.first + group.len;
        for (i, shape) in range.clone().zip(&shapes[range]) {
            members.push((i, g, first_dtype, shape.clone()));
        }
    }
    AdafactorEngine::new(ctx, &members, params)
}

impl Optimizer {
    /// Refuses `group`'s gradients as the elementwise families' plans do (`gpu::plan`): a
    /// range its buffer cannot bind, a length other than its parameter's (the passes would
    /// read past the gradient), f64, or memory shared with its parameter other than exactly
    /// it (the passes would read elements already updated). `grads` has one per parameter.
    /// For the groups whose passes do not bind a gradient beside its parameter: Adafactor's,
    /// and Muon's (its momentum pass binds the gradient beside Muon's scratch).
    pub(super) fn check_grads_against_params(&self, group: &Group, grads: &[Tensor]) -> Result<()> {
        let members = self.params.iter().zip(grads).enumerate().skip(group.first).take(group.len);
        for (i, (param, grad)) in members {
            let (param, grad) =
                (Arg::new(format!("params[{i}]"), param), Arg::new(format!("grads[{i}]"), grad));
            check_like(&grad, &param)?;
            if grad.tensor.overlaps(&param.tensor) && grad.tensor != param.tensor {
                return Err(Error::PartialOverlap { output: param.name, other: grad.name });
            }
        }
        Ok(())
    }

    /// Binds the Adafactor passes to `grads` (checked already by `bind`).
    pub(super) fn bind_adafactor(&mut self, grads: &[Tensor]) -> Result<()> {
        match &mut self.adafactor {
            Some(engine) => engine.bind(&self.ctx, &self.params, grads, self.uniforms.buffer()),
            None => Ok(()),
        }
    }

    /// Records the Adafactor passes of the step into `pass`, after the other groups'.
    pub(super) fn record_adafactor(&self, pass: &mut wgpu::ComputePass<'_>) {
        if let Some(engine) = &self.adafactor {
            engine.record(pass, self.ctx.device().limits().max_compute_workgroups_per_dimension);
        }
    }
}

#[cfg(feature = "checkpoint")]
impl Optimizer {
    /// Checkpoints: parameter `i`'s Adafactor states' kinds (F32), `None` for a parameter of
    /// another algorithm.
    pub(super) fn adafactor_layout_state(&self, i: usize) -> Option<Vec<(crate::StateKind, DType)>> {
        let engine = self.adafactor.as_ref()?;
        let shape = self.shapes.get(i)?;
        engine.state_at(i, 0)?;
        Some(crate::adafactor_state_kinds(shape).iter().map(|kind| (*kind, DType::F32)).collect())
    }

    /// Checkpoints: the tensor of an Adafactor parameter's state slot.
    pub(super) fn adafactor_slot(&self, slot: crate::checkpoint::layout::Slot) -> Option<&Tensor> {
        let crate::checkpoint::layout::Slot::State { param, k } = slot else { return None };
        self.adafactor.as_ref()?.state_at(param, k)
    }
}
