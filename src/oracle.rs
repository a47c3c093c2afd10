//! The testkit's f64 oracle (`wgpu_optim_testkit::oracle`, a dev-dependency) for the unit
//! tests that check internals against it: the CPU kernels under the ONNX and DirectML
//! conventions (`cpu/tests.rs`) and the GPU's 8-bit and 4-bit kernels (`gpu/q8`, `gpu/q4`).
//!
//! The testkit links wgpu-optim as a crate of its own (`wgpu_optim_testkit::library`): the
//! same definitions, other types. The functions here take this crate's values and hand the
//! oracle its own: configurations field by field, or through their checkpoint JSON with a
//! check that nothing was lost; stored states by their public fields.

use wgpu_optim_testkit::library as theirs;
use wgpu_optim_testkit::oracle as reference;

use crate::q4::Q4State;
use crate::q8::StoredState;
use crate::{Algorithm, DmlAdam, MomentumMode, OnnxAdagrad, OnnxAdam, OnnxMomentum};

pub(crate) use reference::{BnbAdam, BnbSgd};

/// What the oracle's steps return: its own crate's result (its errors print the same).
type Outcome = theirs::Result<()>;

/// `algorithm` as the oracle's crate spells it: through the checkpoint JSON both read, and
/// checked field for field by the two `Debug` forms.
fn algorithm(algorithm: &Algorithm) -> theirs::Algorithm {
    let copy = theirs::Algorithm::from_json(&algorithm.to_json())
        .unwrap_or_else(|e| panic!("{algorithm:?} did not cross to the oracle: {e}"));
    assert_eq!(format!("{copy:?}"), format!("{algorithm:?}"), "the JSON lost a field");
    copy
}

fn stored_to_oracle(state: &StoredState) -> theirs::q8::StoredState {
    match state {
        StoredState::Q8 { codes, absmax } => {
            theirs::q8::StoredState::Q8 { codes: codes.clone(), absmax: absmax.clone() }
        }
        StoredState::F32(values) => theirs::q8::StoredState::F32(values.clone()),
    }
}

fn stored_from_oracle(state: theirs::q8::StoredState) -> StoredState {
    match state {
        theirs::q8::StoredState::Q8 { codes, absmax } => StoredState::Q8 { codes, absmax },
        theirs::q8::StoredState::F32(values) => StoredState::F32(values),
    }
}

/// Runs `step` on the oracle's copies of `states` and writes them back.
fn with_oracle_states<const N: usize>(
    states: [&mut StoredState; N],
    step: impl FnOnce(&mut [theirs::q8::StoredState]) -> Outcome,
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
    let config = algorithm(config);
    let mut copies: Vec<_> = states.iter().map(stored_to_oracle).collect();
    let outcome = reference::bnb_8bit_step(&config, step, param, grad, &mut copies);
    for (state, copy) in states.iter_mut().zip(copies) {
        *state = stored_from_oracle(copy);
    }
    outcome
}

/// torchao's 4-bit Adam ([`reference::ao4`]) on this crate's configuration and states.
pub(crate) mod ao4 {
    use super::{reference, theirs, Outcome, Q4State};

    pub(crate) use reference::ao4::unpack;

    fn to_oracle(state: &Q4State) -> theirs::q4::Q4State {
        match state {
            Q4State::Q4 { codes, scale } => {
                theirs::q4::Q4State::Q4 { codes: codes.clone(), scale: scale.clone() }
            }
            Q4State::F32(values) => theirs::q4::Q4State::F32(values.clone()),
        }
    }

    fn from_oracle(state: theirs::q4::Q4State) -> Q4State {
        match state {
            theirs::q4::Q4State::Q4 { codes, scale } => Q4State::Q4 { codes, scale },
            theirs::q4::Q4State::F32(values) => Q4State::F32(values),
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
        let config = match super::algorithm(&(*config).into()) {
            theirs::Algorithm::Adam(adam) => adam,
            other => panic!("Adam crossed as {other:?}"),
        };
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
    let OnnxAdam { alpha, beta, epsilon, norm_coefficient, norm_coefficient_post } = *a;
    let a = theirs::OnnxAdam { alpha, beta, epsilon, norm_coefficient, norm_coefficient_post };
    reference::onnx_adam(&a, r, t, x, g, v, h)
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
    let DmlAdam { learning_rate, beta1, beta2, epsilon } = *d;
    let d = theirs::DmlAdam { learning_rate, beta1, beta2, epsilon };
    reference::dml_adam(&d, t, parameters, first_moment, second_moment, gradient)
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
    let OnnxMomentum { alpha, beta, mode, norm_coefficient } = *a;
    let mode = match mode {
        MomentumMode::Standard => theirs::MomentumMode::Standard,
        MomentumMode::Nesterov => theirs::MomentumMode::Nesterov,
    };
    reference::onnx_momentum(&theirs::OnnxMomentum { alpha, beta, mode, norm_coefficient }, r, t, x, g, v)
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
    let OnnxAdagrad { decay_factor, epsilon, norm_coefficient } = *a;
    reference::onnx_adagrad(&theirs::OnnxAdagrad { decay_factor, epsilon, norm_coefficient }, r, t, x, g, h)
}
