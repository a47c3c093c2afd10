//! Adafactor (`torch.optim.Adafactor`) on the GPU and the CPU backend against the f64
//! oracle (`wgpu_optim_testkit::oracle::AdafactorOracle`) and the public vectors: each
//! backend on its own, 16-bit parameters, groups beside AdamW, maximize, shapes whose last
//! dimensions are 1 or odd, and refusals (nothing created or changed). `nonfinite`: NaN and
//! infinite gradients; `grads`: the gradients a step refuses.

mod grads;
mod nonfinite;

use crate::common;

use std::path::PathBuf;

use wgpu_optim_testkit::conformance::{run_case, Backend, Case, Outcome};

fn adafactor_vectors() -> Vec<Case> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("adafactor_")))
        .collect();
    files.sort();
    assert!(files.len() >= 2, "the public adafactor_* vectors");
    files.iter().map(|f| Case::load(f).unwrap_or_else(|e| panic!("{e}"))).collect()
}

fn vectors_pass_on(backends: &[Backend]) {
    let ctx = backends.iter().any(|b| !matches!(b, Backend::Oracle | Backend::Cpu)).then(common::ctx);
    for case in adafactor_vectors() {
        for &backend in backends {
            let report =
                run_case(&case, backend, ctx.as_ref()).unwrap_or_else(|e| panic!("{}: {e}", case.name));
            assert_eq!(
                report.outcome,
                Outcome::Pass,
                "{} on {} (worst {})",
                case.name,
                backend.name(),
                report.worst
            );
        }
    }
}

#[test]
fn public_vectors_pass_on_the_oracle() {
    vectors_pass_on(&[Backend::Oracle]);
}

#[test]
fn public_vectors_pass_on_the_cpu_backend() {
    vectors_pass_on(&[Backend::Cpu]);
}

#[test]
fn public_vectors_pass_on_the_gpu_in_place_and_out_of_place() {
    vectors_pass_on(&[Backend::GpuInPlace, Backend::GpuOutOfPlace]);
}

use common::{assert_close, ctx, download, Rng, Tolerance};
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut, HostTensor};
use wgpu_optim::{
    adafactor_state_kinds, Adafactor, Adam, Algorithm, DType, Error, GradClip, Optimizer, ParamGroup,
    Rounding, StateKind, StateStorage, Tensor,
};
use wgpu_optim_testkit::oracle::{AdafactorOracle, Storage, ToOracle, TorchState};

/// Shapes with tails around the workgroup size, last dimensions of 1, odd sizes, a 3-D batch
/// and a vector.
const SHAPES: [&[usize]; 7] = [&[257], &[9, 13], &[1, 7], &[7, 1], &[3, 5, 7], &[1], &[2, 1, 1, 65]];

fn host(values: &[f64], dtype: DType) -> HostTensor {
    HostTensor::from_f64(dtype, values).unwrap_or_else(|e| panic!("{e}"))
}

/// The state values of the oracle's tensor i in `adafactor_state_kinds` order.
fn oracle_states(oracle: &AdafactorOracle, i: usize) -> Vec<Vec<f64>> {
    let s = &oracle.state[i];
    if oracle.shapes[i].len() >= 2 {
        vec![s.row_var.clone(), s.col_var.clone()]
    } else {
        vec![s.variance.clone()]
    }
}

