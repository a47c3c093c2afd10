//! ONNX `Adam` on the GPU against the oracle's transcription of the operator's pseudo code:
//! T = 0 (no bias correction) and T > 0, the two norm coefficients, n tensors of mixed
//! lengths in one call, each output in place or out of place.

mod common;

use common::{assert_tensor, ctx, to_f32, Rng};
use wgpu_optim::ops::onnx;
use wgpu_optim::{oracle, DType, OnnxAdam, Tensor};

const LENGTHS: [usize; 5] = [1, 255, 256, 257, 100_003];

/// Runs one call with `in_place[k]` choosing the k-th output's mode, and checks every output.
fn check(attributes: OnnxAdam, r: f64, t: u64, seed: u64, in_place: impl Fn(usize) -> bool) {
    let ctx = ctx();
    let mut rng = Rng::new(seed);
    let n = LENGTHS.len();
    let x: Vec<Vec<f64>> = LENGTHS.iter().map(|&l| rng.vec(l, 1.0)).collect();
    let g: Vec<Vec<f64>> = LENGTHS.iter().map(|&l| rng.vec(l, 1.0)).collect();
    let v: Vec<Vec<f64>> = LENGTHS.iter().map(|&l| rng.vec(l, 0.1)).collect();
    let h: Vec<Vec<f64>> = LENGTHS.iter().map(|&l| rng.positive(l, 0.01)).collect();
    let inputs: Vec<Tensor> = [&x, &g, &v, &h]
        .iter()
        .flat_map(|set| set.iter().map(|values| ctx.upload_f32("input", &to_f32(values))))
        .collect();
    // Outputs in operator order: X_new_1..n, V_new_1..n, H_new_1..n.
    let updated = |k: usize| &inputs[if k < n { k } else { k + n }];
    let outputs: Vec<Option<Tensor>> =
        (0..3 * n).map(|k| (!in_place(k)).then(|| ctx.zeros("output", updated(k).len, DType::F32))).collect();
    ctx.submit("onnx.Adam", |encoder| onnx::adam(&ctx, encoder, &attributes, r, t, &inputs, &outputs))
        .unwrap();
    for i in 0..n {
        let want = oracle::onnx_adam(&attributes, r, t, &x[i], &g[i], &v[i], &h[i]);
        for (k, (name, values)) in
            [("X_new", &want.0), ("V_new", &want.1), ("H_new", &want.2)].into_iter().enumerate()
        {
            let slot = k * n + i;
            let written = outputs[slot].as_ref().unwrap_or(updated(slot));
            let what = format!("{name}_{} (T = {t}, n = {}, {attributes:?})", i + 1, LENGTHS[i]);
            assert_tensor(&ctx, &what, written, values);
        }
    }
}

#[test]
fn t_zero_applies_no_bias_correction() {
    let a =
        OnnxAdam { alpha: 0.95, beta: 0.1, epsilon: 1e-7, norm_coefficient: 0.001, ..OnnxAdam::default() };
    check(a, 0.1, 0, 1, |_| true);
}

#[test]
fn t_positive_corrects_the_rate_and_adds_epsilon_to_sqrt_h() {
    for t in [1, 2, 10, 1000] {
        check(OnnxAdam::default(), 0.01, t, 10 + t, |_| true);
    }
}

#[test]
fn norm_coefficient_is_added_to_the_gradient() {
    let a = OnnxAdam { norm_coefficient: 0.05, ..OnnxAdam::default() };
    check(a, 0.01, 3, 2, |_| false);
}

#[test]
fn norm_coefficient_post_shrinks_x_after_the_update() {
    let a = OnnxAdam { norm_coefficient_post: 0.01, ..OnnxAdam::default() };
    check(a, 0.01, 3, 3, |_| true);
    let both = OnnxAdam { norm_coefficient: 0.01, norm_coefficient_post: 0.01, ..OnnxAdam::default() };
    check(both, 0.01, 0, 4, |_| false);
}

#[test]
fn each_output_chooses_in_place_or_out_of_place() {
    check(OnnxAdam::default(), 0.01, 5, 5, |k| k % 2 == 0);
    check(OnnxAdam::default(), 0.01, 5, 6, |k| k % 3 == 1);
}

#[test]
fn wrong_input_counts_are_refused() {
    let ctx = ctx();
    let x = ctx.upload_f32("x", &[1.0; 4]);
    let mut encoder = ctx.device().create_command_encoder(&Default::default());
    let three = vec![x.clone(), x.clone(), x.clone()];
    let err = onnx::adam(&ctx, &mut encoder, &OnnxAdam::default(), 0.1, 1, &three, &[None, None, None])
        .unwrap_err();
    assert!(matches!(err, wgpu_optim::Error::CountMismatch { got: 3, expected: 4, .. }), "{err}");
    let g = ctx.upload_f32("g", &[1.0; 4]);
    let v = ctx.upload_f32("v", &[0.0; 4]);
    let h = ctx.upload_f32("h", &[0.0; 4]);
    let four = vec![x, g, v, h];
    let err = onnx::adam(&ctx, &mut encoder, &OnnxAdam::default(), 0.1, 1, &four, &[None]).unwrap_err();
    assert!(matches!(err, wgpu_optim::Error::CountMismatch { got: 1, expected: 3, .. }), "{err}");
}
