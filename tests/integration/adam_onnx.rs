//! ONNX `Adam` on the GPU against the oracle's transcription of the operator's pseudo code:
//! T = 0 (no bias correction) and T > 0, the two norm coefficients, n tensors of mixed
//! lengths in one call, each output in place or out of place, f32 and f64.
//!
//! f64 (`tensor(double)`) needs `SHADER_F64`, which the suite's Vulkan run (lavapipe) has
//! and its GL run has not, so each branch has a test named after it. The refusal without
//! the feature runs in both runs, on a device opened without it. The f64 arithmetic runs
//! where the adapter has the feature; on an adapter without it the test passes only if the
//! backend is GL (whose run leaves f64 to the Vulkan run) and fails anywhere else.

use crate::common;

use common::{ctx, OnnxCall, Tolerance};
use wgpu_optim::ops::onnx;
use wgpu_optim::{DType, Error, OnnxAdam};
use wgpu_optim_testkit::oracle::{self, ToOracle};

const LENGTHS: [usize; 5] = [1, 255, 256, 257, 100_003];

fn check(attributes: OnnxAdam, r: f64, t: u64, seed: u64, in_place: &dyn Fn(usize) -> bool) {
    let call = OnnxCall {
        groups: &["X", "G", "V", "H"],
        lengths: &LENGTHS,
        dtype: DType::F32,
        in_place,
        seed,
        tolerance: Tolerance::F32,
    };
    call.check(
        |ctx, encoder, inputs, outputs| onnx::adam(ctx, encoder, &attributes, r, t, inputs, outputs),
        |i| {
            let (x, v, h) = oracle::onnx_adam(&attributes.to_oracle(), r, t, &i[0], &i[1], &i[2], &i[3]);
            vec![x, v, h]
        },
    );
}

#[test]
fn t_zero_applies_no_bias_correction() {
    let a =
        OnnxAdam { alpha: 0.95, beta: 0.1, epsilon: 1e-7, norm_coefficient: 0.001, ..OnnxAdam::default() };
    check(a, 0.1, 0, 1, &|_| true);
}

#[test]
fn t_positive_corrects_the_rate_and_adds_epsilon_to_sqrt_h() {
    for t in [1, 2, 10, 1000] {
        check(OnnxAdam::default(), 0.01, t, 10 + t, &|_| true);
    }
}

#[test]
fn norm_coefficient_is_added_to_the_gradient() {
    let a = OnnxAdam { norm_coefficient: 0.0625, ..OnnxAdam::default() };
    check(a, 0.01, 3, 2, &|_| false);
}

#[test]
fn norm_coefficient_post_shrinks_x_after_the_update() {
    let a = OnnxAdam { norm_coefficient_post: 0.01, ..OnnxAdam::default() };
    check(a, 0.01, 3, 3, &|_| true);
    let both = OnnxAdam { norm_coefficient: 0.01, norm_coefficient_post: 0.01, ..OnnxAdam::default() };
    check(both, 0.01, 0, 4, &|_| false);
}

#[test]
fn each_output_chooses_in_place_or_out_of_place() {
    check(OnnxAdam::default(), 0.01, 5, 5, &|k| k % 2 == 0);
    check(OnnxAdam::default(), 0.01, 5, 6, &|k| k % 3 == 1);
}

#[test]
fn f64_tensors_run_in_f64_where_the_adapter_has_shader_f64() {
    let a = OnnxAdam { norm_coefficient: 0.01, norm_coefficient_post: 0.001, ..OnnxAdam::default() };
    if !common::has_feature_unless_gl(&ctx(), wgpu::Features::SHADER_F64, "SHADER_F64") {
        return;
    }
    let call = OnnxCall {
        groups: &["X", "G", "V", "H"],
        lengths: &[1, 257, 3000],
        dtype: DType::F64,
        in_place: &|k| k % 2 == 0,
        seed: 9,
        tolerance: Tolerance::F64,
    };
    call.check(
        |ctx, encoder, inputs, outputs| onnx::adam(ctx, encoder, &a, 0.01, 7, inputs, outputs),
        |i| {
            let (x, v, h) = oracle::onnx_adam(&a.to_oracle(), 0.01, 7, &i[0], &i[1], &i[2], &i[3]);
            vec![x, v, h]
        },
    );
}

#[test]
fn f64_tensors_are_refused_naming_shader_f64_without_it() {
    let a = OnnxAdam { norm_coefficient: 0.01, norm_coefficient_post: 0.001, ..OnnxAdam::default() };
    common::assert_f64_refused(&common::ctx_without_features(), 4, |ctx, encoder, t| {
        onnx::adam(ctx, encoder, &a, 0.01, 7, t, &[None, None, None])
    });
}

#[test]
fn wrong_input_counts_are_refused() {
    let ctx = ctx();
    let x = ctx.upload_f32("x", &[1.0; 4]);
    let mut encoder = ctx.device().create_command_encoder(&Default::default());
    let three = vec![x.clone(), x.clone(), x.clone()];
    let err = onnx::adam(&ctx, &mut encoder, &OnnxAdam::default(), 0.1, 1, &three, &[None, None, None])
        .unwrap_err();
    assert!(matches!(err, Error::CountMismatch { got: 3, expected: 4, .. }), "{err}");
    let g = ctx.upload_f32("g", &[1.0; 4]);
    let v = ctx.upload_f32("v", &[0.0; 4]);
    let h = ctx.upload_f32("h", &[0.0; 4]);
    let four = vec![x, g, v, h];
    let err = onnx::adam(&ctx, &mut encoder, &OnnxAdam::default(), 0.1, 1, &four, &[None]).unwrap_err();
    assert!(matches!(err, Error::CountMismatch { got: 1, expected: 3, .. }), "{err}");
}
