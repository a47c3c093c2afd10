//! Burn's drop-in optimizers (`FusedOptimizer`, `ModuleStep`) running the families added
//! after Adam, SGD and Adagrad through the front end's generic path (no Burn code names
//! them), against the oracle.

use wgpu_optim::{Adan, Adopt, Algorithm, Lion};
use wgpu_optim_burn::{FusedOptimizer, ModuleStep, SharedDevice};
use wgpu_optim_testkit::oracle::{ToOracle, TorchState};

use crate::common::{assert_close, Params, Rng, Tolerance};

/// `algorithm` over `steps` steps through Burn's `FusedOptimizer` and `ModuleStep`, each
/// against the oracle; `name` in the messages.
pub fn the_fused_optimizer_and_the_module_step_follow_the_oracle(
    algorithm: Algorithm,
    name: &str,
    steps: usize,
) {
    let shared =
        SharedDevice::headless_blocking().unwrap_or_else(|e| panic!("Burn tests need an adapter: {e}"));
    let device = shared.device().clone().autodiff();
    let mut rng = Rng::new(90);
    let lens = [1000usize, 37];
    let initial: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grads: Vec<Vec<Vec<f64>>> =
        (0..steps).map(|_| lens.iter().map(|&n| rng.vec(n, 1.0)).collect()).collect();
    let mut want = initial.clone();
    let mut states: Vec<TorchState> =
        lens.iter().map(|&n| TorchState::new(algorithm.to_oracle(), n)).collect();
    for step in &grads {
        for ((p, g), s) in want.iter_mut().zip(step).zip(&mut states) {
            s.step(p, g);
        }
    }

    let mut optim = FusedOptimizer::new(&shared, algorithm).unwrap().init();
    let mut model = Params::new(&initial, &device);
    for step in &grads {
        let g = model.grads(step, &device);
        model = optim.step(algorithm.lr(), model, g);
    }
    for (i, (got, want)) in model.values().iter().zip(&want).enumerate() {
        assert_close(&format!("FusedOptimizer {name}, parameter {i}"), got, want, Tolerance::F32);
    }

    let mut module_step = ModuleStep::builder().build(&shared, algorithm).unwrap();
    let mut model = Params::new(&initial, &device);
    for step in &grads {
        let g = model.grads(step, &device);
        model = module_step.step(algorithm.lr(), model, g).unwrap();
    }
    for (i, (got, want)) in model.values().iter().zip(&want).enumerate() {
        assert_close(&format!("ModuleStep {name}, parameter {i}"), got, want, Tolerance::F32);
    }
}

/// Adan: its two new states travel in the fused state under their official names.
#[test]
fn adan_follows_the_oracle() {
    let adan = Adan {
        lr: 3e-3,
        beta1: 0.9,
        beta2: 0.7,
        beta3: 0.999,
        eps: 1e-6,
        weight_decay: 0.5,
        ..Adan::default()
    };
    the_fused_optimizer_and_the_module_step_follow_the_oracle(adan.into(), "Adan", 4);
}

/// ADOPT, decoupled decay and its clipping of the first steps.
#[test]
fn adopt_follows_the_oracle() {
    let adopt = Adopt {
        lr: 3e-3,
        beta1: 0.4,
        beta2: 0.99,
        eps: 1e-5,
        weight_decay: 0.5,
        decouple: true,
        clip_exponent: Some(0.5),
        maximize: false,
    };
    the_fused_optimizer_and_the_module_step_follow_the_oracle(adopt.into(), "ADOPT", 4);
}

/// Lion with decoupled decay.
#[test]
fn lion_follows_the_oracle() {
    let lion = Lion { lr: 3e-3, beta1: 0.8, beta2: 0.95, weight_decay: 0.5 };
    the_fused_optimizer_and_the_module_step_follow_the_oracle(lion.into(), "Lion", 3);
}