/// `steps` steps of `config` over tensors of `shapes` stored as `dtype` on the oracle, the
/// GPU and the CPU backend; parameters and states compared at the end within `tolerance`.
fn backends_follow_the_oracle(config: Adafactor, shapes: &[&[usize]], dtype: DType, steps: usize, seed: u64) {
    let ctx = ctx();
    let mut rng = Rng::new(seed);
    let round = |v: Vec<f64>| -> Vec<f64> { v.into_iter().map(|x| dtype.to_oracle().round(x)).collect() };
    let shapes: Vec<Vec<usize>> = shapes.iter().map(|s| s.to_vec()).collect();
    let lens: Vec<usize> = shapes.iter().map(|s| s.iter().product()).collect();
    let start: Vec<Vec<f64>> = lens.iter().map(|&n| round(rng.vec(n, 1.0))).collect();
    let grads: Vec<Vec<Vec<f64>>> =
        (0..steps).map(|_| lens.iter().map(|&n| round(rng.vec(n, 1.0))).collect()).collect();

    let mut oracle = AdafactorOracle::new(config.to_oracle(), shapes.clone(), dtype.to_oracle());
    let mut want = start.clone();
    for g in &grads {
        oracle.step(&mut want, g);
    }

    let params: Vec<Tensor> = start.iter().map(|p| ctx.upload("param", p, dtype)).collect();
    let grad_tensors: Vec<Tensor> = lens.iter().map(|&n| ctx.zeros("grad", n as u64, dtype)).collect();
    let mut gpu = Optimizer::builder().param_shapes(shapes.clone()).build(&ctx, config, &params).unwrap();
    let mut cpu_params: Vec<HostTensor> = start.iter().map(|p| host(p, dtype)).collect();
    let views: Vec<HostSlice<'_>> = cpu_params.iter().map(HostTensor::as_slice).collect();
    let mut cpu = CpuOptimizer::builder().param_shapes(shapes.clone()).build(config, &views).unwrap();
    for g in &grads {
        for (t, g) in grad_tensors.iter().zip(g) {
            ctx.write(t, g).unwrap();
        }
        gpu.step(&grad_tensors).unwrap();
        let host_grads: Vec<HostTensor> = g.iter().map(|g| host(g, dtype)).collect();
        let grad_views: Vec<HostSlice<'_>> = host_grads.iter().map(HostTensor::as_slice).collect();
        let mut param_views: Vec<HostSliceMut<'_>> =
            cpu_params.iter_mut().map(HostTensor::as_mut_slice).collect();
        cpu.step(&mut param_views, &grad_views).unwrap();
    }
    // 16-bit stores may round an f32 result and the f64 one to neighbours, a few times over
    // the trajectory.
    let tolerance = match dtype {
        DType::F16 => Tolerance::Close { rtol: 2e-3, atol: 2e-3 },
        DType::BF16 => Tolerance::Close { rtol: 1.6e-2, atol: 1.6e-2 },
        _ => Tolerance::Close { rtol: 2e-5, atol: 2e-6 },
    };
    for (i, shape) in shapes.iter().enumerate() {
        let what = |backend: &str, name: &str| format!("{backend} {name}[{i}] {shape:?} {dtype:?}");
        assert_close(&what("gpu", "param"), &download(&ctx, &params[i]), &want[i], tolerance);
        assert_close(&what("cpu", "param"), &cpu_params[i].to_f64(), &want[i], tolerance);
        for (kind, state) in adafactor_state_kinds(shape).iter().zip(oracle_states(&oracle, i)) {
            let name = kind.torch_name();
            let gpu_state = download(&ctx, gpu.state(i, *kind).unwrap().and_then(|s| s.dense()).unwrap());
            let cpu_state = cpu.state(i, *kind).and_then(|s| s.dense()).unwrap().to_f64();
            // The states are f32 whatever the parameters; 16-bit gradients are exact in f32.
            let tol = Tolerance::Close { rtol: 2e-5, atol: 1e-7 };
            let tol = if dtype == DType::F32 { tol } else { tolerance };
            assert_close(&what("gpu", name), &gpu_state, &state, tol);
            assert_close(&what("cpu", name), &cpu_state, &state, tol);
        }
    }
}

#[test]
fn f32_trajectories_follow_the_oracle_on_every_shape() {
    backends_follow_the_oracle(Adafactor::default(), &SHAPES, DType::F32, 6, 1);
}

#[test]
fn weight_decay_large_rate_eps1_and_d_follow_the_oracle() {
    let config = Adafactor {
        lr: 0.3,
        weight_decay: 0.05,
        eps1: Some(1e-4),
        eps2: 1e-2,
        d: 1.5,
        ..Adafactor::default()
    };
    backends_follow_the_oracle(config, &SHAPES, DType::F32, 5, 2);
}

