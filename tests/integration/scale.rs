//! Scale and trainer integration: a tensor larger than one storage binding, a model with
//! hundreds of tensors stepped in one pass with no GPU objects created per step, and
//! parameter groups whose hyperparameters change every step without a new pipeline.

use crate::common;
#[path = "../../examples/bench/shapes.rs"]
mod shapes;

use common::{assert_close, ctx, download, to_f32, Rng, Tolerance};
use wgpu_optim::{Adam, Algorithm, DType, Optimizer, ParamGroup, Sgd, StateKind, Tensor};
use wgpu_optim_testkit::oracle::{ToOracle, TorchState};

#[test]
fn a_tensor_larger_than_a_storage_binding_is_updated_in_chunks() {
    // 40 M f32 elements = 160 MB, over a storage binding of 128 MiB (WebGPU's default, and
    // lavapipe's) and over 65,535 workgroups of 256 invocations. The device gets that binding
    // limit whatever the adapter offers (a discrete GPU's bindings may hold 2 GiB), and the
    // adapter's own buffer size limit, which must hold the 160 MB buffers.
    let binding_limit: u64 = 128 << 20;
    let ctx = common::ctx_with_adapter_limits(|adapter| wgpu::Limits {
        max_storage_buffer_binding_size: adapter.max_storage_buffer_binding_size.min(binding_limit),
        ..adapter
    });
    let n: usize = 40_000_000;
    assert!((n * 4) as u64 > ctx.report().max_storage_buffer_binding_size);
    assert!(
        (n * 4) as u64 <= ctx.report().max_buffer_size,
        "the adapter's buffers hold {} bytes, fewer than the test's 160 MB",
        ctx.report().max_buffer_size
    );
    // Values that identify their index, so that a chunk landing at the wrong offset shows.
    let param_values: Vec<f32> = (0..n).map(|i| ((i % 1000) as f32 - 500.0) * 1e-3).collect();
    let grad_values: Vec<f32> = (0..n).map(|i| (((i * 7919) % 2000) as f32 - 1000.0) * 1e-3).collect();
    let param = ctx.upload_f32("param", &param_values);
    let grad = ctx.upload_f32("grad", &grad_values);
    let algorithm: Algorithm = Adam { lr: 1e-2, ..Adam::adamw() }.into();
    let mut optimizer = Optimizer::builder().build(&ctx, algorithm, std::slice::from_ref(&param)).unwrap();
    for _ in 0..2 {
        optimizer.step(std::slice::from_ref(&grad)).unwrap();
    }
    let got = ctx.read_f32(&param).unwrap();
    let exp_avg = ctx
        .read_f32(optimizer.state(0, StateKind::ExpAvg).unwrap().and_then(|s| s.dense()).unwrap())
        .unwrap();
    // Sampled: every 997th element, plus every element near the ends and near each chunk
    // boundary (a chunk bound at the wrong offset or with the wrong shift shows there).
    let per_binding = (ctx.report().max_storage_buffer_binding_size / 4) as usize;
    let mut sample: Vec<usize> = (0..n).step_by(997).collect();
    for center in [0, per_binding / 2, per_binding, 2 * per_binding, n] {
        sample.extend(center.saturating_sub(4096)..(center + 4096).min(n));
    }
    let p0: Vec<f64> = sample.iter().map(|&i| f64::from(param_values[i])).collect();
    let g: Vec<f64> = sample.iter().map(|&i| f64::from(grad_values[i])).collect();
    let mut p = p0.clone();
    let mut state = TorchState::new(algorithm.to_oracle(), p.len());
    state.step(&mut p, &g);
    state.step(&mut p, &g);
    let got_p: Vec<f64> = sample.iter().map(|&i| f64::from(got[i])).collect();
    let got_m: Vec<f64> = sample.iter().map(|&i| f64::from(exp_avg[i])).collect();
    assert_close(&format!("param at {} sampled indices", sample.len()), &got_p, &p, Tolerance::F32);
    assert_close("exp_avg at the sampled indices", &got_m, &state.tensors()[0], Tolerance::F32);
}

