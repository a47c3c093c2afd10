//! Global gradient-norm clipping on the GPU against the oracle's `clip_grad_norm_`: the
//! norm over every tensor of every group, the coefficient applied inside the update, the
//! same bits on every run, NaN propagation, AMP skipping, and refusals.

use crate::common;

use common::{assert_close, ctx, download, Rng, Tolerance};
use wgpu_optim::{
    Adam, DType, Error, GradClip, NormType, Optimizer, OptimizerBuilder, ParamGroup, Sgd, Tensor,
};
use wgpu_optim_testkit::oracle::{
    clip_grad_norm, torch_adam_step, torch_sgd_step, Storage, ToOracle, TorchAdamState,
};

fn clipped(clip: GradClip) -> OptimizerBuilder {
    Optimizer::builder().grad_clip(clip)
}

/// The relative difference of an f32 norm from the f64 oracle's.
fn relative(got: f64, want: f64) -> f64 {
    (got - want).abs() / want.abs().max(f64::MIN_POSITIVE)
}

#[test]
fn adamw_clipped_to_a_global_l2_norm_matches_the_oracle_over_tensors_and_groups() {
    let ctx = ctx();
    let mut rng = Rng::new(11);
    let lengths = [1000usize, 257, 64, 3];
    let adamw = Adam { lr: 1e-2, weight_decay: 0.01, decoupled_weight_decay: true, ..Adam::default() };
    let mut p: Vec<Vec<f64>> = lengths.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let params: Vec<Tensor> = p.iter().map(|v| ctx.upload("param", v, DType::F32)).collect();
    // Two groups with different learning rates: the norm is still over all four tensors.
    let second = Adam { lr: 3e-3, ..adamw };
    let groups = vec![ParamGroup::new(adamw, &params[..2]), ParamGroup::new(second, &params[2..])];
    let mut optimizer = (clipped(GradClip::l2(1.0))).build_groups(&ctx, groups).unwrap();
    let mut state: Vec<TorchAdamState> = lengths.iter().map(|&n| TorchAdamState::zeros(n, false)).collect();
    for step in 0..4 {
        let mut g: Vec<Vec<f64>> = lengths.iter().map(|&n| rng.vec(n, 2.0)).collect();
        let grads: Vec<Tensor> = g.iter().map(|v| ctx.upload("grad", v, DType::F32)).collect();
        optimizer.step(&grads).unwrap();
        // The oracle sees the f32 gradients the GPU read.
        for v in &mut g {
            v.iter_mut().for_each(|x| *x = f64::from(*x as f32));
        }
        let unclipped = g[0].clone();
        let want_norm = clip_grad_norm(&mut g, &GradClip::l2(1.0).to_oracle());
        assert!(want_norm > 10.0, "the case clips (norm {want_norm})");
        for (i, config) in [adamw, adamw, second, second].iter().enumerate() {
            torch_adam_step(&config.to_oracle(), &mut p[i], &g[i], &mut state[i]);
        }
        let norm = optimizer.grad_norm().unwrap();
        assert!(relative(norm, want_norm) < 1e-5, "step {step}: norm {norm}, oracle {want_norm}");
        for (i, param) in params.iter().enumerate() {
            let what = format!("step {step}: param {i}");
            assert_close(&what, &download(&ctx, param), &p[i], Tolerance::F32);
        }
        // The gradients themselves are left as they were.
        assert_eq!(download(&ctx, &grads[0]), unclipped, "step {step}: gradient rewritten");
    }
}

