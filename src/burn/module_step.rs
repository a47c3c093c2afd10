//! Every parameter of a Burn module in one fused, multi-tensor step.

use std::collections::{BTreeMap, HashMap};

use ::burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use ::burn::optim::GradientsParams;
use ::burn::tensor::{Bytes, GradientCheckpointingStrategy, Tensor as BurnTensor, TensorData};

use super::lease::{bindable, lease, Access, Leased};
use super::muon::{algorithm_for, in_main_group, needs_shapes, FrontEnd};
use super::record::{self, ParamRecord, ScheduleFreeRecord};
use super::schedule_free::lease_params;
use super::SharedDevice;
use crate::optimizer::device::check_inv_scale;
use crate::ParamGroup;
use crate::{
    Algorithm, BurnFailure, Error, Optimizer, OptimizerBuilder, OptimizerOptions, Result, ScheduleFreeMode,
    ScheduleFreeScalars, Tensor,
};

/// A fused step over a whole Burn module: every parameter that has a gradient is updated by
/// one [`Optimizer`], whose multi-tensor dispatches cover all of them (one per kernel
/// variant, not one per parameter), with the [`OptimizerBuilder`] options of this crate: global
/// gradient clipping ([`OptimizerBuilder::grad_clip`]), AMP skipping
/// ([`Self::step_unscaled`], with [`OptimizerBuilder::capturable`]), 16-bit, 8-bit or 4-bit state.
///
/// Parameters are updated in their own buffers; one whose storage is shared with another
/// tensor is copied first (see [`crate::burn`]).
///
/// # Parameters without a gradient
///
/// As in Burn and PyTorch, a parameter with no gradient in a step (an unused branch, a
/// frozen layer) is left as it is, parameter and state, and each parameter counts its own
/// steps: Adam's bias correction of a parameter uses the number of steps *that parameter*
/// took, so a layer unfrozen after `k` steps continues from its own count, and one first
/// stepped late starts at step 1. Parameters with equal counts share one optimizer and its
/// dispatches; parameters whose counts differ are stepped by one optimizer per count, in
/// the same submission. Global gradient clipping and AMP's all-or-nothing skip cover one
/// optimizer, so with [`OptimizerBuilder::grad_clip`] or [`OptimizerBuilder::capturable`] a
/// step whose parameters have different counts is refused ([`Error::Burn`]). In capturable
/// mode the counts are the device's (AMP skips excluded), read back when the set of
/// parameters with gradients changes.
///
/// # Muon and Adafactor
///
/// Their optimizers are built with the parameters' shapes, which Burn's tensors carry.
/// Muon takes 2-D parameters only: [`ModuleStepBuilder::fallback`] names the algorithm of
/// the others (AdamW typically), and each optimizer then has two groups, Muon's matrices and
/// the fallback's other parameters, as a torch trainer builds them. Without a fallback a
/// step over a parameter that is not 2-D is refused ([`Error::BadShape`], its place among
/// the step's parameters in module order and its shape).
///
/// # Checkpoints
///
/// [`Self::to_bytes`] saves every parameter's state and step count, and
/// [`Self::load_bytes`] restores it, before or after the first step; training resumed
/// from it continues bit for bit. The bytes are a Burn optimizer record, the one
/// [`FusedOptimizer`](super::FusedOptimizer)'s `ModuleOptimizer` reads and writes, so a
/// trainer may switch between the two (and load Burn's own Adam and AdamW records).
///
/// # Refusals
///
/// A refused step hands the module back ([`StepError`]), its parameters' values as they
/// were, and changes no state.
///
/// ```no_run
/// # fn train<M: burn::module::Module>(model: M, grads: burn::optim::GradientsParams) -> wgpu_optim::Result<M> {
/// use wgpu_optim::burn::{ModuleStep, SharedDevice};
/// use wgpu_optim::Adam;
///
/// let shared = SharedDevice::headless_blocking()?;
/// let mut step = ModuleStep::builder().build(&shared, Adam::adamw())?;
/// let model = step.step(1e-3, model, grads)?; // `?` keeps the error, dropping the model
/// # Ok(model) }
/// ```
pub struct ModuleStep {
    shared: SharedDevice,
    algorithm: Algorithm,
    /// Under Muon, the algorithm of the parameters that are not 2-D.
    fallback: Option<Algorithm>,
    options: OptimizerOptions,
    /// Every parameter stepped or loaded so far.
    params: HashMap<ParamId, Entry>,
    /// The optimizers holding the state; the last step's come first.
    bounds: Vec<Bound>,
    /// The key of the next optimizer built.
    next_key: u64,
    /// Schedule-Free's mode: whether the parameters with state hold y or x.
    mode: ScheduleFreeMode,
}

/// A refused [`ModuleStep`] step: the reason, and the module handed back with its
/// parameters' values as they were (a parameter may sit in a new buffer, never with new
/// values) and the optimizer's state unchanged.
///
/// `?` converts it into [`Error`] (dropping the module); to keep training after a refusal,
/// match on it:
///
/// ```no_run
/// # fn train<M: burn::module::Module>(step: &mut wgpu_optim::burn::ModuleStep, model: M, grads: burn::optim::GradientsParams) -> M {
/// let model = match step.step(1e-3, model, grads) {
///     Ok(model) => model,
///     Err(refused) => {
///         eprintln!("step skipped: {}", refused.error);
///         refused.module
///     }
/// };
/// # model }
/// ```
pub struct StepError<M> {
    /// The module, as it was passed in.
    pub module: M,
    /// Why the step was refused.
    pub error: Error,
}

