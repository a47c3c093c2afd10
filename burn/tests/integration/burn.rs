//! The `burn` feature: Burn's tensors stepped by this crate's kernels on a shared device,
//! against the f64 oracle and against Burn's own AdamW.

use crate::common;

use burn::module::{Module, Param};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::momentum::MomentumConfig;
use burn::optim::{AdamWConfig, GradientsParams, ModuleOptimizer, SgdConfig};
use burn::tensor::{DType as BurnDType, Device, Distribution, Tensor, TensorData};
use common::{adagrad_variants, adam_switch_combinations, assert_close, sgd_variants, Rng, Tolerance};
use wgpu_optim::q8::Q8States;
use wgpu_optim::{
    Adam, Algorithm, BurnFailure, Error, GradClip, ScheduleFreeAdamW, ScheduleFreeMode, Sgd, StateStorage,
};
use wgpu_optim_burn::{adam_from_config, FusedOptimizer, ModuleStep, SharedDevice};
use wgpu_optim_testkit::oracle::{clip_grad_norm, ScheduleFreeOracle, ToOracle, TorchState};

use crate::common::{shared, tensor, values, Params};

/// `steps` gradients for parameters of the given lengths.
fn gradient_steps(rng: &mut Rng, lens: &[usize], steps: usize) -> Vec<Vec<Vec<f64>>> {
    (0..steps).map(|_| lens.iter().map(|&n| rng.vec(n, 1.0)).collect()).collect()
}

/// The oracle's parameters after `grads` from `initial`, with PyTorch's `clip_grad_norm_`
/// before each step where `clip` is given.
fn oracle(
    algorithm: Algorithm,
    initial: &[Vec<f64>],
    grads: &[Vec<Vec<f64>>],
    clip: Option<&GradClip>,
) -> Vec<Vec<f64>> {
    let mut params = initial.to_vec();
    let mut states: Vec<TorchState> =
        params.iter().map(|p| TorchState::new(algorithm.to_oracle(), p.len())).collect();
    for step in grads {
        let mut step = step.clone();
        if let Some(clip) = clip {
            clip_grad_norm(&mut step, &clip.to_oracle());
        }
        for ((p, g), s) in params.iter_mut().zip(&step).zip(&mut states) {
            s.step(p, g);
        }
    }
    params
}

fn every_algorithm() -> Vec<Algorithm> {
    let mut all = adam_switch_combinations();
    all.extend(sgd_variants());
    all.extend(adagrad_variants());
    all.extend(common::rmsprop_variants());
    all
}

#[test]
fn the_drop_in_optimizer_follows_the_oracle_for_every_algorithm() {
    let shared = shared();
    let device = shared.device().clone().autodiff();
    let mut rng = Rng::new(1);
    let lens = [1000, 37];
    let initial: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grads = gradient_steps(&mut rng, &lens, 3);
    for algorithm in every_algorithm() {
        let mut optim = FusedOptimizer::new(&shared, algorithm).unwrap().init();
        let mut model = Params::new(&initial, &device);
        for step in &grads {
            let g = model.grads(step, &device);
            model = optim.step(algorithm.lr(), model, g);
        }
        let want = oracle(algorithm, &initial, &grads, None);
        for (i, (got, want)) in model.values().iter().zip(&want).enumerate() {
            assert_close(&format!("{algorithm:?}, parameter {i}"), got, want, Tolerance::F32);
        }
    }
}

#[test]
fn the_module_step_follows_the_oracle_for_every_algorithm_in_one_step_call() {
    let shared = shared();
    let device = shared.device().clone().autodiff();
    let mut rng = Rng::new(2);
    let lens = [4096, 1000, 5, 4096];
    let initial: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grads = gradient_steps(&mut rng, &lens, 3);
    for algorithm in every_algorithm() {
        let mut step = ModuleStep::builder().build(&shared, algorithm).unwrap();
        let mut model = Params::new(&initial, &device);
        let mut buffers = Vec::new();
        for g in &grads {
            let g = model.grads(g, &device);
            model = step.step(algorithm.lr(), model, g).unwrap();
            buffers.push(step.optimizer().unwrap().params().to_vec());
        }
        assert_eq!(step.optimizer().map(|o| o.step_count()), Some(3));
        // Nothing else holds the parameters: every step writes the same buffers in place.
        assert!(buffers.windows(2).all(|w| w[0] == w[1]), "{algorithm:?}: a parameter moved");
        let want = oracle(algorithm, &initial, &grads, None);
        for (i, (got, want)) in model.values().iter().zip(&want).enumerate() {
            assert_close(&format!("{algorithm:?}, parameter {i}"), got, want, Tolerance::F32);
        }
    }
}

#[test]
fn the_module_step_clips_the_global_gradient_norm() {
    let shared = shared();
    let device = shared.device().clone().autodiff();
    let mut rng = Rng::new(3);
    let lens = [3000, 200];
    let initial: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grads = gradient_steps(&mut rng, &lens, 3);
    let clip = GradClip::l2(2.0);
    let algorithm: Algorithm = Adam::adamw().into();
    let mut step = ModuleStep::builder().grad_clip(clip).build(&shared, algorithm).unwrap();
    let mut model = Params::new(&initial, &device);
    for g in &grads {
        let g = model.grads(g, &device);
        model = step.step(algorithm.lr(), model, g).unwrap();
    }
    let want = oracle(algorithm, &initial, &grads, Some(&clip));
    for (i, (got, want)) in model.values().iter().zip(&want).enumerate() {
        assert_close(&format!("clipped AdamW, parameter {i}"), got, want, Tolerance::F32);
    }
}

