//! Capturable mode and AMP: the step counter and learning rate live on the device, bias
//! corrections are computed there (accurately at small t), and a step whose gradients hold
//! a NaN or an infinity after unscaling leaves parameters, state and the counter untouched,
//! with no host round trip.

use crate::common;

use common::{assert_close, ctx, download, Rng, Tolerance};
use wgpu_optim::{Adagrad, Adam, Algorithm, DType, Error, GpuContext, Optimizer, Sgd, Tensor};
use wgpu_optim_testkit::oracle::{Storage, ToOracle, TorchState};

fn capturable(ctx: &GpuContext, algorithm: Algorithm, params: &[Tensor]) -> Optimizer {
    let options = Optimizer::builder().capturable(true);
    options.build(ctx, algorithm, params).unwrap()
}

/// Steps a capturable optimizer and the oracle from step `start` with the same gradients.
fn check_from_step(algorithm: Algorithm, start: u64, steps: u64, seed: u64) {
    let ctx = ctx();
    let mut rng = Rng::new(seed);
    let n = 513;
    let mut p = rng.vec(n, 1.0);
    let param = ctx.upload("param", &p, DType::F32);
    let grad = ctx.zeros("grad", n as u64, DType::F32);
    let mut optimizer = capturable(&ctx, algorithm, std::slice::from_ref(&param));
    optimizer.set_step_count(start).unwrap();
    let zeros = vec![vec![0.0; n]; algorithm.state_kinds().len()];
    let mut oracle = TorchState::resume(algorithm.to_oracle(), start, &zeros)
        .storing(DType::F32.to_oracle(), DType::F32.to_oracle());
    if let Algorithm::Adagrad(c) = algorithm {
        oracle = TorchState::resume(algorithm.to_oracle(), start, &[vec![c.initial_accumulator_value; n]]);
    }
    for _ in 0..steps {
        let g = rng.vec(n, 1.0);
        ctx.write(&grad, &g).unwrap();
        optimizer.step(std::slice::from_ref(&grad)).unwrap();
        oracle.step(&mut p, &g);
    }
    assert_eq!(optimizer.read_device_step().unwrap(), start + steps);
    let what = format!("{algorithm:?} from step {start}");
    assert_close(&what, &download(&ctx, &param), &p, Tolerance::F32);
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

#[test]
fn device_bias_corrections_match_the_oracle_at_t_1_2_10_and_1e6() {
    for (k, algorithm) in
        [Adam { lr: 1e-2, ..Adam::default() }, Adam { lr: 1e-2, amsgrad: true, ..Adam::adamw() }]
            .into_iter()
            .enumerate()
    {
        for t in [1u64, 2, 10, 1_000_000] {
            check_from_step(algorithm.into(), t - 1, 1, 10 * k as u64 + t);
        }
    }
}

#[test]
fn device_bias_corrections_stay_accurate_for_beta_close_to_1() {
    // 1 - beta2 = 1e-6 is not representable relative to 1 in f32 (1 - 0.999999f32 is off
    // by 1 %), so the device works from ln(beta) computed on the host in f64.
    let adam = Adam { lr: 1e-2, beta1: 0.999, beta2: 0.999_999, ..Adam::default() };
    for t in [1u64, 2, 10] {
        check_from_step(adam.into(), t - 1, 1, 100 + t);
    }
}

#[test]
fn sgd_and_adagrad_trajectories_match_the_oracle() {
    let algorithms: [Algorithm; 3] = [
        Sgd { lr: 0.05, momentum: 0.9, dampening: 0.1, ..Sgd::default() }.into(),
        Sgd { lr: 0.05, momentum: 0.9, nesterov: true, weight_decay: 0.015625, ..Sgd::default() }.into(),
        Adagrad { lr: 0.1, lr_decay: 0.05, initial_accumulator_value: 0.1, ..Adagrad::default() }.into(),
    ];
    for (k, algorithm) in algorithms.into_iter().enumerate() {
        check_from_step(algorithm, 0, 10, 200 + k as u64);
    }
}

#[test]
fn a_schedule_writes_the_device_learning_rate() {
    let ctx = ctx();
    let mut rng = Rng::new(3);
    let n = 100;
    let mut p = rng.vec(n, 1.0);
    let param = ctx.upload("param", &p, DType::F32);
    let grad = ctx.zeros("grad", n as u64, DType::F32);
    let mut adam = Adam { lr: 1e-2, ..Adam::default() };
    let mut optimizer = capturable(&ctx, adam.into(), std::slice::from_ref(&param));
    let lr = optimizer.lr_tensor(0).expect("a device learning rate");
    let mut oracle = TorchState::new(adam.to_oracle().into(), n);
    for t in 0..12 {
        // A trainer's scheduler writes the rate on the device (here through the queue).
        adam.lr = 1e-2 / (1.0 + t as f64);
        ctx.write(&lr, &[adam.lr]).unwrap();
        oracle.set_algorithm(adam.to_oracle().into());
        let g = rng.vec(n, 1.0);
        ctx.write(&grad, &g).unwrap();
        optimizer.step(std::slice::from_ref(&grad)).unwrap();
        oracle.step(&mut p, &g);
    }
    let tolerance = Tolerance::Close { rtol: 1e-5, atol: 1e-5 };
    assert_close("param under a device schedule", &download(&ctx, &param), &p, tolerance);
    assert_eq!(optimizer.read_device_step().unwrap(), 12);
    // set_lr reaches the device too.
    optimizer.set_lr(0.5).unwrap();
    ctx.queue().submit([]);
    assert_eq!(download(&ctx, &lr), vec![0.5]);
}

#[test]
fn amp_unscales_the_gradients_on_the_device() {
    let ctx = ctx();
    let mut rng = Rng::new(4);
    let n = 1000;
    let mut p = rng.vec(n, 1.0);
    let param = ctx.upload("param", &p, DType::F32);
    let algorithm: Algorithm = Adam { lr: 1e-2, ..Adam::adamw() }.into();
    let mut optimizer = capturable(&ctx, algorithm, std::slice::from_ref(&param));
    let mut oracle = TorchState::new(algorithm.to_oracle(), n);
    let scale = 1024.0;
    let inv_scale = ctx.upload("inv_scale", &[1.0 / scale], DType::F32);
    for _ in 0..3 {
        let g = rng.vec(n, 1.0);
        let scaled = ctx.upload("scaled grad", &g.iter().map(|x| x * scale).collect::<Vec<_>>(), DType::F32);
        ctx.submit("amp step", |encoder| {
            optimizer.record_unscale(encoder, std::slice::from_ref(&scaled), &inv_scale)?;
            optimizer.record_step(encoder, std::slice::from_ref(&scaled))
        })
        .unwrap();
        assert!(!optimizer.read_found_inf().unwrap());
        assert_close("unscaled gradient", &download(&ctx, &scaled), &g, Tolerance::F32);
        oracle.step(&mut p, &g);
    }
    assert_close("param after AMP steps", &download(&ctx, &param), &p, Tolerance::F32);
    assert_eq!(optimizer.read_device_step().unwrap(), 3);
}

#[test]
fn amp_skips_a_step_with_a_non_finite_gradient_and_changes_nothing() {
    for (dtype, bad) in [
        (DType::F32, f64::INFINITY),
        (DType::F32, f64::NAN),
        (DType::F16, f64::NEG_INFINITY),
        (DType::BF16, f64::NAN),
    ] {
        let ctx = ctx();
        let mut rng = Rng::new(5);
        let n = 257;
        let param = ctx.upload("param", &rng.vec(n, 1.0), dtype);
        let algorithm: Algorithm = Adam { lr: 1e-2, amsgrad: true, ..Adam::default() }.into();
        let mut optimizer = capturable(&ctx, algorithm, std::slice::from_ref(&param));
        let inv_scale = ctx.upload("inv_scale", &[0.5], DType::F32);
        let step = |optimizer: &mut Optimizer, g: &[f64]| {
            let grad = ctx.upload("grad", g, dtype);
            ctx.submit("amp step", |encoder| {
                optimizer.record_unscale(encoder, std::slice::from_ref(&grad), &inv_scale)?;
                optimizer.record_step(encoder, std::slice::from_ref(&grad))
            })
            .unwrap();
        };
        step(&mut optimizer, &rng.vec(n, 1.0));
        let snapshot = |optimizer: &Optimizer| {
            let mut bytes = ctx.read_bytes(&param).unwrap();
            for kind in algorithm.state_kinds() {
                bytes.extend(
                    ctx.read_bytes(optimizer.state(0, *kind).unwrap().and_then(|s| s.dense()).unwrap())
                        .unwrap(),
                );
            }
            (bytes, optimizer.read_device_step().unwrap())
        };
        let before = snapshot(&optimizer);
        let mut g = rng.vec(n, 1.0);
        g[100] = bad;
        step(&mut optimizer, &g);
        assert!(optimizer.read_found_inf().unwrap(), "{dtype:?} {bad}: found_inf is set");
        assert_eq!(
            snapshot(&optimizer),
            before,
            "{dtype:?} {bad}: a skipped step changed parameters, state or step"
        );

        // The next finite step runs, as step 2 of the device's count.
        let mut p = download(&ctx, &param);
        let state: Vec<Vec<f64>> = algorithm
            .state_kinds()
            .iter()
            .map(|k| download(&ctx, optimizer.state(0, *k).unwrap().and_then(|s| s.dense()).unwrap()))
            .collect();
        let mut oracle = TorchState::resume(algorithm.to_oracle(), 1, &state)
            .storing(dtype.to_oracle(), dtype.to_oracle());
        let g = dtype.to_oracle().decode(&dtype.to_oracle().encode(&rng.vec(n, 1.0)));
        step(&mut optimizer, &g);
        oracle.step(&mut p, &g.iter().map(|x| dtype.to_oracle().round(x * 0.5)).collect::<Vec<_>>());
        assert!(!optimizer.read_found_inf().unwrap());
        assert_eq!(optimizer.read_device_step().unwrap(), 2, "{dtype:?}");
        let got = download(&ctx, &param);
        assert_close(&format!("{dtype:?} step after the skip"), &got, &p, Tolerance::stored(dtype));
    }
}

#[test]
fn a_step_without_unscale_is_not_skipped_by_an_old_flag() {
    let ctx = ctx();
    let param = ctx.upload("param", &[1.0; 8], DType::F32);
    let mut optimizer =
        capturable(&ctx, Sgd { lr: 0.5, ..Sgd::default() }.into(), std::slice::from_ref(&param));
    let inf = ctx.upload("grad", &[f64::INFINITY; 8], DType::F32);
    let inv_scale = ctx.upload("inv_scale", &[1.0], DType::F32);
    ctx.submit("skipped", |e| {
        optimizer.record_unscale(e, std::slice::from_ref(&inf), &inv_scale)?;
        optimizer.record_step(e, std::slice::from_ref(&inf))
    })
    .unwrap();
    assert_eq!(download(&ctx, &param), vec![1.0; 8]);
    let grad = ctx.upload("grad", &[1.0; 8], DType::F32);
    optimizer.step(std::slice::from_ref(&grad)).unwrap();
    assert_eq!(download(&ctx, &param), vec![0.5; 8]);
    assert_eq!(optimizer.read_device_step().unwrap(), 1);
}

#[test]
fn amp_and_device_counters_need_capturable_mode() {
    let ctx = ctx();
    let param = ctx.upload("param", &[1.0; 8], DType::F32);
    let mut optimizer =
        Optimizer::builder().build(&ctx, Sgd::default(), std::slice::from_ref(&param)).unwrap();
    let inv_scale = ctx.upload("inv_scale", &[1.0], DType::F32);
    let mut encoder = ctx.device().create_command_encoder(&Default::default());
    let err = optimizer.record_unscale(&mut encoder, std::slice::from_ref(&param), &inv_scale).unwrap_err();
    assert!(err.to_string().contains("capturable"), "{err}");
    assert!(optimizer.read_device_step().is_err());
    assert!(optimizer.lr_tensor(0).is_none());
}

#[test]
fn a_capturable_step_uploads_nothing_from_the_host() {
    // No queue.write_buffer per step: its staging buffers would show in the live count
    // while the encoder that holds the steps is alive. A device of its own, so that other
    // tests' buffers do not move the count.
    let ctx = common::fresh_ctx();
    let param = ctx.upload("param", &[1.0; 64], DType::F32);
    let grad = ctx.upload("grad", &[0.5; 64], DType::F32);
    let algorithm: Algorithm = Adam::default().into();
    let mut optimizer = capturable(&ctx, algorithm, std::slice::from_ref(&param));
    optimizer.step(std::slice::from_ref(&grad)).unwrap();
    ctx.device().poll(wgpu::PollType::wait_indefinitely()).unwrap();
    let buffers = || ctx.device().get_internal_counters().hal.buffers.read();
    let before = buffers();
    let mut encoder = ctx.device().create_command_encoder(&Default::default());
    for _ in 0..10 {
        optimizer.record_step(&mut encoder, std::slice::from_ref(&grad)).unwrap();
    }
    assert_eq!(buffers(), before, "ten capturable steps staged uploads");
    ctx.queue().submit([encoder.finish()]);
    assert_eq!(optimizer.read_device_step().unwrap(), 11);
}

#[test]
fn unscaling_gradients_that_share_memory_is_refused_and_changes_nothing() {
    // The unscale rewrites every gradient in place: two that share bytes would be scaled
    // twice where they meet.
    let ctx = ctx();
    let params = [ctx.upload("p0", &[1.0; 8], DType::F32), ctx.upload("p1", &[1.0; 8], DType::F32)];
    let mut optimizer = capturable(&ctx, Sgd { lr: 0.5, ..Sgd::default() }.into(), &params);
    let flat = ctx.upload("grads", &[2.0; 16], DType::F32);
    let inv_scale = ctx.upload("inv_scale", &[0.5], DType::F32);
    for overlapping in [[flat.slice(0, 8), flat.slice(4, 8)], [flat.slice(0, 8), flat.slice(0, 8)]] {
        let mut encoder = ctx.device().create_command_encoder(&Default::default());
        let err = optimizer.record_unscale(&mut encoder, &overlapping, &inv_scale).unwrap_err();
        ctx.queue().submit([encoder.finish()]);
        assert!(
            matches!(&err, Error::OverlapsWritten { tensor, written } if tensor == "grads[1]" && written == "grads[0]"),
            "expected grads[1] refused for sharing memory with grads[0], got: {err}"
        );
        assert_eq!(download(&ctx, &flat), vec![2.0; 16], "a refused unscale changed the gradients");
        assert_eq!(optimizer.read_device_step().unwrap(), 0);
    }
    // Disjoint slices of one buffer unscale (2 * 0.5) and step: 1 - 0.5 * 1.
    let disjoint = [flat.slice(0, 8), flat.slice(8, 8)];
    ctx.submit("unscale and step", |e| {
        optimizer.record_unscale(e, &disjoint, &inv_scale)?;
        optimizer.record_step(e, &disjoint)
    })
    .unwrap();
    for param in &params {
        assert_eq!(download(&ctx, param), vec![0.5; 8]);
    }
}