impl<M> StepError<M> {
    /// The module and the error.
    pub fn into_inner(self) -> (M, Error) {
        (self.module, self.error)
    }
}

impl<M> std::fmt::Debug for StepError<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepError").field("error", &self.error).finish_non_exhaustive()
    }
}

impl<M> std::fmt::Display for StepError<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the step was refused: {}", self.error)
    }
}

impl<M> std::error::Error for StepError<M> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<M> From<StepError<M>> for Error {
    fn from(refused: StepError<M>) -> Self {
        refused.error
    }
}

/// One parameter's step count and where its state is.
struct Entry {
    /// Steps this parameter took (in capturable mode, recorded ones: the device's count,
    /// AMP skips excluded, is its home optimizer's).
    time: u64,
    /// Its shape, for the records (empty until a step saw the parameter).
    shape: Vec<usize>,
    /// Schedule-Free's running values after its last step (`k` is `time`): per parameter,
    /// since parameters stepped together share an optimizer (and its group's values) only
    /// while their histories agree.
    schedule_free: Option<ScheduleFreeScalars>,
    home: Home,
}

enum Home {
    /// In the optimizer of [`Bound::key`] this.
    Bound(u64),
    /// Loaded from a record, written into an optimizer at the parameter's next step.
    Loaded(ParamRecord),
}

/// An optimizer over parameters stepped with one step count.
struct Bound {
    key: u64,
    ids: Vec<ParamId>,
    params: Vec<Tensor>,
    optimizer: Optimizer,
}

/// The parameters of one step with the same step count: indices into the step's lists.
struct Cohort {
    time: u64,
    schedule_free: Option<ScheduleFreeScalars>,
    members: Vec<usize>,
}

/// How a [`ModuleStep`] is built: [`ModuleStep::builder`], the options a module step
/// honours (every one off by default), then [`Self::build`]. They are
/// [`OptimizerBuilder`]'s, less those a Burn module decides itself (its parameters' dtypes,
/// copies and shapes: master weights, model copies, parameter shapes), which have no setter
/// here:
///
/// ```compile_fail
/// let builder = wgpu_optim::burn::ModuleStep::builder().master_weights(true);
/// ```
#[derive(Clone, Debug)]
#[must_use = "a module step builder does nothing until `build`"]
pub struct ModuleStepBuilder {
    options: OptimizerOptions,
    fallback: Option<Algorithm>,
}

impl ModuleStepBuilder {
    /// [`OptimizerBuilder::state_dtype`].
    pub fn state_dtype(mut self, dtype: impl Into<Option<crate::DType>>) -> Self {
        self.options.state_dtype = dtype.into();
        self
    }

    /// [`OptimizerBuilder::capturable`]: needed by [`ModuleStep::step_unscaled`].
    pub fn capturable(mut self, on: bool) -> Self {
        self.options.capturable = on;
        self
    }

    /// [`OptimizerBuilder::grad_clip`], over the parameters of one step that share a step
    /// count.
    pub fn grad_clip(mut self, clip: impl Into<Option<crate::GradClip>>) -> Self {
        self.options.grad_clip = clip.into();
        self
    }

    /// [`OptimizerBuilder::rounding`].
    pub fn rounding(mut self, rounding: crate::Rounding) -> Self {
        self.options.rounding = rounding;
        self
    }

    /// [`OptimizerBuilder::q8_states`].
    pub fn q8_states(mut self, q8: impl Into<Option<crate::q8::Q8States>>) -> Self {
        self.options.q8_states = q8.into();
        self
    }

    /// [`OptimizerBuilder::q4_states`]: Adam's and AdamW's moments in torchao's 4-bit
    /// format. Records ([`ModuleStep::to_bytes`]) hold them under torchao's names, as this
    /// crate's checkpoints do: a 4-bit state as `exp_avg.codes` (U8, two codes per byte),
    /// `exp_avg.scale` (F32, one per block) and `exp_avg.qmap` (its 16 entries); a tensor
    /// that keeps f32 state as `exp_avg`.
    pub fn q4_states(mut self, q4: impl Into<Option<crate::q4::Q4States>>) -> Self {
        self.options.q4_states = q4.into();
        self
    }

    /// Under Muon, `algorithm` steps the module's parameters that are not 2-D (biases,
    /// norms), as a torch trainer puts them in an AdamW group beside the Muon group: each
    /// step's optimizer has the two groups. Both take the step's learning rate (with
    /// [`MuonLrAdjust::MatchRmsAdamW`](crate::MuonLrAdjust) one rate fits both). Without
    /// it, a step with a parameter Muon cannot take is refused ([`Error::BadShape`]).
    /// [`Self::build`] refuses it for another algorithm than Muon, or a Muon fallback
    /// ([`Error::ConflictingOptions`]).
    ///
    /// ```no_run
    /// # fn main() -> wgpu_optim::Result<()> {
    /// use wgpu_optim::burn::{ModuleStep, SharedDevice};
    /// use wgpu_optim::{Adam, Muon};
    ///
    /// let shared = SharedDevice::headless_blocking()?;
    /// let step = ModuleStep::builder().fallback(Adam::adamw()).build(&shared, Muon::default())?;
    /// # Ok(()) }
    /// ```
    pub fn fallback(mut self, algorithm: impl Into<Algorithm>) -> Self {
        self.fallback = Some(algorithm.into());
        self
    }

