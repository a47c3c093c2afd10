//! ADOPT (the official `adopt.ADOPT`) on the GPU and the CPU backend against the f64 oracle:
//! f32 trajectories (coupled and decoupled decay, `maximize`, no clipping), 16-bit storage
//! and state dtypes other than the parameter's, master weights, two groups, capturable mode
//! (the first step and the clipping bound from the device's step), global clipping,
//! stochastic and Kahan rounding, the first step that moves nothing, NaN gradients,
//! checkpoints, refusals, and low-bit state (8-bit runs, 4-bit is refused). The public
//! vectors (`adopt_plain`, `adopt_decouple_wd`) run in `tests/conformance.rs`.

use crate::common;
use crate::family;

use common::{assert_close, ctx, download, Rng, Tolerance};
use family::{host, slices, slices_mut};
use wgpu_optim::cpu::{CpuOptimizer, HostTensor};
use wgpu_optim::q8::StoredState;
use wgpu_optim::{Adam, Adopt, Algorithm, DType, Error, Optimizer, StateKind, StateStorage, Tensor};
use wgpu_optim_testkit::oracle::{ToOracle, TorchState};

fn plain() -> Algorithm {
    Adopt { lr: 1e-2, ..Adopt::default() }.into()
}

/// Decoupled decay, another clipping exponent and betas whose lerp takes ATen's other form.
fn decoupled() -> Algorithm {
    Adopt {
        lr: 3e-3,
        beta1: 0.4,
        beta2: 0.99,
        eps: 1e-5,
        weight_decay: 0.5,
        decouple: true,
        clip_exponent: Some(0.5),
        maximize: false,
    }
    .into()
}

/// Coupled decay (a power of two, so `g + wd p` rounds once in f32), `maximize`, no
/// clipping.
fn coupled_unclipped() -> Algorithm {
    Adopt {
        lr: 2e-3,
        beta2: 0.999,
        weight_decay: 0.25,
        clip_exponent: None,
        maximize: true,
        ..Adopt::default()
    }
    .into()
}

#[test]
fn defaults_and_state_are_the_official_ones() {
    let d = Adopt::default();
    assert_eq!((d.lr, d.beta1, d.beta2, d.eps, d.weight_decay), (1e-3, 0.9, 0.9999, 1e-6, 0.0));
    assert_eq!((d.decouple, d.clip_exponent, d.maximize), (false, Some(0.25), false));
    let a: Algorithm = d.into();
    assert_eq!(a.name(), "ADOPT");
    assert_eq!(a.state_kinds(), &[StateKind::ExpAvg, StateKind::ExpAvgSq]);
}

#[test]
fn f32_trajectories_follow_the_oracle_on_the_gpu_and_the_cpu() {
    family::f32_trajectories_follow_the_oracle(plain(), 12, 1);
    family::f32_trajectories_follow_the_oracle(decoupled(), 12, 2);
    family::f32_trajectories_follow_the_oracle(coupled_unclipped(), 12, 3);
}

#[test]
fn sixteen_bit_storage_and_other_state_dtypes_match_the_oracle_natively() {
    let ctx = ctx().with_packed_f16(false);
    // Only GL may lack SHADER_F16; its run leaves the native path to the Vulkan run.
    if !common::has_feature_unless_gl(&ctx, wgpu::Features::SHADER_F16, "SHADER_F16") {
        return;
    }
    family::mixes_match_the_oracle_step_by_step(&ctx, decoupled(), &family::no_ties, 6, 10);
}

#[test]
fn sixteen_bit_storage_and_other_state_dtypes_match_the_oracle_packed() {
    let ctx = ctx().with_packed_f16(true);
    family::mixes_match_the_oracle_step_by_step(&ctx, coupled_unclipped(), &family::no_ties, 6, 20);
}

#[test]
fn master_weights_follow_the_oracle_and_round_the_model_copy_once() {
    family::master_weights_follow_the_oracle(decoupled(), 30);
}

