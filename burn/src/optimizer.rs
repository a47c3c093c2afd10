//! Burn's per-tensor optimizer trait on this crate's fused kernels.

use std::sync::{Arc, Mutex, MutexGuard};

use burn::module::Module;
use burn::optim::{LearningRate, ModuleOptimizer, Optimizer as BurnOptimizer};
use burn::tensor::{Bytes, Device, Tensor as BurnTensor};

use super::fallback::{algorithm_for, FrontEnd};
use super::fused_state::FusedState;
use super::lease::{lease, Access, Leased};
use super::record;
use super::schedule_free::{lease_params, record_swap};
use super::{SharedDevice, StepError};
use wgpu_optim::ops::{self, StepScalars, Update};
use wgpu_optim::{Algorithm, BurnFailure, Error, Result, Rounding, ScheduleFreeMode, ScheduleFreeScalars};

/// A drop-in optimizer for Burn: any of this crate's algorithms (Adam, AdamW, AMSGrad, SGD
/// with standard or Nesterov momentum, Adagrad, RMSprop, Lion, AdEMAMix, Schedule-Free AdamW,
/// LAMB, Adafactor, Muon, all in PyTorch's convention) behind Burn's per-tensor
/// [`Optimizer`](burn::optim::Optimizer) trait. Each parameter's step of an elementwise
/// algorithm is one fused kernel (Burn's own AdamW runs about fifteen elementwise kernels
/// per parameter).
///
/// Muon and Adafactor look at each tensor by its shape (Burn's tensors carry it): their step
/// builds a one-parameter [`Optimizer`](wgpu_optim::Optimizer) over the tensor, with the state
/// copied in and out of the Burn tensors that keep it, so it allocates per step;
/// [`ModuleStep`](super::ModuleStep) keeps its optimizers. Muon takes 2-D parameters only:
/// [`Self::fallback`] names the algorithm of the others (AdamW typically, as torch users
/// put biases and norms in an AdamW group); without one, a step on another shape is
/// refused ([`Error::BadShape`]).
///
/// The learning rate is Burn's (the algorithm's `lr` is ignored). State lives in Burn
/// tensors ([`FusedState`]), so Burn's optimizer records save and load it.
///
/// Burn's trait returns no error, so a step on a tensor this crate cannot update (not on
/// [`SharedDevice::device`], or not F32, F16 or BF16) panics with the reason;
/// [`Self::try_step`] returns it instead. [`ModuleStep`](super::ModuleStep) updates a whole
/// module in one dispatch per kernel variant.
///
/// ```no_run
/// use burn::optim::GradientsParams;
/// use wgpu_optim_burn::{FusedOptimizer, SharedDevice};
/// use wgpu_optim::Adam;
///
/// let shared = SharedDevice::headless_blocking()?;
/// let mut optim = FusedOptimizer::new(&shared, Adam::adamw())?.init();
/// // In the training loop, exactly as with Burn's `AdamWConfig::new().init()`:
/// // model = optim.step(lr, model, GradientsParams::from_grads(loss.backward(), &model));
/// # Ok::<(), wgpu_optim::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct FusedOptimizer {
    shared: SharedDevice,
    algorithm: Algorithm,
    /// Under Muon, the algorithm of the parameters that are not 2-D.
    fallback: Option<Algorithm>,
    /// Schedule-Free's mode, shared by this optimizer's clones (the one inside Burn's
    /// `ModuleOptimizer` and the one a trainer keeps to call [`Self::eval`]).
    mode: Arc<Mutex<ScheduleFreeMode>>,
}

impl FusedOptimizer {
    /// `algorithm` on `shared`'s device. Refused where the algorithm's hyperparameters are
    /// invalid.
    pub fn new(shared: &SharedDevice, algorithm: impl Into<Algorithm>) -> Result<Self> {
        let algorithm = algorithm.into();
        algorithm.validate()?;
        Ok(FusedOptimizer { shared: shared.clone(), algorithm, fallback: None, mode: Arc::default() })
    }

    /// Under Muon, `algorithm` steps the parameters that are not 2-D (biases, norms), as a
    /// torch trainer puts them in an AdamW group beside the Muon group; both take Burn's
    /// learning rate (with [`MuonLrAdjust::MatchRmsAdamW`](wgpu_optim::MuonLrAdjust) one rate fits
    /// both). Refused ([`Error::ConflictingOptions`]) for another algorithm than Muon, or a
    /// Muon fallback, and where `algorithm`'s hyperparameters are invalid.
    ///
    /// ```no_run
    /// use wgpu_optim_burn::{FusedOptimizer, SharedDevice};
    /// use wgpu_optim::{Adam, Muon};
    ///
    /// let shared = SharedDevice::headless_blocking()?;
    /// let optim = FusedOptimizer::new(&shared, Muon::default())?.fallback(Adam::adamw())?.init();
    /// # Ok::<(), wgpu_optim::Error>(())
    /// ```
    pub fn fallback(mut self, algorithm: impl Into<Algorithm>) -> Result<Self> {
        let fallback = algorithm.into();
        super::fallback::check_fallback(&self.algorithm, Some(&fallback))?;
        self.fallback = Some(fallback);
        Ok(self)
    }

