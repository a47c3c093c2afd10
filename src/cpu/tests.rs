//! The CPU loops under the kernel steps of the ONNX and DirectML conventions, which
//! `CpuOptimizer` never produces but `KernelStep` carries: eps before the bias correction,
//! no weight decay at all, a post-update scale, ONNX's momentum coefficients. (The PyTorch
//! conventions are tested through the public API in tests/integration/cpu.rs.)

use super::host::{HostSlice, HostSliceMut};
use super::kernels::Kernel;
use super::state_memory::StateTensor;
use super::work;
use crate::step::KernelStep;
use crate::{oracle, Adam, DmlAdam, MomentumMode, OnnxAdagrad, OnnxAdam, OnnxMomentum};

const N: usize = 2500;

/// Deterministic values in [-scale, scale), exactly representable in f32.
fn values(seed: u32, scale: f64) -> Vec<f64> {
    (0..N).map(|i| f64::from((((i as f64 + 1.0) * (f64::from(seed) + 0.61)).sin() * scale) as f32)).collect()
}

/// Runs `step` once over f32 copies of `param`, `grad` and `state`; returns the new
/// parameter and state.
fn run(step: &KernelStep, param: &[f64], grad: &[f64], state: &[Vec<f64>]) -> (Vec<f64>, Vec<Vec<f64>>) {
    let kernel = Kernel::new(step);
    let to_f32 = |v: &[f64]| v.iter().map(|x| *x as f32).collect::<Vec<f32>>();
    let mut p = to_f32(param);
    let g = to_f32(grad);
    let tensor = |s: &Vec<f64>| {
        let mut t = StateTensor::filled(crate::DType::F32, s.len(), 0.0, 0).unwrap_or_else(|e| panic!("{e}"));
        if let HostSliceMut::F32(values) = t.as_mut_slice() {
            values.copy_from_slice(&to_f32(s));
        }
        t
    };
    let mut tensors = vec![state.iter().map(tensor).collect::<Vec<_>>()];
    let stores = super::storage::Stores::default();
    work::run(
        &kernel,
        &stores,
        &mut [HostSliceMut::F32(&mut p)],
        &[HostSlice::F32(&g)],
        &mut tensors,
        &mut [],
    );
    let state = tensors[0].iter().map(|t| t.as_slice().to_f64()).collect();
    (p.iter().map(|x| f64::from(*x)).collect(), state)
}

/// The f32 kernels against the f64 oracle, with the tests' one comparator.
fn assert_close(what: &str, got: &[f64], want: &[f64]) {
    wgpu_optim_testkit::compare::assert_close(what, got, want, wgpu_optim_testkit::compare::Tolerance::F32);
}

#[test]
fn onnx_adam_adds_eps_before_the_correction_and_scales_after_the_update() {
    let a = OnnxAdam { norm_coefficient: 0.01, norm_coefficient_post: 0.02, ..OnnxAdam::default() };
    let (x, g, v, h) = (values(1, 1.0), values(2, 1.0), values(3, 0.1), values(4, 0.01));
    let h: Vec<f64> = h.iter().map(|x| x.abs()).collect();
    for t in [0, 3] {
        let (x_new, state) = run(&a.kernel_step(0.1, t), &x, &g, &[v.clone(), h.clone()]);
        let want = oracle::onnx_adam(&a, 0.1, t, &x, &g, &v, &h);
        assert_close(&format!("X_new at T = {t}"), &x_new, &want.0);
        assert_close(&format!("V_new at T = {t}"), &state[0], &want.1);
        assert_close(&format!("H_new at T = {t}"), &state[1], &want.2);
    }
}

#[test]
fn directml_adam_has_no_weight_decay_at_all() {
    let d = DmlAdam { learning_rate: 0.01, beta1: 0.9, beta2: 0.999, epsilon: 1e-8 };
    // The step's switches and uniform are the family's own (src/family/adam/config.rs's
    // tests); here its loops against DirectML's documented formula, which has no decay.
    let step = d.kernel_step(4);
    let (p, g, m, v) = (values(5, 1.0), values(6, 1.0), values(7, 0.1), values(8, 0.01));
    let v: Vec<f64> = v.iter().map(|x| x.abs()).collect();
    let (p_new, state) = run(&step, &p, &g, &[m.clone(), v.clone()]);
    let want = oracle::dml_adam(&d, 4, &p, &m, &v, &g);
    assert_close("OutputParameters", &p_new, &want.0);
    assert_close("OutputFirstMoment", &state[0], &want.1);
    assert_close("OutputSecondMoment", &state[1], &want.2);
}

#[test]
fn onnx_momentum_scales_the_gradient_by_beta_after_the_first_step() {
    let (x, g, v) = (values(9, 1.0), values(10, 1.0), values(11, 0.1));
    for mode in [MomentumMode::Standard, MomentumMode::Nesterov] {
        let a = OnnxMomentum { alpha: 0.9, beta: 0.5, mode, norm_coefficient: 0.01 };
        for t in [0, 5] {
            let (x_new, state) = run(&a.kernel_step(0.1, t), &x, &g, std::slice::from_ref(&v));
            let want = oracle::onnx_momentum(&a, 0.1, t, &x, &g, &v);
            assert_close(&format!("{mode:?} X_new at T = {t}"), &x_new, &want.0);
            assert_close(&format!("{mode:?} V_new at T = {t}"), &state[0], &want.1);
        }
    }
}

#[test]
fn onnx_adagrad_decays_the_rate_with_t() {
    let a = OnnxAdagrad { decay_factor: 0.1, norm_coefficient: 0.01, ..OnnxAdagrad::default() };
    let (x, g, h) = (values(12, 1.0), values(13, 1.0), values(14, 0.1));
    let h: Vec<f64> = h.iter().map(|x| x.abs()).collect();
    let (x_new, state) = run(&a.kernel_step(0.1, 2), &x, &g, std::slice::from_ref(&h));
    let want = oracle::onnx_adagrad(&a, 0.1, 2, &x, &g, &h);
    assert_close("X_new", &x_new, &want.0);
    assert_close("H_new", &state[0], &want.1);
}

#[test]
fn l2_with_a_coefficient_that_is_zero_in_f32_is_skipped_as_the_shader_does() {
    // The shader tests the f32 coefficient against 0 and skips `g += wd * p`; with a NaN
    // parameter that is visible: skipped, the NaN stays in p only; applied, it reaches m.
    let p = vec![f64::NAN; 4];
    let g = vec![0.5; 4];
    let zeros = vec![0.0; 4];
    let first_moment =
        |adam: Adam| run(&adam.kernel_step(1), &p, &g, &[zeros.clone(), zeros.clone()]).1[0][0];
    let without = f64::from(0.1f32 * 0.5f32);
    assert_eq!(first_moment(Adam::default()), without);
    assert_eq!(first_moment(Adam { weight_decay: 1e-50, ..Adam::default() }), without);
    assert!(first_moment(Adam { weight_decay: 1e-2, ..Adam::default() }).is_nan());
    // Decoupled decay scales p and never touches the gradient.
    assert_eq!(first_moment(Adam { weight_decay: 1e-2, ..Adam::adamw() }), without);
}