#[test]
fn two_groups_keep_their_own_hyperparameters() {
    family::two_groups_follow_their_own_oracles(plain(), decoupled(), 40);
}

#[test]
fn capturable_mode_takes_the_first_step_and_the_clipping_bound_from_the_device() {
    // The bound (t - 1)^q is an f32 pow on the device (the host's is f64).
    let tolerance = Tolerance::Close { rtol: 1e-5, atol: 1e-6 };
    let schedule = |t: u64| 1e-2 / (1.0 + 0.1 * t as f64);
    family::capturable_follows_the_oracle(decoupled(), 0, 8, schedule, tolerance, 50);
    family::capturable_follows_the_oracle(plain(), 0, 5, |_| 1e-2, tolerance, 51);
    // From a later step, with zero state: the bound is what holds the first update.
    family::capturable_follows_the_oracle(plain(), 1000, 2, |_| 1e-3, tolerance, 52);
    family::capturable_follows_the_oracle(coupled_unclipped(), 3, 3, |_| 1e-3, tolerance, 53);
}

#[test]
fn global_clipping_scales_the_gradients_before_the_update() {
    family::clipped_steps_follow_the_oracle(decoupled(), 60);
    family::clipped_steps_follow_the_oracle(coupled_unclipped(), 61);
}

#[test]
fn stochastic_and_kahan_rounding_store_the_same_bits_on_the_gpu_and_the_cpu() {
    // Each element's gradient keeps one power-of-two magnitude and one sign: `exp_avg_sq`
    // stays its square, the root and the quotient are exact, `exp_avg` (weights 1/2) and a
    // step of 2^-13 times it are exact too, so every f32 operation is exact on both; the
    // updates add up past half a 16-bit spacing within the run.
    let adopt: Algorithm =
        Adopt { lr: 1.0 / 8192.0, beta1: 0.5, beta2: 0.75, eps: 1.0 / 64.0, ..Adopt::default() }.into();
    let mut rng = Rng::new(70);
    let sizes = [300usize, 7];
    let magnitudes: Vec<Vec<f64>> = sizes
        .iter()
        .map(|&n| {
            rng.vec(n, 1.0)
                .iter()
                .map(|x| x.signum() * 2f64.powi(-2 - (x.abs() * 5.0).floor() as i32))
                .collect()
        })
        .collect();
    let start: Vec<Vec<f64>> = sizes.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grads: Vec<Vec<Vec<f64>>> = (0..24).map(|_| magnitudes.clone()).collect();
    family::rounding_stores_the_same_bits_on_the_gpu_and_the_cpu(adopt, &start, &grads);
}

/// `steps` steps of `algorithm` with `grads` on both backends from `start` (f32): the
/// parameters and each state, GPU then CPU.
fn run_both(algorithm: Algorithm, start: &[f64], grads: &[Vec<f64>]) -> [(Vec<f64>, Vec<Vec<f64>>); 2] {
    let ctx = ctx();
    let param = ctx.upload("param", start, DType::F32);
    let mut gpu = Optimizer::builder().build(&ctx, algorithm, std::slice::from_ref(&param)).unwrap();
    let mut cpu_params = vec![host(start, DType::F32)];
    let mut cpu = CpuOptimizer::builder().build(algorithm, &slices(&cpu_params)).unwrap();
    for g in grads {
        gpu.step(&[ctx.upload("grad", g, DType::F32)]).unwrap();
        cpu.step(&mut slices_mut(&mut cpu_params), &slices(&[host(g, DType::F32)])).unwrap();
    }
    let kinds = algorithm.state_kinds();
    let gpu_state = kinds
        .iter()
        .map(|k| download(&ctx, gpu.state(0, *k).unwrap().and_then(|s| s.dense()).unwrap()))
        .collect();
    let cpu_state =
        kinds.iter().map(|k| cpu.state(0, *k).and_then(|s| s.dense()).unwrap().to_f64()).collect();
    [(download(&ctx, &param), gpu_state), (cpu_params[0].to_f64(), cpu_state)]
}

