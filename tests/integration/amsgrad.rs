//! The AMSGrad example's claims: on Reddi et al.'s problem Adam drifts towards +1 (the
//! worst point) while AMSGrad heads for -1 (the optimum) with less regret, and the GPU
//! follows the f64 oracle along the way, as in PaddlePaddle's design-document run.

use crate::common;

#[path = "../../examples/amsgrad/counterexample.rs"]
#[allow(dead_code)]
mod counterexample;

use common::{assert_close, Tolerance};
use counterexample::{average_regret, gradient, run, Problem};
use wgpu_optim::{Adam, Algorithm};
use wgpu_optim_testkit::oracle::{ToOracle, TorchState};

#[test]
fn adam_drifts_to_the_worst_point_and_amsgrad_to_the_optimum() {
    let ctx = common::ctx();
    let adam = Adam { lr: 0.5, beta1: 0.9, beta2: 0.99, ..Adam::default() };
    let problem = |amsgrad| Problem {
        adam: Adam { amsgrad, ..adam },
        steps: 5000,
        first_t: 1,
        projected: true,
        decaying_lr: true,
    };
    let plain = run(&ctx, &problem(false)).unwrap();
    let amsgrad = run(&ctx, &problem(true)).unwrap();
    let (adam_end, amsgrad_end) = (plain[plain.len() - 1], amsgrad[amsgrad.len() - 1]);
    // The f64 reference puts them at +0.374 and -0.896 after 5,000 steps.
    assert!(adam_end > 0.3, "Adam ends at {adam_end}");
    assert!(amsgrad_end < -0.85, "AMSGrad ends at {amsgrad_end}");
    assert!(average_regret(&amsgrad, 1) < average_regret(&plain, 1));
}

#[test]
fn the_unprojected_run_follows_the_f64_oracle() {
    let ctx = common::ctx();
    let steps = 2000;
    for amsgrad in [false, true] {
        let adam = Adam { lr: 0.1, beta1: 0.9, beta2: 0.999, eps: 1e-8, amsgrad, ..Adam::default() };
        let xs =
            run(&ctx, &Problem { adam, steps, first_t: 0, projected: false, decaying_lr: false }).unwrap();
        let algorithm: Algorithm = adam.into();
        let mut x = [0.0];
        let mut state = TorchState::new(algorithm.to_oracle(), 1);
        let want: Vec<f64> = (0..xs.len())
            .map(|i| {
                state.step(&mut x, &[gradient(i as u64)]);
                x[0]
            })
            .collect();
        // f32 error accumulates over the run; 5e-5 + 5e-5 |x| stays within 1e-4 where
        // |x| <= 1 and within 1e-4 |x| beyond.
        let tolerance = Tolerance::Close { rtol: 5e-5, atol: 5e-5 };
        assert_close(&format!("amsgrad {amsgrad}: x after each iteration"), &xs, &want, tolerance);
        // PaddlePaddle's document: x = 0.1 after iteration 0 in float64.
        let documented = Tolerance::Close { rtol: 0.0, atol: 1e-6 };
        assert_close(&format!("amsgrad {amsgrad}: x after iteration 0"), &xs[..1], &[0.1], documented);
    }
}