#[test]
fn an_amp_step_with_an_infinite_gradient_is_skipped_on_the_device() {
    let shared = shared();
    let device = shared.device().clone().autodiff();
    let mut rng = Rng::new(4);
    let initial = vec![rng.vec(512, 1.0)];
    let algorithm: Algorithm = Adam::default().into();
    let mut step = ModuleStep::builder().capturable(true).build(&shared, algorithm).unwrap();
    let model = Params::new(&initial, &device);
    let mut bad = rng.vec(512, 1.0);
    bad[17] = f64::INFINITY;
    let inv_scale = tensor(&[0.5], shared.device());
    let g = model.grads(&[bad], &device);
    let model = step.step_unscaled(1e-3, model, g, &inv_scale).unwrap();
    assert!(step.optimizer().unwrap().read_found_inf().unwrap());
    assert_close("skipped step", &model.values()[0], &initial[0], Tolerance::exact(wgpu_optim::DType::F32));

    let good = rng.vec(512, 2.0);
    let g = model.grads(std::slice::from_ref(&good), &device);
    let model = step.step_unscaled(1e-3, model, g, &inv_scale).unwrap();
    let unscaled: Vec<f64> = good.iter().map(|g| g * 0.5).collect();
    let want = oracle(algorithm, &initial, &[vec![unscaled]], None);
    assert_close("unscaled step", &model.values()[0], &want[0], Tolerance::F32);
}

#[test]
fn burn_kernels_and_steps_interleave_in_submission_order_with_no_host_sync() {
    let shared = shared();
    let device = shared.device().clone().autodiff();
    let mut rng = Rng::new(5);
    let initial = vec![rng.vec(4096, 1.0)];
    let grads = gradient_steps(&mut rng, &[4096], 4);
    let algorithm: Algorithm = Sgd { lr: 0.1, momentum: 0.9, ..Sgd::default() }.into();
    let mut module_step = ModuleStep::builder().build(&shared, algorithm).unwrap();
    let mut per_tensor = FusedOptimizer::new(&shared, algorithm).unwrap().init();
    for use_module_step in [true, false] {
        let mut model = Params::new(&initial, &device);
        let (mut before, mut after) = (Vec::new(), Vec::new());
        for g in &grads {
            // Queued by Burn, not yet run: it must see the parameter before the step.
            before.push(model.params[0].val().inner().mul_scalar(2.0));
            let g = model.grads(g, &device);
            model = if use_module_step {
                module_step.step(0.1, model, g).unwrap()
            } else {
                per_tensor.step(0.1, model, g)
            };
            // Queued after the step: it must see the new values.
            after.push(model.params[0].val().inner().add_scalar(1.0));
        }
        for k in 0..grads.len() {
            let at = |n: usize| oracle(algorithm, &initial, &grads[..n], None).remove(0);
            let twice: Vec<f64> = at(k).iter().map(|v| 2.0 * v).collect();
            let plus_one: Vec<f64> = at(k + 1).iter().map(|v| v + 1.0).collect();
            let how = if use_module_step { "module step" } else { "per-tensor" };
            assert_close(
                &format!("{how}: Burn's read before step {k}"),
                &values(before[k].clone()),
                &twice,
                Tolerance::F32,
            );
            assert_close(
                &format!("{how}: Burn's read after step {k}"),
                &values(after[k].clone()),
                &plus_one,
                Tolerance::F32,
            );
        }
    }
}

#[test]
fn a_parameter_whose_storage_is_shared_is_copied_not_overwritten() {
    let shared = shared();
    let device = shared.device().clone().autodiff();
    let mut rng = Rng::new(6);
    let initial = vec![rng.vec(2048, 1.0), rng.vec(300, 1.0)];
    let grads = gradient_steps(&mut rng, &[2048, 300], 1);
    let algorithm: Algorithm = Adam::default().into();
    let want = oracle(algorithm, &initial, &grads, None);

    let model = Params::new(&initial, &device);
    let kept = model.clone();
    let mut step = ModuleStep::builder().build(&shared, algorithm).unwrap();
    let g = model.grads(&grads[0], &device);
    let stepped = step.step(1e-3, model, g).unwrap();
    for i in 0..2 {
        assert_close(&format!("module step, parameter {i}"), &stepped.values()[i], &want[i], Tolerance::F32);
        assert_close(
            &format!("the clone's parameter {i}"),
            &kept.values()[i],
            &initial[i],
            Tolerance::exact(wgpu_optim::DType::F32),
        );
    }

    let model = Params::new(&initial, &device);
    let kept = model.clone();
    let mut optim = FusedOptimizer::new(&shared, algorithm).unwrap().init();
    let g = model.grads(&grads[0], &device);
    let stepped = optim.step(1e-3, model, g);
    for i in 0..2 {
        assert_close(&format!("per-tensor, parameter {i}"), &stepped.values()[i], &want[i], Tolerance::F32);
        assert_close(
            &format!("the clone's parameter {i}"),
            &kept.values()[i],
            &initial[i],
            Tolerance::exact(wgpu_optim::DType::F32),
        );
    }
}

