//! LAMB through the `burn` feature: the drop-in `FusedOptimizer` (one tensor per call) and
//! `ModuleStep` (every tensor in one step) against the f64 oracle. Both take LAMB's norms per
//! tensor, as torch-optimizer does.

use crate::common;

use common::{assert_close, Rng, Tolerance};
use wgpu_optim::{Algorithm, DType, Lamb};
use wgpu_optim_burn::{FusedOptimizer, ModuleStep};
use wgpu_optim_testkit::oracle::{LambOracle, ToOracle};

use crate::common::{shared, Params};

fn config() -> Lamb {
    Lamb { lr: 1e-2, weight_decay: 0.1, debias: true, ..Lamb::default() }
}

fn data() -> (Vec<Vec<f64>>, Vec<Vec<Vec<f64>>>) {
    let mut rng = Rng::new(11);
    let lens = [1000, 37, 4096];
    let initial = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grads = (0..3).map(|_| lens.iter().map(|&n| rng.vec(n, 1.0)).collect()).collect();
    (initial, grads)
}

fn oracle(initial: &[Vec<f64>], grads: &[Vec<Vec<f64>>]) -> Vec<Vec<f64>> {
    let mut oracle = LambOracle::new(config().to_oracle(), initial.len())
        .storing(DType::F32.to_oracle(), DType::F32.to_oracle());
    let mut params = initial.to_vec();
    for g in grads {
        oracle.step(&mut params, g);
    }
    params
}

#[test]
fn the_drop_in_optimizer_runs_lamb_per_tensor() {
    let shared = shared();
    let device = shared.device().clone().autodiff();
    let (initial, grads) = data();
    let algorithm: Algorithm = config().into();
    let mut optim = FusedOptimizer::new(&shared, algorithm).unwrap().init();
    let mut model = Params::new(&initial, &device);
    for step in &grads {
        let g = model.grads(step, &device);
        model = optim.step(algorithm.lr(), model, g);
    }
    for (i, (got, want)) in model.values().iter().zip(&oracle(&initial, &grads)).enumerate() {
        assert_close(&format!("parameter {i}"), got, want, Tolerance::F32);
    }
}

#[test]
fn the_module_step_runs_lamb_over_every_tensor_in_one_step() {
    let shared = shared();
    let device = shared.device().clone().autodiff();
    let (initial, grads) = data();
    let algorithm: Algorithm = config().into();
    let mut step = ModuleStep::builder().build(&shared, algorithm).unwrap();
    let mut model = Params::new(&initial, &device);
    for g in &grads {
        let g = model.grads(g, &device);
        model = step.step(algorithm.lr(), model, g).unwrap();
    }
    assert_eq!(step.optimizer().map(|o| o.step_count()), Some(3));
    let norms = step.optimizer().and_then(|o| o.lamb_norms(0));
    assert!(norms.is_some(), "the module step's optimizer keeps LAMB's norms");
    for (i, (got, want)) in model.values().iter().zip(&oracle(&initial, &grads)).enumerate() {
        assert_close(&format!("parameter {i}"), got, want, Tolerance::F32);
    }
}
