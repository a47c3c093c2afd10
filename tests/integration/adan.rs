//! Adan (the official `adan.Adan`) on the GPU and the CPU backend against the f64 oracle:
//! f32 trajectories (proximal and `no_prox` decay, other betas), 16-bit storage and state
//! dtypes other than the parameter's, master weights, two groups, capturable mode (the bias
//! corrections and the first step from the device's step), the optimizer's global clipping,
//! stochastic and Kahan rounding, the first step's zero difference, NaN gradients,
//! checkpoints, refusals, low-bit state (8-bit against the oracle on both backends, 4-bit
//! refused), and Adan's own clipping (`max_grad_norm`,
//! with Adan's `eps`) against the oracle on both backends. The public vectors (`adan_plain`,
//! `adan_wd_prox`) run in `tests/conformance.rs`.

use crate::common;
use crate::family;

use common::{assert_close, ctx, download, Rng, Tolerance};
use family::{host, slices, slices_mut};
use wgpu_optim::cpu::{CpuOptimizer, HostTensor};
use wgpu_optim::{Adam, Adan, Algorithm, DType, Error, Optimizer, StateKind, StateStorage, Tensor};
use wgpu_optim_testkit::oracle::adan::AdanOracle;
use wgpu_optim_testkit::oracle::{ToOracle, TorchState};

fn plain() -> Algorithm {
    Adan { lr: 1e-2, ..Adan::default() }.into()
}

/// The proximal decay (the default) with other betas and eps.
fn proximal() -> Algorithm {
    Adan { lr: 3e-3, beta1: 0.9, beta2: 0.7, beta3: 0.999, eps: 1e-6, weight_decay: 0.5, ..Adan::default() }
        .into()
}

/// The decay before the update (`no_prox`).
fn no_prox() -> Algorithm {
    Adan { lr: 2e-3, weight_decay: 0.25, no_prox: true, ..Adan::default() }.into()
}

#[test]
fn defaults_and_state_are_the_official_ones() {
    let d = Adan::default();
    assert_eq!((d.lr, d.beta1, d.beta2, d.beta3, d.eps), (1e-3, 0.98, 0.92, 0.99, 1e-8));
    assert_eq!((d.weight_decay, d.max_grad_norm, d.no_prox), (0.0, 0.0, false));
    let a: Algorithm = d.into();
    assert_eq!(a.name(), "Adan");
    let kinds = [StateKind::ExpAvg, StateKind::ExpAvgSq, StateKind::ExpAvgDiff, StateKind::NegPreGrad];
    assert_eq!(a.state_kinds(), &kinds);
    let names: Vec<&str> = kinds.iter().map(|k| k.torch_name()).collect();
    assert_eq!(names, ["exp_avg", "exp_avg_sq", "exp_avg_diff", "neg_pre_grad"]);
}

#[test]
fn f32_trajectories_follow_the_oracle_on_the_gpu_and_the_cpu() {
    family::f32_trajectories_follow_the_oracle(plain(), 12, 1);
    family::f32_trajectories_follow_the_oracle(proximal(), 12, 2);
    family::f32_trajectories_follow_the_oracle(no_prox(), 12, 3);
}

#[test]
fn sixteen_bit_storage_and_other_state_dtypes_match_the_oracle_natively() {
    let ctx = ctx().with_packed_f16(false);
    // Only GL may lack SHADER_F16; its run leaves the native path to the Vulkan run.
    if !common::has_feature_unless_gl(&ctx, wgpu::Features::SHADER_F16, "SHADER_F16") {
        return;
    }
    family::mixes_match_the_oracle_step_by_step(&ctx, proximal(), &family::no_ties, 6, 10);
}

#[test]
fn sixteen_bit_storage_and_other_state_dtypes_match_the_oracle_packed() {
    let ctx = ctx().with_packed_f16(true);
    family::mixes_match_the_oracle_step_by_step(&ctx, no_prox(), &family::no_ties, 6, 20);
}

#[test]
fn master_weights_follow_the_oracle_and_round_the_model_copy_once() {
    family::master_weights_follow_the_oracle(proximal(), 30);
}

#[test]
fn two_groups_keep_their_own_hyperparameters() {
    family::two_groups_follow_their_own_oracles(plain(), no_prox(), 40);
}

#[test]
fn capturable_mode_takes_the_bias_corrections_and_the_first_step_from_the_device() {
    // The bias corrections are f32 on the device (the host's are f64).
    let tolerance = Tolerance::Close { rtol: 1e-5, atol: 1e-6 };
    let schedule = |t: u64| 1e-2 / (1.0 + 0.1 * t as f64);
    family::capturable_follows_the_oracle(proximal(), 0, 8, schedule, tolerance, 50);
    family::capturable_follows_the_oracle(no_prox(), 0, 5, |_| 1e-2, tolerance, 51);
    // From a later step: the first step's flag comes from the device's step, not the host's.
    family::capturable_follows_the_oracle(plain(), 3, 3, |_| 1e-3, tolerance, 52);
}

#[test]
fn global_clipping_scales_the_gradients_before_the_update() {
    family::clipped_steps_follow_the_oracle(proximal(), 60);
    family::clipped_steps_follow_the_oracle(no_prox(), 61);
}