#[test]
fn maximize_follows_the_oracle() {
    let config = Adafactor { maximize: true, beta2_decay: -0.5, ..Adafactor::default() };
    backends_follow_the_oracle(config, &SHAPES, DType::F32, 4, 3);
}

#[test]
fn f16_and_bf16_parameters_follow_the_oracle_with_their_machine_epsilon() {
    for dtype in [DType::F16, DType::BF16] {
        backends_follow_the_oracle(Adafactor::default(), &SHAPES, dtype, 3, 4);
    }
}

#[test]
fn tiny_gradients_meet_the_eps1_floors() {
    // Gradients far below eps1 = 2^-23: V and the row mean hit their floors.
    let ctx = ctx();
    let shapes = vec![vec![4, 6], vec![5]];
    let config = Adafactor::default();
    let start = [vec![0.5; 24], vec![-0.25; 5]];
    let grad = [vec![1e-9; 24], vec![-2e-9; 5]];
    let mut oracle = AdafactorOracle::new(config.to_oracle(), shapes.clone(), DType::F32.to_oracle());
    let mut want = start.to_vec();
    oracle.step(&mut want, &grad);
    let params: Vec<Tensor> = start.iter().map(|p| ctx.upload("param", p, DType::F32)).collect();
    let grads: Vec<Tensor> = grad.iter().map(|g| ctx.upload("grad", g, DType::F32)).collect();
    let mut gpu = Optimizer::builder().param_shapes(shapes.clone()).build(&ctx, config, &params).unwrap();
    gpu.step(&grads).unwrap();
    let mut cpu_params: Vec<HostTensor> = start.iter().map(|p| host(p, DType::F32)).collect();
    let views: Vec<HostSlice<'_>> = cpu_params.iter().map(HostTensor::as_slice).collect();
    let mut cpu = CpuOptimizer::builder().param_shapes(shapes).build(config, &views).unwrap();
    let host_grads: Vec<HostTensor> = grad.iter().map(|g| host(g, DType::F32)).collect();
    let grad_views: Vec<HostSlice<'_>> = host_grads.iter().map(HostTensor::as_slice).collect();
    let mut param_views: Vec<HostSliceMut<'_>> =
        cpu_params.iter_mut().map(HostTensor::as_mut_slice).collect();
    cpu.step(&mut param_views, &grad_views).unwrap();
    for i in 0..2 {
        assert_close(
            "cpu param",
            &cpu_params[i].to_f64(),
            &want[i],
            Tolerance::Close { rtol: 2e-5, atol: 2e-6 },
        );
        assert_close(
            "param",
            &download(&ctx, &params[i]),
            &want[i],
            Tolerance::Close { rtol: 2e-5, atol: 2e-6 },
        );
    }
}

