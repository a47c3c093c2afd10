//! PyTorch-convention optimizers on the GPU against the f64 oracle over 30-step
//! trajectories: every switch combination of Adam/AdamW/AMSGrad, SGD (plain, momentum,
//! dampening, Nesterov, maximize, weight decay) and Adagrad, at sizes around the workgroup
//! boundary, through the stateful optimizer (in place) and `ops::update` (out of place).

use crate::common;

use common::{assert_close, assert_tensor, ctx, to_f32, Rng, Tolerance};
use wgpu_optim::ops::{self, Update};
use wgpu_optim::{Adam, Algorithm, DType, Error, GpuContext, Optimizer, Sgd, StateKind, Tensor};
use wgpu_optim_testkit::oracle::{ToOracle, TorchState};

const SIZES: [usize; 5] = [1, 255, 256, 257, 100_003];
const STEPS: usize = 30;

fn write(ctx: &GpuContext, tensor: &Tensor, values: &[f64]) {
    ctx.write_bytes(tensor, bytemuck::cast_slice(&to_f32(values))).expect("write");
}

/// The oracle's run of the same trajectory.
struct Reference {
    params: Vec<Vec<f64>>,
    states: Vec<TorchState>,
}

impl Reference {
    fn new(algorithm: Algorithm, params: &[Vec<f64>]) -> Self {
        Reference {
            params: params.to_vec(),
            states: params.iter().map(|p| TorchState::new(algorithm.to_oracle(), p.len())).collect(),
        }
    }

    fn step(&mut self, grads: &[Vec<f64>]) {
        for ((p, s), g) in self.params.iter_mut().zip(&mut self.states).zip(grads) {
            s.step(p, g);
        }
    }

    /// Compares the GPU's parameters and state (`state[i][k]`, in state-kind order).
    fn assert_matches(&self, ctx: &GpuContext, what: &str, params: &[Tensor], state: &[Vec<Tensor>]) {
        for (i, (p, s)) in self.params.iter().zip(&self.states).enumerate() {
            assert_tensor(ctx, &format!("{what} param[{i}] (n = {})", p.len()), &params[i], p);
            for (k, want) in s.tensors().iter().enumerate() {
                assert_tensor(
                    ctx,
                    &format!("{what} state {k} of param[{i}] (n = {})", p.len()),
                    &state[i][k],
                    want,
                );
            }
        }
    }
}

fn check_in_place(algorithm: Algorithm, seed: u64) {
    let ctx = ctx();
    let mut rng = Rng::new(seed);
    let initial: Vec<Vec<f64>> = SIZES.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let params: Vec<Tensor> = initial.iter().map(|p| ctx.upload_f32("param", &to_f32(p))).collect();
    let grads: Vec<Tensor> = SIZES.iter().map(|&n| ctx.zeros("grad", n as u64, DType::F32)).collect();
    let mut optimizer = Optimizer::builder().build(&ctx, algorithm, &params).expect("optimizer");
    let mut reference = Reference::new(algorithm, &initial);
    for _ in 0..STEPS {
        let g: Vec<Vec<f64>> = SIZES.iter().map(|&n| rng.vec(n, 1.0)).collect();
        for (tensor, values) in grads.iter().zip(&g) {
            write(&ctx, tensor, values);
        }
        optimizer.step(&grads).expect("step");
        reference.step(&g);
    }
    assert_eq!(optimizer.step_count(), STEPS as u64);
    let state: Vec<Vec<Tensor>> = (0..SIZES.len())
        .map(|i| {
            algorithm
                .state_kinds()
                .iter()
                .map(|k| optimizer.state(i, *k).unwrap().and_then(|s| s.dense()).unwrap().clone())
                .collect()
        })
        .collect();
    reference.assert_matches(&ctx, &format!("{algorithm:?} in place"), &params, &state);
}

