//! LAMB (torch-optimizer's `Lamb`) on the GPU and the CPU backend against the f64 oracle:
//! the public vectors (with the norms they carry), 16-bit storage, a LAMB group beside an
//! AdamW group, a zero parameter, `adam = true`, the clamp, and refusals.

use crate::common;
use crate::family;

use common::{ctx, Rng};
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut, HostTensor};
use wgpu_optim::{
    Adam, Algorithm, DType, Error, GpuContext, GradClip, Lamb, Optimizer, ParamGroup, Rounding, StateKind,
    StateStorage, Tensor,
};
use wgpu_optim_testkit::conformance::{run_case, Backend, Case, Outcome};
use wgpu_optim_testkit::oracle::{torch_adam_step, LambOracle, Storage, ToOracle, TorchAdamState};

/// Every tensor's values after a run: the parameter, `exp_avg`, `exp_avg_sq`, and the
/// last step's `[weight_norm, adam_norm, trust_ratio]`.
#[derive(Debug)]
struct Finals {
    params: Vec<Vec<f64>>,
    exp_avg: Vec<Vec<f64>>,
    exp_avg_sq: Vec<Vec<f64>>,
    norms: Vec<[f64; 3]>,
}

/// `grads[k][i]`: tensor i's gradient at step k.
type Grads = Vec<Vec<Vec<f64>>>;

fn oracle(config: Lamb, dtype: DType, init: &[Vec<f64>], grads: &Grads) -> Finals {
    let mut oracle =
        LambOracle::new(config.to_oracle(), init.len()).storing(dtype.to_oracle(), dtype.to_oracle());
    let mut params: Vec<Vec<f64>> =
        init.iter().map(|p| p.iter().map(|&x| dtype.to_oracle().round(x)).collect()).collect();
    for g in grads {
        let g: Vec<Vec<f64>> =
            g.iter().map(|g| g.iter().map(|&x| dtype.to_oracle().round(x)).collect()).collect();
        oracle.step(&mut params, &g);
    }
    let norms = oracle.norms.iter().map(|n| [n.weight_norm, n.adam_norm, n.trust_ratio]).collect();
    Finals { params, exp_avg: oracle.exp_avg, exp_avg_sq: oracle.exp_avg_sq, norms }
}

fn gpu(ctx: &GpuContext, config: Lamb, dtype: DType, init: &[Vec<f64>], grads: &Grads) -> Finals {
    let params: Vec<Tensor> = init.iter().map(|p| ctx.upload("param", p, dtype)).collect();
    let grad_tensors: Vec<Tensor> = params.iter().map(|p| ctx.zeros("grad", p.len, dtype)).collect();
    let mut optimizer = Optimizer::builder().build(ctx, config, &params).unwrap();
    for g in grads {
        for (t, g) in grad_tensors.iter().zip(g) {
            ctx.write(t, g).unwrap();
        }
        optimizer.step(&grad_tensors).unwrap();
    }
    gpu_finals(ctx, &optimizer, 0..params.len())
}

fn gpu_finals(ctx: &GpuContext, optimizer: &Optimizer, tensors: std::ops::Range<usize>) -> Finals {
    let read = |t: &Tensor| ctx.read(t).unwrap();
    let state = |i, kind| read(optimizer.state(i, kind).unwrap().and_then(|s| s.dense()).unwrap());
    Finals {
        params: tensors.clone().map(|i| read(&optimizer.params()[i])).collect(),
        exp_avg: tensors.clone().map(|i| state(i, StateKind::ExpAvg)).collect(),
        exp_avg_sq: tensors.clone().map(|i| state(i, StateKind::ExpAvgSq)).collect(),
        norms: tensors
            .map(|i| {
                let n = read(&optimizer.lamb_norms(i).unwrap());
                [n[0], n[1], n[2]]
            })
            .collect(),
    }
}