#[test]
fn a_148_tensor_model_steps_in_one_pass_and_creates_nothing_per_step() {
    // A device of its own: the live counts are per device, and other tests run in parallel.
    let ctx = common::fresh_ctx();
    let sizes: Vec<usize> = shapes::gpt2_small(8).into_iter().map(|n| n as usize).collect();
    assert_eq!(sizes.len(), 148);
    let mut rng = Rng::new(1);
    let initial: Vec<Vec<f64>> = sizes.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let params: Vec<Tensor> = initial.iter().map(|p| ctx.upload_f32("param", &to_f32(p))).collect();
    let grads_values: Vec<Vec<f64>> = sizes.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grads: Vec<Tensor> = grads_values.iter().map(|g| ctx.upload_f32("grad", &to_f32(g))).collect();
    let algorithm: Algorithm = Adam::adamw().into();
    let mut optimizer = Optimizer::builder().build(&ctx, algorithm, &params).unwrap();
    // The first steps build the pipeline and the bind groups, and the staging that carries
    // the uniforms of five steps in flight, which later steps reuse.
    let mut encoder = ctx.device().create_command_encoder(&Default::default());
    for _ in 0..5 {
        optimizer.record_step(&mut encoder, &grads).unwrap();
    }
    ctx.queue().submit([encoder.finish()]);
    ctx.device().poll(wgpu::PollType::wait_indefinitely()).unwrap();

    // While an encoder is alive it keeps every object its passes use alive, so anything a
    // step created would show in the live counts.
    let live = || {
        let c = ctx.device().get_internal_counters().hal;
        [
            ("buffers", c.buffers.read()),
            ("bind groups", c.bind_groups.read()),
            ("bind group layouts", c.bind_group_layouts.read()),
            ("compute pipelines", c.compute_pipelines.read()),
            ("pipeline layouts", c.pipeline_layouts.read()),
            ("shader modules", c.shader_modules.read()),
        ]
    };
    let before = live();
    assert!(before[1].1 >= 148, "the counters feature counts objects ({before:?})");
    let mut encoder = ctx.device().create_command_encoder(&Default::default());
    for _ in 0..5 {
        optimizer.record_step(&mut encoder, &grads).unwrap();
    }
    assert_eq!(live(), before, "five recorded steps created GPU objects");
    ctx.queue().submit([encoder.finish()]);

    let mut reference: Vec<(Vec<f64>, TorchState)> =
        initial.into_iter().map(|p| (p.clone(), TorchState::new(algorithm.to_oracle(), p.len()))).collect();
    for _ in 0..10 {
        for ((p, s), g) in reference.iter_mut().zip(&grads_values) {
            s.step(p, g);
        }
    }
    for (i, (p, _)) in reference.iter().enumerate().step_by(7) {
        assert_close(&format!("param[{i}]"), &download(&ctx, &params[i]), p, Tolerance::F32);
    }
}

#[test]
fn more_tensors_than_one_table_holds_each_find_their_workgroups() {
    // 700 small tensors (1-3000 elements: two rows each, 1400 rows past one table's 1023) and
    // two of 3 Mi elements that take hundreds of workgroups each: several dispatches whose
    // workgroup maps mix one-workgroup and many-workgroup tensors. Every tensor against the
    // oracle: a workgroup given the wrong tensor leaves its own unchanged or corrupts another.
    let ctx = ctx();
    let mut rng = Rng::new(5);
    let mut sizes: Vec<usize> = (0..700).map(|i| 1 + (i * 7919) % 3000).collect();
    sizes.insert(100, 3 << 20);
    sizes.insert(500, 3 << 20);
    let total: usize = sizes.iter().sum();
    let initial = rng.vec(total, 1.0);
    let grad_values = rng.vec(total, 1.0);
    let flat = ctx.upload_f32("params", &to_f32(&initial));
    let flat_grads = ctx.upload_f32("grads", &to_f32(&grad_values));
    let starts: Vec<usize> =
        sizes.iter().scan(0, |next, &n| Some(std::mem::replace(next, *next + n))).collect();
    let view = |buffer: &Tensor, t: usize| Tensor {
        buffer: buffer.buffer.clone(),
        offset: 4 * starts[t] as u64,
        len: sizes[t] as u64,
        dtype: DType::F32,
    };
    let params: Vec<Tensor> = (0..sizes.len()).map(|t| view(&flat, t)).collect();
    let grads: Vec<Tensor> = (0..sizes.len()).map(|t| view(&flat_grads, t)).collect();
    let algorithm: Algorithm = Adam { lr: 1e-2, ..Adam::adamw() }.into();
    let mut optimizer = Optimizer::builder().build(&ctx, algorithm, &params).unwrap();
    for _ in 0..2 {
        optimizer.step(&grads).unwrap();
    }
    let got = download(&ctx, &flat);
    for (t, (&start, &n)) in starts.iter().zip(&sizes).enumerate() {
        let mut want = initial[start..start + n].to_vec();
        let mut state = TorchState::new(algorithm.to_oracle(), n);
        for _ in 0..2 {
            state.step(&mut want, &grad_values[start..start + n]);
        }
        assert_close(&format!("params[{t}] ({n} elements)"), &got[start..start + n], &want, Tolerance::F32);
    }
}