    /// `algorithm` over a module's parameters on `shared`'s device. The optimizers are built
    /// at the first step, when the parameters are known; the algorithm, the fallback and the
    /// clip are checked here.
    pub fn build(self, shared: &SharedDevice, algorithm: impl Into<Algorithm>) -> Result<ModuleStep> {
        let algorithm = algorithm.into();
        algorithm.validate()?;
        super::muon::check_fallback(&algorithm, self.fallback.as_ref())?;
        if let Some(clip) = &self.options.grad_clip {
            clip.validate()?;
        }
        if let Some(q4) = &self.options.q4_states {
            q4.validate()?;
        }
        Ok(ModuleStep {
            shared: shared.clone(),
            algorithm,
            fallback: self.fallback,
            options: self.options,
            params: HashMap::new(),
            bounds: Vec::new(),
            next_key: 0,
            mode: ScheduleFreeMode::Train,
        })
    }
}

impl ModuleStep {
    /// The one way to build a module step: options first, then the device and the algorithm
    /// ([`ModuleStepBuilder::build`]).
    pub fn builder() -> ModuleStepBuilder {
        ModuleStepBuilder { options: OptimizerOptions::default(), fallback: None }
    }

    /// The optimizer that stepped the last step's parameters (the one over those with the
    /// lowest step count, where their counts differed), once a step has built it: its step
    /// count, last gradient norm, AMP flag, state tensors. Save and restore the whole
    /// module's state with [`Self::to_bytes`] and [`Self::load_bytes`].
    pub fn optimizer(&self) -> Option<&Optimizer> {
        self.bounds.first().map(|b| &b.optimizer)
    }

    /// How many steps parameter `id` took (recorded ones, in capturable mode), counting
    /// the loaded record's; `None` for a parameter never stepped nor loaded.
    pub fn param_step_count(&self, id: ParamId) -> Option<u64> {
        self.params.get(&id).map(|e| e.time)
    }

    /// Schedule-Free's mode: whether the parameters hold y ([`ScheduleFreeMode::Train`],
    /// where a module step starts) or the average x ([`Self::eval`]).
    pub fn mode(&self) -> ScheduleFreeMode {
        self.mode
    }

    /// Schedule-Free's `eval()`: every parameter of `module` with a stepped state becomes
    /// the average `x = lerp(y, z, 1 - 1/beta1)`, on the device, in one submission (nothing is
    /// read back), and steps are refused ([`Error::EvalMode`]) until [`Self::train`]. A
    /// no-op in eval mode already, as the package's. Refused, with the module handed back
    /// unchanged ([`StepError`]), for another algorithm, for `beta1 = 0` (x cannot be
    /// recovered), or where a parameter cannot be bound.
    ///
    /// ```no_run
    /// # fn run<M: burn::module::Module>(model: M, grads: burn::optim::GradientsParams) -> wgpu_optim::Result<M> {
    /// use wgpu_optim::burn::{ModuleStep, SharedDevice};
    /// use wgpu_optim::ScheduleFreeAdamW;
    ///
    /// let shared = SharedDevice::headless_blocking()?;
    /// let mut step = ModuleStep::builder().build(&shared, ScheduleFreeAdamW::default())?;
    /// let model = step.step(0.0025, model, grads)?;
    /// let model = step.eval(model)?; // evaluate x
    /// let model = step.train(model)?; // back to y, to train on
    /// # Ok(model) }
    /// ```
    pub fn eval<M: Module>(&mut self, module: M) -> Result<M, StepError<M>> {
        self.swap(module, ScheduleFreeMode::Eval)
    }

    /// Schedule-Free's `train()`: back from x to `y = lerp(x, z, 1 - beta1)` and train mode.
    /// A no-op in train mode; otherwise as [`Self::eval`].
    pub fn train<M: Module>(&mut self, module: M) -> Result<M, StepError<M>> {
        self.swap(module, ScheduleFreeMode::Train)
    }

    fn swap<M: Module>(&mut self, module: M, to: ScheduleFreeMode) -> Result<M, StepError<M>> {
        let checked = match self.algorithm {
            Algorithm::ScheduleFreeAdamW(config) if to == ScheduleFreeMode::Eval => {
                crate::algo::check_eval(&config)
            }
            Algorithm::ScheduleFreeAdamW(_) => Ok(()),
            other => Err(Error::Burn {
                cause: BurnFailure::Config,
                detail: format!(
                    "eval() and train() switch Schedule-Free AdamW's parameters between y and x; this \
                     module step runs {}",
                    other.name()
                ),
            }),
        };
        if let Err(error) = checked {
            return Err(StepError { module, error });
        }
        if self.mode == to {
            return Ok(module);
        }
        let params = &self.params;
        let stepped = |id: ParamId| params.get(&id).is_some_and(|e| e.time > 0);
        let (module, leased) = lease_params(&self.shared, module, &stepped)?;
        match self.record_swap(&leased, to) {
            Ok(()) => Ok(module),
            Err(error) => Err(StepError { module, error }),
        }
    }

