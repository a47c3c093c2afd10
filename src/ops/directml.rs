//! DirectML's `DML_ADAM_OPTIMIZER_OPERATOR_DESC`, member by member, with its binding rule:
//! each output may alias an eligible input (same size and type) or have memory of its own.
//!
//! ```no_run
//! # fn main() -> wgpu_optim::Result<()> {
//! use wgpu_optim::ops::directml::{self, AdamOptimizerDesc, TrainingStep};
//! use wgpu_optim::{DType, DmlAdam, GpuContext};
//!
//! let ctx = GpuContext::headless_blocking()?;
//! let [p, m, v, g] = ["p", "m", "v", "g"].map(|name| ctx.upload(name, &[0.5; 256], DType::F32));
//! let desc = AdamOptimizerDesc {
//!     // Every output aliases its input: an in-place update.
//!     output_parameters_tensor: p.clone(),
//!     output_first_moment_tensor: m.clone(),
//!     output_second_moment_tensor: v.clone(),
//!     input_parameters_tensor: p,
//!     input_first_moment_tensor: m,
//!     input_second_moment_tensor: v,
//!     gradient_tensor: g,
//!     training_step_tensor: TrainingStep::Integer(1),
//!     scalars: DmlAdam { learning_rate: 0.001, beta1: 0.9, beta2: 0.999, epsilon: 1e-8 },
//! };
//! let mut encoder = ctx.device().create_command_encoder(&Default::default());
//! directml::adam(&ctx, &mut encoder, &desc)?;
//! ctx.queue().submit([encoder.finish()]);
//! # Ok(()) }
//! ```

use crate::gpu::plan::{Arg, KernelArgs};
use crate::ops::record_stateless;
use crate::{DmlAdam, Error, GpuContext, Result, StepProblem, Tensor};

/// The value of `TrainingStepTensor`. DirectML's documentation gives it as UINT32 in the
/// member text and as the parameters' float type in the support table; both are accepted,
/// a float only when it holds a whole number. Exhaustive: those are the two forms the
/// operator takes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TrainingStep {
    /// An integer step.
    Integer(u64),
    /// A float holding a whole number.
    Float(f64),
}

impl TrainingStep {
    /// The step as an integer, or an error saying why it is not one.
    pub fn value(self) -> Result<u64> {
        match self {
            TrainingStep::Integer(t) => Ok(t),
            TrainingStep::Float(t) if t.is_finite() && t >= 0.0 && t.fract() == 0.0 && t < 2f64.powi(53) => {
                Ok(t as u64)
            }
            TrainingStep::Float(t) => Err(Error::BadStep {
                argument: "TrainingStepTensor",
                step: t,
                problem: StepProblem::NotWhole,
            }),
        }
    }
}

/// `DML_ADAM_OPTIMIZER_OPERATOR_DESC`: five inputs, three outputs, four scalars.
///
/// To update in place, pass an input tensor again as its output.
#[derive(Clone, Debug)]
pub struct AdamOptimizerDesc {
    /// `InputParametersTensor`.
    pub input_parameters_tensor: Tensor,
    /// `InputFirstMomentTensor`.
    pub input_first_moment_tensor: Tensor,
    /// `InputSecondMomentTensor`.
    pub input_second_moment_tensor: Tensor,
    /// `GradientTensor`.
    pub gradient_tensor: Tensor,
    /// `TrainingStepTensor` (a scalar; must be >= 1).
    pub training_step_tensor: TrainingStep,
    /// `OutputParametersTensor`.
    pub output_parameters_tensor: Tensor,
    /// `OutputFirstMomentTensor`.
    pub output_first_moment_tensor: Tensor,
    /// `OutputSecondMomentTensor`.
    pub output_second_moment_tensor: Tensor,
    /// `LearningRate`, `Beta1`, `Beta2`, `Epsilon`.
    pub scalars: DmlAdam,
}

/// Records the operator into `encoder`. Nothing is recorded if any check fails.
pub fn adam(ctx: &GpuContext, encoder: &mut wgpu::CommandEncoder, desc: &AdamOptimizerDesc) -> Result<()> {
    let t = desc.training_step_tensor.value()?;
    desc.scalars.validate(t)?;
    let args = KernelArgs {
        inputs: vec![
            Some(Arg::new("InputParametersTensor", &desc.input_parameters_tensor)),
            Some(Arg::new("GradientTensor", &desc.gradient_tensor)),
            Some(Arg::new("InputFirstMomentTensor", &desc.input_first_moment_tensor)),
            Some(Arg::new("InputSecondMomentTensor", &desc.input_second_moment_tensor)),
            None,
            None,
        ],
        outputs: vec![
            Some(Arg::new("OutputParametersTensor", &desc.output_parameters_tensor)),
            Some(Arg::new("OutputFirstMomentTensor", &desc.output_first_moment_tensor)),
            Some(Arg::new("OutputSecondMomentTensor", &desc.output_second_moment_tensor)),
            None,
            None,
            None,
        ],
    };
    record_stateless(ctx, encoder, &desc.scalars.kernel_step(t), &[args], "dml.Adam")
}