#[test]
fn stochastic_and_kahan_rounding_store_the_same_bits_on_the_gpu_and_the_cpu() {
    let adan: Algorithm = Adan { lr: 1.0 / 8192.0, weight_decay: 0.5, ..Adan::default() }.into();
    let mut rng = Rng::new(70);
    let sizes = [300usize, 7];
    let start: Vec<Vec<f64>> = sizes.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grads: Vec<Vec<Vec<f64>>> =
        (0..24).map(|_| sizes.iter().map(|&n| rng.vec(n, 1.0)).collect()).collect();
    family::rounding_stores_the_same_bits_on_the_gpu_and_the_cpu(adan, &start, &grads);
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
fn the_first_difference_is_zero_and_neg_pre_grad_is_minus_the_gradient_on_both_backends() {
    let mut rng = Rng::new(90);
    let start = rng.vec(257, 1.0);
    let g: Vec<f64> = rng.vec(257, 1.0).iter().map(|g| f64::from(*g as f32)).collect();
    let second: Vec<f64> = rng.vec(257, 1.0).iter().map(|g| f64::from(*g as f32)).collect();
    for config in [proximal(), no_prox()] {
        let mut want = start.clone();
        let mut oracle = TorchState::new(config.to_oracle(), start.len());
        oracle.step(&mut want, &g);
        let minus_g: Vec<f64> = g.iter().map(|g| -g).collect();
        let [gpu, cpu] = run_both(config, &start, std::slice::from_ref(&g));
        for (backend, (param, state)) in [("GPU", gpu), ("CPU", cpu)] {
            let what = format!("{backend} {config:?}");
            assert_close(&what, &param, &want, Tolerance::F32);
            assert!(state[2].iter().all(|v| *v == 0.0), "{what}: exp_avg_diff moved on the first step");
            assert_eq!(state[3], minus_g, "{what}: neg_pre_grad");
        }
        // The second step's difference is the gradients' difference.
        let mut want = start.clone();
        let mut oracle = TorchState::new(config.to_oracle(), start.len());
        oracle.step(&mut want, &g);
        oracle.step(&mut want, &second);
        let [gpu, cpu] = run_both(config, &start, &[g.clone(), second.clone()]);
        for (backend, (param, state)) in [("GPU", gpu), ("CPU", cpu)] {
            let what = format!("{backend} {config:?} step 2");
            assert_close(&what, &param, &want, Tolerance::F32);
            for (k, (got, want)) in state.iter().zip(oracle.tensors()).enumerate() {
                assert_close(&format!("{what} state {k}"), got, &want, Tolerance::F32);
            }
        }
    }
}

/// As the official code: a NaN gradient makes its element's moments NaN for good (and its
/// parameter), and the next step's difference too; the other elements stay finite.
#[test]
fn a_nan_gradient_spoils_its_element_as_in_the_official_code() {
    let mut rng = Rng::new(91);
    let n = 300;
    let start = rng.vec(n, 1.0);
    let (nan_first, nan_later) = (5usize, 200usize);
    let grads: Vec<Vec<f64>> = (0..4)
        .map(|k| {
            let mut g = rng.vec(n, 1.0);
            if k == 0 {
                g[nan_first] = f64::NAN;
            }
            if k == 2 {
                g[nan_later] = f64::NAN;
            }
            g
        })
        .collect();
    for config in [plain(), proximal()] {
        let mut want = start.clone();
        let mut oracle = TorchState::new(config.to_oracle(), n);
        for g in &grads {
            oracle.step(&mut want, g);
        }
        assert!(want[nan_first].is_nan() && want[nan_later].is_nan());
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
/// bit for bit on each backend (the first brings back `neg_pre_grad` and the step count).
#[test]
fn a_loaded_checkpoint_continues_the_same_trajectory_on_both_backends() {
    family::checkpoint::a_loaded_checkpoint_continues_the_same_trajectory(proximal(), 92);
    family::checkpoint::a_loaded_checkpoint_continues_the_same_trajectory(no_prox(), 93);
}

#[test]
fn a_gpu_checkpoint_continues_on_the_cpu_backend() {
    family::a_gpu_checkpoint_continues_on_the_cpu(proximal(), 80);
    family::a_gpu_checkpoint_continues_on_the_cpu(no_prox(), 81);
}

#[test]
fn a_checkpoint_of_adan_does_not_load_into_adam_and_adam_not_into_adan() {
    family::a_checkpoint_of_another_algorithm_is_refused(proximal(), Adam::default().into());
    family::a_checkpoint_of_another_algorithm_is_refused(Adam::adamw().into(), plain());
}

#[test]
fn the_checkpoint_json_keeps_the_official_names() {
    family::json_round_trips(plain());
    family::json_round_trips(proximal());
    family::json_round_trips(no_prox());
    let json = proximal().to_json();
    assert_eq!(json["optimizer"], serde_json::json!("Adan"));
    assert_eq!(json["betas"], serde_json::json!([0.9, 0.7, 0.999]));
    assert_eq!(json["no_prox"], serde_json::json!(false));
    assert_eq!(json["max_grad_norm"], serde_json::json!(0.0));
    assert_eq!(no_prox().to_json()["no_prox"], serde_json::json!(true));
    let mut two_betas = json.clone();
    two_betas.insert("betas".into(), serde_json::json!([0.9, 0.7]));
    assert!(matches!(Algorithm::from_json(&two_betas), Err(Error::BadJson { .. })));
}

#[test]
fn bad_hyperparameters_are_refused_by_name_and_change_nothing() {
    let good = proximal();
    let d = Adan::default();
    let cases: [(Adan, &str); 9] = [
        (Adan { lr: -1e-3, ..d }, "lr"),
        (Adan { lr: f64::NAN, ..d }, "lr"),
        (Adan { eps: -1e-8, ..d }, "eps"),
        (Adan { beta1: 1.0, ..d }, "beta1"),
        (Adan { beta2: -0.1, ..d }, "beta2"),
        (Adan { beta3: 1.0, ..d }, "beta3"),
        (Adan { weight_decay: -0.1, ..d }, "weight_decay"),
        (Adan { max_grad_norm: -1.0, ..d }, "max_grad_norm"),
        (Adan { max_grad_norm: f64::NAN, ..d }, "max_grad_norm"),
    ];
    for (bad, name) in cases {
        family::a_bad_hyperparameter_is_refused_by_name(good, bad.into(), name);
    }
}

/// bitsandbytes has no Adan, but 8-bit state is the shared machinery's: Adan's update on the
/// dequantized blocks, `exp_avg_sq` with the unsigned map and the other three states with the
/// signed one. Each step of each backend against the oracle resumed from what that backend
/// stored before it: the official step on the dequantized states, its new states (rounded
/// to f32) quantized by the testkit's blockwise quantizer; codes as the vectors' format
/// compares them (each within one code, at most 1 % differing: a value near the midpoint of
/// two codes takes either), absmax within 1e-4 relative, parameters as f32 results. A
/// tensor below `min_8bit_size` keeps f32 state, and the GPU and the CPU store the same
/// codes.
#[test]
fn eight_bit_state_follows_the_oracle_step_by_step_and_the_gpu_matches_the_cpu() {
    use wgpu_optim::q8::{Q8States, StoredState};
    use wgpu_optim_testkit::oracle::bnb;
    let ctx = ctx();
    let config = Q8States::default();
    // Whole blocks and a partial last one; and a tensor of f32 state.
    let lens = [4096usize + 100, 300];
    for (seed, adan) in [(70, proximal()), (71, no_prox())] {
        let Algorithm::Adan(hyper) = adan else { unreachable!() };
        let kinds = adan.state_kinds();
        let mut rng = Rng::new(seed);
        let start: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
        let params: Vec<Tensor> = start.iter().map(|p| ctx.upload("param", p, DType::F32)).collect();
        let storage = StateStorage::Q8(config);
        let mut gpu = Optimizer::builder().state_storage(storage).build(&ctx, adan, &params).unwrap();
        let mut cpu_params: Vec<HostTensor> = start.iter().map(|p| host(p, DType::F32)).collect();
        let mut cpu =
            CpuOptimizer::builder().state_storage(storage).build(adan, &slices(&cpu_params)).unwrap();
        for t in 0..6u64 {
            let g: Vec<Vec<f64>> = lens
                .iter()
                .map(|&n| rng.vec(n, 1.0).iter().map(|g| f64::from(*g as f32)).collect())
                .collect();
            // What each backend stored before this step.
            let gpu_before: Vec<Vec<f64>> = params.iter().map(|p| download(&ctx, p)).collect();
            let cpu_before: Vec<Vec<f64>> = cpu_params.iter().map(HostTensor::to_f64).collect();
            let gpu_states = |gpu: &Optimizer| -> Vec<Vec<StoredState>> {
                (0..lens.len())
                    .map(|i| {
                        kinds
                            .iter()
                            .map(|k| gpu.state(i, *k).unwrap().and_then(|v| v.q8()).unwrap())
                            .collect()
                    })
                    .collect()
            };
            let cpu_states = |cpu: &CpuOptimizer| -> Vec<Vec<StoredState>> {
                (0..lens.len())
                    .map(|i| {
                        kinds.iter().map(|k| cpu.state(i, *k).and_then(|v| v.q8()).unwrap().clone()).collect()
                    })
                    .collect()
            };
            // The oracle resumed from a backend's parameters and states: the parameters it
            // wants, and the states it wants in the form that backend keeps.
            let resume = |before: &[Vec<f64>], states: &[Vec<StoredState>]| {
                let mut oracle = AdanOracle::new(hyper.to_oracle(), lens.len())
                    .storing(DType::F32.to_oracle(), DType::F32.to_oracle());
                oracle.step = t;
                if t > 0 {
                    for (i, states) in states.iter().enumerate() {
                        let load = |k: usize| -> Vec<f64> {
                            match &states[k] {
                                StoredState::Q8 { codes, absmax } => {
                                    bnb::dequantize(codes, absmax, &bnb::map_for(kinds[k].torch_name()))
                                }
                                StoredState::F32(values) => values.clone(),
                            }
                            .into_iter()
                            .map(f64::from)
                            .collect()
                        };
                        oracle.exp_avg[i] = load(0);
                        oracle.exp_avg_sq[i] = load(1);
                        oracle.exp_avg_diff[i] = load(2);
                        oracle.neg_pre_grad[i] = load(3);
                    }
                }
                let mut want = before.to_vec();
                oracle.step(&mut want, &g);
                let want_states: Vec<Vec<StoredState>> = (0..lens.len())
                    .map(|i| {
                        let values = [
                            &oracle.exp_avg[i],
                            &oracle.exp_avg_sq[i],
                            &oracle.exp_avg_diff[i],
                            &oracle.neg_pre_grad[i],
                        ];
                        values
                            .iter()
                            .zip(kinds)
                            .map(|(values, kind)| {
                                let narrowed: Vec<f32> = values.iter().map(|&v| v as f32).collect();
                                if lens[i] < config.min_8bit_size as usize {
                                    return StoredState::F32(narrowed);
                                }
                                let mut codes = vec![0u8; narrowed.len()];
                                let mut absmax = vec![0f32; narrowed.len().div_ceil(bnb::BLOCK_SIZE)];
                                bnb::quantize(
                                    &narrowed,
                                    &bnb::map_for(kind.torch_name()),
                                    &mut codes,
                                    &mut absmax,
                                );
                                StoredState::Q8 { codes, absmax }
                            })
                            .collect()
                    })
                    .collect();
                (want, want_states)
            };
            let (gpu_want, gpu_want_states) = resume(&gpu_before, &gpu_states(&gpu));
            let (cpu_want, cpu_want_states) = resume(&cpu_before, &cpu_states(&cpu));

            let tensors: Vec<Tensor> = g.iter().map(|g| ctx.upload("grad", g, DType::F32)).collect();
            gpu.step(&tensors).unwrap();
            let host_grads: Vec<HostTensor> = g.iter().map(|g| host(g, DType::F32)).collect();
            cpu.step(&mut slices_mut(&mut cpu_params), &slices(&host_grads)).unwrap();

            let (gpu_after, cpu_after) = (gpu_states(&gpu), cpu_states(&cpu));
            for i in 0..lens.len() {
                let what = format!("{adan:?} step {t} param[{i}]");
                let gpu_p = download(&ctx, &params[i]);
                let cpu_p = cpu_params[i].to_f64();
                assert_close(&format!("GPU {what}"), &gpu_p, &gpu_want[i], Tolerance::F32);
                assert_close(&format!("CPU {what}"), &cpu_p, &cpu_want[i], Tolerance::F32);
                assert_close(&format!("GPU against CPU {what}"), &gpu_p, &cpu_p, Tolerance::F32);
                for (k, kind) in kinds.iter().enumerate() {
                    let what = format!("{what} {kind:?}");
                    assert_state_follows(&format!("GPU {what}"), &gpu_after[i][k], &gpu_want_states[i][k]);
                    assert_state_follows(&format!("CPU {what}"), &cpu_after[i][k], &cpu_want_states[i][k]);
                    if let StoredState::Q8 { .. } = &gpu_after[i][k] {
                        assert_eq!(gpu_after[i][k], cpu_after[i][k], "GPU against CPU {what}");
                    }
                }
            }
        }
    }
}

/// A GPU checkpoint of 8-bit Adan (four states' codes and absmax under their official names)
/// loads into the CPU backend with every state as the GPU kept it, saves back the same
/// file, and both backends take the next step to the same parameters and codes.
#[test]
fn an_eight_bit_checkpoint_moves_between_the_backends() {
    use wgpu_optim::q8::Q8States;
    let ctx = ctx();
    let adan = proximal();
    let storage = StateStorage::Q8(Q8States::default());
    let lens = [4096usize + 100, 300];
    let mut rng = Rng::new(72);
    let start: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let params: Vec<Tensor> = start.iter().map(|p| ctx.upload("param", p, DType::F32)).collect();
    let mut gpu = Optimizer::builder().state_storage(storage).build(&ctx, adan, &params).unwrap();
    for _ in 0..3 {
        let g: Vec<Tensor> = lens.iter().map(|&n| ctx.upload("grad", &rng.vec(n, 1.0), DType::F32)).collect();
        gpu.step(&g).unwrap();
    }
    let bytes = gpu.save_to_bytes().unwrap();
    let now: Vec<Vec<f64>> = params.iter().map(|p| download(&ctx, p)).collect();
    let mut cpu_params: Vec<HostTensor> = now.iter().map(|p| host(p, DType::F32)).collect();
    let mut cpu = CpuOptimizer::builder().state_storage(storage).build(adan, &slices(&cpu_params)).unwrap();
    cpu.load_from_bytes(&bytes).unwrap_or_else(|e| panic!("{e}"));
    let states = |gpu: &Optimizer, cpu: &CpuOptimizer, when: &str| {
        for i in 0..lens.len() {
            for kind in adan.state_kinds() {
                let gpu_state = gpu.state(i, *kind).unwrap().and_then(|v| v.q8());
                assert_eq!(
                    gpu_state.as_ref(),
                    cpu.state(i, *kind).and_then(|v| v.q8()),
                    "{when}: {kind:?}[{i}]"
                );
            }
        }
    };
    states(&gpu, &cpu, "loaded");
    assert_eq!(
        wgpu_optim_testkit::checkpoint::canonical(&cpu.save_to_bytes().unwrap()),
        wgpu_optim_testkit::checkpoint::canonical(&bytes),
        "the CPU saves what it loaded"
    );
    let g: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
    gpu.step(&g.iter().map(|g| ctx.upload("grad", g, DType::F32)).collect::<Vec<_>>()).unwrap();
    let host_grads: Vec<HostTensor> = g.iter().map(|g| host(g, DType::F32)).collect();
    cpu.step(&mut slices_mut(&mut cpu_params), &slices(&host_grads)).unwrap();
    states(&gpu, &cpu, "stepped");
    for (i, p) in params.iter().enumerate() {
        let what = format!("param[{i}] after the load");
        assert_close(&what, &download(&ctx, p), &cpu_params[i].to_f64(), Tolerance::F32);
    }
}

/// `got` (read back) against the oracle's state as the vectors' format compares 8-bit
/// state: codes by `compare_codes`, absmax within 1e-4 relative; f32 state as f32 results.
fn assert_state_follows(what: &str, got: &wgpu_optim::q8::StoredState, want: &wgpu_optim::q8::StoredState) {
    use wgpu_optim::q8::StoredState;
    match (got, want) {
        (StoredState::Q8 { codes, absmax }, StoredState::Q8 { codes: want_codes, absmax: want_absmax }) => {
            let widen = |c: &[u8]| c.iter().map(|&c| f64::from(c)).collect::<Vec<_>>();
            let codes_match = wgpu_optim_testkit::compare_codes(&widen(codes), &widen(want_codes));
            assert!(codes_match.passed(), "{what}: codes {codes_match}");
            let widen = |a: &[f32]| a.iter().map(|&a| f64::from(a)).collect::<Vec<_>>();
            let tolerance = Tolerance::Close { rtol: 1e-4, atol: 0.0 };
            assert_close(&format!("{what}: absmax"), &widen(absmax), &widen(want_absmax), tolerance);
        }
        (StoredState::F32(values), StoredState::F32(want_values)) => {
            let widen = |a: &[f32]| a.iter().map(|&a| f64::from(a)).collect::<Vec<_>>();
            assert_close(what, &widen(values), &widen(want_values), Tolerance::F32);
        }
        _ => panic!("{what}: stored as {got:?}, not as the oracle's"),
    }
}

/// torchao has no 4-bit Adan: both backends refuse it, naming the Adam it has.
#[test]
fn four_bit_state_is_refused_as_torchaos_adam_only() {
    use wgpu_optim::q4::Q4States;
    let ctx = ctx();
    let values = vec![0.5; 4096];
    let param = ctx.upload("param", &values, DType::F32);
    let cpu_param = host(&values, DType::F32);
    let refused = |err: Error, backend: &str| match err {
        Error::ConflictingOptions { first: "state_storage", second: "algorithm", reason } => {
            assert!(reason.contains("Adam"), "{backend}: {reason}");
        }
        other => panic!("{backend}: expected ConflictingOptions, got {other:?}"),
    };
    let gpu = Optimizer::builder().state_storage(StateStorage::Q4(Q4States::default()));
    refused(gpu.build(&ctx, plain(), std::slice::from_ref(&param)).expect_err("GPU"), "GPU");
    let cpu = CpuOptimizer::builder().state_storage(StateStorage::Q4(Q4States::default()));
    refused(cpu.build(plain(), &[cpu_param.as_slice()]).expect_err("CPU"), "CPU");
}

// Adan's own clipping: every gradient of the optimizer scaled by
// min(1, max_grad_norm / (global L2 norm + eps)) with Adan's eps, checked against the
// official code's oracle, which clips all tensors together.

/// Two tensors, so the norm is global.
const CLIP_SIZES: [usize; 2] = [257, 40];

/// `steps` steps of `adan` on both backends from `start` with `grads` (parameters and
/// gradients in `dtype`, f32 state: 16-bit state would hold `(1 - beta3) g^2` of clipped
/// gradients as subnormals, which the kernels use unrounded within the step), each
/// step's parameters, states and norm checked against the oracle resumed from what that
/// backend stored before it (16-bit stores round where the oracle's f64 does not, so an
/// ulp must not compound). Returns the oracle's clip coefficient of each step.
fn own_clipping_follows_the_oracle(
    adan: Adan,
    dtype: DType,
    start: &[Vec<f64>],
    grads: &[Vec<Vec<f64>>],
) -> Vec<f64> {
    let ctx = ctx();
    let algorithm: Algorithm = adan.into();
    let kinds = algorithm.state_kinds();
    let params: Vec<Tensor> = start.iter().map(|p| ctx.upload("param", p, dtype)).collect();
    let f32_state = StateStorage::Dtype(DType::F32);
    let mut gpu = Optimizer::builder().state_storage(f32_state).build(&ctx, algorithm, &params).unwrap();
    let mut cpu_params: Vec<HostTensor> = start.iter().map(|p| host(p, dtype)).collect();
    let mut cpu =
        CpuOptimizer::builder().state_storage(f32_state).build(algorithm, &slices(&cpu_params)).unwrap();
    let mut coefficients = Vec::new();
    for (t, g) in grads.iter().enumerate() {
        // What each backend stored before this step, in the oracle's order.
        let gpu_before: Vec<Vec<f64>> = params.iter().map(|p| download(&ctx, p)).collect();
        let cpu_before: Vec<Vec<f64>> = cpu_params.iter().map(HostTensor::to_f64).collect();
        let gpu_state = |k: StateKind, i: usize, gpu: &Optimizer| {
            download(&ctx, gpu.state(i, k).unwrap().and_then(|s| s.dense()).unwrap())
        };
        let resume = |before: &[Vec<f64>], state: &dyn Fn(StateKind, usize) -> Vec<f64>| {
            let mut oracle = AdanOracle::new(adan.to_oracle(), before.len())
                .storing(dtype.to_oracle(), DType::F32.to_oracle());
            oracle.step = t as u64;
            if t > 0 {
                for i in 0..before.len() {
                    oracle.exp_avg[i] = state(StateKind::ExpAvg, i);
                    oracle.exp_avg_diff[i] = state(StateKind::ExpAvgDiff, i);
                    oracle.exp_avg_sq[i] = state(StateKind::ExpAvgSq, i);
                    oracle.neg_pre_grad[i] = state(StateKind::NegPreGrad, i);
                }
            }
            let mut want = before.to_vec();
            let stored: Vec<Vec<f64>> = g.iter().map(|g| host(g, dtype).to_f64()).collect();
            oracle.step(&mut want, &stored);
            (oracle, want, stored)
        };
        let (gpu_oracle, gpu_want, stored) = resume(&gpu_before, &|k, i| gpu_state(k, i, &gpu));
        let (cpu_oracle, cpu_want, _) =
            resume(&cpu_before, &|k, i| cpu.state(i, k).and_then(|s| s.dense()).unwrap().to_f64());
        coefficients.push(gpu_oracle.clip_coefficient);

        let grad_tensors: Vec<Tensor> = g.iter().map(|g| ctx.upload("grad", g, dtype)).collect();
        gpu.step(&grad_tensors).unwrap();
        let host_grads: Vec<HostTensor> = g.iter().map(|g| host(g, dtype)).collect();
        cpu.step(&mut slices_mut(&mut cpu_params), &slices(&host_grads)).unwrap();

        let want_norm = stored.iter().flatten().map(|g| g * g).sum::<f64>().sqrt();
        for (backend, norm) in [("GPU", gpu.grad_norm().unwrap()), ("CPU", cpu.grad_norm().unwrap())] {
            let relative = (norm - want_norm).abs() / want_norm;
            assert!(relative < 1e-5, "{backend} step {t}: norm {norm}, oracle {want_norm}");
        }
        // A 16-bit gradient's ulp (see `assert_relative`) moves the update by as much.
        let tolerance = match Tolerance::stored(dtype) {
            Tolerance::Ulps { dtype, ulps, .. } => Tolerance::Ulps { dtype, ulps, abs: adan.lr * 1e-2 },
            f32 => f32,
        };
        for i in 0..g.len() {
            let what = format!("{adan:?} {dtype:?} step {t} param[{i}]");
            assert_close(&format!("GPU {what}"), &download(&ctx, &params[i]), &gpu_want[i], tolerance);
            assert_close(&format!("CPU {what}"), &cpu_params[i].to_f64(), &cpu_want[i], tolerance);
            let tensors = |o: &AdanOracle| {
                [
                    o.exp_avg[i].clone(),
                    o.exp_avg_sq[i].clone(),
                    o.exp_avg_diff[i].clone(),
                    o.neg_pre_grad[i].clone(),
                ]
            };
            for ((kind, gpu_want), cpu_want) in
                kinds.iter().zip(tensors(&gpu_oracle)).zip(tensors(&cpu_oracle))
            {
                let got = gpu_state(*kind, i, &gpu);
                assert_relative(&format!("GPU {what} {kind:?}"), &got, &gpu_want, dtype);
                let got = cpu.state(i, *kind).and_then(|s| s.dense()).unwrap().to_f64();
                assert_relative(&format!("CPU {what} {kind:?}"), &got, &cpu_want, dtype);
            }
        }
    }
    coefficients
}

/// `Tolerance::F32`'s rule with its absolute part scaled to the tensor's largest value, so
/// that tiny states are compared as closely as large ones (a fixed floor would accept a
/// wrong clip of gradients of 1e-7). With 16-bit gradients the relative part is one of
/// their ulps: the official code stores the clipped gradient in the gradient's dtype,
/// where the fused clip scales it in f32 as the update loads it.
#[track_caller]
fn assert_relative(what: &str, got: &[f64], want: &[f64], grad_dtype: DType) {
    let largest = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let rtol = match grad_dtype {
        DType::F16 => 1e-3,
        DType::BF16 => 8e-3,
        _ => 1e-5,
    };
    assert_close(what, got, want, Tolerance::Close { rtol, atol: rtol * largest });
}

fn clip_case(seed: u64, steps: usize, scale: f64) -> (Vec<Vec<f64>>, Vec<Vec<Vec<f64>>>) {
    let mut rng = Rng::new(seed);
    let start = CLIP_SIZES.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grads = (0..steps).map(|_| CLIP_SIZES.iter().map(|&n| rng.vec(n, scale)).collect()).collect();
    (start, grads)
}

#[test]
fn own_clipping_that_bites_every_step_follows_the_oracle_on_both_backends() {
    for (adan, seed) in [
        (Adan { max_grad_norm: 1.0, ..Adan { lr: 1e-2, ..Adan::default() } }, 100),
        (Adan { lr: 2e-3, weight_decay: 0.25, no_prox: true, max_grad_norm: 0.5, ..Adan::default() }, 101),
    ] {
        let (start, grads) = clip_case(seed, 5, 1.0);
        let coefficients = own_clipping_follows_the_oracle(adan, DType::F32, &start, &grads);
        assert!(coefficients.iter().all(|&c| c < 0.2), "the case clips every step: {coefficients:?}");
    }
}

#[test]
fn own_clipping_that_never_bites_follows_the_oracle_on_both_backends() {
    let adan = Adan { lr: 1e-2, weight_decay: 0.5, max_grad_norm: 1e3, ..Adan::default() };
    let (start, grads) = clip_case(102, 5, 1.0);
    let coefficients = own_clipping_follows_the_oracle(adan, DType::F32, &start, &grads);
    assert!(coefficients.iter().all(|&c| c == 1.0), "the case never clips: {coefficients:?}");
}

/// Gradients near 1e-7 make the norm comparable with eps: the coefficient with Adan's eps
/// (1e-8) is about twice `grad_clip`'s (1e-6), so a clip that added 1e-6 would leave the
/// states twice the oracle's.
#[test]
fn own_clipping_adds_adans_eps_to_the_norm_not_1e_6() {
    let adan = Adan { lr: 1e-2, max_grad_norm: 5e-7, ..Adan::default() };
    let (start, mut grads) = clip_case(103, 4, 1.0);
    for g in grads.iter_mut().flatten() {
        let norm = g.iter().map(|v| v * v).sum::<f64>().sqrt();
        // Each tensor's norm 7e-7, the global one near 1e-6.
        g.iter_mut().for_each(|v| *v *= 7e-7 / norm);
    }
    let coefficients = own_clipping_follows_the_oracle(adan, DType::F32, &start, &grads);
    for (c, g) in coefficients.iter().zip(&grads) {
        let norm = g.iter().flatten().map(|v| v * v).sum::<f64>().sqrt();
        let torch = (adan.max_grad_norm / (norm + 1e-6)).min(1.0);
        assert!((c - torch).abs() > 0.3 * c, "the eps matters: {c} against {torch}");
    }
}

#[test]
fn own_clipping_of_sixteen_bit_parameters_follows_the_oracle() {
    for (dtype, seed) in [(DType::F16, 104), (DType::BF16, 105)] {
        let adan = Adan { lr: 1e-2, weight_decay: 0.5, max_grad_norm: 1.0, ..Adan::default() };
        let (start, grads) = clip_case(seed, 4, 1.0);
        let coefficients = own_clipping_follows_the_oracle(adan, dtype, &start, &grads);
        assert!(coefficients.iter().all(|&c| c < 0.2), "the case clips every step: {coefficients:?}");
    }
}

/// A checkpoint taken between clipped steps continues the uninterrupted trajectory bit for
/// bit on each backend (the clip is the configuration's, rebuilt with the optimizer).
#[test]
fn own_clipping_survives_a_checkpoint_on_both_backends() {
    let ctx = ctx();
    let adan = Adan { lr: 1e-2, max_grad_norm: 0.5, ..Adan::default() };
    let (start, grads) = clip_case(106, 4, 1.0);
    let gpu_run = |interrupt: bool| -> Vec<Vec<f64>> {
        let params: Vec<Tensor> = start.iter().map(|p| ctx.upload("param", p, DType::F32)).collect();
        let mut opt = Optimizer::builder().build(&ctx, adan, &params).unwrap();
        for (k, g) in grads.iter().enumerate() {
            if interrupt && k == 2 {
                let bytes = opt.save_to_bytes().unwrap();
                opt = Optimizer::builder().build(&ctx, adan, &params).unwrap();
                opt.load_from_bytes(&bytes).unwrap();
            }
            let g: Vec<Tensor> = g.iter().map(|g| ctx.upload("grad", g, DType::F32)).collect();
            opt.step(&g).unwrap();
        }
        let state = (0..start.len()).map(|i| {
            download(&ctx, opt.state(i, StateKind::NegPreGrad).unwrap().and_then(|s| s.dense()).unwrap())
        });
        params.iter().map(|p| download(&ctx, p)).chain(state).collect()
    };
    let cpu_run = |interrupt: bool| -> Vec<Vec<f64>> {
        let mut params: Vec<HostTensor> = start.iter().map(|p| host(p, DType::F32)).collect();
        let mut opt = CpuOptimizer::builder().build(adan, &slices(&params)).unwrap();
        for (k, g) in grads.iter().enumerate() {
            if interrupt && k == 2 {
                let bytes = opt.save_to_bytes().unwrap();
                opt = CpuOptimizer::builder().build(adan, &slices(&params)).unwrap();
                opt.load_from_bytes(&bytes).unwrap();
            }
            let g: Vec<HostTensor> = g.iter().map(|g| host(g, DType::F32)).collect();
            opt.step(&mut slices_mut(&mut params), &slices(&g)).unwrap();
        }
        let state = (0..start.len())
            .map(|i| opt.state(i, StateKind::NegPreGrad).and_then(|s| s.dense()).unwrap().to_f64());
        params.iter().map(HostTensor::to_f64).chain(state).collect()
    };
    for (backend, resumed, whole) in
        [("GPU", gpu_run(true), gpu_run(false)), ("CPU", cpu_run(true), cpu_run(false))]
    {
        for (k, (got, want)) in resumed.iter().zip(&whole).enumerate() {
            family::assert_bits_eq(&format!("{backend} clipped, saved after 2: tensor {k}"), got, want);
        }
    }
}

/// A checkpoint saved with other clipping settings is refused on both backends (the clip is
/// built with the optimizer), and nothing changes.
#[test]
fn a_checkpoint_with_other_clipping_is_refused() {
    let ctx = ctx();
    let adan = Adan { max_grad_norm: 0.5, ..Adan::default() };
    let other = Adan { max_grad_norm: 2.0, ..adan };
    let gpu_param = [ctx.upload("param", &[0.5; 64], DType::F32)];
    let saved = Optimizer::builder().build(&ctx, other, &gpu_param).unwrap().save_to_bytes().unwrap();
    let mut gpu = Optimizer::builder().build(&ctx, adan, &gpu_param).unwrap();
    assert_conflict(gpu.load_from_bytes(&saved), "max_grad_norm", "set_group_algorithm");
    assert_eq!(gpu.group_algorithm(0), Some(&Algorithm::from(adan)));
    let cpu_param = host(&[0.5; 64], DType::F32);
    let saved =
        CpuOptimizer::builder().build(other, &[cpu_param.as_slice()]).unwrap().save_to_bytes().unwrap();
    let mut cpu = CpuOptimizer::builder().build(adan, &[cpu_param.as_slice()]).unwrap();
    assert_conflict(cpu.load_from_bytes(&saved), "max_grad_norm", "set_group_algorithm");
    assert_eq!(cpu.group_algorithm(0), Some(&Algorithm::from(adan)));
}

/// Capturable mode runs the same clip pass, writing the coefficient into the device state
/// (one tensor of 513 elements whose norm is near 13, so every step clips).
#[test]
fn own_clipping_runs_in_capturable_mode() {
    let tolerance = Tolerance::Close { rtol: 1e-5, atol: 1e-6 };
    let clipped = Adan { lr: 1e-2, weight_decay: 0.5, max_grad_norm: 1.0, ..Adan::default() };
    family::capturable_follows_the_oracle(clipped.into(), 0, 5, |_| 1e-2, tolerance, 107);
}

#[track_caller]
fn assert_conflict<T: std::fmt::Debug>(result: wgpu_optim::Result<T>, first: &str, second: &str) {
    match result {
        Err(Error::ConflictingOptions { first: f, second: s, .. }) if f == first && s == second => {}
        other => panic!("expected ConflictingOptions {{ {first}, {second} }}, got {other:?}"),
    }
}

/// Adan's own clipping beside `grad_clip`, groups whose clipping differs (the official code
/// reads one `max_grad_norm` for all groups), and a schedule that would change the clip (on
/// either backend) are refused; a negative `max_grad_norm` is a bad hyperparameter.
#[test]
fn conflicting_clipping_settings_are_refused() {
    use wgpu_optim::{GradClip, ParamGroup};
    let clipped = Adan { max_grad_norm: 1.0, ..Adan::default() };
    let ctx = ctx();
    let params: Vec<Tensor> = (0..2).map(|_| ctx.upload("param", &[0.5; 64], DType::F32)).collect();
    let both = Optimizer::builder().grad_clip(GradClip::l2(1.0)).build(&ctx, clipped, &params[..1]);
    assert_conflict(both, "max_grad_norm", "grad_clip");
    let cpu_param = host(&[0.5; 64], DType::F32);
    let both = CpuOptimizer::builder().grad_clip(GradClip::l2(1.0)).build(clipped, &[cpu_param.as_slice()]);
    assert_conflict(both, "max_grad_norm", "grad_clip");
    for other in [
        Adan { max_grad_norm: 2.0, ..clipped },
        Adan { max_grad_norm: 0.0, ..clipped },
        Adan { eps: 1e-6, ..clipped },
    ] {
        let groups = vec![ParamGroup::new(clipped, &params[..1]), ParamGroup::new(other, &params[1..])];
        assert_conflict(Optimizer::builder().build_groups(&ctx, groups), "max_grad_norm", "param groups");
    }
    let groups = vec![ParamGroup::new(clipped, &params[..1]), ParamGroup::new(Adam::default(), &params[1..])];
    assert_conflict(Optimizer::builder().build_groups(&ctx, groups), "max_grad_norm", "param groups");
    // The same setting in every group is the official one.
    let groups = vec![
        ParamGroup::new(clipped, &params[..1]),
        ParamGroup::new(Adan { lr: 0.1, ..clipped }, &params[1..]),
    ];
    let mut gpu = Optimizer::builder().build_groups(&ctx, groups).unwrap();
    assert_conflict(
        gpu.set_group_algorithm(1, Adan { max_grad_norm: 2.0, ..clipped }),
        "max_grad_norm",
        "set_group_algorithm",
    );
    assert!(gpu.set_group_algorithm(1, Adan { lr: 0.2, ..clipped }).is_ok());
    let mut cpu = CpuOptimizer::builder().build(clipped, &[cpu_param.as_slice()]).unwrap();
    assert_conflict(
        cpu.set_group_algorithm(0, Adan { max_grad_norm: 2.0, ..clipped }),
        "max_grad_norm",
        "set_group_algorithm",
    );
    assert!(cpu.set_group_lr(0, 0.5).is_ok());
    let negative = Algorithm::from(Adan { max_grad_norm: -1.0, ..Adan::default() }).validate();
    assert!(matches!(negative, Err(Error::BadHyperparameter { name: "max_grad_norm", .. })));
}
