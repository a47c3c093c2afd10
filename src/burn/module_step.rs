//! Every parameter of a Burn module in one fused, multi-tensor step.

use ::burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use ::burn::optim::GradientsParams;
use ::burn::tensor::{GradientCheckpointingStrategy, Tensor as BurnTensor};

use super::device::refuse_fusion;
use super::lease::{bindable, lease, Access, Leased};
use super::SharedDevice;
use crate::optimizer::device::check_inv_scale;
use crate::{Algorithm, Error, Optimizer, OptimizerOptions, Result, StateKind, Tensor};

/// A fused step over a whole Burn module: every parameter that has a gradient is updated by
/// one [`Optimizer`], whose multi-tensor dispatches cover all of them (one per kernel
/// variant, not one per parameter), with the [`OptimizerOptions`] of this crate: global
/// gradient clipping ([`OptimizerOptions::grad_clip`]), AMP skipping
/// ([`Self::step_unscaled`], with [`OptimizerOptions::capturable`]), 16-bit or 8-bit state.
///
/// Parameters are updated in their own buffers; one whose storage is shared with another
/// tensor is copied first (see [`crate::burn`]). The state lives in the [`Optimizer`]
/// ([`Self::optimizer`]): save it with the optimizer's checkpoints. The step count is one
/// for all parameters, so the set of parameters with gradients must stay the same from
/// step to step ([`Error::Burn`] otherwise; build a new `ModuleStep` after freezing or
/// unfreezing parameters).
///
/// ```no_run
/// # fn train<M: burn::module::Module>(model: M, grads: burn::optim::GradientsParams) -> wgpu_optim::Result<M> {
/// use wgpu_optim::burn::{ModuleStep, SharedDevice};
/// use wgpu_optim::Adam;
///
/// let shared = SharedDevice::headless_blocking()?;
/// let mut step = ModuleStep::new(&shared, Adam::adamw())?;
/// let model = step.step(1e-3, model, grads)?;
/// # Ok(model) }
/// ```
pub struct ModuleStep {
    shared: SharedDevice,
    algorithm: Algorithm,
    options: OptimizerOptions,
    // Boxed: an `Optimizer` is large, and a `ModuleStep` is moved around by value.
    bound: Option<Box<Bound>>,
}

/// The optimizer built over the parameters' buffers at the first step.
struct Bound {
    ids: Vec<ParamId>,
    params: Vec<Tensor>,
    optimizer: Optimizer,
}

impl ModuleStep {
    /// `algorithm` over a module's parameters on `shared`'s device.
    pub fn new(shared: &SharedDevice, algorithm: impl Into<Algorithm>) -> Result<Self> {
        Self::with_options(shared, algorithm, OptimizerOptions::default())
    }

    /// With [`OptimizerOptions`]. Master weights, model copies and parameter shapes belong
    /// to the module here, so those options are refused ([`Error::ConflictingOptions`]).
    pub fn with_options(
        shared: &SharedDevice,
        algorithm: impl Into<Algorithm>,
        options: OptimizerOptions,
    ) -> Result<Self> {
        refuse_fusion()?;
        let algorithm = algorithm.into();
        algorithm.validate()?;
        if let Some(clip) = &options.grad_clip {
            clip.validate()?;
        }
        for (set, option) in [
            (options.master_weights, "master_weights"),
            (!options.model_copies.is_empty(), "model_copies"),
            (!options.param_shapes.is_empty(), "param_shapes"),
        ] {
            if set {
                return Err(Error::ConflictingOptions {
                    first: "burn::ModuleStep",
                    second: option,
                    reason: "a Burn module owns its parameters' dtypes, copies and shapes",
                });
            }
        }
        Ok(ModuleStep { shared: shared.clone(), algorithm, options, bound: None })
    }

    /// The optimizer holding the state, once the first step has built it: its checkpoints,
    /// step count, last gradient norm, AMP flag.
    pub fn optimizer(&self) -> Option<&Optimizer> {
        self.bound.as_ref().map(|b| &b.optimizer)
    }

