//! PyTorch-convention Adam, AdamW and AMSGrad on the GPU against the f64 oracle: every
//! switch combination, sizes around the workgroup boundary, 30-step trajectories, through
//! the stateful optimizer (in place) and the stateless operator (out of place).

mod common;

use common::{assert_tensor, ctx, to_f32, Rng};
use wgpu_optim::ops::{self, AdamTensors};
use wgpu_optim::oracle::{torch_adam_step, TorchAdamState};
use wgpu_optim::{Adam, DType, GpuContext, Optimizer, StateKind, Tensor};

const SIZES: [usize; 5] = [1, 255, 256, 257, 100_003];
const STEPS: usize = 30;

/// Every combination of amsgrad, maximize and weight-decay mode (none, L2, decoupled).
fn every_switch_combination() -> Vec<Adam> {
    let mut configs = Vec::new();
    for amsgrad in [false, true] {
        for maximize in [false, true] {
            for (weight_decay, decoupled_weight_decay) in [(0.0, false), (0.05, false), (0.05, true)] {
                configs.push(Adam {
                    lr: 1e-2,
                    amsgrad,
                    maximize,
                    weight_decay,
                    decoupled_weight_decay,
                    ..Adam::default()
                });
            }
        }
    }
    configs
}

struct Reference {
    params: Vec<Vec<f64>>,
    states: Vec<TorchAdamState>,
}

impl Reference {
    fn new(params: &[Vec<f64>], amsgrad: bool) -> Self {
        Reference {
            params: params.to_vec(),
            states: params.iter().map(|p| TorchAdamState::zeros(p.len(), amsgrad)).collect(),
        }
    }

    fn step(&mut self, config: &Adam, grads: &[Vec<f64>]) {
        for ((p, s), g) in self.params.iter_mut().zip(&mut self.states).zip(grads) {
            torch_adam_step(config, p, g, s);
        }
    }
}

fn random_params(rng: &mut Rng) -> Vec<Vec<f64>> {
    SIZES.iter().map(|&n| rng.vec(n, 1.0)).collect()
}

fn write(ctx: &GpuContext, tensor: &Tensor, values: &[f64]) {
    ctx.write_bytes(tensor, bytemuck::cast_slice(&to_f32(values))).expect("write");
}

fn check_in_place(config: Adam, seed: u64) {
    let ctx = ctx();
    let mut rng = Rng::new(seed);
    let initial = random_params(&mut rng);
    let params: Vec<Tensor> = initial.iter().map(|p| ctx.upload_f32("param", &to_f32(p))).collect();
    let grads: Vec<Tensor> = SIZES.iter().map(|&n| ctx.zeros("grad", n as u64, DType::F32)).collect();
    let mut optimizer = Optimizer::new(&ctx, config, &params).expect("optimizer");
    let mut reference = Reference::new(&initial, config.amsgrad);
    for _ in 0..STEPS {
        let g: Vec<Vec<f64>> = SIZES.iter().map(|&n| rng.vec(n, 1.0)).collect();
        for (tensor, values) in grads.iter().zip(&g) {
            write(&ctx, tensor, values);
        }
        optimizer.step(&grads).expect("step");
        reference.step(&config, &g);
    }
    assert_eq!(optimizer.step_count(), STEPS as u64);
    for (i, (p, s)) in reference.params.iter().zip(&reference.states).enumerate() {
        let what = |name: &str| format!("{config:?} {name}[{i}] (n = {})", SIZES[i]);
        assert_tensor(&ctx, &what("param"), &params[i], p);
        assert_tensor(&ctx, &what("exp_avg"), optimizer.state(i, StateKind::ExpAvg).unwrap(), &s.exp_avg);
        assert_tensor(
            &ctx,
            &what("exp_avg_sq"),
            optimizer.state(i, StateKind::ExpAvgSq).unwrap(),
            &s.exp_avg_sq,
        );
        match optimizer.state(i, StateKind::MaxExpAvgSq) {
            Some(vmax) => assert_tensor(&ctx, &what("max_exp_avg_sq"), vmax, &s.max_exp_avg_sq),
            None => assert!(!config.amsgrad, "AMSGrad keeps max_exp_avg_sq"),
        }
    }
}

