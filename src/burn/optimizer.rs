//! Burn's per-tensor optimizer trait on this crate's fused kernels.

use std::sync::{Arc, Mutex, MutexGuard};

use ::burn::module::Module;
use ::burn::optim::{
    LearningRate, ModuleOptimizer, Optimizer as BurnOptimizer, RecordState, StateSink, StateSource,
};
use ::burn::tensor::{Bytes, Device, Tensor as BurnTensor};
use burn_pack::Scalar;

use super::lease::{lease, Access, Leased};
use super::muon::{algorithm_for, needs_shapes, FrontEnd};
use super::record::{self, BURN_ADAM, BURN_ADAM_TIME, LR_MAX, TIME, WEIGHT_SUM};
use super::schedule_free::{lease_params, record_swap};
use super::{SharedDevice, StepError};
use crate::family::schedule_free::scalars::check_scalars as check_schedule_free_scalars;
use crate::ops::{self, Update};
use crate::{
    Algorithm, BurnFailure, Error, Result, Rounding, ScheduleFreeMode, ScheduleFreeScalars, StateKind,
};

/// A drop-in optimizer for Burn: any of this crate's algorithms (Adam, AdamW, AMSGrad, SGD
/// with standard or Nesterov momentum, Adagrad, RMSprop, Lion, AdEMAMix, Schedule-Free AdamW,
/// LAMB, Adafactor, Muon, all in PyTorch's convention) behind Burn's per-tensor
/// [`Optimizer`](::burn::optim::Optimizer) trait. Each parameter's step of an elementwise
/// algorithm is one fused kernel (Burn's own AdamW runs about fifteen elementwise kernels
/// per parameter).
///
/// Muon and Adafactor look at each tensor by its shape (Burn's tensors carry it): their step
/// builds a one-parameter [`Optimizer`](crate::Optimizer) over the tensor, with the state
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
/// use wgpu_optim::burn::{FusedOptimizer, SharedDevice};
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

/// One parameter's state under [`FusedOptimizer`]: the step count and the algorithm's state
/// tensors, under PyTorch's names (the ones the algorithm does not use stay `None`). Burn's
/// records hold them as `{param}.time` and `{param}.exp_avg`, ...
///
/// A record of Burn's own Adam or AdamW loads as this state: its `moment_1`, `moment_2`,
/// `max_moment_2` and `time` are PyTorch's `exp_avg`, `exp_avg_sq`, `max_exp_avg_sq` and
/// `step` (the same updates, the step counted from 1), so the next step continues Burn's
/// trajectory. Any other state in a record ([`Self::foreign`]) is refused at the
/// parameter's next step rather than restarted from zero.
#[derive(Clone, Debug)]
pub struct FusedState<const D: usize> {
    /// Steps taken, counted from 1 as PyTorch counts them.
    pub time: usize,
    /// Adam's first moment.
    pub exp_avg: Option<BurnTensor<D>>,
    /// Adam's second moment.
    pub exp_avg_sq: Option<BurnTensor<D>>,
    /// AMSGrad's running maximum of the second moment.
    pub max_exp_avg_sq: Option<BurnTensor<D>>,
    /// SGD's momentum buffer.
    pub momentum_buffer: Option<BurnTensor<D>>,
    /// Adagrad's sum of squared gradients.
    pub sum: Option<BurnTensor<D>>,
    /// Schedule-Free AdamW's z.
    pub z: Option<BurnTensor<D>>,
    /// RMSprop's running average of the squared gradient.
    pub square_avg: Option<BurnTensor<D>>,
    /// Centered RMSprop's running average of the gradient.
    pub grad_avg: Option<BurnTensor<D>>,
    /// AdEMAMix's slow EMA of the gradient.
    pub exp_avg_slow: Option<BurnTensor<D>>,
    /// Adan's moment of gradient differences.
    pub exp_avg_diff: Option<BurnTensor<D>>,
    /// Adan's negated previous gradient.
    pub neg_pre_grad: Option<BurnTensor<D>>,
    /// Adafactor's factored second moment over rows (the parameter's shape with its last
    /// dimension 1), for parameters of 2 or more dimensions.
    pub row_var: Option<BurnTensor<D>>,
    /// Adafactor's factored second moment over columns (the second-last dimension 1).
    pub col_var: Option<BurnTensor<D>>,
    /// Adafactor's unfactored second moment, for vectors.
    pub variance: Option<BurnTensor<D>>,
    /// Schedule-Free AdamW's running values after the last step (`k` is [`Self::time`]):
    /// the package keeps them per group, and every tensor a Burn optimizer steps sees the
    /// same rate sequence, so each tensor's are its group's. Burn's records hold them as
    /// `{param}.weight_sum` and `{param}.lr_max`.
    pub schedule_free: Option<ScheduleFreeScalars>,
    /// Set when a loaded record held another optimizer's state for this parameter (neither
    /// this crate's nor Burn's Adam or AdamW's): the step on it is refused with this reason.
    pub foreign: Option<String>,
}