#[test]
fn the_first_step_only_sets_the_second_moment_on_both_backends() {
    let mut rng = Rng::new(90);
    let start = rng.vec(257, 1.0);
    let g = rng.vec(257, 1.0);
    let decoupled_decay = Adopt { weight_decay: 0.5, decouple: true, ..Adopt::default() };
    let coupled_decay = Adopt { weight_decay: 0.5, maximize: true, ..Adopt::default() };
    for config in [decoupled_decay, coupled_decay] {
        let mut want = start.clone();
        let mut oracle = TorchState::new(config.to_oracle().into(), start.len());
        oracle.step(&mut want, &g);
        assert_eq!(want, start, "the oracle's first step moves nothing");
        for (backend, (param, state)) in
            ["GPU", "CPU"].into_iter().zip(run_both(config.into(), &start, std::slice::from_ref(&g)))
        {
            let what = format!("{backend} {config:?}");
            let bits = |v: &[f64]| v.iter().map(|x| (*x as f32).to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&param), bits(&start), "{what}: the parameters moved");
            assert!(state[0].iter().all(|m| *m == 0.0), "{what}: exp_avg moved");
            // Coupled decay enters the square; decoupled decay waits for the second step.
            assert_close(&format!("{what} exp_avg_sq"), &state[1], &oracle.tensors()[1], Tolerance::F32);
        }
    }
}

/// As the official code: a NaN gradient makes its `exp_avg_sq` NaN, and from then on
/// (`torch.clamp` keeps a NaN root) its parameter and `exp_avg` go NaN at the next update,
/// even with finite gradients; the other elements stay finite. An infinite gradient is
/// clipped to the bound in the update but makes `exp_avg_sq` infinite.
#[test]
fn a_nan_gradient_spoils_its_element_as_in_the_official_code() {
    let mut rng = Rng::new(91);
    let n = 300;
    let start = rng.vec(n, 1.0);
    let (nan_first, nan_later, infinite) = (5usize, 200usize, 77usize);
    let grads: Vec<Vec<f64>> = (0..4)
        .map(|k| {
            let mut g = rng.vec(n, 1.0);
            if k == 0 {
                g[nan_first] = f64::NAN;
            }
            if k == 2 {
                g[nan_later] = f64::NAN;
                g[infinite] = f64::INFINITY;
            }
            g
        })
        .collect();
    for config in [plain(), decoupled()] {
        let mut want = start.clone();
        let mut oracle = TorchState::new(config.to_oracle(), n);
        for g in &grads {
            oracle.step(&mut want, g);
        }
        assert!(want[nan_first].is_nan() && want[nan_later].is_nan() && want[infinite].is_finite());
        assert_eq!(want.iter().filter(|p| p.is_nan()).count(), 2, "{config:?}: the oracle");
        for (backend, (param, state)) in ["GPU", "CPU"].into_iter().zip(run_both(config, &start, &grads)) {
            let what = format!("{backend} {config:?}");
            assert_close(&what, &param, &want, Tolerance::F32);
            for (kind, (got, want)) in config.state_kinds().iter().zip(state.iter().zip(oracle.tensors())) {
                assert_close(&format!("{what} {kind:?}"), got, &want, Tolerance::F32);
            }
        }
    }
}

/// Saving after the first step and after the third continues the uninterrupted trajectory
/// bit for bit on each backend (the first brings back the step count: the next step is an
/// update, not a first step).
#[test]
fn a_loaded_checkpoint_continues_the_same_trajectory_on_both_backends() {
    family::checkpoint::a_loaded_checkpoint_continues_the_same_trajectory(decoupled(), 92);
    family::checkpoint::a_loaded_checkpoint_continues_the_same_trajectory(coupled_unclipped(), 93);
}