#[test]
fn adafactor_beside_adamw_in_one_optimizer_follows_each_oracle() {
    let ctx = ctx();
    let mut rng = Rng::new(7);
    // A model: two matrices under Adafactor, a bias under AdamW between them in memory order.
    let shapes = [vec![16, 8], vec![8], vec![8, 3]];
    let lens: Vec<usize> = shapes.iter().map(|s| s.iter().product()).collect();
    let start: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grads: Vec<Vec<Vec<f64>>> = (0..4).map(|_| lens.iter().map(|&n| rng.vec(n, 1.0)).collect()).collect();
    let adafactor = Adafactor { lr: 0.05, weight_decay: 0.1, ..Adafactor::default() };
    let adamw = Adam { lr: 1e-2, weight_decay: 0.01, ..Adam::adamw() };
    let params: Vec<Tensor> = start.iter().map(|p| ctx.upload("param", p, DType::F32)).collect();
    let groups = vec![
        ParamGroup::new(adafactor, &[params[0].clone(), params[2].clone()]),
        ParamGroup::new(adamw, &[params[1].clone()]),
    ];
    // Shapes in the optimizer's parameter order (group by group).
    let order = [0usize, 2, 1];
    let ordered_shapes: Vec<Vec<usize>> = order.iter().map(|&i| shapes[i].clone()).collect();
    let mut gpu = Optimizer::builder().param_shapes(ordered_shapes).build_groups(&ctx, groups).unwrap();
    let grad_tensors: Vec<Tensor> =
        order.iter().map(|&i| ctx.zeros("grad", lens[i] as u64, DType::F32)).collect();

    let mut oracle = AdafactorOracle::new(
        adafactor.to_oracle(),
        vec![shapes[0].clone(), shapes[2].clone()],
        DType::F32.to_oracle(),
    );
    let mut adam = TorchState::new(adamw.to_oracle().into(), lens[1]);
    let mut want = start.clone();
    for g in &grads {
        for (t, &i) in grad_tensors.iter().zip(&order) {
            ctx.write(t, &g[i]).unwrap();
        }
        gpu.step(&grad_tensors).unwrap();
        let mut factored = vec![want[0].clone(), want[2].clone()];
        oracle.step(&mut factored, &[g[0].clone(), g[2].clone()]);
        want[0] = factored[0].clone();
        want[2] = factored[1].clone();
        adam.step(&mut want[1], &g[1]);
    }
    let tolerance = Tolerance::Close { rtol: 2e-5, atol: 2e-6 };
    for i in 0..3 {
        assert_close(&format!("param {i}"), &download(&ctx, &params[i]), &want[i], tolerance);
    }
    // The AdamW parameter (optimizer index 2) keeps Adam's states, not Adafactor's.
    assert!(gpu.state(2, StateKind::ExpAvg).unwrap().and_then(|s| s.dense()).is_some());
    assert!(gpu.state(2, StateKind::RowVar).unwrap().and_then(|s| s.dense()).is_none());
    assert_eq!(gpu.state(0, StateKind::RowVar).unwrap().and_then(|s| s.dense()).unwrap().len, 16);
    assert_eq!(gpu.state(1, StateKind::ColVar).unwrap().and_then(|s| s.dense()).unwrap().len, 3);
}

#[test]
fn the_factored_state_is_sublinear() {
    let ctx = ctx();
    let params = vec![ctx.zeros("w", 4096 * 1024, DType::F32)];
    let opt = Optimizer::builder()
        .param_shapes(vec![vec![4096, 1024]])
        .build(&ctx, Adafactor::default(), &params)
        .unwrap();
    assert_eq!(opt.state(0, StateKind::RowVar).unwrap().and_then(|s| s.dense()).unwrap().len, 4096);
    assert_eq!(opt.state(0, StateKind::ColVar).unwrap().and_then(|s| s.dense()).unwrap().len, 1024);
    assert!(opt.state(0, StateKind::Variance).unwrap().and_then(|s| s.dense()).is_none());
}

