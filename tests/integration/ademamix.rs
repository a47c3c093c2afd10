//! AdEMAMix (bitsandbytes' `AdEMAMix`) on the GPU and the CPU backend against the f64
//! oracle: f32 trajectories with and without the alpha and beta3 warmups, 16-bit storage and
//! state dtypes other than the parameter's, master weights, two groups, capturable mode (the
//! schedules computed on the device), global clipping, stochastic and Kahan rounding,
//! checkpoints, refusals, and 8-bit state (bitsandbytes' `AdEMAMix8bit`). The public vectors
//! (`ademamix_plain`, `ademamix_schedulers`, `ademamix8bit_n700`) run in `tests/conformance.rs`.

use crate::common;
use crate::family;

use common::{ctx, Tolerance};
use wgpu_optim::{AdEMAMix, Adam, Algorithm, StateKind, StateStorage};
use wgpu_optim_testkit::oracle::{ademamix_alpha, ademamix_beta3, ToOracle};

fn plain() -> Algorithm {
    AdEMAMix { lr: 1e-2, ..AdEMAMix::default() }.into()
}

/// Warmups shorter than the runs, so both the ramps and the held values are exercised.
fn scheduled() -> Algorithm {
    AdEMAMix {
        lr: 3e-3,
        beta1: 0.8,
        beta2: 0.99,
        beta3: 0.999,
        alpha: 4.0,
        t_alpha: Some(5),
        t_beta3: Some(4),
        eps: 1e-6,
        weight_decay: 0.1,
    }
    .into()
}

#[test]
fn defaults_and_state_are_bitsandbytes() {
    let d = AdEMAMix::default();
    assert_eq!((d.lr, d.beta1, d.beta2, d.beta3, d.alpha), (1e-3, 0.9, 0.999, 0.9999, 5.0));
    assert_eq!((d.t_alpha, d.t_beta3, d.eps, d.weight_decay), (None, None, 1e-8, 1e-2));
    let a: Algorithm = d.into();
    assert_eq!(a.name(), "AdEMAMix");
    assert_eq!(a.state_kinds(), &[StateKind::ExpAvg, StateKind::ExpAvgSlow, StateKind::ExpAvgSq]);
    assert_eq!(StateKind::ExpAvgSlow.torch_name(), "exp_avg_slow");
}

#[test]
fn the_oracles_schedules_ramp_then_hold() {
    let Algorithm::AdEMAMix(c) = scheduled() else { unreachable!() };
    assert_eq!(ademamix_alpha(&c.to_oracle(), 1), 0.8);
    assert_eq!(ademamix_alpha(&c.to_oracle(), 5), 4.0);
    assert_eq!(ademamix_alpha(&c.to_oracle(), 9), 4.0);
    // At s = t / t_beta3 = 0 the half-life is beta1's, at s = 1 beta3's, then it holds.
    assert!((ademamix_beta3(&c.to_oracle(), 0) - 0.8).abs() < 1e-15);
    assert!(ademamix_beta3(&c.to_oracle(), 2) > 0.8 && ademamix_beta3(&c.to_oracle(), 2) < 0.999);
    assert!((ademamix_beta3(&c.to_oracle(), 4) - 0.999).abs() < 1e-15);
    assert_eq!(ademamix_beta3(&c.to_oracle(), 7), 0.999);
}

#[test]
fn f32_trajectories_follow_the_oracle_on_the_gpu_and_the_cpu() {
    family::f32_trajectories_follow_the_oracle(plain(), 12, 1);
    family::f32_trajectories_follow_the_oracle(scheduled(), 12, 2);
}

#[test]
fn sixteen_bit_storage_and_other_state_dtypes_match_the_oracle_natively() {
    let ctx = ctx().with_packed_f16(false);
    // Only GL may lack SHADER_F16; its run leaves the native path to the Vulkan run.
    if !common::has_feature_unless_gl(&ctx, wgpu::Features::SHADER_F16, "SHADER_F16") {
        return;
    }
    family::mixes_match_the_oracle_step_by_step(&ctx, scheduled(), &family::no_ties, 6, 10);
}