fn cpu(config: Lamb, dtype: DType, init: &[Vec<f64>], grads: &Grads) -> Finals {
    let mut tensors: Vec<HostTensor> = init.iter().map(|p| HostTensor::from_f64(dtype, p).unwrap()).collect();
    let views: Vec<HostSlice<'_>> = tensors.iter().map(HostTensor::as_slice).collect();
    let mut optimizer = CpuOptimizer::builder().build(config, &views).unwrap();
    for g in grads {
        let g: Vec<HostTensor> = g.iter().map(|g| HostTensor::from_f64(dtype, g).unwrap()).collect();
        let grad_views: Vec<HostSlice<'_>> = g.iter().map(HostTensor::as_slice).collect();
        let mut param_views: Vec<HostSliceMut<'_>> =
            tensors.iter_mut().map(HostTensor::as_mut_slice).collect();
        optimizer.step(&mut param_views, &grad_views).unwrap();
    }
    let n = tensors.len();
    let state = |i, kind| optimizer.state(i, kind).and_then(|s| s.dense()).unwrap().to_f64();
    Finals {
        params: tensors.iter().map(HostTensor::to_f64).collect(),
        exp_avg: (0..n).map(|i| state(i, StateKind::ExpAvg)).collect(),
        exp_avg_sq: (0..n).map(|i| state(i, StateKind::ExpAvgSq)).collect(),
        norms: (0..n)
            .map(|i| {
                let m = optimizer.lamb_norms(i).unwrap();
                [m.weight_norm, m.adam_norm, m.trust_ratio].map(f64::from)
            })
            .collect(),
    }
}

/// Within `ulps` spacings of `dtype` at the expected value (f32: `ulps` f32 spacings), plus
/// `atol`.
#[track_caller]
fn assert_close(what: &str, got: &[f64], want: &[f64], dtype: DType, ulps: f64, atol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let bits = match dtype {
        DType::F16 => 11,
        DType::BF16 => 8,
        _ => 24,
    };
    // 16-bit: a difference of a spacing in a larger value carries through a cancellation
    // (a moment that changes sign), so spacings are counted at a quarter of the tensor's
    // largest magnitude at least.
    let floor = if bits < 24 { want.iter().fold(0f64, |a, w| a.max(w.abs())) / 4.0 } else { 0.0 };
    let mut bad = Vec::new();
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        let tolerance = atol + ulps * w.abs().max(floor) * 2f64.powi(1 - bits);
        if (g - w).abs() > tolerance || g.is_nan() != w.is_nan() {
            bad.push(format!("[{k}] got {g}, want {w}"));
        }
    }
    assert!(
        bad.is_empty(),
        "{what}: {} of {} differ: {}",
        bad.len(),
        got.len(),
        bad[..bad.len().min(5)].join(", ")
    );
}

/// Parameters, moments and norms within `ulps` of the oracle's (norms within 64 f32 ulps).
#[track_caller]
fn assert_finals(who: &str, got: &Finals, want: &Finals, dtype: DType, ulps: f64) {
    for i in 0..want.params.len() {
        assert_close(&format!("{who} param {i}"), &got.params[i], &want.params[i], dtype, ulps, 1e-7);
        assert_close(&format!("{who} exp_avg {i}"), &got.exp_avg[i], &want.exp_avg[i], dtype, ulps, 1e-7);
        assert_close(
            &format!("{who} exp_avg_sq {i}"),
            &got.exp_avg_sq[i],
            &want.exp_avg_sq[i],
            dtype,
            ulps,
            1e-9,
        );
        // The norms sum over moments that may differ by a spacing where they are 16-bit.
        let (norm_dtype, norm_ulps) = if dtype == DType::F32 { (DType::F32, 64.0) } else { (dtype, 1.0) };
        assert_close(&format!("{who} norms {i}"), &got.norms[i], &want.norms[i], norm_dtype, norm_ulps, 0.0);
    }
}

/// `lens.len()` tensors of those lengths and `steps` gradients each.
fn data(seed: u64, lens: &[usize], steps: usize, scale: f64) -> (Vec<Vec<f64>>, Grads) {
    let mut rng = Rng::new(seed);
    let init = lens.iter().map(|&n| rng.vec(n, scale)).collect();
    let grads = (0..steps).map(|_| lens.iter().map(|&n| rng.vec(n, 1.0)).collect()).collect();
    (init, grads)
}

