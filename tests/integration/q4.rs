//! 4-bit state (torchao's `AdamW4bit`/`Adam4bit` format) on the CPU backend and the GPU,
//! against the oracle (`wgpu_optim_testkit::oracle::ao4`, transcribed from torchao's source)
//! and torchao's own vectors; refusals by name with nothing changed.

use crate::common;

use std::path::PathBuf;

use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut};
use wgpu_optim::q4::{Q4State, Q4States};
use wgpu_optim::{
    Adam, DType, Error, GpuContext, GradClip, Optimizer, QuantizedState, Sgd, StateKind, StateStorage, Tensor,
};
use wgpu_optim_testkit::conformance::{run_case, Backend, Case, Outcome};
use wgpu_optim_testkit::oracle::{ao4, clip_grad_norm, State4bit, ToLibrary, ToOracle};

/// Deterministic values in `-scale..scale` (an LCG), `seed` apart.
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn f64s(values: &[f32]) -> Vec<f64> {
    values.iter().map(|&v| f64::from(v)).collect()
}

/// Where torchao's vectors lie: this repository's copies once they are in, else the shared
/// public set.
fn vector(name: &str) -> PathBuf {
    let own = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors").join(name);
    if own.exists() {
        own
    } else {
        PathBuf::from("/work/shared/vectors/public").join(name)
    }
}

