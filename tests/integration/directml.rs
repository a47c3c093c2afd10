//! DirectML's `DML_ADAM_OPTIMIZER_OPERATOR_DESC`, one test per line of its documented pseudo
//! code, each with the expected values written out from that line alone (not from the
//! oracle):
//!
//! ```text
//! M = Beta1 * M + (1.0 - Beta1) * G
//! V = Beta2 * V + (1.0 - Beta2) * G * G
//! Alpha = sqrt(1.0 - pow(Beta2, T)) / (1.0 - pow(Beta1, T))
//! X -= LearningRate * Alpha * M / (sqrt(V) + Epsilon)
//! ```
//!
//! Epsilon sits next to `sqrt(V)` and both bias corrections are in the rate, as in ONNX's
//! Adam; PyTorch's placement (`sqrt(v) / sqrt(1 - beta2^t) + eps`) fails the last two tests.

use crate::common;

use common::{assert_close, ctx, download, Tolerance};
use wgpu_optim::ops::directml::{self, AdamOptimizerDesc, TrainingStep};
use wgpu_optim::{DType, DmlAdam, GpuContext, Tensor};
use wgpu_optim_testkit::oracle::{self, ToOracle};

/// One DirectML Adam call on f32 tensors, written out of place: the new (X, M, V).
fn run(
    ctx: &GpuContext,
    scalars: DmlAdam,
    t: u64,
    x: &[f64],
    m: &[f64],
    v: &[f64],
    g: &[f64],
) -> [Vec<f64>; 3] {
    let input = |values: &[f64]| ctx.upload("input", values, DType::F32);
    let output = |like: &Tensor| ctx.zeros("output", like.len, DType::F32);
    let (x_in, m_in, v_in, g_in) = (input(x), input(m), input(v), input(g));
    let outputs = [output(&x_in), output(&m_in), output(&v_in)];
    let desc = AdamOptimizerDesc {
        input_parameters_tensor: x_in,
        input_first_moment_tensor: m_in,
        input_second_moment_tensor: v_in,
        gradient_tensor: g_in,
        training_step_tensor: TrainingStep::Integer(t),
        output_parameters_tensor: outputs[0].clone(),
        output_first_moment_tensor: outputs[1].clone(),
        output_second_moment_tensor: outputs[2].clone(),
        scalars,
    };
    ctx.submit("dml.Adam", |encoder| directml::adam(ctx, encoder, &desc)).unwrap();
    outputs.map(|t| download(ctx, &t))
}

/// The GPU and the oracle both match `want` (f32 arithmetic: a relative 2e-6).
fn check(what: &str, got_gpu: &[f64], got_oracle: &[f64], want: &[f64]) {
    assert_close(&format!("{what} (GPU)"), got_gpu, want, Tolerance::Close { rtol: 2e-6, atol: 0.0 });
    assert_close(&format!("{what} (oracle)"), got_oracle, want, Tolerance::F64);
}

/// Values exactly representable in f32.
fn f32s(values: &[f64]) -> Vec<f64> {
    values.iter().map(|v| f64::from(*v as f32)).collect()
}

/// The first two lines of the pseudo code, in f64.
fn moments(beta1: f64, beta2: f64, m: &[f64], v: &[f64], g: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let m_new = m.iter().zip(g).map(|(m, g)| beta1 * m + (1.0 - beta1) * g).collect();
    let v_new = v.iter().zip(g).map(|(v, g)| beta2 * v + (1.0 - beta2) * g * g).collect();
    (m_new, v_new)
}

const SCALARS: DmlAdam = DmlAdam { learning_rate: 0.01, beta1: 0.9, beta2: 0.999, epsilon: 1e-8 };