fn decayed() -> Lamb {
    Lamb { lr: 1e-2, weight_decay: 0.1, debias: true, ..Lamb::default() }
}

#[test]
fn lamb_defaults_are_torch_optimizers() {
    let want = Lamb {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-6,
        weight_decay: 0.0,
        clamp_value: 10.0,
        adam: false,
        debias: false,
    };
    assert_eq!(Lamb::default(), want);
    let lamb: Algorithm = Lamb::default().into();
    assert_eq!(lamb.name(), "Lamb");
    assert_eq!(lamb.state_kinds(), &[StateKind::ExpAvg, StateKind::ExpAvgSq]);
}

#[test]
fn f32_trajectories_follow_the_oracle_on_the_gpu_and_the_cpu_across_many_workgroups() {
    let ctx = ctx();
    // Tensors of one element, of a few workgroups, and of many (so several partials each).
    let (init, grads) = data(1, &[1, 1000, 70_001, 3], 4, 0.5);
    for config in [Lamb { lr: 1e-2, ..Lamb::default() }, decayed()] {
        let want = oracle(config, DType::F32, &init, &grads);
        assert_finals("gpu", &gpu(&ctx, config, DType::F32, &init, &grads), &want, DType::F32, 64.0);
        assert_finals("cpu", &cpu(config, DType::F32, &init, &grads), &want, DType::F32, 64.0);
    }
}

#[test]
fn f16_and_bf16_storage_round_each_store_once_with_f32_math() {
    let ctx = ctx();
    let (init, grads) = data(2, &[257, 4096, 9], 3, 0.5);
    for dtype in [DType::F16, DType::BF16] {
        let want = oracle(decayed(), dtype, &init, &grads);
        // f32 and f64 math may round a value at or near a midpoint of two 16-bit values to
        // either (a product of two 16-bit values can be a midpoint exactly); the moments
        // carry such a difference into later steps.
        assert_finals(
            &format!("gpu {dtype:?}"),
            &gpu(&ctx, decayed(), dtype, &init, &grads),
            &want,
            dtype,
            4.0,
        );
        assert_finals(&format!("cpu {dtype:?}"), &cpu(decayed(), dtype, &init, &grads), &want, dtype, 4.0);
    }
    // Packed f16 (the path without SHADER_F16): pairs of elements per word.
    let packed = ctx.with_packed_f16(true);
    let want = oracle(decayed(), DType::F16, &init, &grads);
    assert_finals(
        "gpu packed f16",
        &gpu(&packed, decayed(), DType::F16, &init, &grads),
        &want,
        DType::F16,
        4.0,
    );
}

#[test]
fn a_zero_parameter_has_trust_ratio_one() {
    let ctx = ctx();
    let init = vec![vec![0.0; 100], vec![0.25; 10]];
    let (_, grads) = data(3, &[100, 10], 1, 1.0);
    let want = oracle(Lamb::default(), DType::F32, &init, &grads);
    assert_eq!(want.norms[0][0], 0.0);
    assert_eq!(want.norms[0][2], 1.0);
    for (who, got) in [
        ("gpu", gpu(&ctx, Lamb::default(), DType::F32, &init, &grads)),
        ("cpu", cpu(Lamb::default(), DType::F32, &init, &grads)),
    ] {
        assert_eq!(got.norms[0][0], 0.0, "{who}");
        assert_eq!(got.norms[0][2], 1.0, "{who}");
        assert_finals(who, &got, &want, DType::F32, 64.0);
    }
}