#[test]
fn the_inf_norm_clips_nesterov_sgd_and_leaves_the_gradients_alone() {
    let ctx = ctx();
    let mut rng = Rng::new(12);
    let lengths = [300usize, 41];
    let sgd = Sgd { lr: 0.01, momentum: 0.9, nesterov: true, ..Sgd::default() };
    let clip = GradClip { max_norm: 0.5, norm_type: NormType::Inf };
    let mut p: Vec<Vec<f64>> = lengths.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let params: Vec<Tensor> = p.iter().map(|v| ctx.upload("param", v, DType::F32)).collect();
    let mut optimizer = clipped(clip).build(&ctx, sgd, &params).unwrap();
    let mut buffers = [None, None];
    for step in 0..5 {
        let g32: Vec<Vec<f64>> =
            lengths.iter().map(|&n| rng.vec(n, 3.0).iter().map(|x| f64::from(*x as f32)).collect()).collect();
        let grads: Vec<Tensor> = g32.iter().map(|v| ctx.upload("grad", v, DType::F32)).collect();
        optimizer.step(&grads).unwrap();
        let mut g = g32.clone();
        let want_norm = clip_grad_norm(&mut g, &clip.to_oracle());
        for i in 0..2 {
            torch_sgd_step(&sgd.to_oracle(), &mut p[i], &g[i], &mut buffers[i]);
            assert_close(
                &format!("step {step}: param {i}"),
                &download(&ctx, &params[i]),
                &p[i],
                Tolerance::F32,
            );
            assert_eq!(download(&ctx, &grads[i]), g32[i], "step {step}: gradient {i} rewritten");
        }
        // The largest magnitude is one of the inputs: exact in f32.
        assert_eq!(optimizer.grad_norm().unwrap(), want_norm, "step {step}");
    }
}

/// Reads every byte the optimizer owns or updates.
fn snapshot(ctx: &wgpu_optim::GpuContext, optimizer: &Optimizer) -> Vec<u8> {
    let mut bytes = Vec::new();
    for (i, param) in optimizer.params().iter().enumerate() {
        bytes.extend(ctx.read_bytes(param).unwrap());
        for kind in [wgpu_optim::StateKind::ExpAvg, wgpu_optim::StateKind::ExpAvgSq] {
            bytes.extend(
                ctx.read_bytes(optimizer.state(i, kind).unwrap().and_then(|s| s.dense()).unwrap()).unwrap(),
            );
        }
    }
    bytes.extend(optimizer.grad_norm().unwrap().to_le_bytes());
    bytes
}

#[test]
fn the_same_gradients_give_the_same_bits_every_run() {
    let ctx = ctx();
    // Big enough for many workgroups per tensor, in several buffers and dtypes.
    let lengths = [1usize << 20, 4099, 77];
    let run = || {
        let mut rng = Rng::new(13);
        let params: Vec<Tensor> = lengths
            .iter()
            .zip([DType::F32, DType::BF16, DType::F16])
            .map(|(&n, d)| ctx.upload("param", &rng.vec(n, 1.0), d))
            .collect();
        let grads: Vec<Tensor> = lengths
            .iter()
            .zip([DType::F32, DType::BF16, DType::F16])
            .map(|(&n, d)| ctx.upload("grad", &rng.vec(n, 1.0), d))
            .collect();
        let mut optimizer = (clipped(GradClip::l2(5.0))).build(&ctx, Adam::default(), &params).unwrap();
        for _ in 0..3 {
            optimizer.step(&grads).unwrap();
        }
        snapshot(&ctx, &optimizer)
    };
    let first = run();
    for _ in 0..2 {
        assert!(run() == first, "a rerun changed some bits");
    }
}

#[test]
fn a_nan_gradient_makes_the_norm_and_every_parameter_nan_as_pytorch_does() {
    let ctx = ctx();
    let params = vec![ctx.upload("a", &[1.0; 16], DType::F32), ctx.upload("b", &[2.0; 5], DType::F32)];
    let mut optimizer =
        (clipped(GradClip::l2(1.0))).build(&ctx, Sgd { lr: 0.1, ..Sgd::default() }, &params).unwrap();
    let mut g = vec![0.5; 16];
    g[7] = f64::NAN;
    let grads = vec![ctx.upload("ga", &g, DType::F32), ctx.upload("gb", &[0.5; 5], DType::F32)];
    optimizer.step(&grads).unwrap();
    assert!(optimizer.grad_norm().unwrap().is_nan());
    // The coefficient is NaN, so even the finite gradients' parameters become NaN.
    assert!(download(&ctx, &params[1]).iter().all(|x| x.is_nan()));
}

#[test]
fn a_norm_below_max_norm_leaves_the_step_as_without_clipping() {
    let ctx = ctx();
    let mut rng = Rng::new(14);
    let p0 = rng.vec(513, 1.0);
    let g = rng.vec(513, 1e-3);
    let run = |options: OptimizerBuilder| {
        let param = ctx.upload("param", &p0, DType::F32);
        let mut optimizer = options.build(&ctx, Adam::default(), std::slice::from_ref(&param)).unwrap();
        optimizer.step(&[ctx.upload("grad", &g, DType::F32)]).unwrap();
        download(&ctx, &param)
    };
    // The coefficient clamps to exactly 1, and multiplying by 1 changes no bit.
    assert_eq!(run(clipped(GradClip::l2(1e6))), run(Optimizer::builder()));
}