#[test]
fn a_gpu_checkpoint_continues_on_the_cpu_backend() {
    family::a_gpu_checkpoint_continues_on_the_cpu(decoupled(), 80);
    family::a_gpu_checkpoint_continues_on_the_cpu(coupled_unclipped(), 81);
}

#[test]
fn a_checkpoint_of_adopt_does_not_load_into_adam_and_adam_not_into_adopt() {
    family::a_checkpoint_of_another_algorithm_is_refused(decoupled(), Adam::default().into());
    family::a_checkpoint_of_another_algorithm_is_refused(Adam::adamw().into(), plain());
}

#[test]
fn the_checkpoint_json_keeps_the_official_names() {
    family::json_round_trips(plain());
    family::json_round_trips(decoupled());
    family::json_round_trips(coupled_unclipped());
    let json = decoupled().to_json();
    assert_eq!(json["betas"], serde_json::json!([0.4, 0.99]));
    assert_eq!(json["clip_lambda"], serde_json::json!(0.5));
    assert_eq!(json["decouple"], serde_json::json!(true));
    assert_eq!(coupled_unclipped().to_json()["clip_lambda"], serde_json::Value::Null);
    let mut missing = json.clone();
    missing.remove("clip_lambda");
    assert!(matches!(Algorithm::from_json(&missing), Err(Error::BadJson { .. })));
}

#[test]
fn bad_hyperparameters_are_refused_by_name_and_change_nothing() {
    let good = decoupled();
    let d = Adopt::default();
    let cases: [(Adopt, &str); 10] = [
        (Adopt { lr: -1e-3, ..d }, "lr"),
        (Adopt { lr: f64::NAN, ..d }, "lr"),
        (Adopt { eps: -1e-6, ..d }, "eps"),
        (Adopt { beta1: 1.0, ..d }, "beta1"),
        (Adopt { beta2: -0.1, ..d }, "beta2"),
        (Adopt { beta2: 1.0, ..d }, "beta2"),
        (Adopt { weight_decay: -0.1, ..d }, "weight_decay"),
        (Adopt { clip_exponent: Some(-0.25), ..d }, "clip_exponent"),
        (Adopt { clip_exponent: Some(f64::NAN), ..d }, "clip_exponent"),
        (Adopt { clip_exponent: Some(f64::INFINITY), ..d }, "clip_exponent"),
    ];
    for (bad, name) in cases {
        family::a_bad_hyperparameter_is_refused_by_name(good, bad.into(), name);
    }
}