#[test]
fn sixteen_bit_storage_and_other_state_dtypes_match_the_oracle_packed() {
    let ctx = ctx().with_packed_f16(true);
    family::mixes_match_the_oracle_step_by_step(&ctx, scheduled(), &family::no_ties, 6, 20);
}

#[test]
fn master_weights_follow_the_oracle_and_round_the_model_copy_once() {
    family::master_weights_follow_the_oracle(scheduled(), 30);
}

#[test]
fn two_groups_keep_their_own_hyperparameters() {
    family::two_groups_follow_their_own_oracles(plain(), scheduled(), 40);
}

#[test]
fn capturable_mode_computes_the_schedules_and_corrections_on_the_device() {
    // f32 on the device (the host's are f64): exp and the half-life ratio cost a few ulps.
    let tolerance = Tolerance::Close { rtol: 1e-5, atol: 1e-6 };
    let schedule = |t: u64| 1e-2 / (1.0 + 0.1 * t as f64);
    family::capturable_follows_the_oracle(scheduled(), 0, 8, schedule, tolerance, 50);
    // From a later step: the warmups already past, and in the middle of them.
    family::capturable_follows_the_oracle(scheduled(), 2, 3, |_| 1e-2, tolerance, 51);
    family::capturable_follows_the_oracle(plain(), 1000, 2, |_| 1e-3, tolerance, 52);
}

#[test]
fn global_clipping_scales_the_gradients_before_the_update() {
    family::clipped_steps_follow_the_oracle(scheduled(), 60);
}

#[test]
fn stochastic_and_kahan_rounding_store_the_same_bits_on_the_gpu_and_the_cpu() {
    let ademamix: Algorithm = AdEMAMix {
        lr: 1.0 / 1024.0,
        beta1: 0.5,
        beta2: 0.75,
        beta3: 0.875,
        alpha: 2.0,
        t_alpha: None,
        t_beta3: None,
        eps: 1.0 / 64.0,
        weight_decay: 0.0,
    }
    .into();
    let mut rng = common::Rng::new(70);
    let sizes = [300usize, 7];
    let start: Vec<Vec<f64>> = sizes.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grads: Vec<Vec<Vec<f64>>> =
        (0..6).map(|_| sizes.iter().map(|&n| rng.vec(n, 1.0)).collect()).collect();
    family::rounding_stores_the_same_bits_on_the_gpu_and_the_cpu(ademamix, &start, &grads);
}

#[test]
fn a_gpu_checkpoint_continues_on_the_cpu_backend() {
    family::a_gpu_checkpoint_continues_on_the_cpu(scheduled(), 80);
}

#[test]
fn a_checkpoint_of_ademamix_does_not_load_into_adam_and_adam_not_into_ademamix() {
    family::a_checkpoint_of_another_algorithm_is_refused(scheduled(), Adam::adamw().into());
    family::a_checkpoint_of_another_algorithm_is_refused(Adam::default().into(), plain());
}

#[test]
fn the_checkpoint_json_keeps_bitsandbytes_names() {
    family::json_round_trips(scheduled());
    family::json_round_trips(plain());
    let json = plain().to_json();
    assert_eq!(json["betas"], serde_json::json!([0.9, 0.999, 0.9999]));
    assert_eq!(json["t_alpha"], serde_json::Value::Null);
    assert_eq!(scheduled().to_json()["t_beta3"], serde_json::json!(4));
}

