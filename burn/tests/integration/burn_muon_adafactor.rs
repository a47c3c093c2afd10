//! Muon (with an AdamW fallback for the parameters that are not 2-D) and Adafactor through
//! the `burn` feature: the drop-in `FusedOptimizer` (one tensor per call) and `ModuleStep`
//! (every tensor in one step) on a module of 2-D weights and 1-D biases, against the f64
//! oracle; their records resumed bit for bit; Muon without a fallback refused by shape.

use crate::common;

use burn::module::{Module, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor, TensorData};
use common::{assert_close, Rng, Tolerance};
use wgpu_optim::{Adafactor, Adam, Algorithm, DType, Error, Muon, NsPrecision, StateKind};
use wgpu_optim_burn::{FusedOptimizer, ModuleStep, SharedDevice};
use wgpu_optim_testkit::oracle::{muon_step, AdafactorOracle, ToOracle, TorchState};

fn shared() -> SharedDevice {
    SharedDevice::headless_blocking().unwrap_or_else(|e| panic!("Burn tests need an adapter: {e}"))
}

fn values<const D: usize>(t: Tensor<D>) -> Vec<f64> {
    t.into_data()
        .try_to_vec::<f32>()
        .unwrap_or_else(|e| panic!("reading a Burn tensor: {e:?}"))
        .into_iter()
        .map(f64::from)
        .collect()
}

fn tensor<const D: usize>(values: &[f64], shape: [usize; D], device: &Device) -> Tensor<D> {
    let data: Vec<f32> = values.iter().map(|v| *v as f32).collect();
    Tensor::from_data(TensorData::new(data, shape), device)
}

/// The shapes of [`Net`]'s parameters, in module order: a tall and a wide matrix (Muon
/// transposes the tall one), each with its bias.
const SHAPES: [&[usize]; 4] = [&[8, 5], &[8], &[3, 8], &[3]];

#[derive(Module, Debug)]
struct Net {
    w1: Param<Tensor<2>>,
    b1: Param<Tensor<1>>,
    w2: Param<Tensor<2>>,
    b2: Param<Tensor<1>>,
}

impl Net {
    fn new(v: &[Vec<f64>], device: &Device) -> Self {
        Net {
            w1: Param::from_tensor(tensor(&v[0], [8, 5], device)),
            b1: Param::from_tensor(tensor(&v[1], [8], device)),
            w2: Param::from_tensor(tensor(&v[2], [3, 8], device)),
            b2: Param::from_tensor(tensor(&v[3], [3], device)),
        }
    }

    fn grads(&self, g: &[Vec<f64>], device: &Device) -> GradientsParams {
        let mut out = GradientsParams::new();
        out.register(self.w1.id, tensor(&g[0], [8, 5], device));
        out.register(self.b1.id, tensor(&g[1], [8], device));
        out.register(self.w2.id, tensor(&g[2], [3, 8], device));
        out.register(self.b2.id, tensor(&g[3], [3], device));
        out
    }

    fn values(&self) -> Vec<Vec<f64>> {
        vec![values(self.w1.val()), values(self.b1.val()), values(self.w2.val()), values(self.b2.val())]
    }
}

fn lens() -> Vec<usize> {
    SHAPES.iter().map(|s| s.iter().product()).collect()
}

/// Initial values and `steps` gradients.
fn data(seed: u64, steps: usize) -> (Vec<Vec<f64>>, Vec<Vec<Vec<f64>>>) {
    let mut rng = Rng::new(seed);
    let initial = lens().iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grads = (0..steps).map(|_| lens().iter().map(|&n| rng.vec(n, 0.5)).collect()).collect();
    (initial, grads)
}

const LR: f64 = 0.02;

fn muon() -> Muon {
    // f32 Newton-Schulz: the oracle's bfloat16 rounding ties would make the comparison
    // depend on the order of the products' sums.
    Muon { lr: LR, ns_precision: NsPrecision::F32, weight_decay: 0.1, ..Muon::default() }
}

fn adamw() -> Adam {
    Adam { lr: LR, ..Adam::adamw() }
}

fn adafactor() -> Adafactor {
    Adafactor { lr: LR, weight_decay: 0.1, ..Adafactor::default() }
}

/// torch's Muon over the matrices, beside torch's AdamW over the biases.
fn muon_oracle(initial: &[Vec<f64>], grads: &[Vec<Vec<f64>>]) -> Vec<Vec<f64>> {
    let mut params = initial.to_vec();
    let mut buffers: Vec<Vec<f64>> = lens().iter().map(|&n| vec![0.0; n]).collect();
    let mut adam: Vec<TorchState> =
        lens().iter().map(|&n| TorchState::new(adamw().to_oracle().into(), n)).collect();
    for step in grads {
        for (i, shape) in SHAPES.iter().enumerate() {
            if let [rows, cols] = shape {
                muon_step(&muon().to_oracle(), &mut params[i], &step[i], &mut buffers[i], *rows, *cols);
            } else {
                adam[i].step(&mut params[i], &step[i]);
            }
        }
    }
    params
}