/// The state tensors' names in Burn's records: PyTorch's.
/// In the order of [`FusedState::tensors`].
const STATE_NAMES: &[&str] = &[
    "exp_avg",
    "exp_avg_sq",
    "max_exp_avg_sq",
    "momentum_buffer",
    "sum",
    "z",
    "square_avg",
    "grad_avg",
    "exp_avg_slow",
    "exp_avg_diff",
    "neg_pre_grad",
    "row_var",
    "col_var",
    "variance",
];

impl<const D: usize> FusedState<D> {
    /// Every state slot, in the order of [`STATE_NAMES`].
    fn tensors(&self) -> Vec<&Option<BurnTensor<D>>> {
        vec![
            &self.exp_avg,
            &self.exp_avg_sq,
            &self.max_exp_avg_sq,
            &self.momentum_buffer,
            &self.sum,
            &self.z,
            &self.square_avg,
            &self.grad_avg,
            &self.exp_avg_slow,
            &self.exp_avg_diff,
            &self.neg_pre_grad,
            &self.row_var,
            &self.col_var,
            &self.variance,
        ]
    }

    pub(super) fn slot(&mut self, kind: StateKind) -> &mut Option<BurnTensor<D>> {
        match kind {
            StateKind::ExpAvg => &mut self.exp_avg,
            StateKind::ExpAvgSq => &mut self.exp_avg_sq,
            StateKind::MaxExpAvgSq => &mut self.max_exp_avg_sq,
            StateKind::MomentumBuffer => &mut self.momentum_buffer,
            StateKind::Z => &mut self.z,
            StateKind::SquareAvg => &mut self.square_avg,
            StateKind::GradAvg => &mut self.grad_avg,
            StateKind::ExpAvgSlow => &mut self.exp_avg_slow,
            StateKind::ExpAvgDiff => &mut self.exp_avg_diff,
            StateKind::NegPreGrad => &mut self.neg_pre_grad,
            StateKind::RowVar => &mut self.row_var,
            StateKind::ColVar => &mut self.col_var,
            StateKind::Variance => &mut self.variance,
            // No algorithm keeps a Kahan compensation; only the rounding mode does.
            StateKind::Sum | StateKind::KahanCompensation => &mut self.sum,
        }
    }

    fn moved_to(self, device: &Device) -> Self {
        let moved = |t: Option<BurnTensor<D>>| t.map(|t| t.to_device(device));
        FusedState {
            time: self.time,
            exp_avg: moved(self.exp_avg),
            exp_avg_sq: moved(self.exp_avg_sq),
            max_exp_avg_sq: moved(self.max_exp_avg_sq),
            momentum_buffer: moved(self.momentum_buffer),
            sum: moved(self.sum),
            z: moved(self.z),
            square_avg: moved(self.square_avg),
            grad_avg: moved(self.grad_avg),
            exp_avg_slow: moved(self.exp_avg_slow),
            exp_avg_diff: moved(self.exp_avg_diff),
            neg_pre_grad: moved(self.neg_pre_grad),
            row_var: moved(self.row_var),
            col_var: moved(self.col_var),
            variance: moved(self.variance),
            schedule_free: self.schedule_free,
            foreign: self.foreign,
        }
    }