#[test]
fn the_module_step_carries_the_state_when_a_parameter_moves_to_new_storage() {
    let shared = shared();
    let device = shared.device().clone().autodiff();
    let mut rng = Rng::new(9);
    let lens = [1024, 96];
    let initial: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grads = gradient_steps(&mut rng, &lens, 4);
    for algorithm in [
        Algorithm::from(Adam { amsgrad: true, ..Adam::adamw() }),
        Sgd { lr: 0.01, momentum: 0.9, ..Sgd::default() }.into(),
    ] {
        let mut step = ModuleStep::builder().build(&shared, algorithm).unwrap();
        let mut model = Params::new(&initial, &device);
        let mut snapshots = Vec::new();
        for (k, g) in grads.iter().enumerate() {
            if k % 2 == 1 {
                // A clone shares the storage: the step copies, so the optimizer is rebuilt
                // over the new buffers and must bring the moments along.
                snapshots.push(model.clone());
            }
            let g = model.grads(g, &device);
            model = step.step(algorithm.lr(), model, g).unwrap();
        }
        let want = oracle(algorithm, &initial, &grads, None);
        for (i, (got, want)) in model.values().iter().zip(&want).enumerate() {
            assert_close(&format!("{algorithm:?} after two moves, parameter {i}"), got, want, Tolerance::F32);
        }
        let first_snapshot = oracle(algorithm, &initial, &grads[..1], None);
        assert_close("the first snapshot", &snapshots[0].values()[0], &first_snapshot[0], Tolerance::F32);
    }
}

#[test]
fn burns_optimizer_record_saves_and_restores_the_state_bit_for_bit() {
    let shared = shared();
    let device = shared.device().clone().autodiff();
    let mut rng = Rng::new(7);
    let initial = vec![rng.vec(1500, 1.0), rng.vec(64, 1.0)];
    let grads = gradient_steps(&mut rng, &[1500, 64], 4);
    let algorithm: Algorithm = Adam { amsgrad: true, ..Adam::adamw() }.into();

    let mut straight = FusedOptimizer::new(&shared, algorithm).unwrap().init();
    let mut model = Params::new(&initial, &device);
    for g in &grads {
        let g = model.grads(g, &device);
        model = straight.step(1e-3, model, g);
    }

    let mut first = FusedOptimizer::new(&shared, algorithm).unwrap().init();
    let mut resumed = Params::new(&initial, &device);
    for g in &grads[..2] {
        let g = resumed.grads(g, &device);
        resumed = first.step(1e-3, resumed, g);
    }
    let bytes = first.into_bytes().unwrap();
    drop(first);
    let mut second = FusedOptimizer::new(&shared, algorithm).unwrap().init().from_bytes(bytes).unwrap();
    for g in &grads[2..] {
        let g = resumed.grads(g, &device);
        resumed = second.step(1e-3, resumed, g);
    }
    for (i, (got, want)) in resumed.values().iter().zip(model.values()).enumerate() {
        assert_close(&format!("resumed parameter {i}"), got, &want, Tolerance::exact(wgpu_optim::DType::F32));
    }
}

#[derive(Module, Debug)]
struct Mlp {
    layers: Vec<Linear>,
}

impl Mlp {
    fn forward(&self, mut x: Tensor<2>) -> Tensor<2> {
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward(x);
            if i + 1 < self.layers.len() {
                x = Relu::new().forward(x);
            }
        }
        x
    }
}

#[test]
fn training_matches_burns_adamw_loss_for_fifty_steps() {
    let shared = shared();
    let device = shared.device().clone().autodiff();
    device.seed(11);
    let layers = [16, 32, 32, 1].windows(2).map(|w| LinearConfig::new(w[0], w[1]).init(&device)).collect();
    let initial = Mlp { layers };
    let x = Tensor::<2>::random([128, 16], Distribution::Normal(0.0, 1.0), &device);
    let y = x.clone().sum_dim(1).sin();
    // Burn's hyperparameters are f32: the same values, not 0.999's f64 neighbour.
    let adamw = Adam {
        lr: 3e-3,
        beta1: f64::from(0.9f32),
        beta2: f64::from(0.999f32),
        eps: f64::from(1e-5f32),
        weight_decay: f64::from(1e-4f32),
        decoupled_weight_decay: true,
        ..Adam::default()
    };
    let loss_curve = |mut step: Box<dyn FnMut(Mlp, GradientsParams) -> Mlp>| {
        let mut model = initial.clone();
        let mut losses = Vec::new();
        for _ in 0..50 {
            let loss = (model.forward(x.clone()) - y.clone()).powi_scalar(2).mean();
            losses.push(f64::from(loss.clone().into_scalar::<f32>()));
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = step(model, grads);
        }
        losses
    };
    let mut burn: ModuleOptimizer = AdamWConfig::new().with_epsilon(1e-5).with_weight_decay(1e-4).init();
    let burns = loss_curve(Box::new(move |m, g| burn.step(3e-3, m, g)));
    let mut per_tensor = FusedOptimizer::new(&shared, adamw).unwrap().init();
    let ours = loss_curve(Box::new(move |m, g| per_tensor.step(3e-3, m, g)));
    let mut module_step = ModuleStep::builder().build(&shared, adamw).unwrap();
    let fused = loss_curve(Box::new(move |m, g| module_step.step(3e-3, m, g).unwrap()));
    assert!(burns[49] < 0.5 * burns[0], "the task trains: {} -> {}", burns[0], burns[49]);
    // Burn computes the bias corrections in f32 and this crate in f64, and orders the
    // update's operations differently: the curves drift apart by about an f32 ulp of the
    // loss per step.
    let tolerance = Tolerance::Close { rtol: 2e-5, atol: 1e-7 };
    assert_close("per-tensor loss curve", &ours, &burns, tolerance);
    assert_close("module step loss curve", &fused, &burns, tolerance);
    // The two ways of stepping run the same kernel on the same values.
    assert_close("module step against per-tensor", &fused, &ours, Tolerance::exact(wgpu_optim::DType::F32));
}