#[test]
fn bad_hyperparameters_are_refused_by_name_and_change_nothing() {
    let good = scheduled();
    let d = AdEMAMix::default();
    let cases: [(AdEMAMix, &str); 8] = [
        (AdEMAMix { beta1: 1.0, ..d }, "beta1"),
        (AdEMAMix { beta2: -0.5, ..d }, "beta2"),
        (AdEMAMix { beta3: 1.0, ..d }, "beta3"),
        (AdEMAMix { lr: -1.0, ..d }, "lr"),
        (AdEMAMix { alpha: -1.0, ..d }, "alpha"),
        (AdEMAMix { t_alpha: Some(0), ..d }, "t_alpha"),
        (AdEMAMix { t_beta3: Some(0), ..d }, "t_beta3"),
        (AdEMAMix { eps: f64::INFINITY, ..d }, "eps"),
    ];
    for (bad, name) in cases {
        family::a_bad_hyperparameter_is_refused_by_name(good, bad.into(), name);
    }
    let negative_decay = AdEMAMix { weight_decay: -0.1, ..d };
    family::a_bad_hyperparameter_is_refused_by_name(good, negative_decay.into(), "weight_decay");
}

/// Checkpoints keep bitsandbytes' names on both backends: `state.{i}.state1` of shape
/// `[2, *shape]` (m1, then m2) and `state.{i}.state2` (nu), with the oracle's values.
#[test]
fn checkpoints_stack_m1_and_m2_as_bitsandbytes_state1_and_keep_nu_as_state2() {
    use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostTensor};
    use wgpu_optim::{DType, Optimizer};
    use wgpu_optim_testkit::oracle::TorchState;

    let ctx = ctx();
    let algorithm = scheduled();
    let shapes: Vec<Vec<usize>> = vec![vec![8, 5], vec![3]];
    let mut rng = common::Rng::new(99);
    let mut p: Vec<Vec<f64>> = shapes.iter().map(|s| rng.vec(s.iter().product(), 1.0)).collect();
    let start = p.clone();
    let params: Vec<wgpu_optim::Tensor> = p.iter().map(|v| ctx.upload("param", v, DType::F32)).collect();
    let options = Optimizer::builder().param_shapes(shapes.clone());
    let mut gpu = options.build(&ctx, algorithm, &params).unwrap();
    let mut oracles: Vec<TorchState> =
        p.iter().map(|v| TorchState::new(algorithm.to_oracle(), v.len())).collect();
    for _ in 0..3 {
        let g: Vec<Vec<f64>> = p.iter().map(|v| rng.vec(v.len(), 1.0)).collect();
        let tensors: Vec<wgpu_optim::Tensor> = g.iter().map(|g| ctx.upload("grad", g, DType::F32)).collect();
        gpu.step(&tensors).unwrap();
        for ((p, o), g) in p.iter_mut().zip(&mut oracles).zip(&g) {
            o.step(p, g);
        }
    }
    let bytes = gpu.save_to_bytes().unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let f32s = |data: &[u8]| -> Vec<f64> {
        data.chunks(4).map(|b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))).collect()
    };
    for (i, shape) in shapes.iter().enumerate() {
        let state1 = file.tensor(&format!("state.{i}.state1")).unwrap();
        let stacked: Vec<usize> = std::iter::once(2).chain(shape.iter().copied()).collect();
        assert_eq!((state1.dtype(), state1.shape()), (safetensors::Dtype::F32, &stacked[..]));
        let state2 = file.tensor(&format!("state.{i}.state2")).unwrap();
        assert_eq!((state2.dtype(), state2.shape()), (safetensors::Dtype::F32, &shape[..]));
        let want = oracles[i].tensors();
        let m1m2: Vec<f64> = want[0].iter().chain(&want[1]).copied().collect();
        common::assert_close(&format!("state.{i}.state1"), &f32s(state1.data()), &m1m2, Tolerance::F32);
        common::assert_close(&format!("state.{i}.state2"), &f32s(state2.data()), &want[2], Tolerance::F32);
        for name in ["exp_avg", "exp_avg_slow", "exp_avg_sq"] {
            assert!(file.tensor(&format!("state.{i}.{name}")).is_err(), "{name} is saved as state1/state2");
        }
    }
    // The CPU backend reads the stacked file into its three states and saves it back.
    let host: Vec<HostTensor> = start.iter().map(|v| HostTensor::from_f64(DType::F32, v).unwrap()).collect();
    let views: Vec<HostSlice<'_>> = host.iter().map(HostTensor::as_slice).collect();
    let mut cpu = CpuOptimizer::builder().param_shapes(shapes.clone()).build(algorithm, &views).unwrap();
    cpu.load_from_bytes(&bytes).unwrap();
    for (i, kind) in [StateKind::ExpAvg, StateKind::ExpAvgSlow, StateKind::ExpAvgSq].iter().enumerate() {
        let got = cpu.state(0, *kind).and_then(|s| s.dense()).unwrap().to_f64();
        let want = common::download(&ctx, gpu.state(0, *kind).unwrap().and_then(|s| s.dense()).unwrap());
        assert_eq!(got, want, "{kind:?} (state {i}) on the CPU");
    }
    assert_eq!(cpu.save_to_bytes().unwrap(), bytes, "the CPU saves the same file");
    // A stacked tensor of the wrong shape is refused by name.
    let mut fresh = options_gpu(&ctx, algorithm, &params, &shapes);
    let flat_only = Optimizer::builder().param_shapes(vec![vec![40], vec![3]]);
    let mut other = flat_only.build(&ctx, algorithm, &params).unwrap();
    let err = other.load_from_bytes(&bytes).expect_err("another shape");
    assert!(err.to_string().contains("state.0.state1"), "{err}");
    fresh.load_from_bytes(&bytes).unwrap();
}

