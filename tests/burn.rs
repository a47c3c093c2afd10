//! The `burn` feature: Burn's tensors stepped by this crate's kernels on a shared device,
//! against the f64 oracle and against Burn's own AdamW.

mod common;

use burn::module::{Module, Param};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{AdamWConfig, GradientsParams, ModuleOptimizer};
use burn::tensor::{DType as BurnDType, Device, Distribution, Tensor, TensorData};
use common::{adagrad_variants, adam_switch_combinations, assert_close, sgd_variants, Rng, Tolerance};
use wgpu_optim::burn::{FusedOptimizer, ModuleStep, SharedDevice};
use wgpu_optim::oracle::{clip_grad_norm, TorchState};
use wgpu_optim::{Adam, Algorithm, Error, GradClip, OptimizerOptions, Q8States, Sgd};

fn shared() -> SharedDevice {
    SharedDevice::headless_blocking().unwrap_or_else(|e| panic!("Burn tests need an adapter: {e}"))
}

fn tensor(values: &[f64], device: &Device) -> Tensor<1> {
    let data: Vec<f32> = values.iter().map(|v| *v as f32).collect();
    Tensor::from_data(TensorData::new(data, [values.len()]), device)
}

fn values<const D: usize>(t: Tensor<D>) -> Vec<f64> {
    t.into_data()
        .try_to_vec::<f32>()
        .unwrap_or_else(|e| panic!("reading a Burn tensor: {e:?}"))
        .into_iter()
        .map(f64::from)
        .collect()
}

/// A module of 1-D parameters, so that tests choose every value.
#[derive(Module, Debug)]
struct Params {
    params: Vec<Param<Tensor<1>>>,
}

impl Params {
    fn new(values: &[Vec<f64>], device: &Device) -> Self {
        Params { params: values.iter().map(|v| Param::from_tensor(tensor(v, device))).collect() }
    }

    fn grads(&self, grads: &[Vec<f64>], device: &Device) -> GradientsParams {
        let mut out = GradientsParams::new();
        for (p, g) in self.params.iter().zip(grads) {
            out.register(p.id, tensor(g, device));
        }
        out
    }

    fn values(&self) -> Vec<Vec<f64>> {
        self.params.iter().map(|p| values(p.val())).collect()
    }
}

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
    let mut states: Vec<TorchState> = params.iter().map(|p| TorchState::new(algorithm, p.len())).collect();
    for step in grads {
        let mut step = step.clone();
        if let Some(clip) = clip {
            clip_grad_norm(&mut step, clip);
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
        let mut step = ModuleStep::new(&shared, algorithm).unwrap();
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
    let options = OptimizerOptions { grad_clip: Some(clip), ..Default::default() };
    let mut step = ModuleStep::with_options(&shared, algorithm, options).unwrap();
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
    let options = OptimizerOptions { capturable: true, ..Default::default() };
    let mut step = ModuleStep::with_options(&shared, algorithm, options).unwrap();
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
    let mut module_step = ModuleStep::new(&shared, algorithm).unwrap();
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
    let mut step = ModuleStep::new(&shared, algorithm).unwrap();
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
        let mut step = ModuleStep::new(&shared, algorithm).unwrap();
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
    let mut module_step = ModuleStep::new(&shared, adamw).unwrap();
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
    let mut step = ModuleStep::new(&shared, algorithm).unwrap();
    let err = step.step(1e-3, model, g).unwrap_err();
    assert!(matches!(&err, Error::Burn(m) if m.contains("F64")), "{err}");
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
    let err = step.step(1e-3, model, g).unwrap_err();
    assert!(matches!(&err, Error::Burn(m) if m.contains("shape")), "{err}");

    // A set of parameters other than the first step's.
    let model = Params::new(&initial, &device);
    let g = model.grads(&[rng.vec(256, 1.0), rng.vec(256, 1.0)], &device);
    let model = step.step(1e-3, model, g).unwrap();
    let mut g = GradientsParams::new();
    g.register(model.params[0].id, tensor(&rng.vec(256, 1.0), &device));
    let err = step.step(1e-3, model, g).unwrap_err();
    assert!(matches!(&err, Error::Burn(m) if m.contains("new ModuleStep")), "{err}");

    // What the optimizer itself refuses for these parameters (8-bit state needs F32 ones).
    let options = OptimizerOptions { q8_states: Some(Q8States::default()), ..Default::default() };
    let mut model = Params::new(&initial, &device);
    model.params[0] = Param::from_tensor(tensor(&initial[0], &device).cast(BurnDType::F16));
    let mut g = GradientsParams::new();
    g.register(model.params[0].id, tensor(&rng.vec(256, 1.0), &device).cast(BurnDType::F16));
    let err =
        ModuleStep::with_options(&shared, algorithm, options).unwrap().step(1e-3, model, g).unwrap_err();
    assert!(matches!(err, Error::DTypeMismatch { .. }), "{err}");

    // AMP without capturable mode.
    let model = Params::new(&initial, &device);
    let g = model.grads(&[rng.vec(256, 1.0), rng.vec(256, 1.0)], &device);
    let inv_scale = tensor(&[1.0], shared.device());
    let err =
        ModuleStep::new(&shared, algorithm).unwrap().step_unscaled(1e-3, model, g, &inv_scale).unwrap_err();
    assert!(matches!(err, Error::NeedsOption { option: "capturable", .. }), "{err}");

    // Options a module owns.
    let options = OptimizerOptions { master_weights: true, ..Default::default() };
    let err = ModuleStep::with_options(&shared, algorithm, options).err().unwrap();
    assert!(matches!(err, Error::ConflictingOptions { second: "master_weights", .. }), "{err}");

    // The per-tensor step on an f64 tensor.
    let optim = FusedOptimizer::new(&shared, algorithm).unwrap();
    let p = tensor(&initial[0], shared.device()).cast(BurnDType::F64);
    let err = optim.try_step(1e-3, p, tensor(&initial[1], shared.device()), None).unwrap_err();
    assert!(matches!(&err, Error::Burn(m) if m.contains("F64")), "{err}");
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
    assert!(matches!(&err, Error::Burn(m) if m.contains("adapter")), "{err}");
}