fn check_out_of_place(algorithm: Algorithm, seed: u64) {
    let ctx = ctx();
    let mut rng = Rng::new(seed);
    let initial: Vec<Vec<f64>> = SIZES.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let kinds = algorithm.state_kinds().len();
    let start_state = match algorithm {
        Algorithm::Adagrad(c) => c.initial_accumulator_value,
        _ => 0.0,
    };
    // Sets of [param, state...], ping-ponged every step.
    let mut current: Vec<Vec<Tensor>> = initial
        .iter()
        .map(|p| {
            let mut set = vec![ctx.upload_f32("param", &to_f32(p))];
            set.extend((0..kinds).map(|_| ctx.upload_f32("state", &vec![start_state as f32; p.len()])));
            set
        })
        .collect();
    let mut next: Vec<Vec<Tensor>> =
        current.iter().map(|set| set.iter().map(|t| ctx.zeros("out", t.len, DType::F32)).collect()).collect();
    let grads: Vec<Tensor> = SIZES.iter().map(|&n| ctx.zeros("grad", n as u64, DType::F32)).collect();
    let mut reference = Reference::new(algorithm, &initial);
    for t in 1..=STEPS as u64 {
        let g: Vec<Vec<f64>> = SIZES.iter().map(|&n| rng.vec(n, 1.0)).collect();
        for (tensor, values) in grads.iter().zip(&g) {
            write(&ctx, tensor, values);
        }
        let updates: Vec<Update> = current
            .iter()
            .zip(&next)
            .zip(&grads)
            .map(|((src, dst), grad)| Update {
                param: src[0].clone(),
                grad: grad.clone(),
                state: src[1..].to_vec(),
                param_out: Some(dst[0].clone()),
                state_out: dst[1..].iter().cloned().map(Some).collect(),
                param_copy: None,
            })
            .collect();
        ctx.submit("update", |encoder| ops::update(&ctx, encoder, &algorithm, t, &updates)).expect("update");
        reference.step(&g);
        std::mem::swap(&mut current, &mut next);
    }
    let params: Vec<Tensor> = current.iter().map(|s| s[0].clone()).collect();
    let state: Vec<Vec<Tensor>> = current.iter().map(|s| s[1..].to_vec()).collect();
    reference.assert_matches(&ctx, &format!("{algorithm:?} out of place"), &params, &state);
}

#[test]
fn adam_every_switch_combination_matches_the_oracle_in_place() {
    for (k, algorithm) in common::adam_switch_combinations().into_iter().enumerate() {
        check_in_place(algorithm, 100 + k as u64);
    }
}

#[test]
fn adam_every_switch_combination_matches_the_oracle_out_of_place() {
    for (k, algorithm) in common::adam_switch_combinations().into_iter().enumerate() {
        check_out_of_place(algorithm, 200 + k as u64);
    }
}

#[test]
fn adamw_defaults_are_pytorchs() {
    let c = Adam::adamw();
    assert_eq!((c.lr, c.beta1, c.beta2, c.eps, c.weight_decay), (1e-3, 0.9, 0.999, 1e-8, 0.01));
    assert!(c.decoupled_weight_decay && !c.amsgrad && !c.maximize);
    check_in_place(c.into(), 7);
}

#[test]
fn sgd_variants_match_the_oracle_in_place_and_out_of_place() {
    for (k, algorithm) in common::sgd_variants().into_iter().enumerate() {
        check_in_place(algorithm, 300 + k as u64);
        check_out_of_place(algorithm, 400 + k as u64);
    }
}

#[test]
fn sgd_without_momentum_keeps_no_buffer() {
    let ctx = ctx();
    let params = vec![ctx.upload_f32("p", &[0.5; 64])];
    let optimizer = Optimizer::builder().build(&ctx, Sgd { lr: 0.1, ..Sgd::default() }, &params).unwrap();
    assert!(optimizer.group_algorithm(0).unwrap().state_kinds().is_empty());
    assert!(optimizer.state(0, StateKind::MomentumBuffer).unwrap().and_then(|s| s.dense()).is_none());
    let with_momentum =
        Optimizer::builder().build(&ctx, Sgd { lr: 0.1, momentum: 0.9, ..Sgd::default() }, &params).unwrap();
    assert!(with_momentum.state(0, StateKind::MomentumBuffer).unwrap().and_then(|s| s.dense()).is_some());
}