#[test]
fn refusals_name_the_problem_and_change_nothing() {
    let ctx = ctx();
    let params = vec![ctx.upload("w", &[0.5; 6], DType::F32)];
    // No shapes: refused by name.
    match Optimizer::builder().build(&ctx, Adafactor::default(), &params) {
        Err(Error::NeedsOption { what, option: "param_shapes" }) => assert_eq!(what, "Adafactor"),
        other => panic!("expected NeedsOption, got {other:?}"),
    }
    let host_params = [HostSlice::F32(&[0.5f32; 6])];
    match CpuOptimizer::builder().build(Adafactor::default(), &host_params) {
        Err(Error::NeedsOption { option: "param_shapes", .. }) => {}
        other => panic!("expected NeedsOption, got {other:?}"),
    }
    // Shapes that do not fit the lengths.
    assert!(matches!(
        Optimizer::builder().param_shapes(vec![vec![4, 2]]).build(&ctx, Adafactor::default(), &params),
        Err(Error::LengthMismatch { .. })
    ));
    // Hyperparameters outside torch's ranges, each by its name.
    let bad = [
        ("lr", Adafactor { lr: -1.0, ..Adafactor::default() }),
        ("beta2_decay", Adafactor { beta2_decay: 0.5, ..Adafactor::default() }),
        ("eps1", Adafactor { eps1: Some(-1e-3), ..Adafactor::default() }),
        ("eps2", Adafactor { eps2: f64::NAN, ..Adafactor::default() }),
        ("d", Adafactor { d: 0.5, ..Adafactor::default() }),
        ("weight_decay", Adafactor { weight_decay: -0.1, ..Adafactor::default() }),
    ];
    for (name, config) in bad {
        let shapes = vec![vec![2, 3]];
        match Optimizer::builder().param_shapes(shapes.clone()).build(&ctx, config, &params) {
            Err(Error::BadHyperparameter { name: got, .. }) => assert_eq!(got, name),
            other => panic!("{name}: expected BadHyperparameter, got {other:?}"),
        }
        match CpuOptimizer::builder().param_shapes(shapes).build(config, &host_params) {
            Err(Error::BadHyperparameter { name: got, .. }) => assert_eq!(got, name),
            other => panic!("{name}: expected BadHyperparameter, got {other:?}"),
        }
    }
    // Options its passes do not implement, by name.
    let shapes = || vec![vec![2, 3]];
    let conflict = |r: wgpu_optim::Result<Optimizer>, option: &str| match r {
        Err(Error::ConflictingOptions { first, .. }) => assert_eq!(first, option),
        other => panic!("{option}: expected ConflictingOptions, got {other:?}"),
    };
    let b = || Optimizer::builder().param_shapes(shapes());
    conflict(b().capturable(true).build(&ctx, Adafactor::default(), &params), "capturable");
    conflict(b().grad_clip(GradClip::l2(1.0)).build(&ctx, Adafactor::default(), &params), "grad_clip");
    conflict(b().master_weights(true).build(&ctx, Adafactor::default(), &params), "master_weights");
    conflict(
        b().state_storage(StateStorage::Dtype(DType::BF16)).build(&ctx, Adafactor::default(), &params),
        "state_storage",
    );
    let half = vec![ctx.upload("w16", &[0.5; 6], DType::BF16)];
    conflict(b().rounding(Rounding::Kahan).build(&ctx, Adafactor::default(), &half), "rounding");
    match b().state_storage(StateStorage::Q8(wgpu_optim::q8::Q8States::default())).build(
        &ctx,
        Adafactor::default(),
        &params,
    ) {
        Err(Error::ConflictingOptions { first: "state_storage", .. }) => {}
        other => panic!("q8: expected ConflictingOptions, got {other:?}"),
    }
    // A group cannot switch to or from Adafactor; a refused change leaves it as it was.
    let mut opt = b().build(&ctx, Adafactor::default(), &params).unwrap();
    let sgd = wgpu_optim::Sgd { lr: 0.1, ..wgpu_optim::Sgd::default() };
    assert!(matches!(opt.set_group_algorithm(0, sgd), Err(Error::ConflictingOptions { .. })));
    assert_eq!(opt.group_algorithm(0), Some(&Algorithm::Adafactor(Adafactor::default())));
    // A refused step (wrong gradient count) writes nothing.
    let grads = [ctx.upload("g", &[1.0; 6], DType::F32)];
    assert!(opt.step(&[grads[0].clone(), grads[0].clone()]).is_err());
    assert_eq!(download(&ctx, &params[0]), vec![0.5; 6]);
    assert_eq!(
        download(&ctx, opt.state(0, StateKind::RowVar).unwrap().and_then(|s| s.dense()).unwrap()),
        vec![0.0; 2]
    );
    // The stateless operator has no Adafactor.
    let mut encoder = ctx.device().create_command_encoder(&Default::default());
    let result = wgpu_optim::ops::update(&ctx, &mut encoder, &Adafactor::default().into(), 1, &[]);
    assert!(matches!(result, Err(Error::ConflictingOptions { first: "ops::update", .. })), "{result:?}");
}