fn adafactor_oracle(initial: &[Vec<f64>], grads: &[Vec<Vec<f64>>]) -> Vec<Vec<f64>> {
    let shapes = SHAPES.iter().map(|s| s.to_vec()).collect();
    let mut oracle = AdafactorOracle::new(adafactor().to_oracle(), shapes, DType::F32.to_oracle());
    let mut params = initial.to_vec();
    for step in grads {
        oracle.step(&mut params, step);
    }
    params
}

/// The two front ends, each over `steps` gradients from `initial`.
enum Front {
    DropIn,
    ModuleStep,
}

fn run(
    shared: &SharedDevice,
    front: &Front,
    algorithm: Algorithm,
    fallback: Option<Algorithm>,
    initial: &[Vec<f64>],
    grads: &[Vec<Vec<f64>>],
) -> Vec<Vec<f64>> {
    let device = shared.device().clone().autodiff();
    let mut model = Net::new(initial, &device);
    match front {
        Front::DropIn => {
            let mut fused = FusedOptimizer::new(shared, algorithm).unwrap();
            if let Some(fallback) = fallback {
                fused = fused.fallback(fallback).unwrap();
            }
            let mut optim = fused.init();
            for g in grads {
                let g = model.grads(g, &device);
                model = optim.step(LR, model, g);
            }
        }
        Front::ModuleStep => {
            let mut builder = ModuleStep::builder();
            if let Some(fallback) = fallback {
                builder = builder.fallback(fallback);
            }
            let mut step = builder.build(shared, algorithm).unwrap();
            for g in grads {
                let g = model.grads(g, &device);
                model = step.step(LR, model, g).unwrap();
            }
            assert_eq!(step.optimizer().map(|o| o.step_count()), Some(grads.len() as u64));
        }
    }
    model.values()
}

fn assert_params(what: &str, got: &[Vec<f64>], want: &[Vec<f64>], tolerance: Tolerance) {
    for (i, (got, want)) in got.iter().zip(want).enumerate() {
        assert_close(&format!("{what}, parameter {i} {:?}", SHAPES[i]), got, want, tolerance);
    }
}

#[test]
fn muon_with_an_adamw_fallback_follows_the_oracle_in_both_front_ends() {
    let shared = shared();
    let (initial, grads) = data(3, 3);
    let want = muon_oracle(&initial, &grads);
    let tolerance = Tolerance::Close { rtol: 1e-4, atol: 1e-5 };
    for front in [Front::DropIn, Front::ModuleStep] {
        let got = run(&shared, &front, muon().into(), Some(adamw().into()), &initial, &grads);
        let what = match front {
            Front::DropIn => "drop-in",
            Front::ModuleStep => "module step",
        };
        assert_params(&format!("Muon + AdamW, {what}"), &got, &want, tolerance);
    }
}

#[test]
fn adafactor_follows_the_oracle_in_both_front_ends() {
    let shared = shared();
    let (initial, grads) = data(4, 3);
    let want = adafactor_oracle(&initial, &grads);
    let tolerance = Tolerance::Close { rtol: 2e-5, atol: 2e-6 };
    for front in [Front::DropIn, Front::ModuleStep] {
        let got = run(&shared, &front, adafactor().into(), None, &initial, &grads);
        let what = match front {
            Front::DropIn => "drop-in",
            Front::ModuleStep => "module step",
        };
        assert_params(&format!("Adafactor, {what}"), &got, &want, tolerance);
    }
}

fn module_step(shared: &SharedDevice, algorithm: Algorithm, fallback: Option<Algorithm>) -> ModuleStep {
    let builder = ModuleStep::builder();
    let builder = match fallback {
        Some(fallback) => builder.fallback(fallback),
        None => builder,
    };
    builder.build(shared, algorithm).unwrap()
}

fn fused(shared: &SharedDevice, algorithm: Algorithm, fallback: Option<Algorithm>) -> FusedOptimizer {
    let fused = FusedOptimizer::new(shared, algorithm).unwrap();
    match fallback {
        Some(fallback) => fused.fallback(fallback).unwrap(),
        None => fused,
    }
}

