//! The stateful optimizer a trainer holds: its parameters, zeroed state buffers, the step
//! count, and everything a step records, built once.

use crate::gpu::dispatch::{Batch, HyperRing};
use crate::gpu::kernel::{Family, VariantKey};
use crate::gpu::plan::{plan, Arg, KernelArgs};
use crate::gpu::step::KernelStep;
use crate::ops::{slot_args, SlotArgs};
use crate::{Adagrad, Adam, DType, Error, GpuContext, Result, Sgd, Tensor};

/// Steps that may be recorded between two submits (each needs its own uniform slot).
pub const STEPS_PER_SUBMIT: u32 = 64;

/// The algorithms the stateful optimizer runs, in PyTorch's conventions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Algorithm {
    /// Adam, AdamW or AMSGrad.
    Adam(Adam),
    /// SGD, with standard or Nesterov momentum or none.
    Sgd(Sgd),
    /// Adagrad.
    Adagrad(Adagrad),
}

impl From<Adam> for Algorithm {
    fn from(config: Adam) -> Self {
        Algorithm::Adam(config)
    }
}

impl From<Sgd> for Algorithm {
    fn from(config: Sgd) -> Self {
        Algorithm::Sgd(config)
    }
}

impl From<Adagrad> for Algorithm {
    fn from(config: Adagrad) -> Self {
        Algorithm::Adagrad(config)
    }
}

impl Algorithm {
    /// Checks the hyperparameters.
    pub fn validate(&self) -> Result<()> {
        match self {
            Algorithm::Adam(c) => c.validate(),
            Algorithm::Sgd(c) => c.validate(),
            Algorithm::Adagrad(c) => c.validate(),
        }
    }

    pub(crate) fn kernel_step(&self, t: u64) -> KernelStep {
        match self {
            Algorithm::Adam(c) => c.kernel_step(t),
            Algorithm::Sgd(c) => c.kernel_step(t),
            Algorithm::Adagrad(c) => c.kernel_step(t),
        }
    }

    /// The learning rate.
    pub fn lr(&self) -> f64 {
        match self {
            Algorithm::Adam(c) => c.lr,
            Algorithm::Sgd(c) => c.lr,
            Algorithm::Adagrad(c) => c.lr,
        }
    }

    fn with_lr(mut self, lr: f64) -> Self {
        match &mut self {
            Algorithm::Adam(c) => c.lr = lr,
            Algorithm::Sgd(c) => c.lr = lr,
            Algorithm::Adagrad(c) => c.lr = lr,
        }
        self
    }

    /// The state tensors this algorithm keeps per parameter, in PyTorch's order.
    pub fn state_kinds(&self) -> &'static [StateKind] {
        match self {
            Algorithm::Adam(c) if c.amsgrad => {
                &[StateKind::ExpAvg, StateKind::ExpAvgSq, StateKind::MaxExpAvgSq]
            }
            Algorithm::Adam(_) => &[StateKind::ExpAvg, StateKind::ExpAvgSq],
            Algorithm::Sgd(c) if c.keeps_buffer() => &[StateKind::MomentumBuffer],
            Algorithm::Sgd(_) => &[],
            Algorithm::Adagrad(_) => &[StateKind::Sum],
        }
    }

    /// The value a state tensor starts from.
    fn initial_state(&self) -> f64 {
        match self {
            Algorithm::Adagrad(c) => c.initial_accumulator_value,
            _ => 0.0,
        }
    }
}

/// A per-parameter state tensor, named as in PyTorch's `state_dict`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StateKind {
    /// Adam's first moment.
    ExpAvg,
    /// Adam's second moment.
    ExpAvgSq,
    /// AMSGrad's running maximum of the second moment.
    MaxExpAvgSq,
    /// SGD's momentum buffer.
    MomentumBuffer,
    /// Adagrad's sum of squared gradients.
    Sum,
}