#[test]
fn adam_true_keeps_the_trust_ratio_but_steps_with_one() {
    let ctx = ctx();
    let (init, grads) = data(4, &[300, 5], 3, 0.5);
    let config = Lamb { adam: true, lr: 1e-2, ..Lamb::default() };
    let want = oracle(config, DType::F32, &init, &grads);
    let lamb = oracle(Lamb { adam: false, ..config }, DType::F32, &init, &grads);
    // The rule changes the step: the two trajectories differ.
    assert!((want.params[0][0] - lamb.params[0][0]).abs() > 1e-6);
    assert!((want.norms[0][2] - 1.0).abs() > 1e-3, "{:?}", want.norms);
    assert_finals("gpu", &gpu(&ctx, config, DType::F32, &init, &grads), &want, DType::F32, 64.0);
    assert_finals("cpu", &cpu(config, DType::F32, &init, &grads), &want, DType::F32, 64.0);
}

#[test]
fn the_weight_norm_is_clamped_to_clamp_value() {
    let ctx = ctx();
    // norm(p) = 20 > clamp_value 10 (and 0.5 < 10 for the other).
    let init = vec![vec![2.0; 100], vec![0.25; 4]];
    let (_, grads) = data(5, &[100, 4], 2, 1.0);
    let config = Lamb { lr: 1e-2, ..Lamb::default() };
    let want = oracle(config, DType::F32, &init, &grads);
    assert_eq!(want.norms[0][0], 10.0);
    for (who, got) in [
        ("gpu", gpu(&ctx, config, DType::F32, &init, &grads)),
        ("cpu", cpu(config, DType::F32, &init, &grads)),
    ] {
        assert_eq!(got.norms[0][0], 10.0, "{who}");
        assert_finals(who, &got, &want, DType::F32, 64.0);
    }
    // clamp_value 0: the weight norm is 0 and the ratio 1 (an Adam step without correction).
    let config = Lamb { clamp_value: 0.0, ..config };
    let want = oracle(config, DType::F32, &init, &grads);
    assert_eq!(want.norms[0][2], 1.0);
    assert_finals("gpu", &gpu(&ctx, config, DType::F32, &init, &grads), &want, DType::F32, 64.0);
    assert_finals("cpu", &cpu(config, DType::F32, &init, &grads), &want, DType::F32, 64.0);
}

#[test]
fn a_lamb_group_beside_an_adamw_group_in_one_optimizer() {
    let ctx = ctx();
    let (init, grads) = data(6, &[500, 20, 300, 7], 3, 0.5);
    let tensors: Vec<Tensor> = init.iter().map(|p| ctx.upload("param", p, DType::F32)).collect();
    let adamw = Adam { lr: 1e-2, ..Adam::adamw() };
    let groups = vec![ParamGroup::new(adamw, &tensors[..2]), ParamGroup::new(decayed(), &tensors[2..])];
    let mut optimizer = Optimizer::builder().build_groups(&ctx, groups).unwrap();
    let grad_tensors: Vec<Tensor> = tensors.iter().map(|p| ctx.zeros("grad", p.len, DType::F32)).collect();
    for g in &grads {
        for (t, g) in grad_tensors.iter().zip(g) {
            ctx.write(t, g).unwrap();
        }
        optimizer.step(&grad_tensors).unwrap();
    }
    let lamb_grads: Grads = grads.iter().map(|g| g[2..].to_vec()).collect();
    let want = oracle(decayed(), DType::F32, &init[2..], &lamb_grads);
    let got = gpu_finals(&ctx, &optimizer, 2..4);
    assert_finals("lamb group", &got, &want, DType::F32, 64.0);
    assert!(optimizer.lamb_norms(0).is_none(), "an AdamW tensor has no LAMB norms");
    for i in 0..2 {
        let mut p = init[i].clone();
        let mut state = TorchAdamState::zeros(p.len(), false);
        for g in &grads {
            torch_adam_step(&adamw.to_oracle(), &mut p, &g[i], &mut state);
        }
        let got = ctx.read(&optimizer.params()[i]).unwrap();
        assert_close(&format!("adamw param {i}"), &got, &p, DType::F32, 64.0, 1e-7);
    }
}

