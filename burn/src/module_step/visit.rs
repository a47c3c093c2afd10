//! The two passes over a Burn module: the check, borrowing it, and the lease of each
//! parameter with a gradient, owning it.

use burn::module::{ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{GradientCheckpointingStrategy, Tensor as BurnTensor};

use crate::lease::{bindable, lease, Access, Leased};
use crate::SharedDevice;
use wgpu_optim::{BurnFailure, Error, Result};

/// The first pass, borrowing the module: which parameters have gradients, their shapes,
/// and whether every one of them (and its gradient) can be stepped.
pub(super) struct Check<'a> {
    pub(super) shared: &'a SharedDevice,
    pub(super) grads: &'a GradientsParams,
    pub(super) ids: Vec<ParamId>,
    pub(super) shapes: Vec<Vec<usize>>,
    pub(super) error: Option<Error>,
}

impl ModuleVisitor for Check<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<BurnTensor<D>>) {
        let Some(grad) = self.grads.get::<D>(param.id) else { return };
        self.ids.push(param.id);
        let value = param.val();
        self.shapes.push(value.shape().to_vec());
        if self.error.is_some() {
            return;
        }
        let id = param.id;
        let checked = bindable(self.shared, &value, &format!("parameter {id}"))
            .and_then(|_| bindable(self.shared, &grad, &format!("the gradient of parameter {id}")))
            .and_then(|_| {
                let problem = if grad.shape() != value.shape() {
                    format!(
                        "its gradient's shape is {:?}, not the parameter's {:?}",
                        grad.shape(),
                        value.shape()
                    )
                } else if grad.dtype() != value.dtype() {
                    format!("its gradient is {:?}, the parameter {:?}", grad.dtype(), value.dtype())
                } else {
                    return Ok(());
                };
                Err(Error::Burn { cause: BurnFailure::Tensor, detail: format!("parameter {id}: {problem}") })
            });
        if let Err(e) = checked {
            self.error = Some(e);
        }
    }
}

/// What Burn's own module optimizer keeps of a parameter across an update.
pub(crate) struct ParamContext {
    autodiff: bool,
    require_grad: bool,
    checkpointing: Option<GradientCheckpointingStrategy>,
    distributed: bool,
}

impl ParamContext {
    pub(crate) fn capture<const D: usize>(tensor: &BurnTensor<D>) -> Self {
        ParamContext {
            autodiff: tensor.is_autodiff(),
            require_grad: tensor.is_require_grad(),
            checkpointing: tensor.gradient_checkpointing_strategy(),
            distributed: tensor.is_distributed(),
        }
    }

    pub(crate) fn restore<const D: usize>(self, inner: BurnTensor<D>, id: ParamId) -> BurnTensor<D> {
        if !self.autodiff {
            return inner;
        }
        let mut tensor = BurnTensor::from_inner(inner);
        if let Some(strategy) = self.checkpointing {
            tensor = tensor.with_gradient_checkpointing_strategy(strategy);
        }
        if self.require_grad {
            tensor = tensor.require_grad();
        }
        if self.distributed {
            tensor = tensor.set_distributed(id);
        }
        tensor
    }
}

/// The second pass, owning the module: each parameter with a gradient leased for writing
/// (copied where its storage is shared) and its gradient for reading.
pub(super) struct Take<'a> {
    pub(super) shared: &'a SharedDevice,
    pub(super) grads: &'a mut GradientsParams,
    pub(super) params: Vec<Leased>,
    pub(super) grads_leased: Vec<Leased>,
    pub(super) error: Option<Error>,
}

impl Take<'_> {
    fn lease_pair<const D: usize>(
        &mut self,
        id: ParamId,
        tensor: BurnTensor<D>,
        grad: BurnTensor<D>,
    ) -> Result<BurnTensor<D>> {
        let context = ParamContext::capture(&tensor);
        let (inner, param) = lease(self.shared, tensor, Access::Write, &format!("parameter {id}"))?;
        let (_, grad) = lease(self.shared, grad, Access::Read, &format!("the gradient of parameter {id}"))?;
        self.params.push(param);
        self.grads_leased.push(grad);
        Ok(context.restore(inner, id))
    }
}

impl ModuleMapper for Take<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<BurnTensor<D>>) -> Param<BurnTensor<D>> {
        let (id, tensor, mapper) = param.consume();
        let Some(grad) = self.grads.remove::<D>(id) else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
        if self.error.is_some() {
            return Param::from_mapped_value(id, tensor, mapper);
        }
        let (shape, device) = (tensor.shape(), tensor.device());
        let tensor = self.lease_pair(id, tensor, grad).unwrap_or_else(|e| {
            // `Check` bound this tensor and its gradient already, so leasing them does not
            // fail; were it to, the tensor is consumed, and zeros are all there is to give.
            self.error = Some(e);
            BurnTensor::zeros(shape, &device)
        });
        Param::from_mapped_value(id, tensor, mapper)
    }
}