#[test]
fn checkpoints_hold_torchs_names_and_shapes_and_load_into_the_other_backend() {
    let ctx = ctx();
    let mut rng = Rng::new(11);
    let shapes = vec![vec![9, 13], vec![257], vec![3, 5, 7]];
    let lens: Vec<usize> = shapes.iter().map(|s| s.iter().product()).collect();
    let start: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grads: Vec<Vec<Vec<f64>>> = (0..5).map(|_| lens.iter().map(|&n| rng.vec(n, 1.0)).collect()).collect();
    let config = Adafactor { weight_decay: 0.02, ..Adafactor::default() };
    let mut oracle = AdafactorOracle::new(config.to_oracle(), shapes.clone(), DType::F32.to_oracle());
    let mut want = start.clone();
    for g in &grads {
        oracle.step(&mut want, g);
    }

    // Three steps on the GPU, saved.
    let params: Vec<Tensor> = start.iter().map(|p| ctx.upload("param", p, DType::F32)).collect();
    let grad_tensors: Vec<Tensor> = lens.iter().map(|&n| ctx.zeros("grad", n as u64, DType::F32)).collect();
    let mut gpu = Optimizer::builder().param_shapes(shapes.clone()).build(&ctx, config, &params).unwrap();
    for g in &grads[..3] {
        for (t, g) in grad_tensors.iter().zip(g) {
            ctx.write(t, g).unwrap();
        }
        gpu.step(&grad_tensors).unwrap();
    }
    let bytes = gpu.save_to_bytes().unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let expect = [
        ("state.0.row_var", vec![9, 1]),
        ("state.0.col_var", vec![1, 13]),
        ("state.1.variance", vec![257]),
        ("state.2.row_var", vec![3, 5, 1]),
        ("state.2.col_var", vec![3, 1, 7]),
        ("state.2.step", vec![]),
    ];
    for (name, shape) in expect {
        let tensor = file.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(tensor.shape(), shape.as_slice(), "{name}");
        assert_eq!(tensor.dtype(), safetensors::Dtype::F32, "{name}");
    }
    assert!(file.tensor("state.1.row_var").is_err());

    // The CPU backend resumes from it, with the GPU's parameters, for the last two steps.
    let mut cpu_params: Vec<HostTensor> =
        params.iter().map(|p| host(&download(&ctx, p), DType::F32)).collect();
    let views: Vec<HostSlice<'_>> = cpu_params.iter().map(HostTensor::as_slice).collect();
    let mut cpu =
        CpuOptimizer::builder().param_shapes(shapes.clone()).build(Adafactor::default(), &views).unwrap();
    cpu.load_from_bytes(&bytes).unwrap();
    assert_eq!(cpu.step_count(), 3);
    assert_eq!(cpu.group_algorithm(0), Some(&Algorithm::Adafactor(config)));
    for g in &grads[3..] {
        let host_grads: Vec<HostTensor> = g.iter().map(|g| host(g, DType::F32)).collect();
        let grad_views: Vec<HostSlice<'_>> = host_grads.iter().map(HostTensor::as_slice).collect();
        let mut param_views: Vec<HostSliceMut<'_>> =
            cpu_params.iter_mut().map(HostTensor::as_mut_slice).collect();
        cpu.step(&mut param_views, &grad_views).unwrap();
    }
    let tolerance = Tolerance::Close { rtol: 2e-5, atol: 2e-6 };
    for i in 0..3 {
        assert_close(&format!("cpu param {i}"), &cpu_params[i].to_f64(), &want[i], tolerance);
    }

    // And back: the CPU's checkpoint into a fresh GPU optimizer, whose states it replaces.
    let cpu_bytes = cpu.save_to_bytes().unwrap();
    let mut fresh =
        Optimizer::builder().param_shapes(shapes.clone()).build(&ctx, Adafactor::default(), &params).unwrap();
    fresh.load_from_bytes(&cpu_bytes).unwrap();
    assert_eq!(fresh.step_count(), 5);
    for (i, shape) in shapes.iter().enumerate() {
        for (kind, state) in adafactor_state_kinds(shape).iter().zip(oracle_states(&oracle, i)) {
            let got = download(&ctx, fresh.state(i, *kind).unwrap().and_then(|s| s.dense()).unwrap());
            assert_close(&format!("loaded {} {i}", kind.torch_name()), &got, &state, tolerance);
        }
    }
    // A file of another algorithm is refused, with nothing changed.
    let adam_params = [
        HostSlice::F32(&[0.0f32; 117][..]),
        HostSlice::F32(&[0.0f32; 257][..]),
        HostSlice::F32(&[0.0f32; 105][..]),
    ];
    let adam =
        CpuOptimizer::builder().param_shapes(shapes.clone()).build(Adam::default(), &adam_params).unwrap();
    assert!(fresh.load_from_bytes(&adam.save_to_bytes().unwrap()).is_err());
    assert_eq!(fresh.step_count(), 5);
}