fn check_out_of_place(config: Adam, seed: u64) {
    let ctx = ctx();
    let mut rng = Rng::new(seed);
    let initial = random_params(&mut rng);
    let slots = if config.amsgrad { 4 } else { 3 };
    let make_set = |p: &Vec<f64>, upload: bool| -> Vec<Tensor> {
        (0..slots)
            .map(|k| match (k, upload) {
                (0, true) => ctx.upload_f32("param", &to_f32(p)),
                _ => ctx.zeros("state", p.len() as u64, DType::F32),
            })
            .collect()
    };
    let mut current: Vec<Vec<Tensor>> = initial.iter().map(|p| make_set(p, true)).collect();
    let mut next: Vec<Vec<Tensor>> = initial.iter().map(|p| make_set(p, false)).collect();
    let grads: Vec<Tensor> = SIZES.iter().map(|&n| ctx.zeros("grad", n as u64, DType::F32)).collect();
    let mut reference = Reference::new(&initial, config.amsgrad);
    for t in 1..=STEPS as u64 {
        let g: Vec<Vec<f64>> = SIZES.iter().map(|&n| rng.vec(n, 1.0)).collect();
        for (tensor, values) in grads.iter().zip(&g) {
            write(&ctx, tensor, values);
        }
        let io: Vec<AdamTensors> = current
            .iter()
            .zip(&next)
            .zip(&grads)
            .map(|((src, dst), grad)| AdamTensors {
                param: src[0].clone(),
                grad: grad.clone(),
                exp_avg: src[1].clone(),
                exp_avg_sq: src[2].clone(),
                max_exp_avg_sq: src.get(3).cloned(),
                param_out: Some(dst[0].clone()),
                exp_avg_out: Some(dst[1].clone()),
                exp_avg_sq_out: Some(dst[2].clone()),
                max_exp_avg_sq_out: dst.get(3).cloned(),
            })
            .collect();
        let mut encoder = ctx.device().create_command_encoder(&Default::default());
        ops::adam(&ctx, &mut encoder, &config, t, &io).expect("adam");
        ctx.queue().submit([encoder.finish()]);
        reference.step(&config, &g);
        std::mem::swap(&mut current, &mut next);
    }
    for (i, (p, s)) in reference.params.iter().zip(&reference.states).enumerate() {
        let what = |name: &str| format!("{config:?} {name}[{i}] (n = {}, out of place)", SIZES[i]);
        assert_tensor(&ctx, &what("param"), &current[i][0], p);
        assert_tensor(&ctx, &what("exp_avg"), &current[i][1], &s.exp_avg);
        assert_tensor(&ctx, &what("exp_avg_sq"), &current[i][2], &s.exp_avg_sq);
        if config.amsgrad {
            assert_tensor(&ctx, &what("max_exp_avg_sq"), &current[i][3], &s.max_exp_avg_sq);
        }
    }
}

#[test]
fn every_switch_combination_matches_the_oracle_in_place() {
    for (k, config) in every_switch_combination().into_iter().enumerate() {
        check_in_place(config, 100 + k as u64);
    }
}

#[test]
fn every_switch_combination_matches_the_oracle_out_of_place() {
    for (k, config) in every_switch_combination().into_iter().enumerate() {
        check_out_of_place(config, 200 + k as u64);
    }
}

#[test]
fn adamw_defaults_are_pytorchs() {
    let c = Adam::adamw();
    assert_eq!((c.lr, c.beta1, c.beta2, c.eps, c.weight_decay), (1e-3, 0.9, 0.999, 1e-8, 0.01));
    assert!(c.decoupled_weight_decay && !c.amsgrad && !c.maximize);
    check_in_place(c, 7);
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
    let config = Adam { lr: 0.05, amsgrad: true, ..Adam::default() };
    let mut optimizer = Optimizer::new(&ctx, config, &params).unwrap();
    let mut reference = Reference::new(&initial, true);
    let mut encoder = ctx.device().create_command_encoder(&Default::default());
    for _ in 0..5 {
        optimizer.record_step(&mut encoder, &grads).unwrap();
        reference.step(&config, &g);
    }
    ctx.queue().submit([encoder.finish()]);
    assert_tensor(&ctx, "param after 5 steps in one submit", &params[0], &reference.params[0]);
}

#[test]
fn a_learning_rate_schedule_changes_no_pipeline() {
    let ctx = ctx();
    let mut rng = Rng::new(4);
    let initial = vec![rng.vec(513, 1.0)];
    let params = vec![ctx.upload_f32("param", &to_f32(&initial[0]))];
    let grads = vec![ctx.zeros("grad", 513, DType::F32)];
    let mut config = Adam::adamw();
    let mut optimizer = Optimizer::new(&ctx, config, &params).unwrap();
    let mut reference = Reference::new(&initial, false);
    optimizer.step(&grads).unwrap();
    reference.step(&config, &[vec![0.0; 513]]);
    let compiled = ctx.compiled_pipelines();
    for k in 0..10 {
        let g = vec![rng.vec(513, 1.0)];
        write(&ctx, &grads[0], &g[0]);
        config.lr = 1e-3 * (1.0 + k as f64);
        optimizer.set_lr(config.lr).unwrap();
        optimizer.step(&grads).unwrap();
        reference.step(&config, &g);
    }
    assert_eq!(ctx.compiled_pipelines(), compiled, "a new learning rate must not compile a pipeline");
    assert_tensor(&ctx, "param under a schedule", &params[0], &reference.params[0]);
}