#[test]
fn what_cannot_be_stepped_is_refused_with_nothing_written() {
    let shared = shared();
    let device = shared.device().clone().autodiff();
    let mut rng = Rng::new(8);
    let initial = vec![rng.vec(256, 1.0), rng.vec(256, 1.0)];
    let algorithm: Algorithm = Adam::default().into();

    // An f64 parameter.
    let mut model = Params::new(&initial, &device);
    model.params[1] = Param::from_tensor(tensor(&initial[1], &device).cast(BurnDType::F64));
    let g = model.grads(&[rng.vec(256, 1.0), rng.vec(256, 1.0)], &device);
    let kept = model.clone();
    let mut step = ModuleStep::builder().build(&shared, algorithm).unwrap();
    let err = step.step(1e-3, model, g).unwrap_err().error;
    assert!(
        matches!(&err, Error::Burn { cause: BurnFailure::Tensor, detail: m } if m.contains("F64")),
        "{err}"
    );
    assert_close(
        "parameter 0 untouched",
        &values(kept.params[0].val()),
        &initial[0],
        Tolerance::exact(wgpu_optim::DType::F32),
    );

    // A gradient of the wrong shape.
    let model = Params::new(&initial, &device);
    let mut g = GradientsParams::new();
    g.register(model.params[0].id, tensor(&rng.vec(255, 1.0), &device));
    let err = step.step(1e-3, model, g).unwrap_err().error;
    assert!(
        matches!(&err, Error::Burn { cause: BurnFailure::Tensor, detail: m } if m.contains("shape")),
        "{err}"
    );

    // With global clipping, parameters whose step counts differ (one skipped a step): the
    // clipping norm covers one optimizer.
    let mut step = ModuleStep::builder().grad_clip(GradClip::l2(1.0)).build(&shared, algorithm).unwrap();
    let model = Params::new(&initial, &device);
    let g = model.grads(&[rng.vec(256, 1.0), rng.vec(256, 1.0)], &device);
    let model = step.step(1e-3, model, g).unwrap();
    let mut g = GradientsParams::new();
    g.register(model.params[0].id, tensor(&rng.vec(256, 1.0), &device));
    let model = step.step(1e-3, model, g).unwrap();
    let g = model.grads(&[rng.vec(256, 1.0), rng.vec(256, 1.0)], &device);
    let err = step.step(1e-3, model, g).unwrap_err().error;
    assert!(
        matches!(&err, Error::Burn { cause: BurnFailure::Step, detail: m } if m.contains("different step counts")),
        "{err}"
    );

    // What the optimizer itself refuses for these parameters (8-bit state needs F32 ones).
    let mut model = Params::new(&initial, &device);
    model.params[0] = Param::from_tensor(tensor(&initial[0], &device).cast(BurnDType::F16));
    let mut g = GradientsParams::new();
    g.register(model.params[0].id, tensor(&rng.vec(256, 1.0), &device).cast(BurnDType::F16));
    let err = ModuleStep::builder()
        .state_storage(StateStorage::Q8(Q8States::default()))
        .build(&shared, algorithm)
        .unwrap()
        .step(1e-3, model, g)
        .unwrap_err()
        .error;
    assert!(matches!(err, Error::DTypeMismatch { .. }), "{err}");

    // AMP without capturable mode.
    let model = Params::new(&initial, &device);
    let g = model.grads(&[rng.vec(256, 1.0), rng.vec(256, 1.0)], &device);
    let inv_scale = tensor(&[1.0], shared.device());
    let err = ModuleStep::builder()
        .build(&shared, algorithm)
        .unwrap()
        .step_unscaled(1e-3, model, g, &inv_scale)
        .unwrap_err()
        .error;
    assert!(matches!(err, Error::NeedsOption { option: "capturable", .. }), "{err}");

    // Options a module owns (master weights, model copies, shapes) have no setter on
    // `ModuleStepBuilder`: its compile_fail doctest shows it.

    // The per-tensor step on an f64 tensor.
    let optim = FusedOptimizer::new(&shared, algorithm).unwrap();
    let p = tensor(&initial[0], shared.device()).cast(BurnDType::F64);
    let err = optim.try_step(1e-3, p, tensor(&initial[1], shared.device()), None).unwrap_err();
    assert!(
        matches!(&err, Error::Burn { cause: BurnFailure::Tensor, detail: m } if m.contains("F64")),
        "{err}"
    );
}

#[test]
fn both_sides_share_one_device() {
    // This crate's device handed to Burn: a Burn op and a step see each other's writes.
    let shared = shared();
    let t = tensor(&[1.0, 2.0, 3.0, 4.0], shared.device());
    assert_eq!(values(t.mul_scalar(3.0)), vec![3.0, 6.0, 9.0, 12.0]);
    let report = shared.context().report();
    assert!(!report.adapter_name.is_empty());
    // A context whose device lacks the adapter's limits is refused before Burn sees it.
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter =
        pollster::block_on(wgpu::util::initialize_adapter_from_env_or_default(&instance, None)).unwrap();
    let (device, queue) =
        pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor::default())).unwrap();
    let ctx = wgpu_optim::GpuContext::from_device(device, queue);
    let err = SharedDevice::from_context(ctx, instance, adapter).unwrap_err();
    assert!(
        matches!(&err, Error::Burn { cause: BurnFailure::Device, detail: m } if m.contains("adapter")),
        "{err}"
    );
}