#[test]
fn sgd_nesterov_needs_momentum_and_no_dampening() {
    let ctx = ctx();
    let params = vec![ctx.upload_f32("p", &[0.5; 4])];
    for bad in [
        Sgd { nesterov: true, ..Sgd::default() },
        Sgd { nesterov: true, momentum: 0.9, dampening: 0.1, ..Sgd::default() },
    ] {
        let err = Optimizer::builder().build(&ctx, bad, &params).unwrap_err();
        assert!(matches!(err, Error::BadHyperparameter { .. }), "{err}");
    }
}

#[test]
fn adagrad_variants_match_the_oracle_in_place_and_out_of_place() {
    for (k, algorithm) in common::adagrad_variants().into_iter().enumerate() {
        check_in_place(algorithm, 500 + k as u64);
        check_out_of_place(algorithm, 600 + k as u64);
    }
}

#[test]
fn several_steps_recorded_before_one_submit_each_keep_their_step() {
    // queue.write_buffer lands at the next submit, so each recorded step needs its own
    // uniform slot; otherwise all five would run with step 5's bias corrections.
    let ctx = ctx();
    let mut rng = Rng::new(3);
    let initial = vec![rng.vec(1000, 1.0)];
    let g = vec![rng.vec(1000, 1.0)];
    let params = vec![ctx.upload_f32("param", &to_f32(&initial[0]))];
    let grads = vec![ctx.upload_f32("grad", &to_f32(&g[0]))];
    let algorithm: Algorithm = Adam { lr: 0.05, amsgrad: true, ..Adam::default() }.into();
    let mut optimizer = Optimizer::builder().build(&ctx, algorithm, &params).unwrap();
    let mut reference = Reference::new(algorithm, &initial);
    let mut encoder = ctx.device().create_command_encoder(&Default::default());
    for _ in 0..5 {
        optimizer.record_step(&mut encoder, &grads).unwrap();
        reference.step(&g);
    }
    ctx.queue().submit([encoder.finish()]);
    assert_tensor(&ctx, "param after 5 steps in one submit", &params[0], &reference.params[0]);
}

#[test]
fn a_thousand_steps_recorded_into_one_encoder_match_the_oracle() {
    // Each step's uniform (its bias corrections, its learning rate) is copied into place by a
    // command recorded with the step, so every step reads its own values whatever the count;
    // a learning rate changed halfway through the encoder applies from that step on.
    let ctx = ctx();
    let mut rng = Rng::new(13);
    let initial = vec![rng.vec(300, 1.0)];
    let g = vec![rng.vec(300, 1.0)];
    let params = vec![ctx.upload_f32("param", &to_f32(&initial[0]))];
    let grads = vec![ctx.upload_f32("grad", &to_f32(&g[0]))];
    let mut config = Adam { lr: 1e-3, ..Adam::default() };
    let mut optimizer = Optimizer::builder().build(&ctx, config, &params).unwrap();
    let mut reference = Reference::new(config.into(), &initial);
    let mut encoder = ctx.device().create_command_encoder(&Default::default());
    for step in 0..1000 {
        if step == 500 {
            config.lr = 2e-3;
            optimizer.set_lr(config.lr).unwrap();
            reference.states[0].set_algorithm(config.to_oracle().into());
        }
        optimizer.record_step(&mut encoder, &grads).unwrap();
        reference.step(&g);
    }
    ctx.queue().submit([encoder.finish()]);
    assert_eq!(optimizer.step_count(), 1000);
    // f32 rounding accumulates over 1000 steps to about 1e-5 relative; steps that read
    // another step's uniform are off by several percent.
    let got: Vec<f64> = ctx.read_f32(&params[0]).unwrap().into_iter().map(f64::from).collect();
    let tolerance = Tolerance::Close { rtol: 1e-4, atol: 1e-6 };
    assert_close("param after 1000 steps in one encoder", &got, &reference.params[0], tolerance);
}