    /// Records and submits the swap of the leased parameters: each cohort's optimizer found
    /// or built (its state brought in, its mode the module step's), then its swap pass.
    fn record_swap(&mut self, leased: &[(ParamId, Leased)], to: ScheduleFreeMode) -> Result<()> {
        let ids: Vec<ParamId> = leased.iter().map(|(id, _)| *id).collect();
        let shapes = ids.iter().map(|id| self.params.get(id).map(|e| e.shape.clone()).unwrap_or_default());
        let checked = Checked { shapes: shapes.collect(), ids };
        let cohorts = self.cohorts(&checked.ids, &checked.shapes, false)?;
        let ctx = self.shared.context().clone();
        let mut encoder = ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("wgpu-optim swap") });
        let mut prepared = Vec::with_capacity(cohorts.len());
        for cohort in &cohorts {
            let ids: Vec<ParamId> = cohort.members.iter().map(|&i| checked.ids[i]).collect();
            let params: Vec<Tensor> = cohort.members.iter().map(|&i| leased[i].1.tensor.clone()).collect();
            let shapes = cohort.members.iter().map(|&i| checked.shapes[i].clone()).collect();
            prepared.push(self.prepare(&mut encoder, ids, params, shapes, cohort)?);
        }
        for prepared in &mut prepared {
            let optimizer = match prepared {
                Prepared::Reused(k) => &mut self.bounds[*k].optimizer,
                Prepared::Built(bound) => &mut bound.optimizer,
            };
            match to {
                ScheduleFreeMode::Eval => optimizer.record_eval(&mut encoder)?,
                ScheduleFreeMode::Train => optimizer.record_train(&mut encoder)?,
            }
        }
        // A refused submission comes back as an error, not to Burn's device's handler.
        ctx.catch("submitting a Burn step", || ctx.queue().submit([encoder.finish()]))?;
        self.commit(&checked, &cohorts, prepared, false);
        self.mode = to;
        Ok(())
    }

    /// One step with learning rate `lr` of every parameter of `module` that has a gradient
    /// in `grads`, recorded and submitted before it returns; parameters without one keep
    /// their values and state. Refused, with the module handed back and nothing written
    /// ([`StepError`]), where `lr` is invalid, a parameter or gradient is not on the shared
    /// device or not F32, F16 or BF16, a gradient's shape or dtype is not its parameter's,
    /// a loaded state does not fit its parameter, or the optimizer refuses the parameters.
    pub fn step<M: Module>(&mut self, lr: f64, module: M, grads: GradientsParams) -> Result<M, StepError<M>> {
        self.step_inner(lr, module, grads, None)
    }

    /// AMP: the step of [`Self::step`] after unscaling the gradients by the device scalar
    /// `inv_scale` (one f32 element), skipped on the device when any gradient is NaN or
    /// infinite ([`Optimizer::record_unscale`]). Needs [`OptimizerBuilder::capturable`].
    pub fn step_unscaled<M: Module>(
        &mut self,
        lr: f64,
        module: M,
        grads: GradientsParams,
        inv_scale: &BurnTensor<1>,
    ) -> Result<M, StepError<M>> {
        if !self.options.capturable {
            let error = Error::NeedsOption { what: "ModuleStep::step_unscaled".into(), option: "capturable" };
            return Err(StepError { module, error });
        }
        self.step_inner(lr, module, grads, Some(inv_scale.clone()))
    }

    /// Every parameter's state and step count as a Burn optimizer record (burnpack bytes,
    /// each state tensor in its parameter's shape and its storage dtype), read back from
    /// the device: this waits for the submitted steps. Refused with 8-bit state
    /// ([`Error::ConflictingOptions`]; save the [`Self::optimizer`]'s checkpoint instead).
    /// 4-bit states are saved under torchao's names ([`ModuleStepBuilder::q4_states`]).
    pub fn to_bytes(&self) -> Result<Bytes> {
        self.refuse_q8("ModuleStep::to_bytes")?;
        let mut states = BTreeMap::new();
        for (id, entry) in &self.params {
            let state = match &entry.home {
                Home::Loaded(state) => state.clone(),
                Home::Bound(key) => ParamRecord {
                    rank: entry.shape.len(),
                    time: self.device_time(entry)?,
                    tensors: self.read_state(*key, *id, &entry.shape)?,
                    schedule_free: entry.schedule_free.map(|s| ScheduleFreeRecord {
                        weight_sum: s.weight_sum,
                        lr_max: s.lr_max,
                        train_mode: None,
                    }),
                },
            };
            let train_mode = Some(self.mode == ScheduleFreeMode::Train);
            let state = ParamRecord {
                schedule_free: state.schedule_free.map(|s| ScheduleFreeRecord { train_mode, ..s }),
                ..state
            };
            states.insert(id.val(), state);
        }
        record::write(states)
    }

    /// Replaces every parameter's state and step count with a record's: one from
    /// [`Self::to_bytes`], from [`FusedOptimizer`](super::FusedOptimizer)'s
    /// `ModuleOptimizer::into_bytes`, or from Burn's own Adam or AdamW (whose moments and
    /// step count are PyTorch's, under other names). Before or after the first step; each
    /// parameter's state is written into the optimizer at its next step, so the next step
    /// continues bit for bit from where the record was saved. Parameters the record does
    /// not name start afresh, as under Burn's `load_record`.
    ///
    /// Refused, with nothing changed, where the bytes are not an optimizer record, a
    /// parameter's state is another optimizer's (named in the [`Error::Burn`]), or with
    /// 8-bit state ([`Error::ConflictingOptions`]). A state whose length does not fit its
    /// parameter is refused at that parameter's step.
    pub fn load_bytes(&mut self, bytes: Bytes) -> Result<()> {
        self.refuse_q8("ModuleStep::load_bytes")?;
        let states = record::read(bytes)?;
        for (id, state) in &states {
            if self.options.q4_states.is_some() {
                super::q4::check_names(*id, state.tensors.keys().map(String::as_str), &self.algorithm)?;
                record::check_schedule_free(*id, state, &self.algorithm)?;
                continue;
            }
            let algorithm = self.algorithm_of_rank(state.rank);
            let expected = record::param_names(&algorithm, state.rank, self.options.rounding);
            record::check_names(*id, state.tensors.keys().map(String::as_str), &expected, &algorithm)?;
            record::check_schedule_free(*id, state, &algorithm)?;
        }
        let mode = record_mode(&states)?;
        self.bounds.clear();
        self.params = states
            .into_iter()
            .map(|(id, state)| {
                let entry = Entry {
                    time: state.time,
                    shape: Vec::new(),
                    schedule_free: state.scalars(),
                    home: Home::Loaded(state),
                };
                (ParamId::from(id), entry)
            })
            .collect();
        self.mode = mode;
        Ok(())
    }

    fn refuse_q8(&self, what: &'static str) -> Result<()> {
        if self.options.q8_states.is_some() {
            return Err(Error::ConflictingOptions {
                first: what,
                second: "q8_states",
                reason: "a Burn record holds f32 state; save the optimizer's own checkpoint",
            });
        }
        Ok(())
    }

    /// Parameter `id`'s state tensors in the optimizer `key`, as record tensors: every
    /// state the optimizer keeps for it (its group's algorithm's, Adafactor's in their own
    /// shapes, the Kahan compensation).
    fn read_state(&self, key: u64, id: ParamId, shape: &[usize]) -> Result<BTreeMap<String, TensorData>> {
        let bound = self.bound(key)?;
        let i = bound.ids.iter().position(|p| *p == id).ok_or_else(|| lost(id))?;
        if self.options.q4_states.is_some() {
            return super::q4::read_state(&self.algorithm, &bound.optimizer, i, shape, || lost(id));
        }
        let mut tensors = BTreeMap::new();
        for kind in record::ALL_KINDS {
            let Some(tensor) = bound.optimizer.state(i, kind) else { continue };
            let bytes = self.shared.context().read_bytes(tensor)?;
            let shape = record::state_shape(kind, shape);
            let data = TensorData::from_bytes_vec(bytes, shape, record::burn_dtype(tensor.dtype));
            tensors.insert(kind.torch_name().to_string(), data);
        }
        Ok(tensors)
    }

    /// A parameter's step count: in capturable mode its optimizer's device count (AMP skips
    /// excluded), read back.
    fn device_time(&self, entry: &Entry) -> Result<u64> {
        match (&entry.home, self.options.capturable) {
            (Home::Bound(key), true) => self.bound(*key)?.optimizer.read_device_step(),
            _ => Ok(entry.time),
        }
    }

    fn bound(&self, key: u64) -> Result<&Bound> {
        self.bounds.iter().find(|b| b.key == key).ok_or_else(|| Error::Burn {
            cause: BurnFailure::Internal,
            detail: format!("internal: optimizer {key} of a parameter's state is gone"),
        })
    }

    fn step_inner<M: Module>(
        &mut self,
        lr: f64,
        module: M,
        grads: GradientsParams,
        inv_scale: Option<BurnTensor<1>>,
    ) -> Result<M, StepError<M>> {
        // Everything that can be refused before the module is taken apart is.
        if self.mode == ScheduleFreeMode::Eval {
            return Err(StepError { module, error: Error::EvalMode { call: "ModuleStep::step" } });
        }
        let checked = match self.check(lr, &module, &grads) {
            Ok(checked) => checked,
            Err(error) => return Err(StepError { module, error }),
        };
        if checked.ids.is_empty() {
            return Ok(module);
        }
        let cohorts = match self.cohorts(&checked.ids, &checked.shapes, true) {
            Ok(cohorts) => cohorts,
            Err(error) => return Err(StepError { module, error }),
        };
        let inv_scale = match inv_scale.map(|t| self.lease_inv_scale(t)).transpose() {
            Ok(inv_scale) => inv_scale,
            Err(error) => return Err(StepError { module, error }),
        };
        let mut grads = grads;
        let mut take = Take {
            shared: &self.shared,
            grads: &mut grads,
            params: vec![],
            grads_leased: vec![],
            error: None,
        };
        let module = module.map(&mut take);
        let (params, grads_leased, error) = (take.params, take.grads_leased, take.error);
        if let Some(error) = error {
            return Err(StepError { module, error });
        }
        let leased = StepTensors { params: &params, grads: &grads_leased };
        match self.record(lr, &checked, &cohorts, leased, inv_scale.as_ref()) {
            Ok(()) => Ok(module),
            Err(error) => Err(StepError { module, error }),
        }
    }

    /// The first pass, borrowing the module: the parameters with gradients, in module
    /// order, their shapes, and whether each of them (and its gradient) can be stepped.
    fn check<M: Module>(&self, lr: f64, module: &M, grads: &GradientsParams) -> Result<Checked> {
        self.algorithm.with_lr(lr).validate()?;
        if let Some(fallback) = &self.fallback {
            fallback.with_lr(lr).validate()?;
        }
        let mut check =
            Check { shared: &self.shared, grads, ids: Vec::new(), shapes: Vec::new(), error: None };
        module.visit(&mut check);
        if let Some(error) = check.error {
            return Err(error);
        }
        // Muon without a fallback: a parameter it cannot take, by its place among the step's
        // parameters (module order) and its shape.
        let fallback = self.fallback.as_ref();
        for (i, shape) in check.shapes.iter().enumerate() {
            algorithm_for(&self.algorithm, fallback, shape, i, FrontEnd::ModuleStep)?;
        }
        Ok(Checked { ids: check.ids, shapes: check.shapes })
    }

    /// The step's parameters grouped by step count (and Schedule-Free's values), lowest
    /// first; in each, the main algorithm's parameters (of `shapes`) before the fallback's.
    /// Refused, for a step, where the counts differ and an option needs one optimizer over
    /// all of them.
    fn cohorts(&mut self, ids: &[ParamId], shapes: &[Vec<usize>], for_step: bool) -> Result<Vec<Cohort>> {
        let same_as_last = self.bounds.len() == 1 && self.bounds[0].ids == ids;
        if self.options.capturable && !same_as_last {
            self.settle_device_counts()?;
        }
        // Keyed by the values' bits: parameters share an optimizer only where they are equal.
        type Key = (u64, Option<(u64, u64)>);
        let mut by_time: BTreeMap<Key, (Option<ScheduleFreeScalars>, Vec<usize>)> = BTreeMap::new();
        for (i, id) in ids.iter().enumerate() {
            let (time, scalars) = self.params.get(id).map_or((0, None), |e| (e.time, e.schedule_free));
            let key = (time, scalars.map(|s| (s.weight_sum.to_bits(), s.lr_max.to_bits())));
            by_time.entry(key).or_insert_with(|| (scalars, Vec::new())).1.push(i);
        }
        let counts: std::collections::BTreeSet<u64> = by_time.keys().map(|(t, _)| *t).collect();
        if for_step && counts.len() > 1 && (self.options.grad_clip.is_some() || self.options.capturable) {
            let option = if self.options.capturable { "capturable (AMP)" } else { "grad_clip" };
            return Err(Error::Burn {
                cause: BurnFailure::Step,
                detail: format!(
                    "the parameters with gradients have different step counts ({:?}) (some had no \
                 gradient in an earlier step); {option} covers one optimizer, one count, so \
                 they cannot be stepped together under it",
                    counts
                ),
            });
        }
        let (algorithm, fallback) = (self.algorithm, self.fallback);
        let main = |i: &usize| in_main_group(&algorithm, fallback.as_ref(), &shapes[*i]);
        let cohorts = by_time.into_iter().map(|((time, _), (schedule_free, mut members))| {
            // Stable: module order within each group.
            members.sort_by_key(|i| !main(i));
            Cohort { time, schedule_free, members }
        });
        Ok(cohorts.collect())
    }

    /// Capturable mode: each parameter's count from its optimizer's device counter (AMP
    /// skips are counted on the device only).
    fn settle_device_counts(&mut self) -> Result<()> {
        let counts: HashMap<u64, u64> = self
            .bounds
            .iter()
            .map(|b| Ok((b.key, b.optimizer.read_device_step()?)))
            .collect::<Result<_>>()?;
        for entry in self.params.values_mut() {
            if let Home::Bound(key) = entry.home {
                if let Some(count) = counts.get(&key) {
                    entry.time = *count;
                }
            }
        }
        Ok(())
    }

    fn lease_inv_scale(&self, inv_scale: BurnTensor<1>) -> Result<Leased> {
        let leased = lease(&self.shared, inv_scale, Access::Read, "inv_scale")?.1;
        check_inv_scale(&leased.tensor)?;
        Ok(leased)
    }

    /// Records and submits the step: each cohort's optimizer found or built (bringing its
    /// parameters' state from wherever it is), then each one's step. `self` changes only
    /// once everything is recorded.
    fn record(
        &mut self,
        lr: f64,
        checked: &Checked,
        cohorts: &[Cohort],
        leased: StepTensors<'_>,
        inv_scale: Option<&Leased>,
    ) -> Result<()> {
        let ctx = self.shared.context().clone();
        let mut encoder = ctx.device().create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("wgpu-optim Burn module step"),
        });
        let mut prepared = Vec::with_capacity(cohorts.len());
        for cohort in cohorts {
            let ids: Vec<ParamId> = cohort.members.iter().map(|&i| checked.ids[i]).collect();
            let params: Vec<Tensor> =
                cohort.members.iter().map(|&i| leased.params[i].tensor.clone()).collect();
            let shapes = cohort.members.iter().map(|&i| checked.shapes[i].clone()).collect();
            prepared.push(self.prepare(&mut encoder, ids, params, shapes, cohort)?);
        }
        for (cohort, prepared) in cohorts.iter().zip(&mut prepared) {
            let grads: Vec<Tensor> = cohort.members.iter().map(|&i| leased.grads[i].tensor.clone()).collect();
            let optimizer = match prepared {
                Prepared::Reused(k) => &mut self.bounds[*k].optimizer,
                Prepared::Built(bound) => &mut bound.optimizer,
            };
            optimizer.set_lr(lr)?;
            if let Some(inv_scale) = inv_scale {
                optimizer.record_unscale(&mut encoder, &grads, &inv_scale.tensor)?;
            }
            optimizer.record_step(&mut encoder, &grads)?;
        }
        // A refused submission comes back as an error, not to Burn's device's handler.
        ctx.catch("submitting a Burn step", || ctx.queue().submit([encoder.finish()]))?;
        self.commit(checked, cohorts, prepared, true);
        Ok(())
    }

    /// The optimizer for one cohort: the one that stepped exactly these parameters in these
    /// buffers before, or a new one; either way with every parameter's state brought in
    /// (copies recorded into `encoder`) and the cohort's step count. `shapes` are the
    /// parameters', for the algorithms that need them.
    fn prepare(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        ids: Vec<ParamId>,
        params: Vec<Tensor>,
        shapes: Vec<Vec<usize>>,
        cohort: &Cohort,
    ) -> Result<Prepared> {
        let time = cohort.time;
        if let Some(k) = self.bounds.iter().position(|b| b.ids == ids && b.params == params) {
            let bound = &self.bounds[k];
            self.bring_in(encoder, &bound.optimizer, Some(bound.key), &ids)?;
            // Host mode only: a capturable optimizer's device count is its parameters' own.
            let optimizer = &mut self.bounds[k].optimizer;
            if !self.options.capturable && optimizer.step_count() != time {
                optimizer.set_step_count(time)?;
            }
            continue_schedule_free(optimizer, cohort, self.mode)?;
            return Ok(Prepared::Reused(k));
        }
        let mut optimizer = self.build_optimizer(&params, shapes)?;
        self.bring_in(encoder, &optimizer, None, &ids)?;
        if time != 0 {
            optimizer.set_step_count(time)?;
        }
        continue_schedule_free(&mut optimizer, cohort, self.mode)?;
        let key = self.next_key;
        self.next_key += 1;
        Ok(Prepared::Built(Box::new(Bound { key, ids, params, optimizer })))
    }

    /// A new optimizer over one cohort's `params` (of `shapes`, the main algorithm's first:
    /// [`Self::cohorts`] orders them so): one group, or under Muon with a fallback, the
    /// 2-D parameters' Muon group and the others' fallback group (either may be empty).
    fn build_optimizer(&self, params: &[Tensor], shapes: Vec<Vec<usize>>) -> Result<Optimizer> {
        let fallback = self.fallback.as_ref();
        let main = shapes.iter().take_while(|s| in_main_group(&self.algorithm, fallback, s)).count();
        let mut groups = vec![ParamGroup::new(self.algorithm, &params[..main])];
        if let Some(fallback) = fallback {
            groups.push(ParamGroup::new(*fallback, &params[main..]));
        }
        let mut options = self.options.clone();
        if needs_shapes(&self.algorithm) || fallback.is_some_and(needs_shapes) {
            options.param_shapes = shapes;
        }
        OptimizerBuilder { options }.build_groups(self.shared.context(), groups)
    }

    /// The algorithm that steps a parameter of rank `rank` (of a record, whose shape it does
    /// not keep): under Muon, the fallback below or above 2. Where Muon would refuse it, Muon,
    /// whose step refuses it.
    fn algorithm_of_rank(&self, rank: usize) -> Algorithm {
        let shape = vec![2; rank];
        algorithm_for(&self.algorithm, self.fallback.as_ref(), &shape, 0, FrontEnd::ModuleStep)
            .unwrap_or(self.algorithm)
    }

    /// Brings each of `ids`' state into `target` (whose parameter `i` is `ids[i]`; `key`
    /// where it is one of `self.bounds`) from where it is: another optimizer (copied in
    /// `encoder`) or a loaded record (written through the queue). A parameter never stepped
    /// keeps the fresh state `target` was built with.
    fn bring_in(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        target: &Optimizer,
        key: Option<u64>,
        ids: &[ParamId],
    ) -> Result<()> {
        for (i, id) in ids.iter().enumerate() {
            match self.params.get(id).map(|e| &e.home) {
                None => {}
                Some(Home::Bound(home)) if Some(*home) == key => {}
                Some(Home::Bound(home)) => {
                    let source = self.bound(*home)?;
                    let j = source.ids.iter().position(|p| p == id).ok_or_else(|| lost(*id))?;
                    let q8 = self.options.q8_states.is_some();
                    copy_state(&source.optimizer, j, target, i, encoder, q8)?;
                    if self.options.q4_states.is_some() {
                        super::q4::copy(&self.algorithm, &source.optimizer, j, target, i)?;
                    }
                }
                Some(Home::Loaded(state)) => self.write_loaded(target, i, *id, &state.tensors)?,
            }
        }
        Ok(())
    }

    /// A loaded record's state tensors into `target`'s parameter `i`, each converted to the
    /// state's dtype (bit for bit where they are the same).
    fn write_loaded(
        &self,
        target: &Optimizer,
        i: usize,
        id: ParamId,
        tensors: &BTreeMap<String, TensorData>,
    ) -> Result<()> {
        if self.options.q4_states.is_some() {
            return super::q4::write_loaded(&self.algorithm, target, i, id.val(), tensors);
        }
        let ctx = self.shared.context();
        for (name, data) in tensors {
            let kind = record::state_kind(name).ok_or_else(|| lost(id))?;
            let tensor = target.state(i, kind).ok_or_else(|| lost(id))?;
            if data.num_elements() as u64 != tensor.len {
                return Err(Error::LengthMismatch {
                    argument: format!("the loaded {name} of parameter {id}"),
                    got: data.num_elements() as u64,
                    expected: tensor.len,
                    reference: format!("parameter {id}"),
                });
            }
            let dtype = record::dtype_of(data)?;
            if dtype == tensor.dtype {
                ctx.write_bytes(tensor, data.as_bytes())?;
            } else {
                ctx.write(tensor, &dtype.decode(data.as_bytes()))?;
            }
        }
        Ok(())
    }

    /// After a submitted step (or, `stepped` false, a Schedule-Free swap): each parameter
    /// counts it and lives in its cohort's optimizer; this call's optimizers come first, and
    /// those holding no one's state go.
    fn commit(&mut self, checked: &Checked, cohorts: &[Cohort], prepared: Vec<Prepared>, stepped: bool) {
        let mut keys = Vec::with_capacity(cohorts.len());
        let mut built = Vec::new();
        for (cohort, prepared) in cohorts.iter().zip(prepared) {
            let (key, optimizer) = match prepared {
                Prepared::Reused(k) => (self.bounds[k].key, &self.bounds[k].optimizer),
                Prepared::Built(bound) => {
                    built.push(*bound);
                    let bound = &built[built.len() - 1];
                    (bound.key, &bound.optimizer)
                }
            };
            keys.push(key);
            let schedule_free = optimizer.schedule_free_scalars(0);
            for &i in &cohort.members {
                let entry = Entry {
                    time: cohort.time + u64::from(stepped),
                    shape: checked.shapes[i].clone(),
                    schedule_free,
                    home: Home::Bound(key),
                };
                self.params.insert(checked.ids[i], entry);
            }
        }
        self.bounds.extend(built);
        let homes: Vec<u64> = self
            .params
            .values()
            .filter_map(|e| if let Home::Bound(k) = e.home { Some(k) } else { None })
            .collect();
        self.bounds.retain(|b| homes.contains(&b.key));
        self.bounds.sort_by_key(|b| keys.iter().position(|k| *k == b.key).unwrap_or(usize::MAX));
    }
}

