//! The AMSGrad example's claims: on Reddi et al.'s problem Adam drifts towards +1 (the
//! worst point) while AMSGrad heads for -1 (the optimum) with less regret, and the GPU
//! follows the f64 oracle along the way, as in PaddlePaddle's design-document run.

mod common;

#[path = "../examples/amsgrad/counterexample.rs"]
#[allow(dead_code)]
mod counterexample;

use counterexample::{average_regret, gradient, run, Problem};
use wgpu_optim::oracle::TorchState;
use wgpu_optim::{Adam, Algorithm};

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
        let mut state = TorchState::new(algorithm, 1);
        for (i, got) in xs.iter().enumerate() {
            state.step(&mut x, &[gradient(i as u64)]);
            let tolerance = 1e-4 * x[0].abs().max(1.0);
            assert!(
                (got - x[0]).abs() <= tolerance,
                "amsgrad {amsgrad}: x after iteration {i} is {got}, the oracle says {}",
                x[0]
            );
        }
        // PaddlePaddle's document: x = 0.1 after iteration 0 in float64.
        assert!((xs[0] - 0.1).abs() < 1e-6);
    }
}