#[test]
fn a_learning_rate_schedule_changes_no_pipeline() {
    let ctx = common::fresh_ctx();
    let mut rng = Rng::new(4);
    let initial = vec![rng.vec(513, 1.0)];
    let params = vec![ctx.upload_f32("param", &to_f32(&initial[0]))];
    let grads = vec![ctx.zeros("grad", 513, DType::F32)];
    let mut config = Adam::adamw();
    let mut optimizer = Optimizer::builder().build(&ctx, config, &params).unwrap();
    let mut reference = Reference::new(config.into(), &initial);
    optimizer.step(&grads).unwrap();
    reference.step(&[vec![0.0; 513]]);
    let compiled = common::compute_pipelines(&ctx);
    for k in 0..10 {
        let g = vec![rng.vec(513, 1.0)];
        write(&ctx, &grads[0], &g[0]);
        config.lr = 1e-3 * (1.0 + k as f64);
        optimizer.set_lr(config.lr).unwrap();
        reference.states[0].set_algorithm(config.to_oracle().into());
        optimizer.step(&grads).unwrap();
        reference.step(&g);
    }
    assert_eq!(common::compute_pipelines(&ctx), compiled, "a new learning rate must not compile a pipeline");
    assert_tensor(&ctx, "param under a schedule", &params[0], &reference.params[0]);
}

#[test]
fn alternating_two_gradient_sets_builds_each_set_of_bind_groups_once() {
    // A trainer that double-buffers gradients: sets A and B alternate. Both stay bound, so
    // after the first steps no step creates a bind group (or anything else).
    let ctx = common::fresh_ctx();
    let mut rng = Rng::new(21);
    let initial: Vec<Vec<f64>> = [300, 64, 1025].iter().map(|&n| rng.vec(n, 1.0)).collect();
    let params: Vec<Tensor> = initial.iter().map(|p| ctx.upload_f32("param", &to_f32(p))).collect();
    let values: [Vec<Vec<f64>>; 2] =
        std::array::from_fn(|_| initial.iter().map(|p| rng.vec(p.len(), 1.0)).collect());
    let sets: [Vec<Tensor>; 2] =
        std::array::from_fn(|s| values[s].iter().map(|g| ctx.upload_f32("grad", &to_f32(g))).collect());
    let algorithm: Algorithm = Adam::adamw().into();
    let mut optimizer = Optimizer::builder().build(&ctx, algorithm, &params).unwrap();
    let mut reference = Reference::new(algorithm, &initial);
    let mut record = |count: usize| {
        let mut encoder = ctx.device().create_command_encoder(&Default::default());
        for k in 0..count {
            optimizer.record_step(&mut encoder, &sets[k % 2]).unwrap();
            reference.step(&values[k % 2]);
        }
        encoder
    };
    // Binds both sets and makes the staging of four steps in flight.
    ctx.queue().submit([record(4).finish()]);
    ctx.device().poll(wgpu::PollType::wait_indefinitely()).unwrap();
    let live = || {
        let c = ctx.device().get_internal_counters().hal;
        [c.bind_groups.read(), c.buffers.read(), c.compute_pipelines.read()]
    };
    let before = live();
    // The encoder keeps whatever its steps use alive, so anything created would show.
    let encoder = record(4);
    assert_eq!(
        live(),
        before,
        "[bind groups, buffers, pipelines] changed while alternating two gradient sets"
    );
    ctx.queue().submit([encoder.finish()]);
    for (i, (param, want)) in params.iter().zip(&reference.params).enumerate() {
        assert_tensor(&ctx, &format!("param[{i}] after 8 alternating steps"), param, want);
    }
}
