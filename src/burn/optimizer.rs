//! Burn's per-tensor optimizer trait on this crate's fused kernels.

use ::burn::optim::{
    LearningRate, ModuleOptimizer, Optimizer as BurnOptimizer, RecordState, StateSink, StateSource,
};
use ::burn::tensor::{Bytes, Device, Tensor as BurnTensor};
use burn_pack::Scalar;

use super::lease::{lease, Access, Leased};
use super::record::{self, BURN_ADAM, BURN_ADAM_TIME, TIME};
use super::SharedDevice;
use crate::ops::{self, Update};
use crate::{Algorithm, BurnFailure, Error, Result, Rounding, StateKind};

/// A drop-in optimizer for Burn: any of this crate's algorithms (Adam, AdamW, AMSGrad, SGD
/// with standard or Nesterov momentum, Adagrad, all in PyTorch's convention) behind Burn's
/// per-tensor [`Optimizer`](::burn::optim::Optimizer) trait. Each parameter's step is one
/// fused kernel (Burn's own AdamW runs about fifteen elementwise kernels per parameter).
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
    /// Schedule-Free's z (no algorithm Burn's front ends run keeps it yet).
    pub z: Option<BurnTensor<D>>,
    /// RMSprop's running average of the squared gradient.
    pub square_avg: Option<BurnTensor<D>>,
    /// Centered RMSprop's running average of the gradient.
    pub grad_avg: Option<BurnTensor<D>>,
    /// AdEMAMix's slow EMA of the gradient.
    pub exp_avg_slow: Option<BurnTensor<D>>,
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
        ]
    }

    fn slot(&mut self, kind: StateKind) -> &mut Option<BurnTensor<D>> {
        match kind {
            StateKind::ExpAvg => &mut self.exp_avg,
            StateKind::ExpAvgSq => &mut self.exp_avg_sq,
            StateKind::MaxExpAvgSq => &mut self.max_exp_avg_sq,
            StateKind::MomentumBuffer => &mut self.momentum_buffer,
            StateKind::Z => &mut self.z,
            StateKind::SquareAvg => &mut self.square_avg,
            StateKind::GradAvg => &mut self.grad_avg,
            StateKind::ExpAvgSlow => &mut self.exp_avg_slow,
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
            foreign: None,
        }
    }

    /// Refused ([`Error::Burn`]) where this state cannot be continued by `algorithm`: a
    /// foreign record's, or one whose tensors are not the algorithm's (another algorithm's
    /// record would otherwise lose its state, or restart missing moments from zero).
    fn check(&self, algorithm: &Algorithm) -> Result<()> {
        if let Some(foreign) = &self.foreign {
            return Err(Error::Burn { cause: BurnFailure::Record, detail: foreign.clone() });
        }
        if self.time == 0 {
            return Ok(());
        }
        let held: Vec<&str> =
            STATE_NAMES.iter().zip(self.tensors()).filter(|(_, t)| t.is_some()).map(|(n, _)| *n).collect();
        let expected: Vec<&str> = algorithm.state_kinds().iter().map(|k| k.torch_name()).collect();
        if held.iter().all(|n| expected.contains(n)) && expected.iter().all(|n| held.contains(n)) {
            return Ok(());
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
        let mut take =
            |name: &str| src.take_tensor(prefix, name).map(|data| BurnTensor::from_data(data, device));
        Some(FusedState {
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
        super::schedule_free::refuse(&algorithm, "FusedOptimizer")?;
        super::muon::refuse(&algorithm, "FusedOptimizer")?;
        Ok(FusedOptimizer { shared: shared.clone(), algorithm })
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
        let expected = record::expected_names(&self.algorithm, Rounding::NearestEven);
        for (id, state) in &states {
            record::check_names(*id, state.tensors.keys().map(String::as_str), &expected, &self.algorithm)?;
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
        let algorithm = self.algorithm.with_lr(lr);
        algorithm.validate()?;
        let mut state = state.unwrap_or_else(FusedState::fresh);
        state.check(&algorithm)?;
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
        ops::update(ctx, &mut encoder, &algorithm, state.time as u64 + 1, &[update])?;
        ctx.queue().submit([encoder.finish()]);
        for (kind, t) in kinds.iter().zip(returned) {
            *state.slot(*kind) = Some(t);
        }
        state.time += 1;
        Ok((tensor, state))
    }
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