#[test]
fn parameter_groups_follow_their_own_schedules_without_new_pipelines() {
    // Weights with decay, biases and norms without, each group's learning rate, betas and
    // weight decay changed every step (the decay even reaching 0).
    let ctx = common::fresh_ctx();
    let mut rng = Rng::new(2);
    let sizes = [300usize, 17, 64];
    let initial: Vec<Vec<f64>> = sizes.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let params: Vec<Tensor> = initial.iter().map(|p| ctx.upload_f32("param", &to_f32(p))).collect();
    let grads: Vec<Tensor> = sizes.iter().map(|&n| ctx.zeros("grad", n as u64, DType::F32)).collect();
    let decayed = Adam { lr: 1e-2, weight_decay: 0.1, ..Adam::adamw() };
    let undecayed = Adam { lr: 3e-2, weight_decay: 0.0, ..Adam::adamw() };
    let groups = vec![ParamGroup::new(decayed, &params[..1]), ParamGroup::new(undecayed, &params[1..])];
    let mut optimizer = Optimizer::builder().build_groups(&ctx, groups).unwrap();
    assert_eq!(optimizer.group_count(), 2);
    assert_eq!(optimizer.group_params(1).unwrap().len(), 2);
    let mut reference: Vec<(Vec<f64>, TorchState)> =
        initial.iter().map(|p| (p.clone(), TorchState::new(decayed.to_oracle().into(), p.len()))).collect();
    for (p, s) in reference.iter_mut().skip(1) {
        *s = TorchState::new(undecayed.to_oracle().into(), p.len());
    }
    let mut compiled = None;
    for t in 0..20 {
        let schedule = 1.0 - t as f64 / 20.0;
        let first = Adam {
            lr: 1e-2 * schedule,
            weight_decay: 0.1 * schedule,
            beta1: 0.9 - 0.01 * schedule,
            ..decayed
        };
        let second = Adam { lr: 3e-2 * schedule, beta2: 0.99 + 0.009 * schedule, ..undecayed };
        optimizer.set_group_algorithm(0, first).unwrap();
        optimizer.set_group_algorithm(1, second).unwrap();
        for (k, (p, s)) in reference.iter_mut().enumerate() {
            s.set_algorithm(if k == 0 { first } else { second }.to_oracle().into());
            let g = rng.vec(p.len(), 1.0);
            ctx.write(&grads[k], &g).unwrap();
            s.step(p, &g);
        }
        optimizer.step(&grads).unwrap();
        let now = common::compute_pipelines(&ctx);
        assert_eq!(*compiled.get_or_insert(now), now, "step {t} compiled a pipeline");
    }
    for (i, (p, _)) in reference.iter().enumerate() {
        assert_close(&format!("param[{i}]"), &download(&ctx, &params[i]), p, Tolerance::F32);
    }
}

#[test]
fn a_group_keeps_its_state_tensors() {
    let ctx = ctx();
    let params = vec![ctx.upload_f32("p", &[0.5; 8])];
    let mut optimizer =
        Optimizer::builder().build(&ctx, Sgd { lr: 0.1, momentum: 0.9, ..Sgd::default() }, &params).unwrap();
    let err = optimizer.set_group_algorithm(0, Sgd { lr: 0.1, ..Sgd::default() }).unwrap_err();
    assert!(matches!(err, wgpu_optim::Error::StateMismatch { .. }), "{err}");
    assert!(err.to_string().contains("group 0"), "{err}");
    let err = optimizer.set_group_algorithm(3, Sgd::default()).unwrap_err();
    assert!(matches!(err, wgpu_optim::Error::NoSuchGroup { index: 3, groups: 1 }), "{err}");
    let err = optimizer.set_group_lr(1, 0.5).unwrap_err();
    assert!(matches!(err, wgpu_optim::Error::NoSuchGroup { index: 1, groups: 1 }), "{err}");
    optimizer
        .set_group_algorithm(0, Sgd { lr: 0.01, momentum: 0.5, nesterov: true, ..Sgd::default() })
        .unwrap();
}

#[test]
fn set_group_lr_changes_one_group_and_set_lr_sets_them_all() {
    let ctx = ctx();
    let params = [ctx.upload_f32("p", &[1.0; 4]), ctx.upload_f32("q", &[1.0; 4])];
    let grads = [ctx.upload_f32("g", &[1.0; 4]), ctx.upload_f32("h", &[1.0; 4])];
    let groups = vec![
        ParamGroup::new(Sgd { lr: 0.125, ..Sgd::default() }, &params[..1]),
        ParamGroup::new(Sgd { lr: 0.25, ..Sgd::default() }, &params[1..]),
    ];
    let mut optimizer = Optimizer::builder().build_groups(&ctx, groups).unwrap();
    optimizer.set_group_lr(1, 0.5).unwrap();
    assert_eq!(optimizer.group_algorithm(0).unwrap().lr(), 0.125);
    optimizer.step(&grads).unwrap();
    assert_eq!(ctx.read_f32(&params[0]).unwrap(), [0.875; 4]);
    assert_eq!(ctx.read_f32(&params[1]).unwrap(), [0.5; 4]);
    optimizer.set_lr(0.0625).unwrap();
    optimizer.step(&grads).unwrap();
    assert_eq!(ctx.read_f32(&params[0]).unwrap(), [0.8125; 4]);
    assert_eq!(ctx.read_f32(&params[1]).unwrap(), [0.4375; 4]);
}