    /// The algorithm of the parameters Muon does not take, where [`Self::fallback`] set one.
    pub fn fallback_algorithm(&self) -> Option<&Algorithm> {
        self.fallback.as_ref()
    }

    /// Burn's module-level optimizer around this one, as Burn's `AdamWConfig::init` gives.
    pub fn init(self) -> ModuleOptimizer {
        ModuleOptimizer::from(self)
    }

    /// The algorithm and its hyperparameters.
    pub fn algorithm(&self) -> &Algorithm {
        &self.algorithm
    }

    /// Burn's `ModuleOptimizer` around this one with a record's state loaded, checked
    /// first: Burn's own `from_bytes` cannot refuse, and drops a state it cannot read
    /// without a word. Takes this optimizer's records (and [`ModuleStep`]'s, the same
    /// format) and Burn's Adam and AdamW ones, whose moments and step count are PyTorch's
    /// under other names. Refused ([`Error::Burn`], naming the entry) where the bytes are
    /// not an optimizer record or a parameter's state is another optimizer's or another
    /// algorithm's.
    ///
    /// [`ModuleStep`]: super::ModuleStep
    pub fn load_bytes(self, bytes: Bytes) -> Result<ModuleOptimizer> {
        let states = record::read(bytes.clone())?;
        for (id, state) in &states {
            let shape = vec![2; state.rank];
            let fallback = self.fallback.as_ref();
            // Which algorithm the parameter's rank gives it; a rank Muon refuses without a
            // fallback is refused at the parameter's step, as a fresh one would be.
            let algorithm = algorithm_for(&self.algorithm, fallback, &shape, 0, FrontEnd::DropIn)
                .unwrap_or(self.algorithm);
            let expected = record::param_names(&algorithm, state.rank, Rounding::NearestEven);
            record::check_names(*id, state.tensors.keys().map(String::as_str), &expected, &algorithm)?;
            record::check_schedule_free(*id, state, &algorithm)?;
            if state.schedule_free.and_then(|sf| sf.train_mode) == Some(false) {
                return Err(Error::Burn {
                    cause: BurnFailure::Record,
                    detail: format!(
                        "parameter {id}'s Schedule-Free state was saved in eval mode (the module's \
                         parameters held x): load it into a ModuleStep, which restores the mode, or \
                         save it after train()"
                    ),
                });
            }
        }
        self.init().from_bytes(bytes).map_err(|e| Error::Burn {
            cause: BurnFailure::Record,
            detail: format!("Burn could not load the record: {e}"),
        })
    }

    /// One step of one parameter, returning what Burn's trait cannot: the reason a tensor
    /// was refused. Nothing is written when it is.
    pub fn try_step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: BurnTensor<D>,
        grad: BurnTensor<D>,
        state: Option<FusedState<D>>,
    ) -> Result<(BurnTensor<D>, FusedState<D>)> {
        let shape = tensor.shape().to_vec();
        let fallback = self.fallback.as_ref();
        let algorithm = algorithm_for(&self.algorithm, fallback, &shape, 0, FrontEnd::DropIn)?.with_lr(lr);
        algorithm.validate()?;
        if self.mode() == ScheduleFreeMode::Eval {
            return Err(Error::EvalMode { call: "FusedOptimizer::step" });
        }
        let mut state = state.unwrap_or_default();
        state.check(&algorithm, algorithm.param_state_kinds(&shape))?;
        if algorithm.needs_shapes() {
            let tensor = super::shaped::step(&self.shared, algorithm, tensor, grad, &mut state)?;
            state.time += 1;
            return Ok((tensor, state));
        }
        let t = state.time as u64 + 1;
        // Schedule-Free's step comes from its running values, the others' from `t`.
        let values = ScheduleFreeScalars { k: state.time as u64, ..state.schedule_free.unwrap_or_default() };
        let (step, next) = match StepScalars::after(&algorithm, &values) {
            Some((step, next)) => (step, Some(next)),
            None => (StepScalars::at(&algorithm, t)?, None),
        };
        let kinds = algorithm.state_kinds();
        let initial = algorithm.initial_state();
        let mut states = Vec::with_capacity(kinds.len());
        for &kind in kinds {
            let existing = state.take_state(kind);
            states.push(existing.unwrap_or_else(|| tensor.full_like(initial)));
        }
        let (tensor, param) = lease(&self.shared, tensor, Access::Write, "the parameter")?;
        let (_, grad) = lease(&self.shared, grad, Access::Read, "the gradient")?;
        let mut leased: Vec<Leased> = Vec::with_capacity(states.len());
        let mut returned = Vec::with_capacity(states.len());
        for (kind, t) in kinds.iter().zip(states) {
            let (t, l) = lease(&self.shared, t, Access::Write, kind.torch_name())?;
            returned.push(t);
            leased.push(l);
        }
        let state_tensors: Vec<wgpu_optim::Tensor> = leased.iter().map(|l| l.tensor.clone()).collect();
        let update = Update::in_place(&param.tensor, &grad.tensor, &state_tensors);
        let ctx = self.shared.context();
        let mut encoder = ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("wgpu-optim Burn step") });
        ops::record_updates(ctx, &mut encoder, &step, kinds, &[update])?;
        // A refused submission comes back as an error, not to Burn's device's handler.
        ctx.catch("submitting a Burn step", || ctx.queue().submit([encoder.finish()]))?;
        for (kind, t) in kinds.iter().zip(returned) {
            state.set_state(*kind, t);
        }
        state.time += 1;
        if next.is_some() {
            state.schedule_free = next;
        }
        Ok((tensor, state))
    }
}