#[test]
fn m_is_beta1_m_plus_one_minus_beta1_g() {
    let (x, m, v, g) =
        (f32s(&[1.0, -2.0, 0.5]), f32s(&[0.3, -0.1, 0.0]), f32s(&[0.2, 0.1, 0.0]), f32s(&[0.7, 1.5, -4.0]));
    let [_, m_gpu, _] = run(&ctx(), SCALARS, 2, &x, &m, &v, &g);
    let (_, m_oracle, _) = oracle::dml_adam(&SCALARS.to_oracle(), 2, &x, &m, &v, &g);
    let want: Vec<f64> = m.iter().zip(&g).map(|(m, g)| 0.9 * m + (1.0 - 0.9) * g).collect();
    check("M", &m_gpu, &m_oracle, &want);
}

#[test]
fn v_is_beta2_v_plus_one_minus_beta2_g_squared() {
    let (x, m, v, g) =
        (f32s(&[1.0, -2.0, 0.5]), f32s(&[0.3, -0.1, 0.0]), f32s(&[0.2, 0.1, 0.0]), f32s(&[0.7, 1.5, -4.0]));
    let [_, _, v_gpu] = run(&ctx(), SCALARS, 2, &x, &m, &v, &g);
    let (_, _, v_oracle) = oracle::dml_adam(&SCALARS.to_oracle(), 2, &x, &m, &v, &g);
    let want: Vec<f64> = v.iter().zip(&g).map(|(v, g)| 0.999 * v + (1.0 - 0.999) * g * g).collect();
    check("V", &v_gpu, &v_oracle, &want);
}

#[test]
fn x_decreases_by_learning_rate_alpha_m_over_sqrt_v_plus_epsilon() {
    // Gradients of a few 1e-7 at T = 1 make sqrt(V) about Epsilon: PyTorch's placement
    // divides sqrt(V) by sqrt(1 - Beta2) = 0.0316 first, so Epsilon hardly counts there.
    let x = f32s(&[1.0, -1.0, 0.25, 2.0]);
    let g = f32s(&[3e-7, -6e-7, 1e-7, 1e-6]);
    let (m, v) = (vec![0.0; 4], vec![0.0; 4]);
    let [x_gpu, ..] = run(&ctx(), SCALARS, 1, &x, &m, &v, &g);
    let (x_oracle, ..) = oracle::dml_adam(&SCALARS.to_oracle(), 1, &x, &m, &v, &g);
    let (m_new, v_new) = moments(0.9, 0.999, &m, &v, &g);
    let alpha = (1.0 - 0.999f64).sqrt() / (1.0 - 0.9);
    let want: Vec<f64> = (0..4).map(|i| x[i] - 0.01 * alpha * m_new[i] / (v_new[i].sqrt() + 1e-8)).collect();
    check("X", &x_gpu, &x_oracle, &want);
    let pytorch_placement = x[0] - 0.01 / (1.0 - 0.9) * m_new[0] / (v_new[0].sqrt() / alpha / 0.1 + 1e-8);
    assert!((pytorch_placement - want[0]).abs() > 1e-3, "the case must tell the placements apart");
}

#[test]
fn alpha_is_sqrt_one_minus_beta2_pow_t_over_one_minus_beta1_pow_t() {
    // A large Epsilon, so that where the corrections go changes the result at T = 3.
    let scalars = DmlAdam { epsilon: 0.1, ..SCALARS };
    let x = f32s(&[0.5, -0.75]);
    let (m, v, g) = (f32s(&[0.02, -0.01]), f32s(&[0.04, 0.01]), f32s(&[0.3, -0.2]));
    let [x_gpu, ..] = run(&ctx(), scalars, 3, &x, &m, &v, &g);
    let (x_oracle, ..) = oracle::dml_adam(&scalars.to_oracle(), 3, &x, &m, &v, &g);
    let (m_new, v_new) = moments(0.9, 0.999, &m, &v, &g);
    let alpha = (1.0 - 0.999f64.powi(3)).sqrt() / (1.0 - 0.9f64.powi(3));
    let want: Vec<f64> = (0..2).map(|i| x[i] - 0.01 * alpha * m_new[i] / (v_new[i].sqrt() + 0.1)).collect();
    check("X", &x_gpu, &x_oracle, &want);
}