/// A cohort's optimizer set to continue Schedule-Free where its parameters left off: the
/// cohort's values, and the module step's mode (a new optimizer starts in train mode).
fn continue_schedule_free(optimizer: &mut Optimizer, cohort: &Cohort, mode: ScheduleFreeMode) -> Result<()> {
    if optimizer.schedule_free_scalars(0).is_none() {
        return Ok(());
    }
    optimizer.set_schedule_free_scalars(0, cohort.schedule_free.unwrap_or_default())?;
    optimizer.set_mode_unchanged(mode);
    Ok(())
}

/// The mode a record was saved in: train unless its Schedule-Free parameters say eval,
/// which they all must say alike.
fn record_mode(states: &BTreeMap<u64, ParamRecord>) -> Result<ScheduleFreeMode> {
    let modes: std::collections::BTreeSet<bool> =
        states.values().filter_map(|s| s.schedule_free.and_then(|sf| sf.train_mode)).collect();
    match modes.into_iter().collect::<Vec<_>>().as_slice() {
        [] | [true] => Ok(ScheduleFreeMode::Train),
        [false] => Ok(ScheduleFreeMode::Eval),
        _ => Err(Error::Burn {
            cause: BurnFailure::Record,
            detail: "the record's parameters were saved in both train and eval mode".into(),
        }),
    }
}