    fn fresh() -> Self {
        FusedState {
            time: 0,
            exp_avg: None,
            exp_avg_sq: None,
            max_exp_avg_sq: None,
            momentum_buffer: None,
            sum: None,
            z: None,
            square_avg: None,
            grad_avg: None,
            exp_avg_slow: None,
            exp_avg_diff: None,
            neg_pre_grad: None,
            row_var: None,
            col_var: None,
            variance: None,
            schedule_free: None,
            foreign: None,
        }
    }

    /// Refused ([`Error::Burn`]) where this state cannot be continued by `algorithm`, which
    /// keeps `kinds` for this parameter: a foreign record's, or one whose tensors are not
    /// those (another algorithm's record would otherwise lose its state, or restart missing
    /// moments from zero).
    fn check(&self, algorithm: &Algorithm, kinds: &[StateKind]) -> Result<()> {
        if let Some(foreign) = &self.foreign {
            return Err(Error::Burn { cause: BurnFailure::Record, detail: foreign.clone() });
        }
        if self.time == 0 {
            return Ok(());
        }
        let held: Vec<&str> =
            STATE_NAMES.iter().zip(self.tensors()).filter(|(_, t)| t.is_some()).map(|(n, _)| *n).collect();
        let expected: Vec<&str> = kinds.iter().map(|k| k.torch_name()).collect();
        if held.iter().all(|n| expected.contains(n)) && expected.iter().all(|n| held.contains(n)) {
            return match (algorithm, self.schedule_free) {
                (Algorithm::ScheduleFreeAdamW(_), None) => Err(Error::Burn {
                    cause: BurnFailure::Record,
                    detail: "the parameter's Schedule-Free state has no weight_sum and lr_max, which \
                             its next step's averaging weight needs"
                        .into(),
                }),
                (Algorithm::ScheduleFreeAdamW(_), Some(scalars)) => check_schedule_free_scalars(
                    algorithm,
                    &ScheduleFreeScalars { k: self.time as u64, ..scalars },
                ),
                _ => Ok(()),
            };
        }
        Err(Error::Burn {
            cause: BurnFailure::Record,
            detail: format!(
                "the parameter's state holds {held:?}, but {} keeps {expected:?}: it is another \
             algorithm's state",
                algorithm.name()
            ),
        })
    }
}

// By hand: Burn's `#[derive(RecordState)]` names paths inside `burn-optim` only.
impl<const D: usize> RecordState for FusedState<D> {
    fn state_flatten(&self, prefix: &str, out: &mut StateSink) {
        out.push_scalar(prefix, TIME, Scalar::from(self.time));
        if let Some(scalars) = self.schedule_free {
            out.push_scalar(prefix, WEIGHT_SUM, Scalar::from(scalars.weight_sum));
            out.push_scalar(prefix, LR_MAX, Scalar::from(scalars.lr_max));
        }
        for (name, tensor) in STATE_NAMES.iter().zip(self.tensors()) {
            if let Some(tensor) = tensor {
                out.push_tensor(prefix, name, tensor.clone().into_data());
            }
        }
    }

