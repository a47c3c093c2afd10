//! ONNX `ai.onnx.preview.training` operators (opset 1), taking exactly the operator's
//! inputs: the attributes, `R`, `T`, then the variadic tensors in the operator's order.
//!
//! Each output may be `None` (written in place over its input) or a tensor of its own.
//! All n tensors of one call are updated in one compute pass, whatever their lengths.
//! Tensors may be `F32` (`tensor(float)`) or `F64` (`tensor(double)`, which needs the
//! adapter feature `SHADER_F64`); the math runs in the tensors' type.

use crate::gpu::plan::{Arg, KernelArgs};
use crate::ops::record_stateless;
use crate::{Error, GpuContext, OnnxAdam, Result, Tensor};

fn check_count(argument: &str, got: usize, expected: usize) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        Err(Error::CountMismatch {
            argument: argument.into(),
            got,
            expected,
        })
    }
}

/// `Adam(R, T, X_1..X_n, G_1..G_n, V_1..V_n, H_1..H_n) -> (X_new_1..n, V_new_1..n, H_new_1..n)`.
///
/// `inputs` holds the 4n tensors after `R` and `T`, in the operator's order; `outputs` the
/// 3n outputs in the operator's order, `None` for in place. `V` is the first moment and
/// `H` the second. `T = 0` applies no bias correction, as the operator specifies.
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
    if !inputs.len().is_multiple_of(4) {
        return Err(Error::CountMismatch {
            argument: "inputs (X, G, V, H for each of n tensors)".into(),
            got: inputs.len(),
            expected: inputs.len().next_multiple_of(4),
        });
    }
    let n = inputs.len() / 4;
    check_count(
        "outputs (X_new, V_new, H_new for each of n tensors)",
        outputs.len(),
        3 * n,
    )?;
    let calls: Vec<KernelArgs> = (0..n)
        .map(|i| {
            let input =
                |k: usize, name: &str| Arg::new(format!("{name}_{}", i + 1), &inputs[k * n + i]);
            let output = |k: usize, name: &str, input: &Arg| {
                Some(match &outputs[k * n + i] {
                    Some(t) => Arg::new(format!("{name}_{}", i + 1), t),
                    None => input.clone(),
                })
            };
            let (x, g, v, h) = (input(0, "X"), input(1, "G"), input(2, "V"), input(3, "H"));
            KernelArgs {
                outputs: vec![
                    output(0, "X_new", &x),
                    output(1, "V_new", &v),
                    output(2, "H_new", &h),
                    None,
                ],
                inputs: vec![Some(x), Some(g), Some(v), Some(h), None],
            }
        })
        .collect();
    record_stateless(
        ctx,
        encoder,
        &attributes.kernel_step(r, t),
        &calls,
        "onnx.Adam",
    )
}