/// What [`ModuleStep::record`] steps each cohort with.
enum Prepared {
    /// `bounds[k]`.
    Reused(usize),
    // Boxed: an `Optimizer` is large.
    Built(Box<Bound>),
}

/// The step's leased parameters and gradients, in the order of [`Checked::ids`].
struct StepTensors<'a> {
    params: &'a [Leased],
    grads: &'a [Leased],
}

/// The parameters with gradients, in module order, and their shapes.
struct Checked {
    ids: Vec<ParamId>,
    shapes: Vec<Vec<usize>>,
}

/// The error of a parameter whose state should be somewhere and is not (a bug, not input).
fn lost(id: ParamId) -> Error {
    Error::Burn {
        cause: BurnFailure::Internal,
        detail: format!("internal: parameter {id}'s state is missing"),
    }
}

/// Copies parameter `j`'s state in `from` into parameter `i`'s in `to` (the same parameter,
/// another optimizer or buffer).
fn copy_state(
    from: &Optimizer,
    j: usize,
    to: &Optimizer,
    i: usize,
    encoder: &mut wgpu::CommandEncoder,
    q8: bool,
) -> Result<()> {
    // 8-bit state is its algorithm's (never Adafactor's nor the Kahan compensation).
    let q8_kinds = if q8 { param_algorithm(from, j).map_or(&[][..], |a| a.state_kinds()) } else { &[] };
    for kind in record::ALL_KINDS {
        match (from.state(j, kind), to.state(i, kind)) {
            (Some(src), Some(dst)) => encoder.copy_buffer_to_buffer(
                &src.buffer,
                src.offset,
                &dst.buffer,
                dst.offset,
                src.byte_len(),
            ),
            // 8-bit state has no `state()` tensor: it moves through the host.
            _ if q8_kinds.contains(&kind) => {
                if let Some(state) = from.q8_state(j, kind)? {
                    to.set_q8_state(i, kind, &state)?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// The algorithm of `optimizer`'s parameter `j`: its group's.
fn param_algorithm(optimizer: &Optimizer, j: usize) -> Option<&Algorithm> {
    let mut first = 0;
    for g in 0..optimizer.group_count() {
        let len = optimizer.group_params(g)?.len();
        if j < first + len {
            return optimizer.group_algorithm(g);
        }
        first += len;
    }
    None
}

/// The first pass, borrowing the module: which parameters have gradients, their shapes,
/// and whether every one of them (and its gradient) can be stepped.
struct Check<'a> {
    shared: &'a SharedDevice,
    grads: &'a GradientsParams,
    ids: Vec<ParamId>,
    shapes: Vec<Vec<usize>>,
    error: Option<Error>,
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
pub(super) struct ParamContext {
    autodiff: bool,
    require_grad: bool,
    checkpointing: Option<GradientCheckpointingStrategy>,
    distributed: bool,
}

impl ParamContext {
    pub(super) fn capture<const D: usize>(tensor: &BurnTensor<D>) -> Self {
        ParamContext {
            autodiff: tensor.is_autodiff(),
            require_grad: tensor.is_require_grad(),
            checkpointing: tensor.gradient_checkpointing_strategy(),
            distributed: tensor.is_distributed(),
        }
    }

    pub(super) fn restore<const D: usize>(self, inner: BurnTensor<D>, id: ParamId) -> BurnTensor<D> {
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
            // `Check` bound this tensor and its gradient already, so leasing them does not
            // fail; were it to, the tensor is consumed, and zeros are all there is to give.
            self.error = Some(e);
            BurnTensor::zeros(shape, &device)
        });
        Param::from_mapped_value(id, tensor, mapper)
    }
}