/// Schedule-Free AdamW's modes. Burn's per-tensor trait hands a step one parameter's state
/// at a time and gives no other access to it, so the swaps read the state through Burn's
/// record (a copy through the host); [`ModuleStep`](super::ModuleStep) swaps on the device
/// with nothing read back.
impl FusedOptimizer {
    /// Which point the parameters hold: y ([`ScheduleFreeMode::Train`], where every
    /// optimizer starts) or the average x after [`Self::eval`]. Shared by this optimizer's
    /// clones, the one inside Burn's `ModuleOptimizer` included.
    pub fn mode(&self) -> ScheduleFreeMode {
        *self.lock_mode()
    }

    /// Schedule-Free's `eval()`: every parameter of `module` that `optim` holds a stepped
    /// state for becomes the average `x = lerp(y, z, 1 - 1/beta1)`, in one submission, and
    /// steps are refused ([`Error::EvalMode`], a panic under Burn's trait) until
    /// [`Self::train`]. `optim` is the `ModuleOptimizer` made from this optimizer or a clone
    /// of it (keep a clone to call this):
    ///
    /// ```no_run
    /// # fn run<M: burn::module::Module>(model: M) -> wgpu_optim::Result<M> {
    /// use wgpu_optim_burn::{FusedOptimizer, SharedDevice};
    /// use wgpu_optim::ScheduleFreeAdamW;
    ///
    /// let shared = SharedDevice::headless_blocking()?;
    /// let fused = FusedOptimizer::new(&shared, ScheduleFreeAdamW::default())?;
    /// let mut optim = fused.clone().init();
    /// // ... training steps: model = optim.step(lr, model, grads);
    /// let model = fused.eval(&optim, model)?; // evaluate x
    /// let model = fused.train(&optim, model)?; // back to y, to train on
    /// # Ok(model) }
    /// ```
    ///
    /// A no-op in eval mode already, as the package's. Refused, with the module handed back
    /// unchanged ([`StepError`]), for another algorithm, for `beta1 = 0` (x cannot be
    /// recovered), where `optim` clips gradients (Burn's per-group clipping is not this
    /// optimizer's to run), or where the record or a parameter cannot be read or bound.
    pub fn eval<M: Module>(
        &self,
        optim: &ModuleOptimizer,
        module: M,
    ) -> std::result::Result<M, StepError<M>> {
        self.swap(optim, module, ScheduleFreeMode::Eval)
    }

    /// Schedule-Free's `train()`: back from x to `y = lerp(x, z, 1 - beta1)` and train mode.
    /// A no-op in train mode; otherwise as [`Self::eval`].
    pub fn train<M: Module>(
        &self,
        optim: &ModuleOptimizer,
        module: M,
    ) -> std::result::Result<M, StepError<M>> {
        self.swap(optim, module, ScheduleFreeMode::Train)
    }