#[test]
fn torchaos_vectors_pass_on_the_oracle_the_cpu_backend_and_the_gpu() {
    let _turn = common::gpu_turn();
    let ctx = common::ctx();
    let mut failures = Vec::new();
    let mut runs = 0;
    for name in ["ao4_small_f32.safetensors", "ao4_n4096.safetensors"] {
        let case = Case::load(&vector(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let backends = Backend::all_for(&case);
        for backend in [Backend::Oracle, Backend::Cpu, Backend::GpuInPlace, Backend::GpuOutOfPlace] {
            assert!(backends.contains(&backend), "{name}: {backend:?} not among {backends:?}");
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

/// The tensors of the tests below: 4-bit (whole blocks at and above min_size) and f32
/// (smaller, or off whole blocks).
const SIZES: [usize; 4] = [8192, 300, 4096 + 64, 4096];

/// `steps` steps of the oracle from torchao's zero state: the parameters and states.
fn oracle_run(
    adam: &Adam,
    config: Q4States,
    params: &[Vec<f32>],
    grads: &[Vec<Vec<f32>>],
) -> Vec<(Vec<f64>, [Q4State; 2])> {
    oracle_run_clipped(adam, config, None, params, grads)
}

/// [`oracle_run`] with every step's gradients clipped first (PyTorch's `clip_grad_norm_`
/// over all of them).
fn oracle_run_clipped(
    adam: &Adam,
    config: Q4States,
    clip: Option<GradClip>,
    params: &[Vec<f32>],
    grads: &[Vec<Vec<f32>>],
) -> Vec<(Vec<f64>, [Q4State; 2])> {
    let mut runs: Vec<(Vec<f64>, [State4bit; 2])> = params
        .iter()
        .map(|p| {
            let zeros = || ao4::zeros(p.len(), config.block_size, config.min_size as usize);
            (f64s(p), [zeros(), zeros()])
        })
        .collect();
    for (t, step_grads) in grads.iter().enumerate() {
        let mut g: Vec<Vec<f64>> = step_grads.iter().map(|g| f64s(g)).collect();
        if let Some(clip) = &clip {
            clip_grad_norm(&mut g, &clip.to_oracle());
        }
        for ((values, [m, v]), g) in runs.iter_mut().zip(&g) {
            ao4::ao4_adam_step(&adam.to_oracle(), t as u64 + 1, config.block_size, values, g, m, v)
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }
    runs.into_iter().map(|(p, [m, v])| (p, [m.to_library(), v.to_library()])).collect()
}

/// With global clipping, both backends scale every gradient by the coefficient of the norm
/// over all of them (those of f32-state tensors included) before the 4-bit step.
#[test]
fn global_clipping_scales_the_gradients_before_the_4bit_step() {
    let _turn = common::gpu_turn();
    let ctx = common::ctx();
    let config = Q4States::default();
    let clip = GradClip::l2(0.5);
    let adamw = Adam { lr: 1e-2, ..Adam::adamw() };
    let (params, grads) = data(3, 21);
    let want = oracle_run_clipped(&adamw, config, Some(clip), &params, &grads);

    let mut host = params.clone();
    let views: Vec<HostSlice<'_>> = host.iter().map(|p| HostSlice::F32(p)).collect();
    let options = CpuOptimizer::builder().state_storage(StateStorage::Q4(config)).grad_clip(clip);
    let mut cpu = options.build(adamw, &views).unwrap_or_else(|e| panic!("{e}"));
    let tensors: Vec<Tensor> = params.iter().map(|p| ctx.upload("p", &f64s(p), DType::F32)).collect();
    let grad_tensors: Vec<Tensor> =
        params.iter().map(|p| ctx.zeros("g", p.len() as u64, DType::F32)).collect();
    let options = Optimizer::builder().state_storage(StateStorage::Q4(config)).grad_clip(clip);
    let mut gpu = options.build(&ctx, adamw, &tensors).unwrap_or_else(|e| panic!("{e}"));
    for step_grads in &grads {
        let g: Vec<HostSlice<'_>> = step_grads.iter().map(|g| HostSlice::F32(g)).collect();
        let mut p: Vec<HostSliceMut<'_>> = host.iter_mut().map(|p| HostSliceMut::F32(p)).collect();
        cpu.step(&mut p, &g).unwrap_or_else(|e| panic!("{e}"));
        for (t, g) in grad_tensors.iter().zip(step_grads) {
            ctx.write(t, &f64s(g)).unwrap_or_else(|e| panic!("{e}"));
        }
        gpu.step(&grad_tensors).unwrap_or_else(|e| panic!("{e}"));
    }
    for (i, want) in want.iter().enumerate() {
        let state = [StateKind::ExpAvg, StateKind::ExpAvgSq]
            .map(|k| cpu.state(i, k).and_then(|s| s.q4()).unwrap_or_else(|| panic!("no state")));
        assert_follows(&format!("cpu clipped tensor {i}"), &host[i], state, want);
        let param: Vec<f32> =
            ctx.read(&tensors[i]).unwrap_or_else(|e| panic!("{e}")).iter().map(|&v| v as f32).collect();
        let state = [StateKind::ExpAvg, StateKind::ExpAvgSq].map(|k| {
            gpu.state(i, k)
                .map(|s| s.and_then(|v| v.q4()))
                .unwrap_or_else(|e| panic!("{e}"))
                .unwrap_or_else(|| panic!("no state"))
        });
        assert_follows(&format!("gpu clipped tensor {i}"), &param, [&state[0], &state[1]], want);
    }
}

/// Asserts `got` follows the oracle's `want`: parameters within 1e-5 relative (+1e-6), 4-bit
/// codes equal but for at most 0.5 % within one code (values that land near a tie between
/// two entries may round either way), scales within 1e-5 relative, f32 states within 1e-5.
fn assert_follows(what: &str, param: &[f32], state: [&Q4State; 2], want: &(Vec<f64>, [Q4State; 2])) {
    for (j, (a, b)) in param.iter().zip(&want.0).enumerate() {
        assert!((f64::from(*a) - b).abs() <= 1e-6 + 1e-5 * b.abs(), "{what} param[{j}]: {a} against {b}");
    }
    for (k, (got, want)) in state.into_iter().zip(&want.1).enumerate() {
        match (got, want) {
            (Q4State::Q4 { codes, scale }, Q4State::Q4 { codes: w_codes, scale: w_scale }) => {
                let (codes, w_codes) = (ao4::unpack(codes), ao4::unpack(w_codes));
                assert_eq!(codes.len(), w_codes.len(), "{what} state {k}: code count");
                let differing = codes.iter().zip(&w_codes).filter(|(a, b)| a != b).count();
                let furthest = codes.iter().zip(&w_codes).map(|(a, b)| a.abs_diff(*b)).max().unwrap_or(0);
                assert!(
                    furthest <= 1 && differing * 200 <= codes.len(),
                    "{what} state {k}: {differing} codes differ"
                );
                assert_eq!(scale.len(), w_scale.len(), "{what} state {k}: scale count");
                for (a, b) in scale.iter().zip(w_scale) {
                    assert!((a - b).abs() <= 1e-5 * b.abs(), "{what} state {k}: scale {a} against {b}");
                }
            }
            (Q4State::F32(values), Q4State::F32(w_values)) => {
                for (a, b) in values.iter().zip(w_values) {
                    assert!((a - b).abs() <= 1e-6 + 1e-5 * b.abs(), "{what} state {k}: {a} against {b}");
                }
            }
            (got, _) => panic!("{what} state {k}: stored as {got:?}, not as the oracle's"),
        }
    }
}

fn data(steps: usize, seed: u64) -> (Vec<Vec<f32>>, Vec<Vec<Vec<f32>>>) {
    let params: Vec<Vec<f32>> =
        SIZES.iter().enumerate().map(|(i, &n)| values(n, seed + i as u64, 1.0)).collect();
    let grads = (0..steps)
        .map(|t| {
            SIZES
                .iter()
                .enumerate()
                .map(|(i, &n)| values(n, seed + 100 * (t as u64 + 1) + i as u64, 0.1))
                .collect()
        })
        .collect();
    (params, grads)
}

/// Adam (L2 decay) and AdamW, torchao's block of 128 and a block of 64, five steps: both
/// backends follow the oracle.
#[test]
fn adam_and_adamw_follow_the_oracle_on_both_backends() {
    let _turn = common::gpu_turn();
    let ctx = common::ctx();
    let adamw = Adam { lr: 1e-2, weight_decay: 0.05, ..Adam::adamw() };
    let adam = Adam { lr: 1e-2, weight_decay: 0.05, ..Adam::default() };
    for (algorithm, block_size) in [(adamw, 128), (adam, 64)] {
        let config = Q4States { block_size, ..Q4States::default() };
        let (params, grads) = data(5, block_size as u64);
        let want = oracle_run(&algorithm, config, &params, &grads);

        let mut host = params.clone();
        let views: Vec<HostSlice<'_>> = host.iter().map(|p| HostSlice::F32(p)).collect();
        let mut cpu = CpuOptimizer::builder()
            .state_storage(StateStorage::Q4(config))
            .build(algorithm, &views)
            .unwrap_or_else(|e| panic!("{e}"));
        for step_grads in &grads {
            let g: Vec<HostSlice<'_>> = step_grads.iter().map(|g| HostSlice::F32(g)).collect();
            let mut p: Vec<HostSliceMut<'_>> = host.iter_mut().map(|p| HostSliceMut::F32(p)).collect();
            cpu.step(&mut p, &g).unwrap_or_else(|e| panic!("{e}"));
        }
        for (i, want) in want.iter().enumerate() {
            let state = [StateKind::ExpAvg, StateKind::ExpAvgSq]
                .map(|k| cpu.state(i, k).and_then(|s| s.q4()).unwrap_or_else(|| panic!("no state")));
            assert_follows(&format!("cpu block {block_size} tensor {i}"), &host[i], state, want);
        }

        let tensors: Vec<Tensor> = params.iter().map(|p| ctx.upload("p", &f64s(p), DType::F32)).collect();
        let grad_tensors: Vec<Tensor> =
            params.iter().map(|p| ctx.zeros("g", p.len() as u64, DType::F32)).collect();
        let mut gpu = Optimizer::builder()
            .state_storage(StateStorage::Q4(config))
            .build(&ctx, algorithm, &tensors)
            .unwrap_or_else(|e| panic!("{e}"));
        for step_grads in &grads {
            for (t, g) in grad_tensors.iter().zip(step_grads) {
                ctx.write(t, &f64s(g)).unwrap_or_else(|e| panic!("{e}"));
            }
            gpu.step(&grad_tensors).unwrap_or_else(|e| panic!("{e}"));
        }
        for (i, want) in want.iter().enumerate() {
            let param: Vec<f32> =
                ctx.read(&tensors[i]).unwrap_or_else(|e| panic!("{e}")).iter().map(|&v| v as f32).collect();
            let state = [StateKind::ExpAvg, StateKind::ExpAvgSq].map(|k| {
                gpu.state(i, k)
                    .map(|s| s.and_then(|v| v.q4()))
                    .unwrap_or_else(|e| panic!("{e}"))
                    .unwrap_or_else(|| panic!("no state"))
            });
            assert_follows(
                &format!("gpu block {block_size} tensor {i}"),
                &param,
                [&state[0], &state[1]],
                want,
            );
        }
    }
}

/// A state written on one backend and read on the other steps the same: the GPU's packed
/// codes are torchao's bytes.
#[test]
fn a_state_moves_between_backends() {
    let _turn = common::gpu_turn();
    let ctx = common::ctx();
    let config = Q4States::default();
    let (params, grads) = data(2, 7);
    let adamw = Adam::adamw();
    let mut host = params.clone();
    let views: Vec<HostSlice<'_>> = host.iter().map(|p| HostSlice::F32(p)).collect();
    let mut cpu = CpuOptimizer::builder()
        .state_storage(StateStorage::Q4(config))
        .build(adamw, &views)
        .unwrap_or_else(|e| panic!("{e}"));
    let g: Vec<HostSlice<'_>> = grads[0].iter().map(|g| HostSlice::F32(g)).collect();
    let mut p: Vec<HostSliceMut<'_>> = host.iter_mut().map(|p| HostSliceMut::F32(p)).collect();
    cpu.step(&mut p, &g).unwrap_or_else(|e| panic!("{e}"));

    let tensors: Vec<Tensor> = host.iter().map(|p| ctx.upload("p", &f64s(p), DType::F32)).collect();
    let gpu = Optimizer::builder()
        .state_storage(StateStorage::Q4(config))
        .build(&ctx, adamw, &tensors)
        .unwrap_or_else(|e| panic!("{e}"));
    for i in 0..SIZES.len() {
        for kind in [StateKind::ExpAvg, StateKind::ExpAvgSq] {
            let state = cpu.state(i, kind).and_then(|s| s.q4()).unwrap_or_else(|| panic!("no state")).clone();
            gpu.set_state(i, kind, &QuantizedState::Q4(state.clone())).unwrap_or_else(|e| panic!("{e}"));
            let back = gpu.state(i, kind).map(|s| s.and_then(|v| v.q4())).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(back.as_ref(), Some(&state), "tensor {i} {kind:?}");
        }
    }
}

#[test]
fn what_4bit_state_does_not_run_is_refused_by_name_and_nothing_changes() {
    let _turn = common::gpu_turn();
    let ctx = common::ctx();
    let weights = vec![0.5f32; 4096];
    let build = |options: wgpu_optim::cpu::CpuOptimizerBuilder, algorithm: wgpu_optim::Algorithm| {
        options.build(algorithm, &[HostSlice::F32(&weights)]).map(|_| ()).unwrap_err()
    };
    let q4 = || CpuOptimizer::builder().state_storage(StateStorage::Q4(Q4States::default()));
    let cases: [(wgpu_optim::cpu::CpuOptimizerBuilder, wgpu_optim::Algorithm, &str); 4] = [
        (q4(), Adam { amsgrad: true, ..Adam::adamw() }.into(), "AMSGrad"),
        (q4(), Adam { maximize: true, ..Adam::adamw() }.into(), "maximize"),
        (q4(), Sgd::default().into(), "Adam"),
        (
            CpuOptimizer::builder()
                .state_storage(StateStorage::Q4(Q4States { block_size: 100, ..Q4States::default() })),
            Adam::adamw().into(),
            "block_size",
        ),
    ];
    for (options, algorithm, named) in cases {
        let err = build(options, algorithm);
        assert!(err.to_string().contains(named), "{named}: {err}");
    }
    // The GPU builder refuses the same.
    let tensor = ctx.upload("w", &[0.5; 4096], DType::F32);
    let err = Optimizer::builder()
        .state_storage(StateStorage::Q4(Q4States::default()))
        .build(&ctx, Adam { amsgrad: true, ..Adam::adamw() }, std::slice::from_ref(&tensor))
        .unwrap_err();
    assert!(matches!(err, Error::ConflictingOptions { first: "state_storage", .. }), "{err}");
    let err = Optimizer::builder()
        .state_storage(StateStorage::Q4(Q4States::default()))
        .master_weights(true)
        .build(&ctx, Adam::adamw(), &[tensor])
        .unwrap_err();
    assert!(err.to_string().contains("master_weights"), "{err}");

    // A schedule cannot switch AMSGrad on; a bad replacement state changes nothing.
    let mut cpu = q4().build(Adam::adamw(), &[HostSlice::F32(&weights)]).unwrap_or_else(|e| panic!("{e}"));
    assert!(cpu.set_group_algorithm(0, Adam { maximize: true, ..Adam::adamw() }).is_err());
    let before = cpu.state(0, StateKind::ExpAvg).and_then(|s| s.q4()).cloned();
    let bad = Q4State::Q4 { codes: vec![0x77; 2048], scale: vec![-1.0; 32] };
    let err = cpu.set_state(0, StateKind::ExpAvg, QuantizedState::Q4(bad)).unwrap_err();
    assert!(err.to_string().contains("scale[0]"), "{err}");
    assert_eq!(cpu.state(0, StateKind::ExpAvg).and_then(|s| s.q4()).cloned(), before);
}

/// A non-finite gradient spoils its own element only: its states take the code of 0 (of
/// the smallest entry for exp_avg_sq) and are left out of their blocks' scales, on both
/// backends, as the oracle does.
#[test]
fn a_non_finite_gradient_spoils_its_own_element_only() {
    let _turn = common::gpu_turn();
    let ctx: GpuContext = common::ctx();
    let config = Q4States::default();
    let params = vec![values(4096, 3, 1.0)];
    let mut g = values(4096, 4, 0.1);
    g[5] = f32::NAN;
    g[300] = f32::INFINITY;
    let grads = vec![vec![g.clone()], vec![values(4096, 5, 0.1)]];
    let adamw = Adam::adamw();
    let want = oracle_run(&adamw, config, &params, &grads);
    let Q4State::Q4 { scale, .. } = &want[0].1[0] else { panic!("4-bit state expected") };
    assert!(scale.iter().all(|s| s.is_finite()));

    let mut host = params.clone();
    let mut cpu = CpuOptimizer::builder()
        .state_storage(StateStorage::Q4(config))
        .build(adamw, &[HostSlice::F32(&host[0])])
        .unwrap_or_else(|e| panic!("{e}"));
    let tensor = ctx.upload("p", &f64s(&params[0]), DType::F32);
    let grad = ctx.zeros("g", 4096, DType::F32);
    let mut gpu = Optimizer::builder()
        .state_storage(StateStorage::Q4(config))
        .build(&ctx, adamw, std::slice::from_ref(&tensor))
        .unwrap_or_else(|e| panic!("{e}"));
    for step_grads in &grads {
        cpu.step(&mut [HostSliceMut::F32(&mut host[0])], &[HostSlice::F32(&step_grads[0])])
            .unwrap_or_else(|e| panic!("{e}"));
        ctx.write(&grad, &f64s(&step_grads[0])).unwrap_or_else(|e| panic!("{e}"));
        gpu.step(std::slice::from_ref(&grad)).unwrap_or_else(|e| panic!("{e}"));
    }
    let gpu_param: Vec<f32> =
        ctx.read(&tensor).unwrap_or_else(|e| panic!("{e}")).iter().map(|&v| v as f32).collect();
    for (what, param) in [("cpu", &host[0]), ("gpu", &gpu_param)] {
        let nan = |j: usize| param[j].is_nan();
        assert!(nan(5) && nan(300), "{what}: the spoilt elements are NaN");
        let finite: Vec<usize> = (0..4096).filter(|&j| j != 5 && j != 300).collect();
        for &j in &finite {
            let b = want[0].0[j];
            assert!(
                (f64::from(param[j]) - b).abs() <= 1e-6 + 1e-5 * b.abs(),
                "{what} param[{j}]: {} against {b}",
                param[j]
            );
        }
    }
    let gpu_states = [StateKind::ExpAvg, StateKind::ExpAvgSq].map(|k| {
        gpu.state(0, k)
            .map(|s| s.and_then(|v| v.q4()))
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("no state"))
    });
    let cpu_states = [StateKind::ExpAvg, StateKind::ExpAvgSq]
        .map(|k| cpu.state(0, k).and_then(|s| s.q4()).unwrap_or_else(|| panic!("no state")));
    // The parameters' NaNs are in the oracle too; compare states only.
    let no_param =
        (want[0].0.iter().map(|v| if v.is_nan() { 0.0 } else { *v }).collect::<Vec<_>>(), want[0].1.clone());
    let zero_param = |p: &[f32]| p.iter().map(|v| if v.is_nan() { 0.0 } else { *v }).collect::<Vec<f32>>();
    assert_follows("cpu", &zero_param(&host[0]), cpu_states, &no_param);
    assert_follows("gpu", &zero_param(&gpu_param), [&gpu_states[0], &gpu_states[1]], &no_param);
}