#[test]
fn bad_hyperparameters_are_refused_by_name_and_change_nothing() {
    let bad = [
        ("lr", Lamb { lr: 0.0, ..Lamb::default() }),
        ("lr", Lamb { lr: f64::NAN, ..Lamb::default() }),
        ("eps", Lamb { eps: -1e-8, ..Lamb::default() }),
        ("beta1", Lamb { beta1: 1.0, ..Lamb::default() }),
        ("beta2", Lamb { beta2: -0.1, ..Lamb::default() }),
        ("weight_decay", Lamb { weight_decay: -0.1, ..Lamb::default() }),
        ("clamp_value", Lamb { clamp_value: -1.0, ..Lamb::default() }),
        ("clamp_value", Lamb { clamp_value: f64::INFINITY, ..Lamb::default() }),
    ];
    let ctx = ctx();
    let params = [ctx.upload("param", &[0.5; 8], DType::F32)];
    let host = [0.5f32; 8];
    let mut optimizer = Optimizer::builder().build(&ctx, Lamb::default(), &params).unwrap();
    let mut cpu = CpuOptimizer::builder().build(Lamb::default(), &[HostSlice::from(&host[..])]).unwrap();
    for (name, config) in bad {
        let named = |e: Error| matches!(e, Error::BadHyperparameter { name: n, .. } if n == name);
        assert!(named(Algorithm::from(config).validate().unwrap_err()), "{name}");
        assert!(named(Optimizer::builder().build(&ctx, config, &params).unwrap_err()), "{name}");
        assert!(
            named(CpuOptimizer::builder().build(config, &[HostSlice::from(&host[..])]).unwrap_err()),
            "{name}"
        );
        assert!(named(optimizer.set_group_algorithm(0, config).unwrap_err()), "{name}");
        assert!(named(cpu.set_group_algorithm(0, config).unwrap_err()), "{name}");
        assert_eq!(optimizer.group_algorithm(0), Some(&Algorithm::Lamb(Lamb::default())));
        assert_eq!(cpu.group_algorithm(0), Some(&Algorithm::Lamb(Lamb::default())));
    }
    assert_eq!(ctx.read(&params[0]).unwrap(), vec![0.5; 8]);
}

#[test]
fn options_lamb_does_not_implement_are_refused_by_name() {
    let ctx = ctx();
    let params = [ctx.upload("param", &[0.5; 8], DType::F32)];
    let host = [0.5f32; 8];
    let conflict = |e: Error, option: &str| matches!(e, Error::ConflictingOptions { first, second: "algorithm", .. } if first == option);
    let refused = Optimizer::builder().capturable(true).build(&ctx, Lamb::default(), &params).unwrap_err();
    assert!(conflict(refused, "capturable"));
    let clip = GradClip::l2(1.0);
    let refused = Optimizer::builder().grad_clip(clip).build(&ctx, Lamb::default(), &params).unwrap_err();
    assert!(conflict(refused, "grad_clip"));
    let refused =
        CpuOptimizer::builder().grad_clip(clip).build(Lamb::default(), &[HostSlice::from(&host[..])]);
    assert!(conflict(refused.unwrap_err(), "grad_clip"));
    let stochastic = Rounding::Stochastic { seed: 1, state: false };
    let refused =
        Optimizer::builder().rounding(stochastic).build(&ctx, Lamb::default(), &params).unwrap_err();
    assert!(conflict(refused, "rounding"),);
    let q8 = wgpu_optim::q8::Q8States::default();
    let refused = Optimizer::builder()
        .state_storage(StateStorage::Q8(q8))
        .build(&ctx, Lamb::default(), &params)
        .unwrap_err();
    assert!(matches!(refused, Error::ConflictingOptions { first: "state_storage", .. }), "{refused:?}");
    // f64 parameters: LAMB's norms are summed in f32.
    let wide = [ctx.upload("param", &[0.5; 8], DType::F64)];
    let refused = Optimizer::builder().build(&ctx, Lamb::default(), &wide).unwrap_err();
    assert!(matches!(refused, Error::DTypeMismatch { got: DType::F64, .. }), "{refused:?}");
    // A group switched to LAMB where the optimizer clips: refused, the group unchanged.
    let mut clipped = Optimizer::builder().grad_clip(clip).build(&ctx, Adam::default(), &params).unwrap();
    assert!(conflict(clipped.set_group_algorithm(0, Lamb::default()).unwrap_err(), "grad_clip"));
    assert_eq!(clipped.group_algorithm(0), Some(&Algorithm::Adam(Adam::default())));
    assert_eq!(ctx.read(&params[0]).unwrap(), vec![0.5; 8]);
}