/// bitsandbytes has no ADOPT, but 8-bit state is the shared machinery's (ADOPT's update on
/// dequantized values, `exp_avg` with the signed map and `exp_avg_sq` with the unsigned
/// one): 20 steps stay close to the f32 trajectory, and the GPU and the CPU store the same
/// codes.
#[test]
fn eight_bit_state_follows_f32_adopt_loosely_and_the_gpu_matches_the_cpu() {
    use wgpu_optim::q8::Q8States;
    let ctx = ctx();
    let algorithm = decoupled();
    let lens = [4096usize, 300];
    let mut rng = Rng::new(93);
    let start: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grads: Vec<Vec<Vec<f64>>> = (0..20)
        .map(|_| {
            lens.iter().map(|&n| rng.vec(n, 1.0).iter().map(|g| f64::from(*g as f32)).collect()).collect()
        })
        .collect();
    let config = Q8States::default();
    let params: Vec<Tensor> = start.iter().map(|p| ctx.upload("param", p, DType::F32)).collect();
    let mut gpu =
        Optimizer::builder().state_storage(StateStorage::Q8(config)).build(&ctx, algorithm, &params).unwrap();
    let mut cpu_params: Vec<HostTensor> = start.iter().map(|p| host(p, DType::F32)).collect();
    let mut cpu = CpuOptimizer::builder()
        .state_storage(StateStorage::Q8(config))
        .build(algorithm, &slices(&cpu_params))
        .unwrap();
    let mut want = start.clone();
    let mut oracles: Vec<TorchState> =
        lens.iter().map(|&n| TorchState::new(algorithm.to_oracle(), n)).collect();
    for g in &grads {
        let tensors: Vec<Tensor> = g.iter().map(|g| ctx.upload("grad", g, DType::F32)).collect();
        gpu.step(&tensors).unwrap();
        let host_grads: Vec<HostTensor> = g.iter().map(|g| host(g, DType::F32)).collect();
        cpu.step(&mut slices_mut(&mut cpu_params), &slices(&host_grads)).unwrap();
        for ((p, o), g) in want.iter_mut().zip(&mut oracles).zip(g) {
            o.step(p, g);
        }
    }
    for i in 0..lens.len() {
        let gpu_p = download(&ctx, &params[i]);
        let cpu_p = cpu_params[i].to_f64();
        let moved = want[i].iter().zip(&start[i]).map(|(w, s)| (w - s).abs()).fold(0.0, f64::max);
        for (backend, got) in [("GPU", &gpu_p), ("CPU", &cpu_p)] {
            let off = got.iter().zip(&want[i]).map(|(g, w)| (g - w).abs()).fold(0.0, f64::max);
            assert!(off < 0.1 * moved, "{backend} param[{i}]: {off} off f32 ADOPT, which moved {moved}");
        }
        assert_close(&format!("GPU against CPU param[{i}]"), &gpu_p, &cpu_p, Tolerance::F32);
        for kind in algorithm.state_kinds() {
            let gpu_state = gpu.state(i, *kind).map(|s| s.and_then(|v| v.q8())).unwrap();
            let cpu_state = cpu.state(i, *kind).and_then(|s| s.q8());
            match (gpu_state, cpu_state) {
                (Some(gpu_state @ StoredState::Q8 { .. }), Some(cpu_state)) => {
                    assert!(
                        lens[i] >= config.min_8bit_size as usize,
                        "param[{i}] quantized below the minimum"
                    );
                    assert_eq!(&gpu_state, cpu_state, "{kind:?} of param[{i}]");
                }
                (Some(StoredState::F32(got)), Some(StoredState::F32(want))) => {
                    assert!(lens[i] < config.min_8bit_size as usize, "param[{i}] kept f32 state");
                    let (got, want): (Vec<f64>, Vec<f64>) =
                        (got.iter().map(|&x| x.into()).collect(), want.iter().map(|&x| x.into()).collect());
                    assert_close(&format!("f32 {kind:?}[{i}]"), &got, &want, Tolerance::F32);
                }
                other => panic!("{kind:?} of param[{i}]: GPU and CPU keep other forms: {other:?}"),
            }
        }
    }
}

#[test]
fn four_bit_state_is_refused_as_torchaos_adam_only() {
    use wgpu_optim::q4::Q4States;
    let ctx = ctx();
    let values = vec![0.5; 4096];
    let param = ctx.upload("param", &values, DType::F32);
    let refused = |err: Error, backend: &str| match err {
        Error::ConflictingOptions { first: "state_storage", second: "algorithm", reason } => {
            assert!(reason.contains("Adam"), "{backend}: {reason}");
        }
        other => panic!("{backend}: expected ConflictingOptions, got {other:?}"),
    };
    let options = Optimizer::builder().state_storage(StateStorage::Q4(Q4States::default()));
    refused(options.build(&ctx, plain(), std::slice::from_ref(&param)).expect_err("GPU"), "GPU");
    let cpu_param = host(&values, DType::F32);
    let options = CpuOptimizer::builder().state_storage(StateStorage::Q4(Q4States::default()));
    refused(options.build(plain(), &[cpu_param.as_slice()]).expect_err("CPU"), "CPU");
}