#[test]
fn amp_skips_a_clipped_step_with_an_infinite_gradient() {
    let ctx = ctx();
    let param = ctx.upload("param", &[1.0; 8], DType::F32);
    let options = Optimizer::builder().capturable(true).grad_clip(GradClip::l2(1.0));
    let mut optimizer =
        options.build(&ctx, Sgd { lr: 0.5, ..Sgd::default() }, std::slice::from_ref(&param)).unwrap();
    let inv_scale = ctx.upload("inv_scale", &[0.5], DType::F32);
    let inf = ctx.upload("grad", &[f64::INFINITY; 8], DType::F32);
    ctx.submit("skipped", |e| {
        optimizer.record_unscale(e, std::slice::from_ref(&inf), &inv_scale)?;
        optimizer.record_step(e, std::slice::from_ref(&inf))
    })
    .unwrap();
    assert!(optimizer.read_found_inf().unwrap());
    assert_eq!(download(&ctx, &param), vec![1.0; 8]);
    // A finite step: gradients 4 * 0.5 = 2 each after unscaling, norm sqrt(8 * 4), so each
    // clipped gradient is 2 / (sqrt(32) + 1e-6).
    let grad = ctx.upload("grad", &[4.0; 8], DType::F32);
    ctx.submit("step", |e| {
        optimizer.record_unscale(e, std::slice::from_ref(&grad), &inv_scale)?;
        optimizer.record_step(e, std::slice::from_ref(&grad))
    })
    .unwrap();
    let norm = optimizer.grad_norm().unwrap();
    assert!(relative(norm, 32f64.sqrt()) < 1e-6, "norm {norm}");
    let coefficient = f64::from(1.0f32 / (32f32.sqrt() + 1e-6));
    assert_close("param", &download(&ctx, &param), &[1.0 - 0.5 * 2.0 * coefficient; 8], Tolerance::F32);
}

#[test]
fn bad_clip_settings_are_refused_before_anything_is_built() {
    let ctx = ctx();
    let param = ctx.upload("param", &[1.0; 4], DType::F32);
    for max_norm in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let options = clipped(GradClip::l2(max_norm));
        match options.build(&ctx, Adam::default(), std::slice::from_ref(&param)) {
            Err(Error::BadHyperparameter { name: "max_norm", .. }) => {}
            other => panic!("max_norm {max_norm}: {other:?}"),
        }
    }
    let unclipped = Optimizer::builder().build(&ctx, Adam::default(), std::slice::from_ref(&param)).unwrap();
    assert!(matches!(unclipped.grad_norm(), Err(Error::NeedsOption { option: "grad_clip", .. })));
    assert_eq!(download(&ctx, &param), vec![1.0; 4]);
}

#[test]
fn the_widest_clipped_step_fits_webgpus_eight_storage_bindings_and_matches_the_oracle() {
    // A device with exactly WebGPU's default limits: 8 storage buffers per shader stage.
    let ctx = common::ctx_with_limits(wgpu::Limits::default());
    assert_eq!(ctx.device().limits().max_storage_buffers_per_shader_stage, 8);
    let amsgrad = Adam { lr: 0.1, amsgrad: true, ..Adam::default() };
    // Master weights (masters, model copy), gradient and three states: six tensor bindings;
    // capturable mode binds two more, and clipping reads its coefficient from one of them.
    let mut rng = Rng::new(5);
    let start: Vec<f64> = rng.vec(40, 1.0).into_iter().map(|x| DType::BF16.to_oracle().round(x)).collect();
    let model = ctx.upload("model", &start, DType::BF16);
    let options = Optimizer::builder().master_weights(true).capturable(true).grad_clip(GradClip::l2(0.5));
    let mut optimizer = options.build(&ctx, amsgrad, std::slice::from_ref(&model)).unwrap();
    let (mut want, mut state) = (start.clone(), TorchAdamState::zeros(40, true));
    for step in 0..3 {
        let g = rng.vec(40, 2.0);
        optimizer.step(&[ctx.upload("grad", &g, DType::F32)]).unwrap();
        let mut g = vec![g.iter().map(|x| f64::from(*x as f32)).collect::<Vec<_>>()];
        let want_norm = clip_grad_norm(&mut g, &GradClip::l2(0.5).to_oracle());
        assert!(want_norm > 1.0, "the case clips (norm {want_norm})");
        torch_adam_step(&amsgrad.to_oracle(), &mut want, &g[0], &mut state);
        let norm = optimizer.grad_norm().unwrap();
        assert!(relative(norm, want_norm) < 1e-5, "step {step}: norm {norm}, oracle {want_norm}");
        let master = download(&ctx, &optimizer.params()[0]);
        assert_close(&format!("step {step}: master"), &master, &want, Tolerance::F32);
        let rounded: Vec<f64> = master.iter().map(|x| DType::BF16.to_oracle().round(*x)).collect();
        assert_eq!(download(&ctx, &model), rounded, "step {step}: the model copy is the master rounded once");
    }
}