impl StateKind {
    /// PyTorch's name for it, which is also the kernel's slot name.
    pub fn torch_name(self) -> &'static str {
        match self {
            StateKind::ExpAvg => "exp_avg",
            StateKind::ExpAvgSq => "exp_avg_sq",
            StateKind::MaxExpAvgSq => "max_exp_avg_sq",
            StateKind::MomentumBuffer => "momentum_buffer",
            StateKind::Sum => "sum",
        }
    }
}

/// Bind groups for one set of gradient tensors.
struct Bound {
    grads: Vec<Tensor>,
    batch: Batch,
}

/// A stateful optimizer over a fixed list of parameter tensors.
///
/// ```no_run
/// # fn main() -> wgpu_optim::Result<()> {
/// use wgpu_optim::{Adam, GpuContext, Optimizer};
/// let ctx = GpuContext::headless_blocking()?;
/// let params = vec![ctx.upload_f32("w", &[0.5; 1024])];
/// let grads = vec![ctx.upload_f32("dw", &[0.1; 1024])];
/// let mut opt = Optimizer::new(&ctx, Adam::default(), &params)?;
/// opt.step(&grads)?; // or opt.record_step(&mut encoder, &grads) inside a trainer's encoder
/// # Ok(()) }
/// ```
pub struct Optimizer {
    ctx: GpuContext,
    algorithm: Algorithm,
    params: Vec<Tensor>,
    model_copies: Vec<Tensor>,
    /// `state[i][k]` is parameter i's `algorithm.state_kinds()[k]`.
    state: Vec<Vec<Tensor>>,
    step: u64,
    ring: HyperRing,
    bound: Option<Bound>,
}

impl std::fmt::Debug for Optimizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Optimizer")
            .field("algorithm", &self.algorithm)
            .field("params", &self.params.len())
            .field("step", &self.step)
            .finish()
    }
}

/// Choices made once, when an optimizer is built.
#[derive(Clone, Debug, Default)]
pub struct OptimizerOptions {
    /// The storage dtype of every state tensor; `None` keeps each parameter's dtype, as
    /// PyTorch does. f32 state for f16 or bf16 parameters is the common mix; all math is
    /// f32 either way and each store rounds once to nearest even.
    pub state_dtype: Option<DType>,
    /// Master-weight mode: one low-precision copy per parameter (same length, usually f16
    /// or bf16), which every step writes with the new parameter values in the same dispatch,
    /// so the model reads its copy with no separate cast pass.
    pub model_copies: Vec<Tensor>,
}

impl Optimizer {
    /// An optimizer over `params` with zeroed state (Adagrad: its initial accumulator
    /// value), at step 0, keeping state in each parameter's dtype.
    ///
    /// The parameter buffers need `STORAGE` usage.
    pub fn new(ctx: &GpuContext, algorithm: impl Into<Algorithm>, params: &[Tensor]) -> Result<Self> {
        Self::with_options(ctx, algorithm, params, OptimizerOptions::default())
    }

    /// Master-weight mode over a model's low-precision parameters: the optimizer keeps f32
    /// master copies (initialized from `model_params`, which therefore need `COPY_SRC`) and
    /// f32 state, and each step writes the rounded new values back into `model_params`.
    pub fn master_weights(
        ctx: &GpuContext,
        algorithm: impl Into<Algorithm>,
        model_params: &[Tensor],
    ) -> Result<Self> {
        let masters = model_params
            .iter()
            .enumerate()
            .map(|(i, p)| Ok(ctx.upload(&format!("master[{i}]"), &ctx.read(p)?, DType::F32)))
            .collect::<Result<Vec<_>>>()?;
        let options = OptimizerOptions { state_dtype: Some(DType::F32), model_copies: model_params.to_vec() };
        Self::with_options(ctx, algorithm, &masters, options)
    }