/// Runs 3 steps of Adafactor on the CPU backend inside `pool` and returns the parameters.
fn cpu_run(
    pool: &rayon::ThreadPool,
    shapes: &[Vec<usize>],
    start: &[Vec<f64>],
    grads: &[Vec<Vec<f64>>],
) -> Vec<Vec<f64>> {
    pool.install(|| {
        let mut params: Vec<HostTensor> = start.iter().map(|p| host(p, DType::F32)).collect();
        let views: Vec<HostSlice<'_>> = params.iter().map(HostTensor::as_slice).collect();
        let mut cpu = CpuOptimizer::builder()
            .param_shapes(shapes.to_vec())
            .build(Adafactor::default(), &views)
            .unwrap();
        for g in grads {
            let host_grads: Vec<HostTensor> = g.iter().map(|g| host(g, DType::F32)).collect();
            let grad_views: Vec<HostSlice<'_>> = host_grads.iter().map(HostTensor::as_slice).collect();
            let mut param_views: Vec<HostSliceMut<'_>> =
                params.iter_mut().map(HostTensor::as_mut_slice).collect();
            cpu.step(&mut param_views, &grad_views).unwrap();
        }
        params.iter().map(HostTensor::to_f64).collect()
    })
}

#[test]
fn the_reductions_give_the_same_bits_on_every_run_and_any_thread_count() {
    let ctx = ctx();
    let mut rng = Rng::new(5);
    // Large enough for many blocks of rows and many partial-sum workgroups.
    let shapes = vec![vec![300, 700], vec![70_001], vec![3, 129, 257]];
    let lens: Vec<usize> = shapes.iter().map(|s| s.iter().product()).collect();
    let start: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grads: Vec<Vec<Vec<f64>>> = (0..3).map(|_| lens.iter().map(|&n| rng.vec(n, 1.0)).collect()).collect();
    let gpu_run = || -> Vec<Vec<f64>> {
        let params: Vec<Tensor> = start.iter().map(|p| ctx.upload("param", p, DType::F32)).collect();
        let grad_tensors: Vec<Tensor> =
            lens.iter().map(|&n| ctx.zeros("grad", n as u64, DType::F32)).collect();
        let mut gpu = Optimizer::builder()
            .param_shapes(shapes.clone())
            .build(&ctx, Adafactor::default(), &params)
            .unwrap();
        for g in &grads {
            for (t, g) in grad_tensors.iter().zip(g) {
                ctx.write(t, g).unwrap();
            }
            gpu.step(&grad_tensors).unwrap();
        }
        params.iter().map(|p| download(&ctx, p)).collect()
    };
    let first = gpu_run();
    assert!(first == gpu_run(), "two GPU runs differ");
    let pool = |n: usize| rayon::ThreadPoolBuilder::new().num_threads(n).build().unwrap();
    let one = cpu_run(&pool(1), &shapes, &start, &grads);
    assert!(one == cpu_run(&pool(3), &shapes, &start, &grads), "1 and 3 threads differ");
    assert!(one == cpu_run(&pool(2), &shapes, &start, &grads), "1 and 2 threads differ");
    // And both follow the oracle.
    let mut oracle =
        AdafactorOracle::new(Adafactor::default().to_oracle(), shapes.clone(), DType::F32.to_oracle());
    let mut want = start.clone();
    for g in &grads {
        oracle.step(&mut want, g);
    }
    let tolerance = Tolerance::Close { rtol: 2e-5, atol: 2e-6 };
    for i in 0..3 {
        assert_close(&format!("gpu {i}"), &first[i], &want[i], tolerance);
        assert_close(&format!("cpu {i}"), &one[i], &want[i], tolerance);
    }
}

