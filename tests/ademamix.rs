//! AdEMAMix (bitsandbytes' `AdEMAMix`) on the GPU and the CPU backend against the f64
//! oracle: f32 trajectories with and without the alpha and beta3 warmups, 16-bit storage and
//! state dtypes other than the parameter's, master weights, two groups, capturable mode (the
//! schedules computed on the device), global clipping, stochastic and Kahan rounding,
//! checkpoints, and refusals. The public vectors (`ademamix_plain`, `ademamix_schedulers`)
//! run in `tests/conformance.rs`.

mod common;
#[path = "family/mod.rs"]
mod family;

use common::{ctx, Tolerance};
use wgpu_optim::{AdEMAMix, Adam, Algorithm, StateKind};
use wgpu_optim_testkit::oracle::{ademamix_alpha, ademamix_beta3};

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
    assert_eq!(ademamix_alpha(&c, 1), 0.8);
    assert_eq!(ademamix_alpha(&c, 5), 4.0);
    assert_eq!(ademamix_alpha(&c, 9), 4.0);
    // At s = t / t_beta3 = 0 the half-life is beta1's, at s = 1 beta3's, then it holds.
    assert!((ademamix_beta3(&c, 0) - 0.8).abs() < 1e-15);
    assert!(ademamix_beta3(&c, 2) > 0.8 && ademamix_beta3(&c, 2) < 0.999);
    assert!((ademamix_beta3(&c, 4) - 0.999).abs() < 1e-15);
    assert_eq!(ademamix_beta3(&c, 7), 0.999);
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
    let mut oracles: Vec<TorchState> = p.iter().map(|v| TorchState::new(algorithm, v.len())).collect();
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
        let got = cpu.state(0, *kind).unwrap().to_f64();
        let want = common::download(&ctx, gpu.state(0, *kind).unwrap());
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

/// bitsandbytes' AdEMAMix8bit is not implemented yet: 8-bit state for AdEMAMix is refused by
/// name on both backends, before anything is built.
#[test]
fn eight_bit_state_for_ademamix_is_refused_by_name_for_now() {
    use wgpu_optim::cpu::{CpuOptimizer, HostTensor};
    use wgpu_optim::q8::Q8States;
    use wgpu_optim::{DType, Error, Optimizer};

    let check = |err: Error, backend: &str| match err {
        Error::ConflictingOptions { first: "q8_states", second: "algorithm", reason } => {
            assert!(reason.contains("AdEMAMix") && reason.contains("not yet"), "{backend}: {reason}");
        }
        other => panic!("{backend}: expected ConflictingOptions, got {other:?}"),
    };
    let ctx = ctx();
    let param = ctx.upload("param", &vec![0.5; 1000], DType::F32);
    let options = Optimizer::builder().q8_states(Q8States::default());
    check(options.build(&ctx, plain(), std::slice::from_ref(&param)).expect_err("GPU"), "GPU");
    let host = HostTensor::from_f64(DType::F32, &vec![0.5; 1000]).unwrap();
    let cpu = CpuOptimizer::builder().q8_states(Q8States::default()).build(plain(), &[host.as_slice()]);
    check(cpu.expect_err("CPU"), "CPU");
}