    /// An optimizer over `params` with the given [`OptimizerOptions`].
    pub fn with_options(
        ctx: &GpuContext,
        algorithm: impl Into<Algorithm>,
        params: &[Tensor],
        options: OptimizerOptions,
    ) -> Result<Self> {
        let algorithm = algorithm.into();
        algorithm.validate()?;
        let double = params.first().is_some_and(|p| p.dtype == DType::F64);
        for (i, p) in params.iter().enumerate() {
            crate::gpu::plan::check_range(&Arg::new(format!("params[{i}]"), p))?;
            if (p.dtype == DType::F64) != double {
                return Err(Error::DTypeMismatch {
                    argument: format!("params[{i}]"),
                    got: p.dtype,
                    expected: "F64 for every parameter or for none (the math runs in one type)".into(),
                });
            }
        }
        if let Some(dtype) = options.state_dtype {
            if (dtype == DType::F64) != double {
                return Err(Error::DTypeMismatch {
                    argument: "options.state_dtype".into(),
                    got: dtype,
                    expected: if double {
                        "F64 for F64 parameters".into()
                    } else {
                        "F32, F16 or BF16".into()
                    },
                });
            }
        }
        if !options.model_copies.is_empty() && options.model_copies.len() != params.len() {
            return Err(Error::CountMismatch {
                argument: "options.model_copies".into(),
                got: options.model_copies.len(),
                expected: params.len(),
            });
        }
        for (i, (copy, p)) in options.model_copies.iter().zip(params).enumerate() {
            crate::gpu::plan::check_range(&Arg::new(format!("model_copies[{i}]"), copy))?;
            if copy.len != p.len {
                return Err(Error::LengthMismatch {
                    argument: format!("model_copies[{i}]"),
                    got: copy.len,
                    expected: p.len,
                    reference: format!("params[{i}]"),
                });
            }
        }
        let initial = algorithm.initial_state();
        let mut state = Vec::with_capacity(params.len());
        for (i, p) in params.iter().enumerate() {
            let dtype = options.state_dtype.unwrap_or(p.dtype);
            let mut tensors = Vec::new();
            for kind in algorithm.state_kinds() {
                let tensor = state_tensor(ctx, &format!("{}[{i}]", kind.torch_name()), p, dtype);
                if initial != 0.0 {
                    ctx.write(&tensor, &vec![initial; p.len as usize])?;
                }
                tensors.push(tensor);
            }
            state.push(tensors);
        }
        Ok(Optimizer {
            ring: HyperRing::new(ctx, STEPS_PER_SUBMIT, "optimizer")?,
            ctx: ctx.clone(),
            algorithm,
            params: params.to_vec(),
            model_copies: options.model_copies,
            state,
            step: 0,
            bound: None,
        })
    }

    /// The model's copies in master-weight mode (empty otherwise).
    pub fn model_copies(&self) -> &[Tensor] {
        &self.model_copies
    }

    /// The algorithm and its hyperparameters.
    pub fn algorithm(&self) -> &Algorithm {
        &self.algorithm
    }

    /// Changes the learning rate from the next step on (a schedule); no pipeline is rebuilt.
    pub fn set_lr(&mut self, lr: f64) -> Result<()> {
        let next = self.algorithm.with_lr(lr);
        next.validate()?;
        self.algorithm = next;
        Ok(())
    }

    /// The parameters.
    pub fn params(&self) -> &[Tensor] {
        &self.params
    }

    /// Steps taken so far.
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// Parameter `index`'s state tensor of `kind`, if the algorithm keeps one.
    pub fn state(&self, index: usize, kind: StateKind) -> Option<&Tensor> {
        let k = self.algorithm.state_kinds().iter().position(|s| *s == kind)?;
        self.state.get(index).map(|s| &s[k])
    }