fn exact() -> Tolerance {
    Tolerance::exact(wgpu_optim::DType::F32)
}

fn assert_all(what: &str, got: &[Vec<f64>], want: &[Vec<f64>], tolerance: Tolerance) {
    assert_eq!(got.len(), want.len(), "{what}: parameter count");
    for (i, (got, want)) in got.iter().zip(want).enumerate() {
        assert_close(&format!("{what}, parameter {i}"), got, want, tolerance);
    }
}

#[test]
fn a_refused_module_step_hands_the_module_back_with_its_values_and_state_unchanged() {
    let shared = shared();
    let device = shared.device().clone().autodiff();
    let mut rng = Rng::new(10);
    let lens = [512, 40];
    let initial: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grads = gradient_steps(&mut rng, &lens, 2);
    let algorithm: Algorithm = Adam::adamw().into();
    let mut step = ModuleStep::builder().build(&shared, algorithm).unwrap();
    let model = Params::new(&initial, &device);
    let g = model.grads(&grads[0], &device);
    let model = step.step(algorithm.lr(), model, g).unwrap();
    let after_one = model.values();

    // A learning rate the algorithm refuses.
    let g = model.grads(&grads[1], &device);
    let (model, error) = step.step(-1.0, model, g).unwrap_err().into_inner();
    assert!(error.to_string().contains("lr"), "{error}");
    assert_all("after a refused lr", &model.values(), &after_one, exact());

    // A gradient of another dtype than its parameter's.
    let mut g = GradientsParams::new();
    g.register(model.params[0].id, tensor(&grads[1][0], &device));
    g.register(model.params[1].id, tensor(&grads[1][1], &device).cast(BurnDType::F16));
    let refused = step.step(algorithm.lr(), model, g).unwrap_err();
    assert!(
        matches!(&refused.error, Error::Burn { cause: BurnFailure::Tensor, detail: m } if m.contains("F16")),
        "{}",
        refused.error
    );
    let model = refused.module;
    assert_all("after a refused gradient", &model.values(), &after_one, exact());

    // Nothing of the state moved either: the next step is the oracle's second.
    let g = model.grads(&grads[1], &device);
    let model = step.step(algorithm.lr(), model, g).unwrap();
    assert_all("the step after", &model.values(), &oracle(algorithm, &initial, &grads, None), Tolerance::F32);
}

/// `k + m` steps of `algorithm` uninterrupted, and `k` steps saved, loaded into a new
/// `ModuleStep` (after `warm` steps of its own on another model, when given) and `m` more.
fn resume(shared: &SharedDevice, algorithm: Algorithm, k: usize, m: usize, warm: bool) -> [Vec<Vec<f64>>; 3] {
    let device = shared.device().clone().autodiff();
    let mut rng = Rng::new(11);
    let lens = [1500, 64, 3];
    let initial: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grads = gradient_steps(&mut rng, &lens, k + m);
    let run = |step: &mut ModuleStep, mut model: Params, grads: &[Vec<Vec<f64>>]| {
        for g in grads {
            let g = model.grads(g, &device);
            model = step.step(1e-2, model, g).unwrap();
        }
        model
    };
    let straight = run(
        &mut ModuleStep::builder().build(shared, algorithm).unwrap(),
        Params::new(&initial, &device),
        &grads,
    );

    let mut first = ModuleStep::builder().build(shared, algorithm).unwrap();
    let model = run(&mut first, Params::new(&initial, &device), &grads[..k]);
    let bytes = first.to_bytes().unwrap();
    drop(first);
    let mut second = ModuleStep::builder().build(shared, algorithm).unwrap();
    if warm {
        let other = Params::new(&initial, &device);
        run(&mut second, other, &grads[..1]);
    }
    second.load_bytes(bytes.clone()).unwrap();
    let resumed = run(&mut second, model.clone(), &grads[k..]);
    assert!(model.params.iter().all(|p| second.param_step_count(p.id) == Some((k + m) as u64)));

    // The same bytes are a Burn optimizer record the drop-in reads.
    let mut optim = FusedOptimizer::new(shared, algorithm).unwrap().load_bytes(bytes).unwrap();
    let mut dropped_in = model;
    for g in &grads[k..] {
        let g = dropped_in.grads(g, &device);
        dropped_in = optim.step(1e-2, dropped_in, g);
    }
    [straight.values(), resumed.values(), dropped_in.values()]
}

#[test]
fn the_module_step_resumes_from_its_saved_state_bit_for_bit() {
    let shared = shared();
    for algorithm in [
        Algorithm::from(Adam { amsgrad: true, ..Adam::adamw() }),
        Sgd { lr: 0.01, momentum: 0.9, nesterov: true, ..Sgd::default() }.into(),
        schedule_free(),
    ] {
        for warm in [false, true] {
            let [straight, resumed, dropped_in] = resume(&shared, algorithm, 3, 2, warm);
            let when = if warm { "after a step" } else { "before the first step" };
            assert_all(&format!("{algorithm:?} loaded {when}"), &resumed, &straight, exact());
            assert_all(&format!("{algorithm:?} in the drop-in"), &dropped_in, &straight, exact());
        }
    }
}

