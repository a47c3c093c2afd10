//! Stateless operator front ends: each call updates the tensors it is given, with every
//! output either its input's range (in place) or a range of its own (DirectML's rule).
//!
//! These calls build their bind groups per call; a trainer that steps the same tensors
//! every iteration should hold an [`Optimizer`](crate::Optimizer), which builds them once.

pub mod directml;
pub mod onnx;

use crate::gpu::dispatch::{Batch, HyperRing};
use crate::gpu::kernel::VariantKey;
use crate::gpu::plan::{plan, plan_dtype, Arg, KernelArgs};
use crate::gpu::step::KernelStep;
use crate::{Adam, DType, Error, GpuContext, Result, Tensor};

/// The tensors of one stateless Adam update. An output left `None` is written in place
/// over its input; an output given as a tensor is written there (it may also be exactly
/// its input's range, which is the same as `None`).
#[derive(Clone, Debug)]
pub struct AdamTensors {
    /// Parameters.
    pub param: Tensor,
    /// Gradients.
    pub grad: Tensor,
    /// First moment (`exp_avg`).
    pub exp_avg: Tensor,
    /// Second moment (`exp_avg_sq`).
    pub exp_avg_sq: Tensor,
    /// Running maximum of the second moment; required when `amsgrad` is set, ignored otherwise.
    pub max_exp_avg_sq: Option<Tensor>,
    /// Where the new parameters go (`None`: in place).
    pub param_out: Option<Tensor>,
    /// Where the new first moment goes (`None`: in place).
    pub exp_avg_out: Option<Tensor>,
    /// Where the new second moment goes (`None`: in place).
    pub exp_avg_sq_out: Option<Tensor>,
    /// Where the new maximum goes (`None`: in place).
    pub max_exp_avg_sq_out: Option<Tensor>,
}

impl AdamTensors {
    /// All four (three without AMSGrad) tensors updated in place.
    pub fn in_place(param: &Tensor, grad: &Tensor, exp_avg: &Tensor, exp_avg_sq: &Tensor) -> Self {
        AdamTensors {
            param: param.clone(),
            grad: grad.clone(),
            exp_avg: exp_avg.clone(),
            exp_avg_sq: exp_avg_sq.clone(),
            max_exp_avg_sq: None,
            param_out: None,
            exp_avg_out: None,
            exp_avg_sq_out: None,
            max_exp_avg_sq_out: None,
        }
    }

    /// Kernel arguments in the Adam family's slot order; `name` turns a field name into
    /// the name errors use.
    pub(crate) fn kernel_args(
        &self,
        amsgrad: bool,
        name: impl Fn(&str) -> String,
    ) -> Result<KernelArgs> {
        let out = |slot: &str, output: &Option<Tensor>, input: &Tensor| {
            Some(Arg::new(name(slot), output.as_ref().unwrap_or(input)))
        };
        let (vmax_in, vmax_out) = match (amsgrad, &self.max_exp_avg_sq) {
            (false, _) => (None, None),
            (true, Some(vmax)) => (
                Some(Arg::new(name("max_exp_avg_sq"), vmax)),
                out("max_exp_avg_sq_out", &self.max_exp_avg_sq_out, vmax),
            ),
            (true, None) => {
                return Err(Error::CountMismatch {
                    argument: name("max_exp_avg_sq"),
                    got: 0,
                    expected: 1,
                })
            }
        };
        Ok(KernelArgs {
            inputs: vec![
                Some(Arg::new(name("param"), &self.param)),
                Some(Arg::new(name("grad"), &self.grad)),
                Some(Arg::new(name("exp_avg"), &self.exp_avg)),
                Some(Arg::new(name("exp_avg_sq"), &self.exp_avg_sq)),
                vmax_in,
            ],
            outputs: vec![
                out("param_out", &self.param_out, &self.param),
                out("exp_avg_out", &self.exp_avg_out, &self.exp_avg),
                out("exp_avg_sq_out", &self.exp_avg_sq_out, &self.exp_avg_sq),
                vmax_out,
            ],
        })
    }
}

/// One PyTorch-convention Adam/AdamW/AMSGrad update of each entry of `tensors` at step `t`
/// (counted from 1), recorded into `encoder` as one compute pass.
pub fn adam(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    config: &Adam,
    t: u64,
    tensors: &[AdamTensors],
) -> Result<()> {
    config.validate()?;
    if t == 0 {
        return Err(Error::BadStep(
            "PyTorch's Adam counts steps from 1; step 0 would divide by 1 - beta^0 = 0".into(),
        ));
    }
    let args = tensors
        .iter()
        .enumerate()
        .map(|(i, io)| io.kernel_args(config.amsgrad, |field| format!("tensors[{i}].{field}")))
        .collect::<Result<Vec<_>>>()?;
    record_stateless(ctx, encoder, &config.kernel_step(t), &args, "adam")
}

/// Plans every call, then records them as one compute pass with a one-slot uniform.
/// Nothing is recorded unless every call is valid.
pub(crate) fn record_stateless(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    step: &KernelStep,
    calls: &[KernelArgs],
    label: &str,
) -> Result<()> {
    let mut items = Vec::with_capacity(calls.len());
    let mut math = None;
    for args in calls {
        let tensor_plan = plan(ctx, step.family, args)?;
        let dtype = plan_dtype(args).unwrap_or(DType::F32);
        match math {
            None => math = Some(dtype),
            Some(m) if m != dtype => {
                return Err(Error::DTypeMismatch {
                    argument: format!("{label} tensor {}", items.len()),
                    got: dtype,
                    expected: format!("{m:?} like the first tensor of the call"),
                })
            }
            Some(_) => {}
        }
        let key = VariantKey {
            family: step.family,
            math: dtype,
            layout: tensor_plan.layout.clone(),
            overrides: step.overrides,
        };
        items.push((key, tensor_plan));
    }
    let math = math.unwrap_or(DType::F32);
    let batch = Batch::build(ctx, &items, label)?;
    let mut ring = HyperRing::new(ctx, 1, label)?;
    let offset = ring.push(ctx.queue(), step, math);
    let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
        label: Some(label),
        timestamp_writes: None,
    });
    batch.record(&mut pass, &ring, offset);
    Ok(())
}
