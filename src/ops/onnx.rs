//! ONNX `ai.onnx.preview.training` operators (opset 1), taking exactly the operator's
//! inputs: the attributes, `R`, `T`, then the variadic tensors in the operator's order
//! (all X, then all G, then each state), and producing its outputs in its order.
//!
//! Each output may be `None` (written in place over its input) or a tensor of its own.
//! All n tensors of one call are updated in one compute pass, whatever their lengths.
//! Tensors may be `F32` (`tensor(float)`) or `F64` (`tensor(double)`, which needs the
//! adapter feature `SHADER_F64`); the math runs in the tensors' type.
//!
//! ```no_run
//! # fn main() -> wgpu_optim::Result<()> {
//! use wgpu_optim::{ops::onnx, DType, GpuContext, OnnxAdam};
//!
//! let ctx = GpuContext::headless_blocking()?;
//! let [x, g, v, h] = ["X", "G", "V", "H"].map(|name| ctx.upload(name, &[0.5; 256], DType::F32));
//! let mut encoder = ctx.device().create_command_encoder(&Default::default());
//! // n = 1, every output in place: X_new over X, V_new over V, H_new over H.
//! onnx::adam(&ctx, &mut encoder, &OnnxAdam::default(), 0.01, 1, &[x, g, v, h], &[None, None, None])?;
//! ctx.queue().submit([encoder.finish()]);
//! # Ok(()) }
//! ```

use crate::gpu::plan::{Arg, KernelArgs};
use crate::ops::record_stateless;
use crate::step::{KernelStep, Slot};
use crate::{Error, GpuContext, OnnxAdagrad, OnnxAdam, OnnxMomentum, Result, StateKind, Tensor};

/// An operator's variadic inputs after `R` and `T`: each group's ONNX name and the kernel
/// slot it feeds. Every group but `G` has an output, named `<group>_new`.
struct Signature {
    op: &'static str,
    groups: &'static [(&'static str, Slot)],
}

const ADAM: Signature = Signature {
    op: "Adam",
    groups: &[
        ("X", Slot::Param),
        ("G", Slot::Grad),
        ("V", Slot::State(StateKind::ExpAvg)),
        ("H", Slot::State(StateKind::ExpAvgSq)),
    ],
};
const MOMENTUM: Signature = Signature {
    op: "Momentum",
    groups: &[("X", Slot::Param), ("G", Slot::Grad), ("V", Slot::State(StateKind::MomentumBuffer))],
};
const ADAGRAD: Signature = Signature {
    op: "Adagrad",
    groups: &[("X", Slot::Param), ("G", Slot::Grad), ("H", Slot::State(StateKind::Sum))],
};

/// `Adam(R, T, X_1..X_n, G_1..G_n, V_1..V_n, H_1..H_n) -> (X_new_1..n, V_new_1..n, H_new_1..n)`.
///
/// `V` is the first moment and `H` the second. `T = 0` applies no bias correction.
pub fn adam(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    attributes: &OnnxAdam,
    r: f64,
    t: u64,
    inputs: &[Tensor],
    outputs: &[Option<Tensor>],
) -> Result<()> {
    attributes.validate(r, t)?;
    variadic(ctx, encoder, &ADAM, &attributes.kernel_step(r, t), inputs, outputs)
}

/// `Momentum(R, T, X_1..X_n, G_1..G_n, V_1..V_n) -> (X_new_1..n, V_new_1..n)`, standard or
/// Nesterov by `attributes.mode`. At `T = 0` the gradient's coefficient `beta` is 1.
pub fn momentum(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    attributes: &OnnxMomentum,
    r: f64,
    t: u64,
    inputs: &[Tensor],
    outputs: &[Option<Tensor>],
) -> Result<()> {
    attributes.validate(r)?;
    variadic(ctx, encoder, &MOMENTUM, &attributes.kernel_step(r, t), inputs, outputs)
}

/// `Adagrad(R, T, X_1..X_n, G_1..G_n, H_1..H_n) -> (X_new_1..n, H_new_1..n)`, with the
/// learning rate `R / (1 + T * decay_factor)`.
pub fn adagrad(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    attributes: &OnnxAdagrad,
    r: f64,
    t: u64,
    inputs: &[Tensor],
    outputs: &[Option<Tensor>],
) -> Result<()> {
    attributes.validate(r, t)?;
    variadic(ctx, encoder, &ADAGRAD, &attributes.kernel_step(r, t), inputs, outputs)
}

/// Maps the flat ONNX lists onto one kernel call per tensor and records them in one pass.
fn variadic(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    signature: &Signature,
    step: &KernelStep,
    inputs: &[Tensor],
    outputs: &[Option<Tensor>],
) -> Result<()> {
    let groups = signature.groups.len();
    let names: Vec<&str> = signature.groups.iter().map(|(name, _)| *name).collect();
    if !inputs.len().is_multiple_of(groups) {
        return Err(Error::CountMismatch {
            argument: format!("inputs of {} ({} for each of n tensors)", signature.op, names.join(", ")),
            got: inputs.len(),
            expected: inputs.len().next_multiple_of(groups),
        });
    }
    let n = inputs.len() / groups;
    if outputs.len() != (groups - 1) * n {
        return Err(Error::CountMismatch {
            argument: format!("outputs of {} (one per non-gradient input)", signature.op),
            got: outputs.len(),
            expected: (groups - 1) * n,
        });
    }
    let family = step.family();
    let calls: Vec<KernelArgs> = (0..n)
        .map(|i| {
            let mut input_args = Vec::new();
            let mut output_args = Vec::new();
            let mut output_group = 0;
            for (g, (name, slot)) in signature.groups.iter().enumerate() {
                let input = Arg::new(format!("{name}_{}", i + 1), &inputs[g * n + i]);
                if *slot != Slot::Grad {
                    let output = match &outputs[output_group * n + i] {
                        Some(t) => Arg::new(format!("{name}_new_{}", i + 1), t),
                        None => input.clone(),
                    };
                    output_args.push((*slot, output));
                    output_group += 1;
                }
                input_args.push((*slot, input));
            }
            let pick = |list: &[(Slot, Arg)], slot: &Slot| {
                list.iter().find(|(s, _)| s == slot).map(|(_, a)| a.clone())
            };
            KernelArgs {
                inputs: family.inputs().iter().map(|slot| pick(&input_args, slot)).collect(),
                outputs: family.outputs().iter().map(|slot| pick(&output_args, slot)).collect(),
            }
        })
        .collect();
    record_stateless(ctx, encoder, step, &calls, signature.op)
}