#[test]
fn the_public_lamb_vectors_pass_on_every_backend_with_their_norms() {
    let ctx = ctx();
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors");
    let mut failures = Vec::new();
    let mut runs = 0;
    for name in ["lamb_plain", "lamb_debias"] {
        let case = Case::load(&dir.join(format!("{name}.safetensors"))).unwrap_or_else(|e| panic!("{e}"));
        let backends = Backend::all_for(&case);
        assert!(
            backends.contains(&Backend::Cpu) && backends.contains(&Backend::GpuOutOfPlace),
            "{backends:?}"
        );
        for backend in backends {
            let report = run_case(&case, backend, Some(&ctx)).unwrap_or_else(|e| panic!("{name}: {e}"));
            runs += 1;
            if let Outcome::Fail(detail) | Outcome::Refused(detail) = report.outcome {
                failures.push(format!("{name} on {}: {detail}", backend.name()));
            }
        }
    }
    assert_eq!(runs, 8);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_checkpoint_json_keeps_torch_optimizers_names() {
    family::json_round_trips(decayed().into());
    let config = Lamb { adam: true, clamp_value: 5.0, ..decayed() };
    family::json_round_trips(config.into());
    let json = Algorithm::from(config).to_json();
    for key in ["lr", "betas", "eps", "weight_decay", "clamp_value", "adam", "debias"] {
        assert!(json.contains_key(key), "{key} in {json:?}");
    }
    assert_eq!(json["optimizer"], "Lamb");
}

#[test]
fn a_checkpoint_of_lamb_does_not_load_into_adamw_and_adamw_not_into_lamb() {
    // The same state names (exp_avg, exp_avg_sq): the optimizer's name tells them apart.
    family::a_checkpoint_of_another_algorithm_is_refused(decayed().into(), Adam::adamw().into());
    family::a_checkpoint_of_another_algorithm_is_refused(Adam::adamw().into(), decayed().into());
}

/// A GPU checkpoint (exp_avg, exp_avg_sq under PyTorch's names) loads on the CPU backend
/// with the same bits, and the CPU's loads on the GPU; the next step on each follows the
/// oracle resumed from the saved state.
#[test]
fn checkpoints_load_on_the_other_backend_and_the_next_step_follows_the_oracle() {
    let ctx = ctx();
    let (init, grads) = data(7, &[300, 1, 64], 4, 0.5);
    let config = decayed();
    for state_dtype in [None, Some(DType::BF16)] {
        let params: Vec<Tensor> = init.iter().map(|p| ctx.upload("param", p, DType::F32)).collect();
        let grad_tensors: Vec<Tensor> = params.iter().map(|p| ctx.zeros("grad", p.len, DType::F32)).collect();
        let mut gpu = Optimizer::builder()
            .state_storage(state_dtype.map_or(StateStorage::ParamDtype, StateStorage::Dtype))
            .build(&ctx, config, &params)
            .unwrap();
        for g in &grads[..3] {
            for (t, g) in grad_tensors.iter().zip(g) {
                ctx.write(t, g).unwrap();
            }
            gpu.step(&grad_tensors).unwrap();
        }
        let bytes = gpu.save_to_bytes().unwrap();
        let now: Vec<Vec<f64>> = params.iter().map(|p| ctx.read(p).unwrap()).collect();
        let mut host: Vec<HostTensor> =
            now.iter().map(|p| HostTensor::from_f64(DType::F32, p).unwrap()).collect();
        let views: Vec<HostSlice<'_>> = host.iter().map(HostTensor::as_slice).collect();
        let mut cpu = CpuOptimizer::builder()
            .state_storage(state_dtype.map_or(StateStorage::ParamDtype, StateStorage::Dtype))
            .build(config, &views)
            .unwrap();
        cpu.load_from_bytes(&bytes).unwrap();
        assert_eq!(cpu.step_count(), 3);
        let stored = state_dtype.unwrap_or(DType::F32);
        let mut oracle = LambOracle::new(config.to_oracle(), init.len())
            .storing(DType::F32.to_oracle(), stored.to_oracle());
        oracle.step = 3;
        for i in 0..init.len() {
            for kind in [StateKind::ExpAvg, StateKind::ExpAvgSq] {
                let on_cpu = cpu.state(i, kind).and_then(|s| s.dense()).unwrap().to_f64();
                let on_gpu = ctx.read(gpu.state(i, kind).unwrap().and_then(|s| s.dense()).unwrap()).unwrap();
                assert_eq!(on_cpu, on_gpu, "{kind:?}[{i}] loaded on the CPU");
            }
            oracle.exp_avg[i] = cpu.state(i, StateKind::ExpAvg).and_then(|s| s.dense()).unwrap().to_f64();
            oracle.exp_avg_sq[i] =
                cpu.state(i, StateKind::ExpAvgSq).and_then(|s| s.dense()).unwrap().to_f64();
        }
        // The CPU's checkpoint loads on a fresh GPU optimizer.
        let cpu_bytes = cpu.save_to_bytes().unwrap();
        let fresh: Vec<Tensor> = now.iter().map(|p| ctx.upload("param", p, DType::F32)).collect();
        let mut gpu2 = Optimizer::builder()
            .state_storage(state_dtype.map_or(StateStorage::ParamDtype, StateStorage::Dtype))
            .build(&ctx, config, &fresh)
            .unwrap();
        gpu2.load_from_bytes(&cpu_bytes).unwrap();
        assert_eq!(gpu2.step_count(), 3);
        // One more step everywhere.
        let last = &grads[3];
        let host_grads: Vec<HostTensor> =
            last.iter().map(|g| HostTensor::from_f64(DType::F32, g).unwrap()).collect();
        let grad_views: Vec<HostSlice<'_>> = host_grads.iter().map(HostTensor::as_slice).collect();
        let mut param_views: Vec<HostSliceMut<'_>> = host.iter_mut().map(HostTensor::as_mut_slice).collect();
        cpu.step(&mut param_views, &grad_views).unwrap();
        for (t, g) in grad_tensors.iter().zip(last) {
            ctx.write(t, g).unwrap();
        }
        gpu2.step(&grad_tensors).unwrap();
        let mut want = now.clone();
        oracle.step(&mut want, last);
        for i in 0..init.len() {
            let what = format!("{state_dtype:?} param {i} after the load");
            assert_close(&format!("cpu {what}"), &host[i].to_f64(), &want[i], DType::F32, 64.0, 1e-7);
            assert_close(
                &format!("gpu {what}"),
                &ctx.read(&fresh[i]).unwrap(),
                &want[i],
                DType::F32,
                64.0,
                1e-7,
            );
        }
    }
}

/// Master-weight mode: f16 model tensors, f32 masters and state. The masters follow the
/// f32 oracle, and the apply pass writes each model copy as its master rounded to f16.
#[test]
fn master_weights_step_f32_masters_and_write_the_16_bit_copies() {
    let ctx = ctx();
    let (init, grads) = data(8, &[300, 7], 3, 0.5);
    let init: Vec<Vec<f64>> =
        init.iter().map(|p| p.iter().map(|&x| DType::F16.to_oracle().round(x)).collect()).collect();
    let model: Vec<Tensor> = init.iter().map(|p| ctx.upload("model", p, DType::F16)).collect();
    let mut optimizer = Optimizer::builder().master_weights(true).build(&ctx, decayed(), &model).unwrap();
    let grad_tensors: Vec<Tensor> = model.iter().map(|p| ctx.zeros("grad", p.len, DType::F32)).collect();
    for g in &grads {
        for (t, g) in grad_tensors.iter().zip(g) {
            ctx.write(t, g).unwrap();
        }
        optimizer.step(&grad_tensors).unwrap();
    }
    let want = oracle(decayed(), DType::F32, &init, &grads);
    assert_finals("masters", &gpu_finals(&ctx, &optimizer, 0..2), &want, DType::F32, 64.0);
    for (i, copy) in model.iter().enumerate() {
        let master = ctx.read(&optimizer.params()[i]).unwrap();
        let rounded: Vec<f64> = master.iter().map(|&x| DType::F16.to_oracle().round(x)).collect();
        assert_eq!(ctx.read(copy).unwrap(), rounded, "model copy {i}");
    }
}

/// The norms are deterministic: the CPU backend gives the same bits on one thread as on
/// several (each tensor is cut into the same chunks and blocks, summed in a fixed order),
/// and two GPU runs give the same bits (a fixed partition into workgroups, partials combined
/// in a fixed order, no float atomics).
#[test]
fn the_reductions_give_the_same_bits_every_run_and_on_any_thread_count() {
    let (init, grads) = data(9, &[300_000, 1000], 2, 0.5);
    let on = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| cpu(decayed(), DType::F32, &init, &grads))
    };
    let (one, two) = (on(1), on(2));
    assert_eq!(one.params, two.params);
    assert_eq!(one.norms, two.norms);
    let ctx = ctx();
    let (a, b) =
        (gpu(&ctx, decayed(), DType::F32, &init, &grads), gpu(&ctx, decayed(), DType::F32, &init, &grads));
    assert_eq!(a.params, b.params);
    assert_eq!(a.norms, b.norms);
}

