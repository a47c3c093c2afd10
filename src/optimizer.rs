//! The stateful optimizer a trainer holds: its parameters, zeroed state buffers, the step
//! count, and everything a step records, built once.

use crate::gpu::dispatch::{Batch, HyperRing};
use crate::gpu::kernel::VariantKey;
use crate::gpu::plan::plan;
use crate::gpu::step::KernelStep;
use crate::ops::AdamTensors;
use crate::{Adam, DType, Error, GpuContext, Result, Tensor};

/// Steps that may be recorded between two submits (each needs its own uniform slot).
pub const STEPS_PER_SUBMIT: u32 = 64;

/// The algorithms the stateful optimizer runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Algorithm {
    /// PyTorch's Adam, AdamW or AMSGrad.
    Adam(Adam),
}

impl From<Adam> for Algorithm {
    fn from(config: Adam) -> Self {
        Algorithm::Adam(config)
    }
}

impl Algorithm {
    fn validate(&self) -> Result<()> {
        match self {
            Algorithm::Adam(c) => c.validate(),
        }
    }

    fn kernel_step(&self, t: u64) -> KernelStep {
        match self {
            Algorithm::Adam(c) => c.kernel_step(t),
        }
    }

    /// The state tensors this algorithm keeps per parameter.
    fn state_kinds(&self) -> &'static [StateKind] {
        match self {
            Algorithm::Adam(c) if c.amsgrad => &[
                StateKind::ExpAvg,
                StateKind::ExpAvgSq,
                StateKind::MaxExpAvgSq,
            ],
            Algorithm::Adam(_) => &[StateKind::ExpAvg, StateKind::ExpAvgSq],
        }
    }
}

/// A per-parameter state tensor, named as in PyTorch's `state_dict`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StateKind {
    /// First moment.
    ExpAvg,
    /// Second moment.
    ExpAvgSq,
    /// AMSGrad's running maximum of the second moment.
    MaxExpAvgSq,
}

impl StateKind {
    /// PyTorch's name for it.
    pub fn torch_name(self) -> &'static str {
        match self {
            StateKind::ExpAvg => "exp_avg",
            StateKind::ExpAvgSq => "exp_avg_sq",
            StateKind::MaxExpAvgSq => "max_exp_avg_sq",
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
    pub fn new(
        ctx: &GpuContext,
        algorithm: impl Into<Algorithm>,
        params: &[Tensor],
    ) -> Result<Self> {
        let algorithm = algorithm.into();
        algorithm.validate()?;
        for (i, p) in params.iter().enumerate() {
            crate::gpu::plan::check_range(&crate::gpu::plan::Arg::new(format!("params[{i}]"), p))?;
            if p.dtype != params[0].dtype {
                return Err(Error::DTypeMismatch {
                    argument: format!("params[{i}]"),
                    got: p.dtype,
                    expected: format!("{:?} like params[0]", params[0].dtype),
                });
            }
        }
        let state = params
            .iter()
            .enumerate()
            .map(|(i, p)| {
                algorithm
                    .state_kinds()
                    .iter()
                    .map(|kind| ctx.zeros(&format!("{}[{i}]", kind.torch_name()), p.len, p.dtype))
                    .collect()
            })
            .collect();
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
        let mut next = self.algorithm;
        match &mut next {
            Algorithm::Adam(c) => c.lr = lr,
        }
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
        let k = self
            .algorithm
            .state_kinds()
            .iter()
            .position(|s| *s == kind)?;
        self.state.get(index).map(|s| &s[k])
    }

    /// Records one step into the caller's encoder; nothing is submitted. Up to
    /// [`STEPS_PER_SUBMIT`] steps may be recorded before the encoders are submitted.
    ///
    /// Bind groups are built on the first step and whenever `grads` are different tensors
    /// from the previous step's; with the same gradient tensors a step creates no GPU objects.
    /// On error nothing is recorded and the step count is unchanged.
    pub fn record_step(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        grads: &[Tensor],
    ) -> Result<()> {
        self.bind(grads)?;
        let t = self.step + 1;
        let step = self.algorithm.kernel_step(t);
        let math = self.params.first().map_or(DType::F32, |p| p.dtype);
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

    /// Records one step and submits it.
    pub fn step(&mut self, grads: &[Tensor]) -> Result<()> {
        let ctx = self.ctx.clone();
        ctx.submit("wgpu-optim step", |encoder| {
            self.record_step(encoder, grads)
        })
        .map(|_| ())
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
        let math = self.params.first().map_or(DType::F32, |p| p.dtype);
        let mut items = Vec::with_capacity(self.params.len());
        for (i, (param, grad)) in self.params.iter().zip(grads).enumerate() {
            let name = |field: &str| match field {
                "grad" => format!("grads[{i}]"),
                "param" | "param_out" => format!("params[{i}]"),
                state => format!("{}[{i}]", state.trim_end_matches("_out")),
            };
            let args = match self.algorithm {
                Algorithm::Adam(c) => {
                    let s = &self.state[i];
                    let mut io = AdamTensors::in_place(param, grad, &s[0], &s[1]);
                    io.max_exp_avg_sq = s.get(2).cloned();
                    io.kernel_args(c.amsgrad, name)?
                }
            };
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
        self.bound = Some(Bound {
            grads: grads.to_vec(),
            batch,
        });
        Ok(())
    }
}
