//! The f64 oracle (the `wgpu-optim-oracle` crate, a dev-dependency that depends on nothing
//! of this crate) for the unit tests that check internals against it: the CPU kernels under
//! the ONNX and DirectML conventions (`cpu/tests.rs`) and the GPU's 8-bit and 4-bit kernels
//! (`gpu/q8`, `gpu/q4`).
//!
//! The oracle has types of its own, under its sources' names. The functions here take this
//! crate's values and hand the oracle its own: configurations through [`ToOracle`] (each
//! family's, in its folder), stored states by their public fields.

use wgpu_optim_oracle as reference;

use crate::q4::Q4State;
use crate::q8::StoredState;
use crate::{Algorithm, DmlAdam, OnnxAdagrad, OnnxAdam, OnnxMomentum};

pub(crate) use reference::{BnbAdam, BnbSgd};

/// What the oracle's steps return.
type Outcome = reference::Result<()>;

/// A configuration of this crate as the oracle's own type. Each family implements it for
/// its configurations in its folder (`config.rs`, field by field), and the registry's
/// generated `Algorithm` dispatches to them, so that no file outside a family's folder takes
/// the family apart.
pub(crate) trait ToOracle {
    /// The oracle's type.
    type Oracle;
    /// The same configuration under the oracle's (its sources') names.
    fn to_oracle(&self) -> Self::Oracle;
}

fn stored_to_oracle(state: &StoredState) -> reference::State8bit {
    match state {
        StoredState::Q8 { codes, absmax } => {
            reference::State8bit::Q8 { codes: codes.clone(), absmax: absmax.clone() }
        }
        StoredState::F32(values) => reference::State8bit::F32(values.clone()),
    }
}

fn stored_from_oracle(state: reference::State8bit) -> StoredState {
    match state {
        reference::State8bit::Q8 { codes, absmax } => StoredState::Q8 { codes, absmax },
        reference::State8bit::F32(values) => StoredState::F32(values),
    }
}

/// Runs `step` on the oracle's copies of `states` and writes them back.
fn with_oracle_states<const N: usize>(
    states: [&mut StoredState; N],
    step: impl FnOnce(&mut [reference::State8bit]) -> Outcome,
) -> Outcome {
    let mut copies: Vec<_> = states.iter().map(|s| stored_to_oracle(s)).collect();
    let outcome = step(&mut copies);
    for (state, copy) in states.into_iter().zip(copies) {
        *state = stored_from_oracle(copy);
    }
    outcome
}

/// [`reference::bnb_adam8bit_step`] on this crate's states.
pub(crate) fn bnb_adam8bit_step(
    config: &BnbAdam,
    step: u64,
    param: &mut [f64],
    grad: &[f64],
    exp_avg: &mut StoredState,
    exp_avg_sq: &mut StoredState,
) -> Outcome {
    with_oracle_states([exp_avg, exp_avg_sq], |states| match states {
        [m, v] => reference::bnb_adam8bit_step(config, step, param, grad, m, v),
        _ => unreachable!("two states in, two out"),
    })
}

/// [`reference::bnb_sgd8bit_step`] on this crate's state.
pub(crate) fn bnb_sgd8bit_step(
    config: &BnbSgd,
    step: u64,
    param: &mut [f64],
    grad: &[f64],
    buffer: &mut StoredState,
) -> Outcome {
    with_oracle_states([buffer], |states| match states {
        [buffer] => reference::bnb_sgd8bit_step(config, step, param, grad, buffer),
        _ => unreachable!("one state in, one out"),
    })
}

/// [`reference::bnb_8bit_step`] on this crate's algorithm and states.
pub(crate) fn bnb_8bit_step(
    config: &Algorithm,
    step: u64,
    param: &mut [f64],
    grad: &[f64],
    states: &mut [StoredState],
) -> Outcome {
    let config = config.to_oracle();
    let mut copies: Vec<_> = states.iter().map(stored_to_oracle).collect();
    let outcome = reference::bnb_8bit_step(&config, step, param, grad, &mut copies);
    for (state, copy) in states.iter_mut().zip(copies) {
        *state = stored_from_oracle(copy);
    }
    outcome
}

/// torchao's 4-bit Adam ([`reference::ao4`]) on this crate's configuration and states.
pub(crate) mod ao4 {
    use super::{reference, Outcome, Q4State, ToOracle};

    pub(crate) use reference::ao4::unpack;

    fn to_oracle(state: &Q4State) -> reference::State4bit {
        match state {
            Q4State::Q4 { codes, scale } => {
                reference::State4bit::Q4 { codes: codes.clone(), scale: scale.clone() }
            }
            Q4State::F32(values) => reference::State4bit::F32(values.clone()),
        }
    }

    fn from_oracle(state: reference::State4bit) -> Q4State {
        match state {
            reference::State4bit::Q4 { codes, scale } => Q4State::Q4 { codes, scale },
            reference::State4bit::F32(values) => Q4State::F32(values),
        }
    }

    /// [`reference::ao4::zeros`] as this crate's state.
    pub(crate) fn zeros(len: usize, block_size: usize, min_size: usize) -> Q4State {
        from_oracle(reference::ao4::zeros(len, block_size, min_size))
    }

    /// [`reference::ao4_adam_step`] on this crate's configuration and states.
    pub(crate) fn ao4_adam_step(
        config: &crate::Adam,
        step: u64,
        block_size: usize,
        param: &mut [f64],
        grad: &[f64],
        exp_avg: &mut Q4State,
        exp_avg_sq: &mut Q4State,
    ) -> Outcome {
        let config = config.to_oracle();
        let (mut m, mut v) = (to_oracle(exp_avg), to_oracle(exp_avg_sq));
        let outcome = reference::ao4_adam_step(&config, step, block_size, param, grad, &mut m, &mut v);
        (*exp_avg, *exp_avg_sq) = (from_oracle(m), from_oracle(v));
        outcome
    }
}

/// [`reference::onnx_adam`] for this crate's configuration.
pub(crate) fn onnx_adam(
    a: &OnnxAdam,
    r: f64,
    t: u64,
    x: &[f64],
    g: &[f64],
    v: &[f64],
    h: &[f64],
) -> reference::OnnxAdamOutputs {
    reference::onnx_adam(&a.to_oracle(), r, t, x, g, v, h)
}

/// [`reference::dml_adam`] for this crate's configuration.
pub(crate) fn dml_adam(
    d: &DmlAdam,
    t: u64,
    parameters: &[f64],
    first_moment: &[f64],
    second_moment: &[f64],
    gradient: &[f64],
) -> reference::OnnxAdamOutputs {
    reference::dml_adam(&d.to_oracle(), t, parameters, first_moment, second_moment, gradient)
}

/// [`reference::onnx_momentum`] for this crate's configuration.
pub(crate) fn onnx_momentum(
    a: &OnnxMomentum,
    r: f64,
    t: u64,
    x: &[f64],
    g: &[f64],
    v: &[f64],
) -> reference::OnnxOutputs2 {
    reference::onnx_momentum(&a.to_oracle(), r, t, x, g, v)
}

/// [`reference::onnx_adagrad`] for this crate's configuration.
pub(crate) fn onnx_adagrad(
    a: &OnnxAdagrad,
    r: f64,
    t: u64,
    x: &[f64],
    g: &[f64],
    h: &[f64],
) -> reference::OnnxOutputs2 {
    reference::onnx_adagrad(&a.to_oracle(), r, t, x, g, h)
}
