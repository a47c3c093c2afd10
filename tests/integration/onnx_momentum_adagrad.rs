//! ONNX `Momentum` (standard and Nesterov) and `Adagrad` on the GPU against the oracle:
//! T = 0 and T > 0, the norm coefficient, n = 3 tensors of mixed lengths in one call, in
//! place and out of place, f32 and f64, and the typed error where f64 is missing.
//!
//! f64 (`tensor(double)`) needs `SHADER_F64`, which the suite's Vulkan run (lavapipe) has
//! and its GL run has not, so each branch has a test named after it. The refusal without
//! the feature runs in both runs, on a device opened without it. The f64 arithmetic runs
//! where the adapter has the feature; on an adapter without it the test passes only if the
//! backend is GL (whose run leaves f64 to the Vulkan run) and fails anywhere else.

use crate::common;

use common::{OnnxCall, Tolerance};
use wgpu_optim::ops::onnx;
use wgpu_optim::{DType, Error, MomentumMode, OnnxAdagrad, OnnxMomentum};
use wgpu_optim_testkit::oracle;
use wgpu_optim_testkit::oracle::ToOracle;

const MIXED: [usize; 3] = [1, 257, 100_003];

fn momentum(a: OnnxMomentum, r: f64, t: u64, dtype: DType, in_place: &dyn Fn(usize) -> bool, seed: u64) {
    let tolerance = Tolerance::stored(dtype);
    let call = OnnxCall { groups: &["X", "G", "V"], lengths: &MIXED, dtype, in_place, seed, tolerance };
    call.check(
        |ctx, encoder, inputs, outputs| onnx::momentum(ctx, encoder, &a, r, t, inputs, outputs),
        |i| {
            let (x, v) = oracle::onnx_momentum(&a.to_oracle(), r, t, &i[0], &i[1], &i[2]);
            vec![x, v]
        },
    );
}

fn adagrad(a: OnnxAdagrad, r: f64, t: u64, dtype: DType, in_place: &dyn Fn(usize) -> bool, seed: u64) {
    let tolerance = Tolerance::stored(dtype);
    let call = OnnxCall { groups: &["X", "G", "H"], lengths: &MIXED, dtype, in_place, seed, tolerance };
    call.check(
        |ctx, encoder, inputs, outputs| onnx::adagrad(ctx, encoder, &a, r, t, inputs, outputs),
        |i| {
            let (x, h) = oracle::onnx_adagrad(&a.to_oracle(), r, t, &i[0], &i[1], &i[2]);
            vec![x, h]
        },
    );
}

const STANDARD: OnnxMomentum =
    OnnxMomentum { alpha: 0.9, beta: 0.5, mode: MomentumMode::Standard, norm_coefficient: 0.0 };
const NESTEROV: OnnxMomentum = OnnxMomentum { mode: MomentumMode::Nesterov, ..STANDARD };

#[test]
fn momentum_at_t_zero_replaces_beta_by_one() {
    momentum(STANDARD, 0.1, 0, DType::F32, &|_| true, 1);
    momentum(NESTEROV, 0.1, 0, DType::F32, &|_| false, 2);
}

#[test]
fn momentum_at_t_positive_scales_the_gradient_by_beta() {
    for t in [1, 3, 100] {
        momentum(STANDARD, 0.05, t, DType::F32, &|k| k % 2 == 0, 10 + t);
    }
}

#[test]
fn nesterov_steps_along_the_gradient_plus_alpha_times_the_new_velocity() {
    for t in [1, 3] {
        momentum(NESTEROV, 0.05, t, DType::F32, &|k| k % 2 == 1, 20 + t);
    }
}

#[test]
fn momentum_norm_coefficient_is_added_to_the_gradient() {
    let a = OnnxMomentum { norm_coefficient: 0.01, ..NESTEROV };
    momentum(a, 0.1, 2, DType::F32, &|_| true, 3);
    momentum(OnnxMomentum { norm_coefficient: 0.01, ..STANDARD }, 0.1, 2, DType::F32, &|_| false, 4);
}

#[test]
fn adagrad_at_t_zero_and_positive_decays_the_rate_by_t() {
    let a = OnnxAdagrad { decay_factor: 0.1, ..OnnxAdagrad::default() };
    for t in [0, 1, 5] {
        adagrad(a, 0.1, t, DType::F32, &|k| k < 2, 30 + t);
    }
}

#[test]
fn adagrad_norm_coefficient_and_epsilon() {
    let a = OnnxAdagrad { decay_factor: 0.0, epsilon: 1e-3, norm_coefficient: 0.0625 };
    adagrad(a, 0.1, 4, DType::F32, &|_| false, 5);
}

#[test]
fn f64_tensors_run_in_f64_where_the_adapter_has_shader_f64() {
    if !common::has_feature_unless_gl(&common::ctx(), wgpu::Features::SHADER_F64, "SHADER_F64") {
        return;
    }
    momentum(NESTEROV, 0.05, 3, DType::F64, &|k| k % 2 == 0, 6);
    adagrad(OnnxAdagrad { decay_factor: 0.01, ..OnnxAdagrad::default() }, 0.1, 5, DType::F64, &|_| true, 7);
}

#[test]
fn f64_tensors_are_refused_naming_shader_f64_without_it() {
    // A device opened without SHADER_F64, as on adapters that lack it.
    let ctx = common::ctx_without_features();
    common::assert_f64_refused(&ctx, 3, |ctx, encoder, t| {
        onnx::adagrad(ctx, encoder, &OnnxAdagrad::default(), 0.1, 1, t, &[None, None])
    });
    let t = |v: f64| ctx.upload("t", &[v; 8], wgpu_optim::DType::F64);
    let inputs = [t(1.0), t(0.5), t(0.0)];
    let mut encoder = ctx.device().create_command_encoder(&Default::default());
    let err = onnx::momentum(&ctx, &mut encoder, &STANDARD, 0.1, 1, &inputs, &[None, None]).unwrap_err();
    assert!(matches!(err, Error::MissingFeature { feature: "SHADER_F64", .. }), "{err}");
    assert!(err.to_string().contains("SHADER_F64"), "{err}");
    // The f32 variant still works on that device.
    let inputs =
        [ctx.upload_f32("x", &[1.0; 8]), ctx.upload_f32("g", &[0.5; 8]), ctx.upload_f32("v", &[0.0; 8])];
    ctx.submit("f32", |encoder| onnx::momentum(&ctx, encoder, &STANDARD, 0.1, 1, &inputs, &[None, None]))
        .unwrap();
    let (x, _) = oracle::onnx_momentum(&STANDARD.to_oracle(), 0.1, 1, &[1.0; 8], &[0.5; 8], &[0.0; 8]);
    common::assert_tensor(&ctx, "X_new on a device without SHADER_F64", &inputs[0], &x);
}
