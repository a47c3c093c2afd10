//! Schedule-Free AdamW's `eval()`/`train()` behind Burn's front ends: the parameters of a
//! module that have state, leased for writing, and the swap pass over one of them.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::Tensor as BurnTensor;

use super::lease::{bindable, lease, Access, Leased};
use super::module_step::{ParamContext, StepError};
use super::SharedDevice;
use wgpu_optim::ops::{self, StepScalars, Update};
use wgpu_optim::{Error, GpuContext, Result, StateKind, Tensor};

/// Parameters leased for writing, in module order.
pub(super) type LeasedParams = Vec<(ParamId, Leased)>;

/// A module's parameters that `wanted` picks, in module order, each leased for writing
/// (copied where its storage is shared, so another holder keeps its values). Refused, with
/// the module handed back and nothing leased, where one of them cannot be bound.
pub(super) fn lease_params<M: Module>(
    shared: &SharedDevice,
    module: M,
    wanted: &dyn Fn(ParamId) -> bool,
) -> std::result::Result<(M, LeasedParams), StepError<M>> {
    let mut check = Bindable { shared, wanted, error: None };
    module.visit(&mut check);
    if let Some(error) = check.error {
        return Err(StepError { module, error });
    }
    let mut take = LeaseParams { shared, wanted, leased: Vec::new(), error: None };
    let module = module.map(&mut take);
    match take.error {
        Some(error) => Err(StepError { module, error }),
        None => Ok((module, take.leased)),
    }
}

/// Records the swap of one parameter, `step` (the algorithm's `mode_swap`: Schedule-Free's
/// `param = lerp(param, z, 1 - 1/beta1)` going to `Eval`, y to the average x,
/// `lerp(param, z, 1 - beta1)` going to `Train`), over its `states` of `kinds`, which a step
/// binds (those the swap does not change included).
pub(super) fn record_swap(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    step: &StepScalars,
    kinds: &[StateKind],
    param: &Tensor,
    states: &[Tensor],
) -> Result<()> {
    // The swap reads no gradient; the parameter stands in for it, as in the optimizer's pass.
    let update = Update::in_place(param, param, states);
    ops::record_updates(ctx, encoder, step, kinds, &[update])
}

/// The first pass, borrowing the module: can every wanted parameter be bound?
struct Bindable<'a> {
    shared: &'a SharedDevice,
    wanted: &'a dyn Fn(ParamId) -> bool,
    error: Option<Error>,
}

impl ModuleVisitor for Bindable<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<BurnTensor<D>>) {
        if self.error.is_none() && (self.wanted)(param.id) {
            let id = param.id;
            if let Err(e) = bindable(self.shared, &param.val(), &format!("parameter {id}")) {
                self.error = Some(e);
            }
        }
    }
}

/// The second pass, owning the module: each wanted parameter leased for writing.
struct LeaseParams<'a> {
    shared: &'a SharedDevice,
    wanted: &'a dyn Fn(ParamId) -> bool,
    leased: Vec<(ParamId, Leased)>,
    error: Option<Error>,
}

impl ModuleMapper for LeaseParams<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<BurnTensor<D>>) -> Param<BurnTensor<D>> {
        let (id, tensor, mapper) = param.consume();
        if self.error.is_some() || !(self.wanted)(id) {
            return Param::from_mapped_value(id, tensor, mapper);
        }
        let context = ParamContext::capture(&tensor);
        let (shape, device) = (tensor.shape(), tensor.device());
        let tensor = match lease(self.shared, tensor, Access::Write, &format!("parameter {id}")) {
            Ok((inner, leased)) => {
                self.leased.push((id, leased));
                context.restore(inner, id)
            }
            Err(e) => {
                // `Bindable` checked this tensor already, so leasing it does not fail; were
                // it to, the tensor is consumed, and zeros are all there is to give.
                self.error = Some(e);
                BurnTensor::zeros(shape, &device)
            }
        };
        Param::from_mapped_value(id, tensor, mapper)
    }
}