    /// One step with learning rate `lr` of every parameter of `module` that has a gradient
    /// in `grads`, recorded and submitted before it returns. Refused, with nothing written,
    /// where a parameter or gradient is not on the shared device or not F32, F16 or BF16,
    /// a gradient's shape is not its parameter's, or the parameters with gradients are not
    /// the ones of the first step.
    pub fn step<M: Module>(&mut self, lr: f64, module: M, grads: GradientsParams) -> Result<M> {
        self.step_inner(lr, module, grads, None)
    }

    /// AMP: the step of [`Self::step`] after unscaling the gradients by the device scalar
    /// `inv_scale` (one f32 element), skipped on the device when any gradient is NaN or
    /// infinite ([`Optimizer::record_unscale`]). Needs [`OptimizerOptions::capturable`].
    pub fn step_unscaled<M: Module>(
        &mut self,
        lr: f64,
        module: M,
        grads: GradientsParams,
        inv_scale: &BurnTensor<1>,
    ) -> Result<M> {
        if !self.options.capturable {
            return Err(Error::NeedsOption {
                what: "ModuleStep::step_unscaled".into(),
                option: "capturable",
            });
        }
        self.step_inner(lr, module, grads, Some(inv_scale.clone()))
    }

    fn step_inner<M: Module>(
        &mut self,
        lr: f64,
        module: M,
        mut grads: GradientsParams,
        inv_scale: Option<BurnTensor<1>>,
    ) -> Result<M> {
        // Everything that can be refused is refused before the module is taken apart.
        self.algorithm.with_lr(lr).validate()?;
        let mut check = Check {
            shared: &self.shared,
            grads: &grads,
            lease_params: self.bound.is_none(),
            ids: Vec::new(),
            leased: Vec::new(),
            error: None,
        };
        module.visit(&mut check);
        if let Some(error) = check.error {
            return Err(error);
        }
        let ids = check.ids;
        if ids.is_empty() {
            return Ok(module);
        }
        if self.bound.is_none() {
            // Built over the parameters where they are now, so that the optimizer's own
            // refusals (dtypes, options) come before the module is consumed; a parameter
            // that is copied below moves, and `bind` follows it.
            let params: Vec<Tensor> = check.leased.iter().map(|l| l.tensor.clone()).collect();
            let optimizer = Optimizer::with_options(
                self.shared.context(),
                self.algorithm,
                &params,
                self.options.clone(),
            )?;
            self.bound = Some(Box::new(Bound { ids: ids.clone(), params, optimizer }));
        }
        drop(check.leased);
        if let Some(bound) = &self.bound {
            if bound.ids != ids {
                return Err(Error::Burn(format!(
                    "the parameters with gradients ({} of them) are not the ones of the first step \
                     ({}): the step count is shared, so build a new ModuleStep for a new set of \
                     parameters",
                    ids.len(),
                    bound.ids.len()
                )));
            }
        }
        let inv_scale = match inv_scale {
            Some(t) => {
                let leased = lease(&self.shared, t, Access::Read, "inv_scale")?.1;
                check_inv_scale(&leased.tensor)?;
                Some(leased)
            }
            None => None,
        };
        let mut take = Take {
            shared: &self.shared,
            grads: &mut grads,
            params: vec![],
            grads_leased: vec![],
            error: None,
        };
        let module = module.map(&mut take);
        if let Some(error) = take.error {
            return Err(error);
        }
        let params: Vec<Tensor> = take.params.iter().map(|l| l.tensor.clone()).collect();
        let grad_tensors: Vec<Tensor> = take.grads_leased.iter().map(|l| l.tensor.clone()).collect();
        let ctx = self.shared.context().clone();
        let mut encoder = ctx.device().create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("wgpu-optim Burn module step"),
        });
        let optimizer = self.bind(&mut encoder, ids, params)?;
        optimizer.set_lr(lr)?;
        if let Some(inv_scale) = &inv_scale {
            optimizer.record_unscale(&mut encoder, &grad_tensors, &inv_scale.tensor)?;
        }
        optimizer.record_step(&mut encoder, &grad_tensors)?;
        ctx.queue().submit([encoder.finish()]);
        Ok(module)
    }

    /// The optimizer over `params`: the one built before, or a new one (carrying the state
    /// over, recorded into `encoder`) where a parameter's buffer moved.
    fn bind(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        ids: Vec<ParamId>,
        params: Vec<Tensor>,
    ) -> Result<&mut Optimizer> {
        if let Some(same) = self.bound.take_if(|b| b.params == params) {
            return Ok(&mut self.bound.insert(same).optimizer);
        }
        let ctx = self.shared.context();
        let mut optimizer = Optimizer::with_options(ctx, self.algorithm, &params, self.options.clone())?;
        if let Some(old) = &self.bound {
            carry_state(&old.optimizer, &mut optimizer, encoder, self.options.q8_states.is_some())?;
        }
        Ok(&mut self.bound.insert(Box::new(Bound { ids, params, optimizer })).optimizer)
    }
}