#[test]
fn a_parameter_without_a_gradient_keeps_its_value_and_state_and_its_own_step_count() {
    let shared = shared();
    let device = shared.device().clone().autodiff();
    let mut rng = Rng::new(12);
    let lens = [700, 50];
    let initial: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grads = gradient_steps(&mut rng, &lens, 4);
    let algorithm: Algorithm = Adam::adamw().into();
    let oracle_of = |i: usize, steps: &[usize]| {
        let g: Vec<Vec<Vec<f64>>> = steps.iter().map(|&s| vec![grads[s][i].clone()]).collect();
        oracle(algorithm, &initial[i..=i], &g, None).remove(0)
    };
    let mut step = ModuleStep::builder().build(&shared, algorithm).unwrap();
    let mut per_tensor = FusedOptimizer::new(&shared, algorithm).unwrap().init();
    let mut model = Params::new(&initial, &device);
    let mut reference = Params::new(&initial, &device);
    let only_first = |model: &Params, g: &[Vec<f64>]| {
        let mut out = GradientsParams::new();
        out.register(model.params[0].id, tensor(&g[0], &device));
        out
    };
    // Both, the first alone (twice), both again.
    for (s, g) in grads.iter().enumerate() {
        let both = s == 0 || s == 3;
        let (gm, gr) = if both {
            (model.grads(g, &device), reference.grads(g, &device))
        } else {
            (only_first(&model, g), only_first(&reference, g))
        };
        let before = model.values();
        model = step.step(algorithm.lr(), model, gm).unwrap();
        reference = per_tensor.step(algorithm.lr(), reference, gr);
        if !both {
            assert_close(
                &format!("the skipped parameter at step {s}"),
                &model.values()[1],
                &before[1],
                exact(),
            );
        }
    }
    assert_eq!(step.param_step_count(model.params[0].id), Some(4));
    assert_eq!(step.param_step_count(model.params[1].id), Some(2));
    // Each parameter's own steps, its bias correction counting them (Burn's and PyTorch's).
    let values = model.values();
    assert_close(
        "the parameter stepped every time",
        &values[0],
        &oracle_of(0, &[0, 1, 2, 3]),
        Tolerance::F32,
    );
    assert_close("the parameter that resumed", &values[1], &oracle_of(1, &[0, 3]), Tolerance::F32);
    // Burn's drop-in runs the same kernel per parameter: the same bits.
    assert_all("against the drop-in", &values, &reference.values(), exact());
}

/// A module of two rank-2 parameters, which Burn's AdamW and the fused step update alike.
fn two_layer_params(device: &Device) -> Params {
    let mut rng = Rng::new(13);
    Params::new(&[rng.vec(600, 1.0), rng.vec(24, 1.0)], device)
}

#[test]
fn burns_adamw_record_continues_burns_trajectory_in_the_fused_optimizers() {
    let shared = shared();
    let device = shared.device().clone().autodiff();
    let mut rng = Rng::new(14);
    let grads = gradient_steps(&mut rng, &[600, 24], 5);
    let lr = 1e-2;
    let config = AdamWConfig::new().with_amsgrad(true);
    let adamw = adam_from_config(&config).unwrap();
    let mut burn = config.init();
    let mut model = two_layer_params(&device);
    for g in &grads[..3] {
        let g = model.grads(g, &device);
        model = burn.step(lr, model, g);
    }
    let bytes = burn.into_bytes().unwrap();
    let continue_with = |step: &mut dyn FnMut(Params, GradientsParams) -> Params| {
        let mut model = model.clone();
        for g in &grads[3..] {
            let g = model.grads(g, &device);
            model = step(model, g);
        }
        model.values()
    };
    let burns = continue_with(&mut |m, g| burn.step(lr, m, g));
    let mut checked = FusedOptimizer::new(&shared, adamw).unwrap().load_bytes(bytes.clone()).unwrap();
    let mut unchecked =
        FusedOptimizer::new(&shared, adamw).unwrap().init().from_bytes(bytes.clone()).unwrap();
    let mut module_step = ModuleStep::builder().build(&shared, adamw).unwrap();
    module_step.load_bytes(bytes).unwrap();
    let mut fresh = FusedOptimizer::new(&shared, adamw).unwrap().init();
    // Burn's f32 bias corrections against this crate's f64 ones: an ulp or two per step.
    let tolerance = Tolerance::Close { rtol: 1e-5, atol: 1e-6 };
    assert_all(
        "drop-in, checked load",
        &continue_with(&mut |m, g| checked.step(lr, m, g)),
        &burns,
        tolerance,
    );
    assert_all(
        "drop-in, Burn's load",
        &continue_with(&mut |m, g| unchecked.step(lr, m, g)),
        &burns,
        tolerance,
    );
    assert_all(
        "module step",
        &continue_with(&mut |m, g| module_step.step(lr, m, g).unwrap()),
        &burns,
        tolerance,
    );
    // The state carried matters: from fresh moments the trajectory is another one.
    let restarted = continue_with(&mut |m, g| fresh.step(lr, m, g));
    let apart = restarted[0].iter().zip(&burns[0]).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    assert!(apart > 1e-3, "a fresh optimizer lands {apart} from Burn's continuation");
}

