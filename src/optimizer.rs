//! The stateful optimizer a trainer holds: its parameters, zeroed state buffers, the step
//! count, and everything a step records, built once.

use crate::gpu::dispatch::{Batch, HyperRing};
use crate::gpu::kernel::{Family, VariantKey};
use crate::gpu::plan::{plan, Arg, KernelArgs};
use crate::gpu::step::KernelStep;
use crate::ops::slot_args;
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

impl Optimizer {
    /// An optimizer over `params` with zeroed state, at step 0.
    ///
    /// All parameters must share one dtype; their buffers need `STORAGE` usage.
    pub fn new(ctx: &GpuContext, algorithm: impl Into<Algorithm>, params: &[Tensor]) -> Result<Self> {
        let algorithm = algorithm.into();
        algorithm.validate()?;
        for (i, p) in params.iter().enumerate() {
            crate::gpu::plan::check_range(&Arg::new(format!("params[{i}]"), p))?;
            if p.dtype != params[0].dtype {
                return Err(Error::DTypeMismatch {
                    argument: format!("params[{i}]"),
                    got: p.dtype,
                    expected: format!("{:?} like params[0]", params[0].dtype),
                });
            }
        }
        let initial = algorithm.initial_state();
        let mut state = Vec::with_capacity(params.len());
        for (i, p) in params.iter().enumerate() {
            let mut tensors = Vec::new();
            for kind in algorithm.state_kinds() {
                let tensor = ctx.zeros(&format!("{}[{i}]", kind.torch_name()), p.len, p.dtype);
                if initial != 0.0 {
                    ctx.write_bytes(&tensor, &p.dtype.encode(&vec![initial; p.len as usize]))?;
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
            state,
            step: 0,
            bound: None,
        })
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
        slot_args(family, kinds, param.clone(), Arg::new(format!("grads[{i}]"), grad), &state, param, &state)
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