/// The stateless update (`ops::update`, which Burn's drop-in optimizer uses): each tensor of
/// the call gets its own norms; the parameters may go out of place, the state may not (the
/// apply pass reads the moments where the moments pass wrote them).
#[test]
fn the_stateless_update_takes_each_tensors_norms_and_keeps_the_state_in_place() {
    use wgpu_optim::ops::{update, Update};
    let ctx = ctx();
    let (init, grads) = data(10, &[300, 7], 1, 0.5);
    let params: Vec<Tensor> = init.iter().map(|p| ctx.upload("param", p, DType::F32)).collect();
    let outs: Vec<Tensor> = init.iter().map(|p| ctx.zeros("out", p.len() as u64, DType::F32)).collect();
    let grad_tensors: Vec<Tensor> = grads[0].iter().map(|g| ctx.upload("grad", g, DType::F32)).collect();
    let state: Vec<Vec<Tensor>> = init
        .iter()
        .map(|p| (0..2).map(|_| ctx.zeros("state", p.len() as u64, DType::F32)).collect())
        .collect();
    let calls: Vec<Update> = (0..2)
        .map(|i| Update {
            param_out: Some(outs[i].clone()),
            ..Update::in_place(&params[i], &grad_tensors[i], &state[i])
        })
        .collect();
    let algorithm: Algorithm = decayed().into();
    ctx.submit("lamb", |encoder| update(&ctx, encoder, &algorithm, 1, &calls)).unwrap();
    let want = oracle(decayed(), DType::F32, &init, &grads);
    for i in 0..2 {
        assert_close(
            &format!("param_out {i}"),
            &ctx.read(&outs[i]).unwrap(),
            &want.params[i],
            DType::F32,
            64.0,
            1e-7,
        );
        assert_close(
            &format!("exp_avg {i}"),
            &ctx.read(&state[i][0]).unwrap(),
            &want.exp_avg[i],
            DType::F32,
            64.0,
            0.0,
        );
        assert_eq!(ctx.read(&params[i]).unwrap(), init[i], "the input parameter {i} is unchanged");
    }
    let elsewhere = ctx.zeros("elsewhere", 300, DType::F32);
    let mut refused = calls[0].clone();
    refused.state_out = vec![Some(elsewhere.clone()), None];
    let err =
        ctx.submit("lamb", |encoder| update(&ctx, encoder, &algorithm, 2, &[refused.clone()])).unwrap_err();
    assert!(matches!(err, Error::ConflictingOptions { first: "state_out", .. }), "{err:?}");
    assert_eq!(ctx.read(&elsewhere).unwrap(), vec![0.0; 300]);
}