    fn state_unflatten(prefix: &str, src: &mut StateSource, device: &Device) -> Option<Self> {
        if src.take_scalar(prefix, TIME).is_none() && src.take_scalar(prefix, BURN_ADAM_TIME).is_some() {
            return Some(burn_adam_state(prefix, src, device));
        }
        let Some(time) = src.take_scalar(prefix, TIME).and_then(|t| usize::try_from(t).ok()) else {
            // Burn's `load_record` would drop a `None` without a word and start afresh.
            let foreign = format!(
                "parameter {prefix}'s state in the loaded record is neither wgpu-optim's \
                 (`time`, `exp_avg`, ...) nor Burn's Adam or AdamW's (`momentum.time`, \
                 `momentum.moment_1`, ...): another optimizer's state cannot be continued; \
                 `FusedOptimizer::load_bytes` names the entries"
            );
            return Some(FusedState { foreign: Some(foreign), ..FusedState::fresh() });
        };
        let weight_sum = src.take_scalar(prefix, WEIGHT_SUM).and_then(|v| f64::try_from(v).ok());
        let lr_max = src.take_scalar(prefix, LR_MAX).and_then(|v| f64::try_from(v).ok());
        let schedule_free = weight_sum.zip(lr_max).map(|(weight_sum, lr_max)| ScheduleFreeScalars {
            k: time as u64,
            weight_sum,
            lr_max,
        });
        let mut take =
            |name: &str| src.take_tensor(prefix, name).map(|data| BurnTensor::from_data(data, device));
        Some(FusedState {
            schedule_free,
            time,
            exp_avg: take("exp_avg"),
            exp_avg_sq: take("exp_avg_sq"),
            max_exp_avg_sq: take("max_exp_avg_sq"),
            momentum_buffer: take("momentum_buffer"),
            sum: take("sum"),
            z: take("z"),
            square_avg: take("square_avg"),
            grad_avg: take("grad_avg"),
            exp_avg_slow: take("exp_avg_slow"),
            exp_avg_diff: take("exp_avg_diff"),
            neg_pre_grad: take("neg_pre_grad"),
            row_var: take("row_var"),
            col_var: take("col_var"),
            variance: take("variance"),
            foreign: None,
        })
    }
}