#[test]
fn another_optimizers_record_is_refused_by_name_not_loaded_as_nothing() {
    let shared = shared();
    let device = shared.device().clone().autodiff();
    let mut rng = Rng::new(15);
    let grads = gradient_steps(&mut rng, &[600, 24], 1);
    let momentum = MomentumConfig::new().with_dampening(0.0);
    let mut sgd = SgdConfig::new().with_momentum(Some(momentum)).init();
    let model = two_layer_params(&device);
    let g = model.grads(&grads[0], &device);
    let model = sgd.step(1e-2, model, g);
    let bytes = sgd.into_bytes().unwrap();
    let adamw = Adam::burn_adamw();

    let err = FusedOptimizer::new(&shared, adamw).unwrap().load_bytes(bytes.clone()).err().unwrap();
    assert!(
        matches!(&err, Error::Burn { cause: BurnFailure::Record, detail: m } if m.contains("momentum.velocity")),
        "{err}"
    );
    let mut step = ModuleStep::builder().build(&shared, adamw).unwrap();
    let err = step.load_bytes(bytes.clone()).unwrap_err();
    assert!(
        matches!(&err, Error::Burn { cause: BurnFailure::Record, detail: m } if m.contains("momentum.velocity")),
        "{err}"
    );

    // Through Burn's own `from_bytes`, which cannot refuse: the step does, by name.
    let optim = FusedOptimizer::new(&shared, adamw).unwrap();
    let mut loaded = optim.clone().init().from_bytes(bytes).unwrap();
    let g = model.grads(&grads[0], &device);
    let panic =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loaded.step(1e-2, model.clone(), g)))
            .expect_err("a foreign state is not stepped");
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(message.contains("another optimizer's state"), "{message}");

    // This crate's record of another algorithm: SGD's momentum buffer is no Adam state.
    let sgd_here: Algorithm = Sgd { lr: 0.01, momentum: 0.9, ..Sgd::default() }.into();
    let mut ours = FusedOptimizer::new(&shared, sgd_here).unwrap().init();
    let g = model.grads(&grads[0], &device);
    ours.step(1e-2, model.clone(), g);
    let err = optim.load_bytes(ours.into_bytes().unwrap()).err().unwrap();
    assert!(
        matches!(&err, Error::Burn { cause: BurnFailure::Record, detail: m } if m.contains("momentum_buffer")),
        "{err}"
    );
}

#[test]
fn burns_adamw_defaults_by_name_are_burns() {
    let config = AdamWConfig::new();
    let json: serde_json::Value = serde_json::from_str(&burn::config::config_to_json(&config)).unwrap();
    let burn = |name: &str| f64::from(json[name].as_f64().unwrap() as f32);
    let ours = Adam::burn_adamw();
    assert_eq!(
        [ours.beta1, ours.beta2, ours.eps, ours.weight_decay],
        [burn("beta_1"), burn("beta_2"), burn("epsilon"), burn("weight_decay")]
    );
    assert!(ours.decoupled_weight_decay && !ours.amsgrad && json["amsgrad"] == false);
    assert_eq!(adam_from_config(&config).unwrap(), ours);
    let tuned = AdamWConfig::new().with_epsilon(1e-7).with_weight_decay(0.05).with_amsgrad(true);
    let want = Adam { eps: f64::from(1e-7f32), weight_decay: f64::from(0.05f32), amsgrad: true, ..ours };
    assert_eq!(adam_from_config(&tuned).unwrap(), want);
    let err = adam_from_config(&AdamWConfig::new().with_cautious_weight_decay(true)).unwrap_err();
    assert!(
        matches!(&err, Error::Burn { cause: BurnFailure::Config, detail: m } if m.contains("cautious")),
        "{err}"
    );
}

/// Schedule-Free AdamW with a warm-up, weight decay and a polynomial weight, so that every
/// running value matters; its lr is the one the tests pass to the front ends.
fn schedule_free() -> Algorithm {
    ScheduleFreeAdamW {
        lr: 1e-2,
        warmup_steps: 3,
        weight_decay: 0.01,
        r: 0.5,
        ..ScheduleFreeAdamW::default()
    }
    .into()
}

fn schedule_free_oracle(count: usize) -> ScheduleFreeOracle {
    match schedule_free() {
        Algorithm::ScheduleFreeAdamW(config) => ScheduleFreeOracle::new(config.to_oracle(), count),
        other => unreachable!("{other:?}"),
    }
}

#[test]
fn schedule_free_steps_evals_and_trains_in_both_front_ends_as_the_oracle() {
    let shared = shared();
    let device = shared.device().clone().autodiff();
    let mut rng = Rng::new(21);
    let lens = [1000, 37];
    let initial: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grads = gradient_steps(&mut rng, &lens, 5);
    let mut oracle = schedule_free_oracle(lens.len());
    let mut want = initial.clone();
    for g in &grads {
        oracle.step(&mut want, g);
    }
    let mut want_eval = want.clone();
    oracle.eval(&mut want_eval);
    let mut want_train = want_eval.clone();
    oracle.train(&mut want_train);

    let fused = FusedOptimizer::new(&shared, schedule_free()).unwrap();
    let mut optim = fused.clone().init();
    let mut per_tensor = Params::new(&initial, &device);
    let mut step = ModuleStep::builder().build(&shared, schedule_free()).unwrap();
    let mut module = Params::new(&initial, &device);
    for g in &grads {
        let gp = per_tensor.grads(g, &device);
        per_tensor = optim.step(1e-2, per_tensor, gp);
        let gm = module.grads(g, &device);
        module = step.step(1e-2, module, gm).unwrap();
    }
    assert_all("FusedOptimizer's y", &per_tensor.values(), &want, Tolerance::F32);
    assert_all("ModuleStep's y", &module.values(), &want, Tolerance::F32);

    let per_tensor = fused.eval(&optim, per_tensor).unwrap();
    let module = step.eval(module).unwrap();
    assert_eq!((fused.mode(), step.mode()), (ScheduleFreeMode::Eval, ScheduleFreeMode::Eval));
    assert_all("FusedOptimizer's x", &per_tensor.values(), &want_eval, Tolerance::F32);
    assert_all("ModuleStep's x", &module.values(), &want_eval, Tolerance::F32);
    // A second eval() is a no-op, as the package's.
    let module = step.eval(module).unwrap();
    assert_all("ModuleStep's x after eval() twice", &module.values(), &want_eval, Tolerance::F32);

    // Steps in eval mode are refused, nothing changed.
    let before = module.values();
    let g = module.grads(&grads[0], &device);
    let refused = step.step(1e-2, module, g).unwrap_err();
    assert!(matches!(refused.error, Error::EvalMode { call: "ModuleStep::step" }), "{}", refused.error);
    let module = refused.module;
    assert_all("after the refused step", &module.values(), &before, exact());
    let t: Tensor<1> = Tensor::from_data(TensorData::new(vec![1.0f32; 3], [3]), shared.device());
    let refused = fused.try_step(1e-2, t.clone(), t, None).unwrap_err();
    assert!(matches!(refused, Error::EvalMode { call: "FusedOptimizer::step" }), "{refused}");

    let per_tensor = fused.train(&optim, per_tensor).unwrap();
    let module = step.train(module).unwrap();
    assert_all("FusedOptimizer's y again", &per_tensor.values(), &want_train, Tolerance::F32);
    assert_all("ModuleStep's y again", &module.values(), &want_train, Tolerance::F32);
    assert_eq!((fused.mode(), step.mode()), (ScheduleFreeMode::Train, ScheduleFreeMode::Train));
    // Training goes on from y.
    let g = module.grads(&grads[0], &device);
    step.step(1e-2, module, g).unwrap();
}