    /// Records one step into the caller's encoder; nothing is submitted. Up to
    /// [`STEPS_PER_SUBMIT`] steps may be recorded before the encoders are submitted.
    ///
    /// Bind groups are built on the first step and whenever `grads` are different tensors
    /// from the previous step's; with the same gradient tensors a step creates no GPU objects.
    /// On error nothing is recorded and the step count is unchanged.
    pub fn record_step(&mut self, encoder: &mut wgpu::CommandEncoder, grads: &[Tensor]) -> Result<()> {
        self.bind(grads)?;
        let t = self.step + 1;
        let step = self.algorithm.kernel_step(t);
        let math = self.math();
        let offset = self.ring.push(self.ctx.queue(), &step, math);
        if let Some(bound) = &self.bound {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("wgpu-optim step"),
                timestamp_writes: None,
            });
            bound.batch.record(&mut pass, &self.ring, offset);
        }
        self.step = t;
        Ok(())
    }

    /// The type the arithmetic runs in: f64 for double parameters, f32 otherwise.
    fn math(&self) -> DType {
        match self.params.first().map(|p| p.dtype) {
            Some(DType::F64) => DType::F64,
            _ => DType::F32,
        }
    }

    /// Records one step and submits it.
    pub fn step(&mut self, grads: &[Tensor]) -> Result<()> {
        let ctx = self.ctx.clone();
        ctx.submit("wgpu-optim step", |encoder| self.record_step(encoder, grads)).map(|_| ())
    }

    /// Parameter `i`'s tensors in its family's slot order, all updated in place.
    fn kernel_args(&self, family: Family, i: usize, grad: &Tensor) -> KernelArgs {
        let param = Arg::new(format!("params[{i}]"), &self.params[i]);
        let kinds = self.algorithm.state_kinds();
        let state: Vec<Arg> = kinds
            .iter()
            .zip(&self.state[i])
            .map(|(kind, t)| Arg::new(format!("{}[{i}]", kind.torch_name()), t))
            .collect();
        let copy = self.model_copies.get(i).map(|c| Arg::new(format!("model_copies[{i}]"), c));
        let grad = Arg::new(format!("grads[{i}]"), grad);
        slot_args(
            family,
            kinds,
            SlotArgs {
                param: param.clone(),
                grad,
                state: &state,
                param_out: param,
                state_out: &state,
                param_copy: copy,
            },
        )
    }

    /// Builds the bind groups for `grads` unless they are the ones already bound.
    fn bind(&mut self, grads: &[Tensor]) -> Result<()> {
        if self.bound.as_ref().is_some_and(|b| b.grads == grads) {
            return Ok(());
        }
        if grads.len() != self.params.len() {
            return Err(Error::CountMismatch {
                argument: "grads".into(),
                got: grads.len(),
                expected: self.params.len(),
            });
        }
        let step = self.algorithm.kernel_step(1);
        let math = self.math();
        let mut items = Vec::with_capacity(self.params.len());
        for (i, grad) in grads.iter().enumerate() {
            let args = self.kernel_args(step.family, i, grad);
            let tensor_plan = plan(&self.ctx, step.family, &args)?;
            let key = VariantKey {
                family: step.family,
                math,
                layout: tensor_plan.layout.clone(),
                overrides: step.overrides,
            };
            items.push((key, tensor_plan));
        }
        let batch = Batch::build(&self.ctx, &items, "optimizer")?;
        self.bound = Some(Bound { grads: grads.to_vec(), batch });
        Ok(())
    }
}

/// A zeroed state tensor for `param`. A 16-bit state starts at the parameter's element
/// parity, so that packed stores of both pair up on the same words (one phase, not two).
fn state_tensor(ctx: &GpuContext, label: &str, param: &Tensor, dtype: DType) -> Tensor {
    let parity = if dtype.size() == 2 && param.dtype.size() == 2 { (param.offset / 2) % 2 } else { 0 };
    let padded = ctx.zeros(label, param.len + parity, dtype);
    Tensor::new(&padded.buffer, parity * 2, param.len, dtype)
}