#[test]
fn amp_unscale_takes_the_norm_of_the_unscaled_gradients_in_the_same_pass() {
    // A device of its own, as the in-crate test that counts this case's pipelines
    // (`amp_with_clipping_compiles_one_update_and_one_unscale_norm_pipeline`) uses.
    let ctx = common::ctx_with_limits(wgpu::Limits::default());
    let mut rng = Rng::new(21);
    // Whole vec4s, so the update is one variant.
    let lengths = [700usize, 36, 4];
    let adam = Adam { lr: 1e-2, ..Adam::default() };
    let mut p: Vec<Vec<f64>> = lengths.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let params: Vec<Tensor> = p.iter().map(|v| ctx.upload("param", v, DType::F32)).collect();
    let options = Optimizer::builder().capturable(true).grad_clip(GradClip::l2(1.0));
    let mut optimizer = options.build(&ctx, adam, &params).unwrap();
    let mut state: Vec<TorchAdamState> = lengths.iter().map(|&n| TorchAdamState::zeros(n, false)).collect();
    // A power of two, so unscaling is exact and the oracle sees the same gradients.
    let scale = 1024.0;
    let inv_scale = ctx.upload("inv_scale", &[1.0 / scale], DType::F32);
    for step in 0..3 {
        let mut g: Vec<Vec<f64>> =
            lengths.iter().map(|&n| rng.vec(n, 2.0).iter().map(|x| f64::from(*x as f32)).collect()).collect();
        let scaled: Vec<Tensor> = g
            .iter()
            .map(|v| ctx.upload("grad", &v.iter().map(|x| x * scale).collect::<Vec<_>>(), DType::F32))
            .collect();
        ctx.submit("amp step", |e| {
            optimizer.record_unscale(e, &scaled, &inv_scale)?;
            optimizer.record_step(e, &scaled)
        })
        .unwrap();
        // The gradients are unscaled in place, as PyTorch's unscale_ leaves them.
        assert_eq!(download(&ctx, &scaled[1]), g[1], "step {step}: gradient not unscaled");
        let want_norm = clip_grad_norm(&mut g, &GradClip::l2(1.0).to_oracle());
        assert!(want_norm > 10.0, "the case clips (norm {want_norm})");
        for i in 0..lengths.len() {
            torch_adam_step(&adam.to_oracle(), &mut p[i], &g[i], &mut state[i]);
        }
        let norm = optimizer.grad_norm().unwrap();
        assert!(relative(norm, want_norm) < 1e-5, "step {step}: norm {norm}, oracle {want_norm}");
        for (i, param) in params.iter().enumerate() {
            assert_close(&format!("step {step}: param {i}"), &download(&ctx, param), &p[i], Tolerance::F32);
        }
        assert!(!optimizer.read_found_inf().unwrap());
    }
}