#[test]
fn f32_gradients_of_16_bit_parameters_at_odd_offsets_follow_the_oracle() {
    // Parameters packed into one buffer at odd element offsets, their f32 gradients in another.
    let ctx = ctx();
    let mut rng = Rng::new(9);
    let shapes = vec![vec![5, 7], vec![3], vec![2, 3, 5]];
    let lens: Vec<usize> = shapes.iter().map(|s| s.iter().product()).collect();
    for dtype in [DType::F16, DType::BF16] {
        let start: Vec<Vec<f64>> = lens
            .iter()
            .map(|&n| rng.vec(n, 1.0).into_iter().map(|v| dtype.to_oracle().round(v)).collect())
            .collect();
        let grads: Vec<Vec<Vec<f64>>> =
            (0..2).map(|_| lens.iter().map(|&n| rng.vec(n, 1.0)).collect()).collect();
        let total: usize = lens.iter().map(|n| n + 1).sum::<usize>() + 2;
        let buffer = ctx.zeros("packed params", total as u64, dtype).buffer;
        let mut at = 1u64;
        let mut params = Vec::new();
        for (values, &n) in start.iter().zip(&lens) {
            let t = Tensor { buffer: buffer.clone(), offset: at * dtype.size(), len: n as u64, dtype };
            ctx.write(&t, values).unwrap();
            params.push(t);
            at += n as u64 + 1;
        }
        let grad_tensors: Vec<Tensor> =
            lens.iter().map(|&n| ctx.zeros("grad", n as u64, DType::F32)).collect();
        let mut gpu = Optimizer::builder()
            .param_shapes(shapes.clone())
            .build(&ctx, Adafactor::default(), &params)
            .unwrap();
        let mut oracle =
            AdafactorOracle::new(Adafactor::default().to_oracle(), shapes.clone(), dtype.to_oracle());
        let mut want = start.clone();
        for g in &grads {
            for (t, g) in grad_tensors.iter().zip(g) {
                ctx.write(t, g).unwrap();
            }
            gpu.step(&grad_tensors).unwrap();
            oracle.step(&mut want, g);
        }
        let tolerance = Tolerance::Close { rtol: 1.6e-2, atol: 1.6e-2 };
        for (i, t) in params.iter().enumerate() {
            assert_close(&format!("{dtype:?} param {i}"), &download(&ctx, t), &want[i], tolerance);
        }
        // The elements between the tensors are untouched.
        let whole = Tensor { buffer: buffer.clone(), offset: 0, len: total as u64, dtype };
        let all = download(&ctx, &whole);
        let mut at = 0usize;
        for &n in &lens {
            assert_eq!(all[at], 0.0, "{dtype:?} gap before element {}", at + 1);
            at += n + 1;
        }
    }
}

#[test]
fn a_zero_row_sends_only_its_matrix_down_the_element_wise_path_on_every_block() {
    // Two matrices of four blocks of rows each on the CPU backend; the second has a row of
    // zero gradients, so its floor may bind (element by element) while the first's sum is
    // taken from the column factors.
    let mut rng = Rng::new(11);
    let shapes = vec![vec![2, 300, 700]];
    let n = 2 * 300 * 700;
    let start = vec![rng.vec(n, 1.0)];
    let grads: Vec<Vec<Vec<f64>>> = (0..2)
        .map(|_| {
            let mut g = rng.vec(n, 1.0);
            let row = (300 + 150) * 700;
            g[row..row + 700].fill(0.0);
            vec![g]
        })
        .collect();
    let pool = |n: usize| rayon::ThreadPoolBuilder::new().num_threads(n).build().unwrap();
    let one = cpu_run(&pool(1), &shapes, &start, &grads);
    assert!(one == cpu_run(&pool(3), &shapes, &start, &grads), "1 and 3 threads differ");
    let mut oracle =
        AdafactorOracle::new(Adafactor::default().to_oracle(), shapes.clone(), DType::F32.to_oracle());
    let mut want = start.clone();
    for g in &grads {
        oracle.step(&mut want, g);
    }
    assert_close("cpu", &one[0], &want[0], Tolerance::Close { rtol: 2e-5, atol: 2e-6 });
}