#[test]
fn schedule_free_keeps_each_parameters_running_values_when_the_set_with_gradients_changes() {
    let shared = shared();
    let device = shared.device().clone().autodiff();
    let mut rng = Rng::new(22);
    let lens = [700, 50];
    let initial: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grads = gradient_steps(&mut rng, &lens, 5);
    // Parameter 1 has no gradient at steps 1 and 2: it takes 3 steps, its own running
    // values (warm-up, weight sum) counting them.
    let takes = |i: usize, s: usize| i == 0 || !(1..=2).contains(&s);
    let mut oracles: Vec<ScheduleFreeOracle> = (0..2).map(|_| schedule_free_oracle(1)).collect();
    let mut want: Vec<Vec<Vec<f64>>> = initial.iter().map(|p| vec![p.clone()]).collect();
    let mut step = ModuleStep::builder().build(&shared, schedule_free()).unwrap();
    let mut model = Params::new(&initial, &device);
    for (s, g) in grads.iter().enumerate() {
        let mut gp = GradientsParams::new();
        for i in 0..2 {
            if takes(i, s) {
                oracles[i].step(&mut want[i], &g[i..=i]);
                gp.register(model.params[i].id, tensor(&g[i], &device));
            }
        }
        model = step.step(1e-2, model, gp).unwrap();
    }
    assert_eq!(step.param_step_count(model.params[1].id), Some(3));
    let want: Vec<Vec<f64>> = want.into_iter().map(|mut p| p.remove(0)).collect();
    assert_all("y", &model.values(), &want, Tolerance::F32);
    // Both parameters in x, each from its own values, though their counts differ.
    let model = step.eval(model).unwrap();
    let mut want_eval: Vec<Vec<Vec<f64>>> = want.iter().map(|p| vec![p.clone()]).collect();
    for (oracle, p) in oracles.iter_mut().zip(&mut want_eval) {
        oracle.eval(p);
    }
    let want_eval: Vec<Vec<f64>> = want_eval.into_iter().map(|mut p| p.remove(0)).collect();
    assert_all("x", &model.values(), &want_eval, Tolerance::F32);
}

#[test]
fn a_module_step_saved_in_eval_mode_loads_in_eval_mode_and_trains_back_to_y() {
    let shared = shared();
    let device = shared.device().clone().autodiff();
    let mut rng = Rng::new(23);
    let lens = [300, 9];
    let initial: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grads = gradient_steps(&mut rng, &lens, 3);
    let mut step = ModuleStep::builder().build(&shared, schedule_free()).unwrap();
    let mut model = Params::new(&initial, &device);
    for g in &grads {
        let gm = model.grads(g, &device);
        model = step.step(1e-2, model, gm).unwrap();
    }
    let y = model.values();
    let model = step.eval(model).unwrap();
    let bytes = step.to_bytes().unwrap();
    // The drop-in cannot tell x from y in its per-tensor records: refused, by name.
    let Err(refused) = FusedOptimizer::new(&shared, schedule_free()).unwrap().load_bytes(bytes.clone())
    else {
        panic!("a record saved in eval mode loaded into the drop-in");
    };
    assert!(matches!(&refused, Error::Burn { detail, .. } if detail.contains("eval mode")), "{refused}");
    let mut loaded = ModuleStep::builder().build(&shared, schedule_free()).unwrap();
    loaded.load_bytes(bytes).unwrap();
    assert_eq!(loaded.mode(), ScheduleFreeMode::Eval);
    let model = loaded.train(model).unwrap();
    assert_all("y after train() on the loaded state", &model.values(), &y, Tolerance::F32);
    // Another algorithm's module step refuses the record by name.
    let mut adam = ModuleStep::builder().build(&shared, Adam::adamw()).unwrap();
    assert!(adam.load_bytes(step.to_bytes().unwrap()).is_err());
    let refused = adam.eval(model).unwrap_err();
    assert!(matches!(&refused.error, Error::Burn { cause: BurnFailure::Config, .. }), "{}", refused.error);
}