/// Copies every state tensor of `old` into `new` (the same parameters at new addresses).
fn carry_state(
    old: &Optimizer,
    new: &mut Optimizer,
    encoder: &mut wgpu::CommandEncoder,
    q8: bool,
) -> Result<()> {
    let kinds = old.group_algorithm(0).map_or(&[][..], |a| a.state_kinds());
    for i in 0..old.params().len() {
        for &kind in kinds.iter().chain(&[StateKind::KahanCompensation]) {
            match (old.state(i, kind), new.state(i, kind)) {
                (Some(from), Some(to)) => encoder.copy_buffer_to_buffer(
                    &from.buffer,
                    from.offset,
                    &to.buffer,
                    to.offset,
                    from.byte_len(),
                ),
                // 8-bit state has no `state()` tensor: it moves through the host.
                _ if q8 && kind != StateKind::KahanCompensation => {
                    if let Some(q8) = old.read_q8_state(i, kind)? {
                        new.write_q8_state(i, kind, &q8)?;
                    }
                }
                _ => {}
            }
        }
    }
    new.set_step_count(old.step_count())
}

/// The first pass, borrowing the module: which parameters have gradients, and whether every
/// one of them (and its gradient) can be stepped.
struct Check<'a> {
    shared: &'a SharedDevice,
    grads: &'a GradientsParams,
    /// Whether to lease each parameter for reading (the first step builds its optimizer
    /// from these).
    lease_params: bool,
    ids: Vec<ParamId>,
    leased: Vec<Leased>,
    error: Option<Error>,
}

impl ModuleVisitor for Check<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<BurnTensor<D>>) {
        let Some(grad) = self.grads.get::<D>(param.id) else { return };
        self.ids.push(param.id);
        if self.error.is_some() {
            return;
        }
        let value = param.val();
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
                Err(Error::Burn(format!("parameter {id}: {problem}")))
            });
        if let Err(e) = checked {
            self.error = Some(e);
            return;
        }
        if self.lease_params {
            match lease(self.shared, value, Access::Read, &format!("parameter {}", param.id)) {
                Ok((_, leased)) => self.leased.push(leased),
                Err(e) => self.error = Some(e),
            }
        }
    }
}

/// What Burn's own module optimizer keeps of a parameter across an update.
struct ParamContext {
    autodiff: bool,
    require_grad: bool,
    checkpointing: Option<GradientCheckpointingStrategy>,
    distributed: bool,
}

impl ParamContext {
    fn capture<const D: usize>(tensor: &BurnTensor<D>) -> Self {
        ParamContext {
            autodiff: tensor.is_autodiff(),
            require_grad: tensor.is_require_grad(),
            checkpointing: tensor.gradient_checkpointing_strategy(),
            distributed: tensor.is_distributed(),
        }
    }

    fn restore<const D: usize>(self, inner: BurnTensor<D>, id: ParamId) -> BurnTensor<D> {
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
struct Take<'a> {
    shared: &'a SharedDevice,
    grads: &'a mut GradientsParams,
    params: Vec<Leased>,
    grads_leased: Vec<Leased>,
    error: Option<Error>,
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
            // The step is refused and the module dropped; this placeholder is never seen.
            self.error = Some(e);
            BurnTensor::zeros(shape, &device)
        });
        Param::from_mapped_value(id, tensor, mapper)
    }
}