#[test]
fn amp_with_bf16_gradients_unscales_then_takes_the_norm_in_its_own_pass() {
    let ctx = ctx();
    let mut rng = Rng::new(8);
    let start = rng.vec(50, 1.0);
    let param = ctx.upload("param", &start, DType::F32);
    let sgd = Sgd { lr: 0.1, momentum: 0.9, ..Sgd::default() };
    let options = Optimizer::builder().capturable(true).grad_clip(GradClip::l2(0.5));
    let mut optimizer = options.build(&ctx, sgd, std::slice::from_ref(&param)).unwrap();
    let inv_scale = ctx.upload("inv_scale", &[0.25], DType::F32);
    let (mut want, mut velocity) = (start.clone(), None);
    for step in 0..3 {
        let g: Vec<f64> = rng.vec(50, 2.0).into_iter().map(|x| DType::BF16.to_oracle().round(x)).collect();
        let scaled = ctx.upload("grad", &g.iter().map(|x| x * 4.0).collect::<Vec<_>>(), DType::BF16);
        ctx.submit("amp step", |e| {
            optimizer.record_unscale(e, std::slice::from_ref(&scaled), &inv_scale)?;
            optimizer.record_step(e, std::slice::from_ref(&scaled))
        })
        .unwrap();
        let mut clipped = vec![g];
        let want_norm = clip_grad_norm(&mut clipped, &GradClip::l2(0.5).to_oracle());
        torch_sgd_step(&sgd.to_oracle(), &mut want, &clipped[0], &mut velocity);
        let norm = optimizer.grad_norm().unwrap();
        assert!(relative(norm, want_norm) < 1e-5, "step {step}: norm {norm}, oracle {want_norm}");
        assert_close(&format!("step {step}"), &download(&ctx, &param), &want, Tolerance::F32);
    }
}

#[test]
fn each_steps_norm_is_kept_on_the_device_and_read_back_once() {
    // Three clipped steps recorded into one encoder, each followed by a copy of its norm:
    // one submit and one readback give all three, each equal to the oracle's.
    let ctx = ctx();
    let mut rng = Rng::new(17);
    let lengths = [700usize, 33];
    let adam = Adam { lr: 1e-2, ..Adam::default() };
    let clip = GradClip::l2(0.5);
    let params: Vec<Tensor> =
        lengths.iter().map(|&n| ctx.upload("param", &rng.vec(n, 1.0), DType::F32)).collect();
    let mut optimizer = clipped(clip).build(&ctx, adam, &params).unwrap();
    let norms = ctx.zeros("norms", 3, DType::F32);
    let mut want = Vec::new();
    let mut gradients = Vec::new();
    for step in 0..3 {
        let mut g: Vec<Vec<f64>> = lengths.iter().map(|&n| rng.vec(n, 1.0 + step as f64)).collect();
        gradients.push(g.iter().map(|v| ctx.upload("grad", v, DType::F32)).collect::<Vec<_>>());
        want.push(clip_grad_norm(&mut g, &clip.to_oracle()));
    }
    ctx.submit("three steps", |encoder| {
        for (step, grads) in gradients.iter().enumerate() {
            optimizer.record_step(encoder, grads)?;
            optimizer.record_grad_norm_copy(encoder, &norms.buffer, 4 * step as u64)?;
        }
        Ok(())
    })
    .unwrap();
    let got = download(&ctx, &norms);
    for (step, (got, want)) in got.iter().zip(&want).enumerate() {
        assert!(*want > 0.5, "step {step} clips (norm {want})");
        assert!(relative(*got, *want) < 1e-5, "step {step}: norm {got}, oracle {want}");
    }
    assert!(want[0] != want[2], "the three norms differ, so each slot holds its own step's");

    // Refusals record nothing: no clipping, a buffer that cannot be copied into, a slot
    // past the end or between words.
    let mut encoder = ctx.device().create_command_encoder(&Default::default());
    let plain = Optimizer::builder().build(&ctx, adam, &params).unwrap();
    let err = plain.record_grad_norm_copy(&mut encoder, &norms.buffer, 0).unwrap_err();
    assert!(matches!(err, Error::NeedsOption { option: "grad_clip", .. }), "{err}");
    let storage_only = ctx.device().create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 16,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    let err = optimizer.record_grad_norm_copy(&mut encoder, &storage_only, 0).unwrap_err();
    assert!(matches!(err, Error::MissingUsage { needed: "COPY_DST", .. }), "{err}");
    for offset in [12, 2] {
        let err = optimizer.record_grad_norm_copy(&mut encoder, &norms.buffer, offset).unwrap_err();
        assert!(matches!(err, Error::BadRange { .. }), "offset {offset}: {err}");
    }
    ctx.queue().submit([encoder.finish()]);
    assert_eq!(download(&ctx, &norms), got, "a refused copy wrote nothing");
}