fn options_gpu(
    ctx: &wgpu_optim::GpuContext,
    algorithm: Algorithm,
    params: &[wgpu_optim::Tensor],
    shapes: &[Vec<usize>],
) -> wgpu_optim::Optimizer {
    wgpu_optim::Optimizer::builder().param_shapes(shapes.to_vec()).build(ctx, algorithm, params).unwrap()
}

/// Lengths of the 8-bit tests: two tensors with 8-bit state (one of a partial last block)
/// and one below `min_8bit_size` (f32 state).
const Q8_LENGTHS: [usize; 3] = [4096, 5000, 300];

/// Four steps of gradients (rounded to f32) for [`Q8_LENGTHS`].
fn q8_gradients(rng: &mut common::Rng) -> Vec<Vec<Vec<f64>>> {
    let round = |v: Vec<f64>| v.into_iter().map(|x| f64::from(x as f32)).collect::<Vec<_>>();
    (0..4).map(|_| Q8_LENGTHS.iter().map(|&n| round(rng.vec(n, 1.0))).collect()).collect()
}

/// `got` against the oracle's state as the vectors' format compares 8-bit state: codes by
/// `compare_codes`, absmax within 1e-4 relative; f32 state as f32 results.
fn assert_state_follows(what: &str, got: &wgpu_optim::q8::StoredState, want: &wgpu_optim::q8::StoredState) {
    use wgpu_optim::q8::StoredState;
    let widen = |a: &[f32]| a.iter().map(|&a| f64::from(a)).collect::<Vec<_>>();
    match (got, want) {
        (StoredState::Q8 { codes, absmax }, StoredState::Q8 { codes: want_codes, absmax: want_absmax }) => {
            let bytes = |c: &[u8]| c.iter().map(|&c| f64::from(c)).collect::<Vec<_>>();
            let codes_match = wgpu_optim_testkit::compare_codes(&bytes(codes), &bytes(want_codes));
            assert!(codes_match.passed(), "{what}: codes {codes_match}");
            let tolerance = Tolerance::Close { rtol: 1e-4, atol: 0.0 };
            common::assert_close(&format!("{what}: absmax"), &widen(absmax), &widen(want_absmax), tolerance);
        }
        (StoredState::F32(values), StoredState::F32(want_values)) => {
            common::assert_close(what, &widen(values), &widen(want_values), Tolerance::F32);
        }
        _ => panic!("{what}: stored as {got:?}, not as the oracle's"),
    }
}

