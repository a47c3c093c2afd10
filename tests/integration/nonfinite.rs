//! NaN and infinity: without AMP a non-finite gradient propagates exactly as in PyTorch
//! (checked against the oracle's f64 transcription, NaN for NaN and infinity for infinity),
//! on the scalar and the vec4 paths. With AMP the step is skipped (tests/capturable.rs).

use crate::common;

use common::{assert_close, ctx, download, Rng, Tolerance};
use wgpu_optim::{Adagrad, Adam, Algorithm, DType, Optimizer, Sgd};
use wgpu_optim_testkit::oracle::{ToOracle, TorchState};

fn algorithms() -> Vec<Algorithm> {
    vec![
        Adam::default().into(),
        Adam { amsgrad: true, ..Adam::default() }.into(),
        Adam::adamw().into(),
        Sgd { lr: 0.1, momentum: 0.9, ..Sgd::default() }.into(),
        Sgd { lr: 0.1, momentum: 0.9, nesterov: true, weight_decay: 0.125, ..Sgd::default() }.into(),
        Adagrad::default().into(),
    ]
}

#[test]
fn non_finite_gradients_propagate_as_in_pytorch() {
    let ctx = ctx();
    let mut rng = Rng::new(1);
    // 16 elements run as vec4s, 13 leave a scalar tail.
    for n in [16usize, 13] {
        for algorithm in algorithms() {
            let mut p = rng.vec(n, 1.0);
            p[9] = f64::INFINITY;
            let param = ctx.upload("param", &p, DType::F32);
            let grad = ctx.zeros("grad", n as u64, DType::F32);
            let mut optimizer =
                Optimizer::builder().build(&ctx, algorithm, std::slice::from_ref(&param)).unwrap();
            let mut oracle = TorchState::new(algorithm.to_oracle(), n)
                .storing(DType::F32.to_oracle(), DType::F32.to_oracle());
            for step in 0..3 {
                let mut g = rng.vec(n, 1.0);
                g[3] = f64::NAN;
                g[5] = if step == 1 { f64::INFINITY } else { 0.5 };
                g[7] = f64::NEG_INFINITY;
                ctx.write(&grad, &g).unwrap();
                optimizer.step(std::slice::from_ref(&grad)).unwrap();
                oracle.step(&mut p, &g);
            }
            let what = format!("{algorithm:?} n = {n}");
            let got = download(&ctx, &param);
            assert!(got[3].is_nan(), "{what}: a NaN gradient makes a NaN parameter");
            assert_close(&what, &got, &p, Tolerance::F32);
            for (k, want) in oracle.tensors().iter().enumerate() {
                let kind = algorithm.state_kinds()[k];
                assert_close(
                    &format!("{what} {kind:?}"),
                    &download(&ctx, optimizer.state(0, kind).unwrap().and_then(|s| s.dense()).unwrap()),
                    want,
                    Tolerance::F32,
                );
            }
        }
    }
}

#[test]
fn amsgrad_keeps_a_nan_second_moment_like_torch_maximum() {
    // torch.maximum(max_exp_avg_sq, exp_avg_sq) is NaN when either is; a max() that drops
    // NaN would let the running maximum forget it.
    let ctx = ctx();
    let algorithm: Algorithm = Adam { amsgrad: true, ..Adam::default() }.into();
    for n in [4usize, 5] {
        let param = ctx.upload("param", &vec![1.0; n], DType::F32);
        let grad = ctx.upload("grad", &vec![f64::NAN; n], DType::F32);
        let mut optimizer =
            Optimizer::builder().build(&ctx, algorithm, std::slice::from_ref(&param)).unwrap();
        optimizer.step(std::slice::from_ref(&grad)).unwrap();
        ctx.write(&grad, &vec![1.0; n]).unwrap();
        optimizer.step(std::slice::from_ref(&grad)).unwrap();
        let vmax = download(
            &ctx,
            optimizer.state(0, wgpu_optim::StateKind::MaxExpAvgSq).unwrap().and_then(|s| s.dense()).unwrap(),
        );
        assert!(vmax.iter().all(|v| v.is_nan()), "n = {n}: {vmax:?}");
    }
}