/// Burn's Adam or AdamW state (`AdaptiveMomentumState`) as PyTorch's, which it is under
/// other names.
fn burn_adam_state<const D: usize>(prefix: &str, src: &mut StateSource, device: &Device) -> FusedState<D> {
    let time = src.take_scalar(prefix, BURN_ADAM_TIME).and_then(|t| usize::try_from(t).ok());
    let mut take = |name: &str| src.take_tensor(prefix, name).map(|data| BurnTensor::from_data(data, device));
    let [m1, m2, max_m2] = BURN_ADAM.map(|(burn, _)| burn);
    FusedState {
        time: time.unwrap_or(0),
        exp_avg: take(m1),
        exp_avg_sq: take(m2),
        max_exp_avg_sq: take(max_m2),
        ..FusedState::fresh()
    }
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
    /// learning rate (with [`MuonLrAdjust::MatchRmsAdamW`](crate::MuonLrAdjust) one rate fits
    /// both). Refused ([`Error::ConflictingOptions`]) for another algorithm than Muon, or a
    /// Muon fallback, and where `algorithm`'s hyperparameters are invalid.
    ///
    /// ```no_run
    /// use wgpu_optim::burn::{FusedOptimizer, SharedDevice};
    /// use wgpu_optim::{Adam, Muon};
    ///
    /// let shared = SharedDevice::headless_blocking()?;
    /// let optim = FusedOptimizer::new(&shared, Muon::default())?.fallback(Adam::adamw())?.init();
    /// # Ok::<(), wgpu_optim::Error>(())
    /// ```
    pub fn fallback(mut self, algorithm: impl Into<Algorithm>) -> Result<Self> {
        let fallback = algorithm.into();
        super::muon::check_fallback(&self.algorithm, Some(&fallback))?;
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
        let mut state = state.unwrap_or_else(FusedState::fresh);
        state.check(&algorithm, super::shaped::state_kinds(&algorithm, &shape))?;
        if needs_shapes(&algorithm) {
            let tensor = super::shaped::step(&self.shared, algorithm, tensor, grad, &mut state)?;
            state.time += 1;
            return Ok((tensor, state));
        }
        let t = state.time as u64 + 1;
        // Schedule-Free's step comes from its running values, the others' from `t`.
        let (step, next) = match algorithm {
            Algorithm::ScheduleFreeAdamW(config) => {
                let scalars =
                    ScheduleFreeScalars { k: state.time as u64, ..state.schedule_free.unwrap_or_default() };
                let (step, next) = config.advance(&scalars);
                (step, Some(next))
            }
            _ => (algorithm.kernel_step(t), None),
        };
        let kinds = algorithm.state_kinds();
        let initial = algorithm.initial_state();
        let mut states = Vec::with_capacity(kinds.len());
        for &kind in kinds {
            let existing = state.slot(kind).take();
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
        let state_tensors: Vec<crate::Tensor> = leased.iter().map(|l| l.tensor.clone()).collect();
        let update = Update::in_place(&param.tensor, &grad.tensor, &state_tensors);
        let ctx = self.shared.context();
        let mut encoder = ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("wgpu-optim Burn step") });
        ops::record_updates(ctx, &mut encoder, &step, kinds, &[update])?;
        // A refused submission comes back as an error, not to Burn's device's handler.
        ctx.catch("submitting a Burn step", || ctx.queue().submit([encoder.finish()]))?;
        for (kind, t) in kinds.iter().zip(returned) {
            *state.slot(*kind) = Some(t);
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
    /// use wgpu_optim::burn::{FusedOptimizer, SharedDevice};
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
        let config = match self.check_swap(optim, to) {
            Ok(config) => config,
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
        let stepped = |id: ::burn::module::ParamId| {
            states.get(&id.val()).is_some_and(|s| s.time > 0 && s.tensors.contains_key("z"))
        };
        let (module, leased) = lease_params(&self.shared, module, &stepped)?;
        let ctx = self.shared.context();
        let mut encoder = ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("wgpu-optim swap") });
        let mut recorded = || -> Result<()> {
            for (id, param) in &leased {
                let state = &states[&id.val()];
                let [z, exp_avg_sq] = ["z", "exp_avg_sq"].map(|name| {
                    let data = state.tensors.get(name).ok_or_else(|| Error::Burn {
                        cause: BurnFailure::Record,
                        detail: format!("parameter {id}'s Schedule-Free state has no {name}"),
                    })?;
                    upload_like(ctx, &param.tensor, data, &format!("parameter {id}'s {name}"))
                });
                record_swap(ctx, &mut encoder, &config, to, &param.tensor, &z?, &exp_avg_sq?)?;
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

    /// The algorithm's Schedule-Free configuration, where a swap to `to` can run under `optim`.
    fn check_swap(&self, optim: &ModuleOptimizer, to: ScheduleFreeMode) -> Result<crate::ScheduleFreeAdamW> {
        let Algorithm::ScheduleFreeAdamW(config) = self.algorithm else {
            return Err(Error::Burn {
                cause: BurnFailure::Config,
                detail: format!(
                    "eval() and train() switch Schedule-Free AdamW's parameters between y and x; this \
                     optimizer runs {}",
                    self.algorithm.name()
                ),
            });
        };
        if to == ScheduleFreeMode::Eval {
            crate::algo::check_eval(&config)?;
        }
        if optim.has_gradient_clipping() {
            return Err(Error::Burn {
                cause: BurnFailure::Config,
                detail: "the ModuleOptimizer clips gradients; Schedule-Free's swaps under it are refused, \
                         as a clipped step's y and z would not be the ones the swap assumes"
                    .into(),
            });
        }
        Ok(config)
    }
}

/// A new tensor of `like`'s length and dtype holding a record tensor's values (converted
/// where the record holds another float dtype).
fn upload_like(
    ctx: &crate::GpuContext,
    like: &crate::Tensor,
    data: &::burn::tensor::TensorData,
    what: &str,
) -> Result<crate::Tensor> {
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
        ctx.write(&tensor, &dtype.decode(data.as_bytes()))?;
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