/// Parameters against the oracle's: within 1e-4 but for at most 1 % of them, and all within
/// a step's size per step (a code one apart from the oracle's, which the format allows near
/// a tie, moves its element's update by up to a code's width).
fn assert_params_follow(what: &str, got: &[f64], want: &[f64], lr: f64, steps: usize) {
    let close = wgpu_optim_testkit::compare(got, want, Tolerance::Close { rtol: 0.0, atol: 1e-4 });
    assert!(close.passed() || close.mismatches * 100 <= want.len(), "{what}: {close}");
    common::assert_close(what, got, want, Tolerance::Close { rtol: 0.0, atol: lr * steps as f64 });
}

/// bitsandbytes' AdEMAMix8bit: m1 and m2 quantized each on its own with the signed map, nu
/// with the unsigned one, a tensor below `min_8bit_size` in f32; both backends follow the
/// oracle's transcription of bitsandbytes' reference (with the warmups running).
#[test]
fn eight_bit_trajectories_follow_bitsandbytes_oracle_on_the_gpu_and_the_cpu() {
    use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut};
    use wgpu_optim::q8::Q8States;
    use wgpu_optim::{DType, Optimizer};
    use wgpu_optim_testkit::oracle::bnb::{bnb_8bit_step, State8bit};
    use wgpu_optim_testkit::oracle::ToLibrary;

    let algorithm = scheduled();
    let kinds = [StateKind::ExpAvg, StateKind::ExpAvgSlow, StateKind::ExpAvgSq];
    assert_eq!(algorithm.state_kinds(), kinds);
    let config = Q8States::default();
    let mut rng = common::Rng::new(808);
    let initial: Vec<Vec<f64>> = Q8_LENGTHS
        .iter()
        .map(|&n| rng.vec(n, 1.0).into_iter().map(|x| f64::from(x as f32)).collect())
        .collect();
    let grads = q8_gradients(&mut rng);

    let mut want = initial.clone();
    let mut want_states: Vec<Vec<State8bit>> = Q8_LENGTHS
        .iter()
        .map(|&n| kinds.iter().map(|_| State8bit::zeros(n, config.quantizes(n as u64))).collect())
        .collect();
    for (k, step) in grads.iter().enumerate() {
        for ((p, g), states) in want.iter_mut().zip(step).zip(&mut want_states) {
            bnb_8bit_step(&algorithm.to_oracle(), k as u64 + 1, p, g, states).unwrap();
        }
    }

    let ctx = ctx();
    let params: Vec<wgpu_optim::Tensor> =
        initial.iter().map(|v| ctx.upload("param", v, DType::F32)).collect();
    let mut gpu =
        Optimizer::builder().state_storage(StateStorage::Q8(config)).build(&ctx, algorithm, &params).unwrap();
    let mut host: Vec<Vec<f32>> = initial.iter().map(|v| common::to_f32(v)).collect();
    let views: Vec<HostSlice<'_>> = host.iter().map(|t| HostSlice::F32(t)).collect();
    let mut cpu =
        CpuOptimizer::builder().state_storage(StateStorage::Q8(config)).build(algorithm, &views).unwrap();
    for step in &grads {
        let g: Vec<wgpu_optim::Tensor> = step.iter().map(|g| ctx.upload("grad", g, DType::F32)).collect();
        gpu.step(&g).unwrap();
        let g32: Vec<Vec<f32>> = step.iter().map(|g| common::to_f32(g)).collect();
        let grad_views: Vec<HostSlice<'_>> = g32.iter().map(|g| HostSlice::F32(g)).collect();
        let mut param_views: Vec<HostSliceMut<'_>> = host.iter_mut().map(|t| HostSliceMut::F32(t)).collect();
        cpu.step(&mut param_views, &grad_views).unwrap();
    }
    let lr = 3e-3;
    for i in 0..Q8_LENGTHS.len() {
        let gpu_param = common::download(&ctx, &params[i]);
        let cpu_param: Vec<f64> = host[i].iter().map(|&v| f64::from(v)).collect();
        assert_params_follow(&format!("GPU param {i}"), &gpu_param, &want[i], lr, grads.len());
        assert_params_follow(&format!("CPU param {i}"), &cpu_param, &want[i], lr, grads.len());
        for (k, kind) in kinds.iter().enumerate() {
            let gpu_state = gpu.state(i, *kind).map(|s| s.and_then(|v| v.q8())).unwrap().unwrap();
            assert_state_follows(&format!("GPU {kind:?} {i}"), &gpu_state, &want_states[i][k].to_library());
            let cpu_state = cpu.state(i, *kind).and_then(|s| s.q8()).unwrap();
            assert_state_follows(&format!("CPU {kind:?} {i}"), cpu_state, &want_states[i][k].to_library());
        }
    }
}