    fn lock_mode(&self) -> MutexGuard<'_, ScheduleFreeMode> {
        // The guarded value is a plain mode, whole whatever a panicking holder did.
        self.mode.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn swap<M: Module>(
        &self,
        optim: &ModuleOptimizer,
        module: M,
        to: ScheduleFreeMode,
    ) -> std::result::Result<M, StepError<M>> {
        let mut mode = self.lock_mode();
        let step = match self.check_swap(optim, to) {
            Ok(step) => step,
            Err(error) => return Err(StepError { module, error }),
        };
        if *mode == to {
            return Ok(module);
        }
        let states = match optim.into_bytes() {
            Ok(bytes) => record::read(bytes),
            Err(e) => Err(Error::Burn {
                cause: BurnFailure::Record,
                detail: format!("Burn could not write the optimizer's record: {e}"),
            }),
        };
        let states = match states {
            Ok(states) => states,
            Err(error) => return Err(StepError { module, error }),
        };
        // The states the swap binds, as a step does.
        let kinds = self.algorithm.state_kinds();
        let stepped = |id: burn::module::ParamId| {
            let held = |s: &record::ParamRecord| kinds.iter().any(|k| s.tensors.contains_key(k.torch_name()));
            states.get(&id.val()).is_some_and(|s| s.time > 0 && held(s))
        };
        let (module, leased) = lease_params(&self.shared, module, &stepped)?;
        let ctx = self.shared.context();
        let mut encoder = ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("wgpu-optim swap") });
        let mut recorded = || -> Result<()> {
            for (id, param) in &leased {
                let state = &states[&id.val()];
                let tensors = (kinds.iter().map(|kind| kind.torch_name()))
                    .map(|name| {
                        let data = state.tensors.get(name).ok_or_else(|| Error::Burn {
                            cause: BurnFailure::Record,
                            detail: format!("parameter {id}'s Schedule-Free state has no {name}"),
                        })?;
                        upload_like(ctx, &param.tensor, data, &format!("parameter {id}'s {name}"))
                    })
                    .collect::<Result<Vec<_>>>()?;
                record_swap(ctx, &mut encoder, &step, kinds, &param.tensor, &tensors)?;
            }
            Ok(())
        };
        if let Err(error) = recorded() {
            return Err(StepError { module, error });
        }
        // A refused submission comes back as an error, not to Burn's device's handler, and
        // leaves the mode as it was.
        if let Err(error) =
            ctx.catch("submitting a Schedule-Free swap", || ctx.queue().submit([encoder.finish()]))
        {
            return Err(StepError { module, error });
        }
        *mode = to;
        Ok(module)
    }

    /// The algorithm's swap step to `to`, where it can run under `optim`.
    fn check_swap(&self, optim: &ModuleOptimizer, to: ScheduleFreeMode) -> Result<StepScalars> {
        let Some(step) = StepScalars::mode_swap(&self.algorithm, to) else {
            return Err(Error::Burn {
                cause: BurnFailure::Config,
                detail: format!(
                    "eval() and train() switch Schedule-Free AdamW's parameters between y and x; this \
                     optimizer runs {}",
                    self.algorithm.name()
                ),
            });
        };
        let step = step?;
        if optim.has_gradient_clipping() {
            return Err(Error::Burn {
                cause: BurnFailure::Config,
                detail: "the ModuleOptimizer clips gradients; Schedule-Free's swaps under it are refused, \
                         as a clipped step's y and z would not be the ones the swap assumes"
                    .into(),
            });
        }
        Ok(step)
    }
}

/// A new tensor of `like`'s length and dtype holding a record tensor's values (converted
/// where the record holds another float dtype).
fn upload_like(
    ctx: &wgpu_optim::GpuContext,
    like: &wgpu_optim::Tensor,
    data: &burn::tensor::TensorData,
    what: &str,
) -> Result<wgpu_optim::Tensor> {
    if data.num_elements() as u64 != like.len {
        return Err(Error::LengthMismatch {
            argument: what.to_string(),
            got: data.num_elements() as u64,
            expected: like.len,
            reference: "its parameter".into(),
        });
    }
    let tensor = ctx.zeros(what, like.len, like.dtype);
    let dtype = record::dtype_of(data)?;
    if dtype == like.dtype {
        ctx.write_bytes(&tensor, data.as_bytes())?;
    } else {
        ctx.write(&tensor, &data.iter::<f64>().collect::<Vec<f64>>())?;
    }
    Ok(tensor)
}

impl BurnOptimizer for FusedOptimizer {
    type State<const D: usize> = FusedState<D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: BurnTensor<D>,
        grad: BurnTensor<D>,
        state: Option<Self::State<D>>,
    ) -> (BurnTensor<D>, Option<Self::State<D>>) {
        match self.try_step(lr, tensor, grad, state) {
            Ok((tensor, state)) => (tensor, Some(state)),
            // Burn's trait has no error channel; `try_step` is the checked form.
            Err(e) => panic!("wgpu-optim could not step a Burn parameter: {e}"),
        }
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &Device) -> Self::State<D> {
        state.moved_to(device)
    }
}
