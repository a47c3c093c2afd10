//! Muon and Adafactor in the drop-in [`FusedOptimizer`](super::FusedOptimizer): algorithms
//! whose step looks at a whole tensor by its shape (Newton-Schulz over a matrix, Adafactor's
//! row and column means), so not the elementwise update the others run per tensor.
//!
//! Burn's per-tensor trait hands a step one parameter, its gradient and its state; the step
//! builds a one-parameter [`Optimizer`] over the parameter's buffer with its shape (Burn's
//! tensors carry it), copies the state from the Burn tensors that keep it into the
//! optimizer's, records the optimizer's step, and copies the state back, all in one
//! submission. The optimizer is dropped after the step; [`ModuleStep`](super::ModuleStep)
//! keeps one over the whole module instead.

use burn::tensor::{Tensor as BurnTensor, TensorData};

use super::fused_state::FusedState;
use super::lease::{lease, Access, Leased};
use super::record::{burn_dtype, state_shape};
use super::SharedDevice;
use wgpu_optim::{Algorithm, BurnFailure, Error, Optimizer, Result, StateKind, Tensor};

/// One step of `algorithm` (Muon or Adafactor, its learning rate set and validated) on one
/// parameter whose `state` was checked against it. Nothing is written where it is refused;
/// the returned tensor is the parameter, updated in its buffer (or a copy where its storage
/// was shared), and `state` holds the new state and step count.
pub(super) fn step<const D: usize>(
    shared: &SharedDevice,
    algorithm: Algorithm,
    tensor: BurnTensor<D>,
    grad: BurnTensor<D>,
    state: &mut FusedState<D>,
) -> Result<BurnTensor<D>> {
    let shape = tensor.shape().to_vec();
    let device = tensor.device();
    let kinds = algorithm.param_state_kinds(&shape);
    let (tensor, param) = lease(shared, tensor, Access::Write, "the parameter")?;
    let (_, grad) = lease(shared, grad, Access::Read, "the gradient")?;
    let ctx = shared.context();
    let mut optimizer = Optimizer::builder().param_shapes(vec![shape.clone()]).build(
        ctx,
        algorithm,
        std::slice::from_ref(&param.tensor),
    )?;
    if state.time > 0 {
        optimizer.set_step_count(state.time as u64)?;
    }
    // Each state as a Burn tensor (a fresh one the first time: the optimizer's is zero, and the
    // copy after the step fills it), leased beside the optimizer's.
    let mut held: Vec<(BurnTensor<D>, Leased, Tensor)> = Vec::with_capacity(kinds.len());
    for &kind in kinds {
        let target = optimizer.tensor_state(0, kind).ok_or_else(|| internal(kind))?.clone();
        let name = kind.torch_name();
        let burn = match state.take_state(kind) {
            Some(t) => t,
            None => {
                let zeros = vec![0u8; target.byte_len() as usize];
                let data =
                    TensorData::from_bytes_vec(zeros, state_shape(kind, &shape), burn_dtype(target.dtype)?);
                BurnTensor::from_data(data, &device)
            }
        };
        let (burn, leased) = lease(shared, burn, Access::Write, &format!("the parameter's {name}"))?;
        check_fits(&leased.tensor, &target, name)?;
        held.push((burn, leased, target));
    }
    let mut encoder = ctx
        .device()
        .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("wgpu-optim Burn step") });
    if state.time > 0 {
        for (_, leased, target) in &held {
            copy(&mut encoder, &leased.tensor, target);
        }
    }
    optimizer.record_step(&mut encoder, std::slice::from_ref(&grad.tensor))?;
    for (_, leased, target) in &held {
        copy(&mut encoder, target, &leased.tensor);
    }
    // A refused submission comes back as an error, not to Burn's device's handler.
    ctx.catch("submitting a Burn step", || ctx.queue().submit([encoder.finish()]))?;
    for (&kind, (burn, _, _)) in kinds.iter().zip(held) {
        state.set_state(kind, burn);
    }
    Ok(tensor)
}

/// Refused where a kept state cannot be copied into the optimizer's: another dtype (a record
/// saved with other state dtypes), another length, or a byte length a buffer copy cannot
/// take (a 16-bit state of an odd length).
fn check_fits(kept: &Tensor, target: &Tensor, name: &str) -> Result<()> {
    if kept.dtype != target.dtype {
        return Err(Error::DTypeMismatch {
            argument: format!("the parameter's {name}"),
            got: kept.dtype,
            expected: format!("{:?}, the dtype its step keeps it in", target.dtype),
        });
    }
    if kept.len != target.len {
        return Err(Error::LengthMismatch {
            argument: format!("the parameter's {name}"),
            got: kept.len,
            expected: target.len,
            reference: "the parameter's shape".into(),
        });
    }
    if !target.byte_len().is_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT) {
        return Err(Error::Burn {
            cause: BurnFailure::Tensor,
            detail: format!(
                "the parameter's {name} is {} bytes, not a whole number of 4-byte words, which a \
                 buffer copy needs: step this parameter with ModuleStep, or keep an even number of \
                 16-bit elements",
                target.byte_len()
            ),
        });
    }
    Ok(())
}

fn copy(encoder: &mut wgpu::CommandEncoder, from: &Tensor, to: &Tensor) {
    encoder.copy_buffer_to_buffer(&from.buffer, from.offset, &to.buffer, to.offset, from.byte_len());
}

/// The error of an optimizer without the state its algorithm keeps (a bug, not input).
fn internal(kind: StateKind) -> Error {
    Error::Burn {
        cause: BurnFailure::Internal,
        detail: format!("internal: the one-parameter optimizer keeps no {}", kind.torch_name()),
    }
}