/// 8-bit AdEMAMix checkpoints keep bitsandbytes' names: `state1` U8 `[2, *shape]` (m1's
/// codes, then m2's) with `absmax1` `[2, blocks]`, `state2` U8 with `absmax2` (nu), `qmap1`
/// (signed) and `qmap2` (unsigned); F32 `state1` `[2, *shape]` and `state2` below
/// `min_8bit_size`. The CPU backend loads the GPU's file into the same states and saves the
/// same bytes.
#[test]
fn eight_bit_checkpoints_keep_bitsandbytes_names_and_load_on_the_other_backend() {
    use safetensors::Dtype;
    use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostTensor};
    use wgpu_optim::q8::{Q8States, StoredState};
    use wgpu_optim::{DType, Optimizer};
    use wgpu_optim_testkit::oracle::bnb::{signed_map, unsigned_map};

    let algorithm = scheduled();
    let kinds = [StateKind::ExpAvg, StateKind::ExpAvgSlow, StateKind::ExpAvgSq];
    let shapes: Vec<Vec<usize>> = vec![vec![64, 70], vec![20, 15]];
    let config = Q8States::default();
    let mut rng = common::Rng::new(31);
    let start: Vec<Vec<f64>> = shapes.iter().map(|s| rng.vec(s.iter().product(), 1.0)).collect();
    let ctx = ctx();
    let params: Vec<wgpu_optim::Tensor> = start.iter().map(|v| ctx.upload("param", v, DType::F32)).collect();
    let options = Optimizer::builder().state_storage(StateStorage::Q8(config)).param_shapes(shapes.clone());
    let mut gpu = options.clone().build(&ctx, algorithm, &params).unwrap();
    for _ in 0..3 {
        let g: Vec<wgpu_optim::Tensor> =
            start.iter().map(|v| ctx.upload("grad", &rng.vec(v.len(), 1.0), DType::F32)).collect();
        gpu.step(&g).unwrap();
    }
    let bytes = gpu.save_to_bytes().unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let f32s = |data: &[u8]| -> Vec<f32> {
        data.chunks(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
    };
    let states: Vec<Vec<StoredState>> = (0..2)
        .map(|i| {
            kinds.iter().map(|k| gpu.state(i, *k).map(|s| s.and_then(|v| v.q8())).unwrap().unwrap()).collect()
        })
        .collect();
    // Tensor 0 (4480 elements, 18 blocks) keeps 8-bit state.
    let (n, blocks) = (4480usize, 18usize);
    let tensor = |name: &str| file.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    let state1 = tensor("state.0.state1");
    assert_eq!((state1.dtype(), state1.shape()), (Dtype::U8, &[2, 64, 70][..]));
    let absmax1 = tensor("state.0.absmax1");
    assert_eq!((absmax1.dtype(), absmax1.shape()), (Dtype::F32, &[2, blocks][..]));
    let state2 = tensor("state.0.state2");
    assert_eq!((state2.dtype(), state2.shape()), (Dtype::U8, &[64, 70][..]));
    let absmax2 = tensor("state.0.absmax2");
    assert_eq!((absmax2.dtype(), absmax2.shape()), (Dtype::F32, &[blocks][..]));
    let [StoredState::Q8 { codes: m1, absmax: a1 }, StoredState::Q8 { codes: m2, absmax: a2 }, StoredState::Q8 { codes: nu, absmax: a3 }] =
        &states[0][..]
    else {
        panic!("tensor 0 keeps 8-bit state: {:?}", states[0].iter().map(StoredState::len).collect::<Vec<_>>())
    };
    assert_eq!((&state1.data()[..n], &state1.data()[n..]), (&m1[..], &m2[..]), "state1 = m1, then m2");
    assert_eq!(f32s(absmax1.data()), a1.iter().chain(a2).copied().collect::<Vec<_>>(), "absmax1");
    assert_eq!((state2.data(), f32s(absmax2.data())), (&nu[..], a3.clone()), "state2, absmax2");
    assert_eq!(f32s(tensor("qmap1").data()), signed_map(), "qmap1 is the signed map");
    assert_eq!(f32s(tensor("qmap2").data()), unsigned_map(), "qmap2 is the unsigned map");
    // Tensor 1 (300 elements) keeps f32 state, stacked the same way.
    let small1 = tensor("state.1.state1");
    assert_eq!((small1.dtype(), small1.shape()), (Dtype::F32, &[2, 20, 15][..]));
    let small2 = tensor("state.1.state2");
    assert_eq!((small2.dtype(), small2.shape()), (Dtype::F32, &[20, 15][..]));
    let [StoredState::F32(s1), StoredState::F32(s2), StoredState::F32(s3)] = &states[1][..] else {
        panic!("tensor 1 keeps f32 state")
    };
    assert_eq!(f32s(small1.data()), s1.iter().chain(s2).copied().collect::<Vec<_>>());
    assert_eq!(&f32s(small2.data()), s3);
    for name in ["qmap3", "state.0.state3", "state.0.absmax3", "state.1.absmax1"] {
        assert!(file.tensor(name).is_err(), "{name} is not saved");
    }

    // The CPU backend loads the file into the same states and saves the same bytes; the GPU
    // loads the CPU's file back.
    let host: Vec<HostTensor> = start.iter().map(|v| HostTensor::from_f64(DType::F32, v).unwrap()).collect();
    let views: Vec<HostSlice<'_>> = host.iter().map(HostTensor::as_slice).collect();
    let cpu_options =
        CpuOptimizer::builder().state_storage(StateStorage::Q8(config)).param_shapes(shapes.clone());
    let mut cpu = cpu_options.build(algorithm, &views).unwrap();
    cpu.load_from_bytes(&bytes).unwrap();
    for (i, tensor_states) in states.iter().enumerate() {
        for (kind, want) in kinds.iter().zip(tensor_states) {
            assert_eq!(cpu.state(i, *kind).and_then(|s| s.q8()), Some(want), "{kind:?} {i} on the CPU");
        }
    }
    let cpu_bytes = cpu.save_to_bytes().unwrap();
    assert_eq!(cpu_bytes, bytes, "the CPU saves the same file");
    let mut fresh = options.build(&ctx, algorithm, &params).unwrap();
    fresh.load_from_bytes(&cpu_bytes).unwrap();
    for (i, tensor_states) in states.iter().enumerate() {
        for (kind, want) in kinds.iter().zip(tensor_states) {
            assert_eq!(
                fresh.state(i, *kind).map(|s| s.and_then(|v| v.q8())).unwrap().as_ref(),
                Some(want),
                "{kind:?} {i} back on the GPU"
            );
        }
    }
}