#[test]
fn records_of_both_front_ends_resume_muon_and_adafactor_bit_for_bit() {
    let shared = shared();
    let device = shared.device().clone().autodiff();
    let (initial, grads) = data(5, 5);
    let (k, exact) = (3, Tolerance::exact(DType::F32));
    for (algorithm, fallback) in
        [(Algorithm::from(muon()), Some(Algorithm::from(adamw()))), (adafactor().into(), None)]
    {
        let name = algorithm.name();
        // The module step, uninterrupted and saved after k steps.
        let straight = run(&shared, &Front::ModuleStep, algorithm, fallback, &initial, &grads);
        let mut first = module_step(&shared, algorithm, fallback);
        let mut model = Net::new(&initial, &device);
        for g in &grads[..k] {
            let g = model.grads(g, &device);
            model = first.step(LR, model, g).unwrap();
        }
        let bytes = first.to_bytes().unwrap();
        drop(first);

        // Loaded into a new module step.
        let mut second = module_step(&shared, algorithm, fallback);
        second.load_bytes(bytes.clone()).unwrap();
        let mut resumed = model.clone();
        for g in &grads[k..] {
            let g = resumed.grads(g, &device);
            resumed = second.step(LR, resumed, g).unwrap();
        }
        assert_params(&format!("{name}, module step resumed"), &resumed.values(), &straight, exact);

        // The same bytes in the drop-in, whose own record resumes it too.
        let mut optim = fused(&shared, algorithm, fallback).load_bytes(bytes).unwrap();
        let mut dropped_in = model.clone();
        let g = dropped_in.grads(&grads[k], &device);
        dropped_in = optim.step(LR, dropped_in, g);
        let drop_in_bytes = optim.into_bytes().unwrap();
        drop(optim);
        let mut optim = fused(&shared, algorithm, fallback).load_bytes(drop_in_bytes).unwrap();
        for g in &grads[k + 1..] {
            let g = dropped_in.grads(g, &device);
            dropped_in = optim.step(LR, dropped_in, g);
        }
        assert_params(&format!("{name}, drop-in resumed"), &dropped_in.values(), &straight, exact);
    }
}

#[test]
fn muon_without_a_fallback_refuses_a_parameter_that_is_not_2d_with_nothing_changed() {
    let shared = shared();
    let device = shared.device().clone().autodiff();
    let (initial, grads) = data(6, 1);

    let mut step = ModuleStep::builder().build(&shared, muon()).unwrap();
    let model = Net::new(&initial, &device);
    let g = model.grads(&grads[0], &device);
    let refused = step.step(LR, model, g).unwrap_err();
    assert!(
        matches!(&refused.error, Error::BadShape { param: 1, shape, algorithm: "Muon", expected }
            if shape == &[8] && expected.contains("fallback")),
        "{}",
        refused.error
    );
    assert_params("after the refused step", &refused.module.values(), &initial, Tolerance::exact(DType::F32));
    assert!(step.optimizer().is_none() && step.param_step_count(refused.module.b1.id).is_none());

    // The drop-in, per tensor: the matrix steps, the bias is refused.
    let fused = FusedOptimizer::new(&shared, muon()).unwrap();
    let bias = tensor(&initial[1], [8], &device);
    let err = fused.try_step(LR, bias.clone(), bias, None).unwrap_err();
    assert!(
        matches!(&err, Error::BadShape { shape, algorithm: "Muon", expected, .. }
            if shape == &[8] && expected.contains("FusedOptimizer::fallback")),
        "{err}"
    );
    let w = tensor(&initial[0], [8, 5], &device);
    let (_, state) = fused.try_step(LR, w.clone(), w, None).unwrap();
    let kinds: Vec<StateKind> = state.states().map(|(kind, _)| kind).collect();
    assert!(kinds == [StateKind::MomentumBuffer] && state.time == 1, "{kinds:?} after {} steps", state.time);
}

#[test]
fn a_fallback_is_muons_only_and_not_muon() {
    let shared = shared();
    let conflicting =
        |e: Option<Error>| matches!(e, Some(Error::ConflictingOptions { first: "fallback", .. }));
    assert!(conflicting(FusedOptimizer::new(&shared, adamw()).unwrap().fallback(adamw()).err()));
    assert!(conflicting(FusedOptimizer::new(&shared, muon()).unwrap().fallback(muon()).err()));
    assert!(conflicting(ModuleStep::builder().fallback(adamw()).build(&shared, adafactor()).err()));
    assert!(conflicting(ModuleStep::builder().fallback(muon()).build(&shared, muon()).err()));
    // An invalid fallback is refused by its hyperparameter's name.
    let bad = Adam { beta1: 1.5, ..adamw() };
    assert!(matches!(
        ModuleStep::builder().fallback(bad).build(&shared, muon()).err(),
        Some(Error::BadHyperparameter { .. })
    ));
}
