//! The checks every elementwise family added after Adam, SGD and Adagrad goes through, on the
//! GPU and the CPU backend, each against the f64 oracle (`TorchState`): f32 trajectories,
//! 16-bit storage step by step, a state dtype other than the parameter's, master weights,
//! two groups, capturable mode, global clipping, stochastic and Kahan rounding (the GPU
//! and the CPU store the same bits), and checkpoints from the GPU to the CPU.
//!
//! Used by the `adan`, `ademamix`, `adopt`, `lamb` and `lion` areas; each passes its own
//! configurations.

pub mod checkpoint;

use crate::common::{assert_close, ctx, download, Rng, Tolerance};
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut, HostTensor};
use wgpu_optim::{
    Algorithm, DType, Error, GpuContext, GradClip, Optimizer, ParamGroup, Rounding, StateStorage, Tensor,
};
use wgpu_optim_testkit::oracle::{clip_grad_norm, Storage, ToOracle, TorchState};

/// Around the GPU's workgroup size and its four-wide loads, with tails.
pub const SIZES: [usize; 5] = [1, 3, 255, 257, 1001];

pub fn host(values: &[f64], dtype: DType) -> HostTensor {
    HostTensor::from_f64(dtype, values).unwrap_or_else(|e| panic!("{e}"))
}

pub fn slices(tensors: &[HostTensor]) -> Vec<HostSlice<'_>> {
    tensors.iter().map(HostTensor::as_slice).collect()
}

pub fn slices_mut(tensors: &mut [HostTensor]) -> Vec<HostSliceMut<'_>> {
    tensors.iter_mut().map(HostTensor::as_mut_slice).collect()
}

/// `steps` f32 steps on the GPU and on the CPU backend from the same start with the same
/// gradients, each compared with the oracle's f64 trajectory at the end.
pub fn f32_trajectories_follow_the_oracle(algorithm: Algorithm, steps: usize, seed: u64) {
    let ctx = ctx();
    let mut rng = Rng::new(seed);
    let start: Vec<Vec<f64>> = SIZES.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grads: Vec<Vec<Vec<f64>>> =
        (0..steps).map(|_| SIZES.iter().map(|&n| rng.vec(n, 1.0)).collect()).collect();
    let mut want = start.clone();
    let mut oracles: Vec<TorchState> =
        SIZES.iter().map(|&n| TorchState::new(algorithm.to_oracle(), n)).collect();
    for g in &grads {
        for ((p, oracle), g) in want.iter_mut().zip(&mut oracles).zip(g) {
            oracle.step(p, g);
        }
    }
    let kinds = algorithm.state_kinds();

    let params: Vec<Tensor> = start.iter().map(|p| ctx.upload("param", p, DType::F32)).collect();
    let grad_tensors: Vec<Tensor> = SIZES.iter().map(|&n| ctx.zeros("grad", n as u64, DType::F32)).collect();
    let mut gpu = Optimizer::builder().build(&ctx, algorithm, &params).unwrap();
    let mut cpu_params: Vec<HostTensor> = start.iter().map(|p| host(p, DType::F32)).collect();
    let mut cpu = CpuOptimizer::builder().build(algorithm, &slices(&cpu_params)).unwrap();
    for g in &grads {
        for (t, g) in grad_tensors.iter().zip(g) {
            ctx.write(t, g).unwrap();
        }
        gpu.step(&grad_tensors).unwrap();
        let host_grads: Vec<HostTensor> = g.iter().map(|g| host(g, DType::F32)).collect();
        cpu.step(&mut slices_mut(&mut cpu_params), &slices(&host_grads)).unwrap();
    }
    for (i, n) in SIZES.iter().enumerate() {
        let what = format!("{algorithm:?} param[{i}] (n = {n})");
        assert_close(&format!("GPU {what}"), &download(&ctx, &params[i]), &want[i], Tolerance::F32);
        assert_close(&format!("CPU {what}"), &cpu_params[i].to_f64(), &want[i], Tolerance::F32);
        for (kind, want) in kinds.iter().zip(oracles[i].tensors()) {
            let gpu_state = download(&ctx, gpu.state(i, *kind).unwrap().and_then(|s| s.dense()).unwrap());
            assert_close(&format!("GPU {what} {kind:?}"), &gpu_state, &want, Tolerance::F32);
            let cpu_state = cpu.state(i, *kind).and_then(|s| s.dense()).unwrap().to_f64();
            assert_close(&format!("CPU {what} {kind:?}"), &cpu_state, &want, Tolerance::F32);
        }
    }
}

/// A parameter, gradient and state dtype combination.
#[derive(Clone, Copy, Debug)]
pub struct Mix {
    pub param: DType,
    pub grad: DType,
    pub state: DType,
}

/// 16-bit parameters and state, and state dtypes other than the parameter's.
pub const MIXES: [Mix; 5] = [
    Mix { param: DType::F16, grad: DType::F16, state: DType::F16 },
    Mix { param: DType::BF16, grad: DType::BF16, state: DType::BF16 },
    Mix { param: DType::F16, grad: DType::F16, state: DType::F32 },
    Mix { param: DType::BF16, grad: DType::F32, state: DType::F32 },
    Mix { param: DType::F32, grad: DType::BF16, state: DType::F16 },
];

/// Redraws gradient elements the family's oracle cannot decide within rounding (Lion: a
/// direction `c` near 0, whose sign rounding may flip), from the state tensors before the
/// step (both backends') and the gradient as stored; the identity for most families.
pub type Untie<'a> = &'a dyn Fn(&[&[Vec<f64>]], &mut [f64], DType);

/// `steps` steps of `algorithm` on parameters of `mix`, on the GPU (`ctx`, native or packed
/// f16) and the CPU backend, each step checked against the oracle resumed from what that
/// backend stored before it, so 1-ulp differences do not compound.
pub fn mixes_match_the_oracle_step_by_step(
    ctx: &GpuContext,
    algorithm: Algorithm,
    untie: Untie<'_>,
    steps: u64,
    seed: u64,
) {
    let kinds = algorithm.state_kinds();
    for (m, mix) in MIXES.into_iter().enumerate() {
        let mut rng = Rng::new(seed + m as u64);
        let start: Vec<Vec<f64>> = SIZES.iter().map(|&n| rng.vec(n, 1.0)).collect();
        let params: Vec<Tensor> = start.iter().map(|p| ctx.upload("param", p, mix.param)).collect();
        let grads: Vec<Tensor> = SIZES.iter().map(|&n| ctx.zeros("grad", n as u64, mix.grad)).collect();
        let mut gpu = Optimizer::builder()
            .state_storage(StateStorage::Dtype(mix.state))
            .build(ctx, algorithm, &params)
            .unwrap();
        let mut cpu_params: Vec<HostTensor> = start.iter().map(|p| host(p, mix.param)).collect();
        let options = CpuOptimizer::builder().state_storage(StateStorage::Dtype(mix.state));
        let mut cpu = options.build(algorithm, &slices(&cpu_params)).unwrap();
        for i in 0..SIZES.len() {
            for kind in kinds {
                assert_eq!(
                    gpu.state(i, *kind).unwrap().and_then(|s| s.dense()).unwrap().dtype,
                    mix.state,
                    "{kind:?} of param[{i}]"
                );
                assert_eq!(
                    cpu.state(i, *kind).and_then(|s| s.dense()).unwrap().dtype(),
                    mix.state,
                    "{kind:?} of param[{i}]"
                );
            }
        }
        for t in 1..=steps {
            // What each backend holds before the step, and the gradients as stored.
            type Before = (Vec<f64>, Vec<Vec<f64>>);
            let gpu_before: Vec<Before> = (0..SIZES.len())
                .map(|i| {
                    let state = kinds
                        .iter()
                        .map(|k| download(ctx, gpu.state(i, *k).unwrap().and_then(|s| s.dense()).unwrap()))
                        .collect();
                    (download(ctx, &params[i]), state)
                })
                .collect();
            let cpu_before: Vec<Before> = (0..SIZES.len())
                .map(|i| {
                    let state = kinds
                        .iter()
                        .map(|k| cpu.state(i, *k).and_then(|s| s.dense()).unwrap().to_f64())
                        .collect();
                    (cpu_params[i].to_f64(), state)
                })
                .collect();
            let mut g: Vec<Vec<f64>> = SIZES.iter().map(|&n| rng.vec(n, 1.0)).collect();
            for (i, g) in g.iter_mut().enumerate() {
                untie(&[&gpu_before[i].1, &cpu_before[i].1], g, mix.grad);
            }
            for (tensor, g) in grads.iter().zip(&g) {
                ctx.write(tensor, g).unwrap();
            }
            let stored_grads: Vec<Vec<f64>> = grads.iter().map(|g| download(ctx, g)).collect();
            gpu.step(&grads).unwrap();
            let host_grads: Vec<HostTensor> = g.iter().map(|g| host(g, mix.grad)).collect();
            cpu.step(&mut slices_mut(&mut cpu_params), &slices(&host_grads)).unwrap();
            for (backend, before) in [("GPU", gpu_before), ("CPU", cpu_before)] {
                for (i, (mut p, state)) in before.into_iter().enumerate() {
                    let mut oracle = TorchState::resume(algorithm.to_oracle(), t - 1, &state)
                        .storing(mix.param.to_oracle(), mix.state.to_oracle());
                    oracle.step(&mut p, &stored_grads[i]);
                    let what = format!("{backend} {algorithm:?} {mix:?} step {t} param[{i}]");
                    let got = match backend {
                        "GPU" => download(ctx, &params[i]),
                        _ => cpu_params[i].to_f64(),
                    };
                    assert_close(&what, &got, &p, Tolerance::stored(mix.param));
                    for (k, want) in oracle.tensors().iter().enumerate() {
                        let got = match backend {
                            "GPU" => download(
                                ctx,
                                gpu.state(i, kinds[k]).unwrap().and_then(|s| s.dense()).unwrap(),
                            ),
                            _ => cpu.state(i, kinds[k]).and_then(|s| s.dense()).unwrap().to_f64(),
                        };
                        let what = format!("{what} {:?}", kinds[k]);
                        assert_close(&what, &got, want, Tolerance::stored(mix.state));
                    }
                }
            }
        }
    }
}

/// f32 masters of 16-bit model parameters: the masters follow the oracle in f32 and the
/// model holds each master rounded once.
pub fn master_weights_follow_the_oracle(algorithm: Algorithm, seed: u64) {
    let mut rng = Rng::new(seed);
    for ctx in [ctx().with_packed_f16(false), ctx().with_packed_f16(true)] {
        for dtype in [DType::F16, DType::BF16] {
            let n = 777;
            let model = ctx.upload("model", &rng.vec(n, 1.0), dtype);
            let options = Optimizer::builder().master_weights(true);
            let mut optimizer = options.build(&ctx, algorithm, std::slice::from_ref(&model)).unwrap();
            let master = optimizer.params()[0].clone();
            assert_eq!(master.dtype, DType::F32);
            let mut p = download(&ctx, &model);
            let mut oracle = TorchState::new(algorithm.to_oracle(), n);
            let grad = ctx.zeros("grad", n as u64, DType::F32);
            for _ in 0..8 {
                let g = rng.vec(n, 1.0);
                ctx.write(&grad, &g).unwrap();
                optimizer.step(std::slice::from_ref(&grad)).unwrap();
                oracle.step(&mut p, &g);
            }
            let masters = download(&ctx, &master);
            assert_close(&format!("{algorithm:?} {dtype:?} masters"), &masters, &p, Tolerance::F32);
            for (kind, want) in algorithm.state_kinds().iter().zip(oracle.tensors()) {
                let state = optimizer.state(0, *kind).unwrap().and_then(|s| s.dense()).unwrap();
                assert_eq!(state.dtype, DType::F32, "{kind:?}");
                assert_close(&format!("{dtype:?} {kind:?}"), &download(&ctx, state), &want, Tolerance::F32);
            }
            let rounded: Vec<f64> = masters.iter().map(|m| dtype.to_oracle().round(*m)).collect();
            let what = format!("{algorithm:?} {dtype:?} model copy");
            assert_close(&what, &download(&ctx, &model), &rounded, Tolerance::exact(dtype));
        }
    }
}

/// Two groups with different hyperparameters in one optimizer, each following its own
/// oracle.
pub fn two_groups_follow_their_own_oracles(first: Algorithm, second: Algorithm, seed: u64) {
    let ctx = ctx();
    let mut rng = Rng::new(seed);
    let mut p: Vec<Vec<f64>> = SIZES.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let params: Vec<Tensor> = p.iter().map(|v| ctx.upload("param", v, DType::F32)).collect();
    let groups = vec![ParamGroup::new(first, &params[..2]), ParamGroup::new(second, &params[2..])];
    let mut optimizer = Optimizer::builder().build_groups(&ctx, groups).unwrap();
    let configs: Vec<Algorithm> = (0..SIZES.len()).map(|i| if i < 2 { first } else { second }).collect();
    let mut oracles: Vec<TorchState> =
        configs.iter().zip(SIZES).map(|(a, n)| TorchState::new((*a).to_oracle(), n)).collect();
    let grads: Vec<Tensor> = SIZES.iter().map(|&n| ctx.zeros("grad", n as u64, DType::F32)).collect();
    for _ in 0..6 {
        for (i, g) in grads.iter().enumerate() {
            let values = rng.vec(SIZES[i], 1.0);
            ctx.write(g, &values).unwrap();
            oracles[i].step(&mut p[i], &values);
        }
        optimizer.step(&grads).unwrap();
    }
    for (i, param) in params.iter().enumerate() {
        let what = format!("{:?} param[{i}]", configs[i]);
        assert_close(&what, &download(&ctx, param), &p[i], Tolerance::F32);
        for (kind, want) in configs[i].state_kinds().iter().zip(oracles[i].tensors()) {
            let got = download(&ctx, optimizer.state(i, *kind).unwrap().and_then(|s| s.dense()).unwrap());
            assert_close(&format!("{what} {kind:?}"), &got, &want, Tolerance::F32);
        }
    }
}

/// Capturable mode from step `start`: the step and the learning rate come from the device,
/// where a schedule writes the rate each step (`lr_at(t)`), and the oracle runs the same
/// schedule. `tolerance` allows for the step-dependent values computed in f32 on the device.
pub fn capturable_follows_the_oracle(
    algorithm: Algorithm,
    start: u64,
    steps: u64,
    lr_at: impl Fn(u64) -> f64,
    tolerance: Tolerance,
    seed: u64,
) {
    let ctx = ctx();
    let mut rng = Rng::new(seed);
    let n = 513;
    let mut p = rng.vec(n, 1.0);
    let param = ctx.upload("param", &p, DType::F32);
    let grad = ctx.zeros("grad", n as u64, DType::F32);
    let options = Optimizer::builder().capturable(true);
    let mut optimizer = options.build(&ctx, algorithm, std::slice::from_ref(&param)).unwrap();
    optimizer.set_step_count(start).unwrap();
    let lr = optimizer.lr_tensor(0).expect("a device learning rate");
    let zeros = vec![vec![0.0; n]; algorithm.state_kinds().len()];
    let mut oracle = TorchState::resume(algorithm.to_oracle(), start, &zeros);
    for t in start + 1..=start + steps {
        // A scheduler writes the rate on the device; the optimizer's own value is stale.
        let rate = lr_at(t);
        ctx.write(&lr, &[rate]).unwrap();
        oracle.set_algorithm((algorithm.with_lr(f64::from(rate as f32))).to_oracle());
        let g = rng.vec(n, 1.0);
        ctx.write(&grad, &g).unwrap();
        optimizer.step(std::slice::from_ref(&grad)).unwrap();
        oracle.step(&mut p, &g);
    }
    assert_eq!(optimizer.read_device_step().unwrap(), start + steps);
    let what = format!("capturable {algorithm:?} from step {start}");
    assert_close(&what, &download(&ctx, &param), &p, tolerance);
    for (kind, want) in algorithm.state_kinds().iter().zip(oracle.tensors()) {
        let got = download(&ctx, optimizer.state(0, *kind).unwrap().and_then(|s| s.dense()).unwrap());
        assert_close(&format!("{what} {kind:?}"), &got, &want, tolerance);
    }
}

/// Global L2 clipping over every tensor, on the GPU and the CPU backend: the norm and the
/// clipped trajectory against `clip_grad_norm_` and the oracle.
pub fn clipped_steps_follow_the_oracle(algorithm: Algorithm, seed: u64) {
    let ctx = ctx();
    let mut rng = Rng::new(seed);
    let clip = GradClip::l2(1.0);
    let mut p: Vec<Vec<f64>> = SIZES.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let params: Vec<Tensor> = p.iter().map(|v| ctx.upload("param", v, DType::F32)).collect();
    let mut gpu = Optimizer::builder().grad_clip(clip).build(&ctx, algorithm, &params).unwrap();
    let mut cpu_params: Vec<HostTensor> = p.iter().map(|v| host(v, DType::F32)).collect();
    let mut cpu = CpuOptimizer::builder().grad_clip(clip).build(algorithm, &slices(&cpu_params)).unwrap();
    let mut oracles: Vec<TorchState> =
        SIZES.iter().map(|&n| TorchState::new(algorithm.to_oracle(), n)).collect();
    for step in 0..4 {
        let mut g: Vec<Vec<f64>> = SIZES.iter().map(|&n| rng.vec(n, 2.0)).collect();
        let grads: Vec<Tensor> = g.iter().map(|v| ctx.upload("grad", v, DType::F32)).collect();
        gpu.step(&grads).unwrap();
        let host_grads: Vec<HostTensor> = g.iter().map(|v| host(v, DType::F32)).collect();
        cpu.step(&mut slices_mut(&mut cpu_params), &slices(&host_grads)).unwrap();
        let want_norm = clip_grad_norm(&mut g, &clip.to_oracle());
        assert!(want_norm > 10.0, "the case clips (norm {want_norm})");
        for ((p, oracle), g) in p.iter_mut().zip(&mut oracles).zip(&g) {
            oracle.step(p, g);
        }
        for (backend, norm) in [("GPU", gpu.grad_norm().unwrap()), ("CPU", cpu.grad_norm().unwrap())] {
            let relative = (norm - want_norm).abs() / want_norm;
            assert!(relative < 1e-5, "{backend} step {step}: norm {norm}, oracle {want_norm}");
        }
        for i in 0..SIZES.len() {
            let what = format!("{algorithm:?} clipped step {step} param[{i}]");
            assert_close(&format!("GPU {what}"), &download(&ctx, &params[i]), &p[i], Tolerance::F32);
            assert_close(&format!("CPU {what}"), &cpu_params[i].to_f64(), &p[i], Tolerance::F32);
        }
    }
}

/// Panics naming the first few indices where `got` and `want` differ in their bits.
#[track_caller]
pub fn assert_bits_eq(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let differ = |i: &usize| got[*i].to_bits() != want[*i].to_bits();
    let count = (0..got.len()).filter(differ).count();
    let first: Vec<String> = (0..got.len())
        .filter(differ)
        .take(5)
        .map(|i| format!("[{i}] got {:e} want {:e}", got[i], want[i]))
        .collect();
    assert!(first.is_empty(), "{what}: {count} of {} differ, first {first:?}", got.len());
}

/// The identity [`Untie`].
pub fn no_ties(_: &[&[Vec<f64>]], _: &mut [f64], _: DType) {}

/// Stochastic rounding (parameters, and parameters and state) and Kahan compensation of
/// 16-bit parameters: the GPU (native and packed f16, capturable or not) stores the same
/// bits as the CPU backend. `algorithm` and `data` must keep every f32 operation exact
/// (powers of two, short mantissas), so that fused and unfused arithmetic agree; the test
/// checks that the stores are not nearest rounding in disguise.
pub fn rounding_stores_the_same_bits_on_the_gpu_and_the_cpu(
    algorithm: Algorithm,
    start: &[Vec<f64>],
    grads: &[Vec<Vec<f64>>],
) {
    let kinds = algorithm.state_kinds();
    for (dtype, packed) in [(DType::BF16, false), (DType::F16, false), (DType::F16, true)] {
        let ctx = ctx().with_packed_f16(packed);
        let cpu_run = |rounding: Rounding| {
            let mut params: Vec<HostTensor> = start.iter().map(|p| host(p, dtype)).collect();
            let mut opt =
                CpuOptimizer::builder().rounding(rounding).build(algorithm, &slices(&params)).unwrap();
            for g in grads {
                let g: Vec<HostTensor> = g.iter().map(|g| host(g, DType::F32)).collect();
                opt.step(&mut slices_mut(&mut params), &slices(&g)).unwrap();
            }
            let state: Vec<Vec<f64>> = (0..start.len())
                .flat_map(|i| kinds.iter().map(move |k| (i, *k)))
                .map(|(i, k)| opt.state(i, k).and_then(|s| s.dense()).unwrap().to_f64())
                .collect();
            (params.iter().map(HostTensor::to_f64).collect::<Vec<_>>(), state)
        };
        for rounding in [
            Rounding::Stochastic { seed: 0x5eed_0000_0001, state: true },
            Rounding::Stochastic { seed: 9, state: false },
            Rounding::Kahan,
        ] {
            let (cpu_params, cpu_state) = cpu_run(rounding);
            for capturable in [false, true] {
                let params: Vec<Tensor> = start.iter().map(|p| ctx.upload("param", p, dtype)).collect();
                let options = Optimizer::builder().rounding(rounding).capturable(capturable);
                let mut opt = options.build(&ctx, algorithm, &params).unwrap();
                for g in grads {
                    let g: Vec<Tensor> = g.iter().map(|g| ctx.upload("grad", g, DType::F32)).collect();
                    opt.step(&g).unwrap();
                }
                let what =
                    format!("{algorithm:?} {dtype:?} (packed {packed}) {rounding:?} capturable {capturable}");
                for (i, p) in params.iter().enumerate() {
                    assert_bits_eq(&format!("{what}: params[{i}]"), &download(&ctx, p), &cpu_params[i]);
                }
                let gpu_state: Vec<Vec<f64>> = (0..start.len())
                    .flat_map(|i| kinds.iter().map(move |k| (i, *k)))
                    .map(|(i, k)| download(&ctx, opt.state(i, k).unwrap().and_then(|s| s.dense()).unwrap()))
                    .collect();
                for (k, (got, want)) in gpu_state.iter().zip(&cpu_state).enumerate() {
                    assert_bits_eq(&format!("{what}: state {k}"), got, want);
                }
            }
            let (nearest, _) = cpu_run(Rounding::NearestEven);
            let differing =
                nearest.iter().flatten().zip(cpu_params.iter().flatten()).filter(|(a, b)| a != b).count();
            assert!(differing > 20, "{dtype:?} {rounding:?}: only {differing} elements differ from nearest");
        }
    }
}

/// A GPU checkpoint (f32, and bf16 state) loads into the CPU backend, which then holds the
/// GPU's state exactly and saves the same tensors; one more step on each follows the
/// oracle resumed from that state.
pub fn a_gpu_checkpoint_continues_on_the_cpu(algorithm: Algorithm, seed: u64) {
    let ctx = ctx();
    let kinds = algorithm.state_kinds();
    for state_dtype in [None, Some(DType::BF16)] {
        let mut rng = Rng::new(seed);
        let start: Vec<Vec<f64>> = SIZES.iter().map(|&n| rng.vec(n, 1.0)).collect();
        let params: Vec<Tensor> = start.iter().map(|p| ctx.upload("param", p, DType::F32)).collect();
        let mut gpu = Optimizer::builder()
            .state_storage(state_dtype.map_or(StateStorage::ParamDtype, StateStorage::Dtype))
            .build(&ctx, algorithm, &params)
            .unwrap();
        for _ in 0..3 {
            let g: Vec<Tensor> =
                SIZES.iter().map(|&n| ctx.upload("grad", &rng.vec(n, 1.0), DType::F32)).collect();
            gpu.step(&g).unwrap();
        }
        let bytes = gpu.save_to_bytes().unwrap();
        let now: Vec<Vec<f64>> = params.iter().map(|p| download(&ctx, p)).collect();
        let mut cpu_params: Vec<HostTensor> = now.iter().map(|p| host(p, DType::F32)).collect();
        let options = CpuOptimizer::builder()
            .state_storage(state_dtype.map_or(StateStorage::ParamDtype, StateStorage::Dtype));
        let mut cpu = options.build(algorithm, &slices(&cpu_params)).unwrap();
        cpu.load_from_bytes(&bytes).unwrap_or_else(|e| panic!("{algorithm:?}: {e}"));
        assert_eq!(cpu.step_count(), 3);
        let stored = state_dtype.unwrap_or(DType::F32);
        let mut before = Vec::new();
        for i in 0..SIZES.len() {
            let state: Vec<Vec<f64>> =
                kinds.iter().map(|k| cpu.state(i, *k).and_then(|s| s.dense()).unwrap().to_f64()).collect();
            for (k, kind) in kinds.iter().enumerate() {
                let gpu_state = download(&ctx, gpu.state(i, *kind).unwrap().and_then(|s| s.dense()).unwrap());
                assert_bits_eq(&format!("{algorithm:?} {kind:?}[{i}] on the CPU"), &state[k], &gpu_state);
            }
            before.push(state);
        }
        let cpu_bytes = cpu.save_to_bytes().unwrap();
        assert_eq!(
            wgpu_optim_testkit::checkpoint::canonical(&cpu_bytes),
            wgpu_optim_testkit::checkpoint::canonical(&bytes),
            "{algorithm:?}: the CPU saves what it loaded"
        );
        let g: Vec<Vec<f64>> = SIZES.iter().map(|&n| rng.vec(n, 1.0)).collect();
        let host_grads: Vec<HostTensor> = g.iter().map(|g| host(g, DType::F32)).collect();
        cpu.step(&mut slices_mut(&mut cpu_params), &slices(&host_grads)).unwrap();
        for i in 0..SIZES.len() {
            let mut p = now[i].clone();
            let mut oracle = TorchState::resume(algorithm.to_oracle(), 3, &before[i])
                .storing(DType::F32.to_oracle(), stored.to_oracle());
            oracle.step(&mut p, &g[i]);
            let what = format!("{algorithm:?} state {stored:?} param[{i}] after the load");
            assert_close(&what, &cpu_params[i].to_f64(), &p, Tolerance::F32);
            for (kind, want) in kinds.iter().zip(oracle.tensors()) {
                let got = cpu.state(i, *kind).and_then(|s| s.dense()).unwrap().to_f64();
                assert_close(&format!("{what} {kind:?}"), &got, &want, Tolerance::stored(stored));
            }
        }
    }
}

/// A checkpoint of `saved` loaded into an optimizer of `other` (another class) is refused
/// on both backends, naming both classes, and changes nothing.
pub fn a_checkpoint_of_another_algorithm_is_refused(saved: Algorithm, other: Algorithm) {
    let ctx = ctx();
    let mut rng = Rng::new(3);
    let values: Vec<Vec<f64>> = SIZES.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let params: Vec<Tensor> = values.iter().map(|p| ctx.upload("param", p, DType::F32)).collect();
    let grads: Vec<Tensor> = values.iter().map(|p| ctx.upload("grad", p, DType::F32)).collect();
    let mut source = Optimizer::builder().build(&ctx, saved, &params).unwrap();
    source.step(&grads).unwrap();
    let bytes = source.save_to_bytes().unwrap();
    let check = |err: Error, backend: &str| match err {
        Error::BadFile { problem, .. } => {
            assert!(problem.contains(saved.name()) && problem.contains(other.name()), "{backend}: {problem}");
        }
        other => panic!("{backend}: expected BadFile, got {other:?}"),
    };

    let target_params: Vec<Tensor> = values.iter().map(|p| ctx.upload("param", p, DType::F32)).collect();
    let mut gpu = Optimizer::builder().build(&ctx, other, &target_params).unwrap();
    gpu.step(&grads).unwrap();
    let before = gpu.save_to_bytes().unwrap();
    check(gpu.load_from_bytes(&bytes).expect_err("another algorithm"), "GPU");
    assert_eq!(gpu.save_to_bytes().unwrap(), before, "a refused load changed the GPU optimizer");
    assert_eq!(gpu.group_algorithm(0), Some(&other));

    let cpu_params: Vec<HostTensor> = values.iter().map(|p| host(p, DType::F32)).collect();
    let mut cpu = CpuOptimizer::builder().build(other, &slices(&cpu_params)).unwrap();
    let before = cpu.save_to_bytes().unwrap();
    check(cpu.load_from_bytes(&bytes).expect_err("another algorithm"), "CPU");
    assert_eq!(cpu.save_to_bytes().unwrap(), before, "a refused load changed the CPU optimizer");
    assert_eq!(cpu.group_algorithm(0), Some(&other));
}

/// `bad` is refused by `validate`, by both backends' builders and by `set_group_algorithm`
/// as [`Error::BadHyperparameter`] naming `name`; the refused change leaves the optimizer,
/// its parameters and its state as they were.
pub fn a_bad_hyperparameter_is_refused_by_name(good: Algorithm, bad: Algorithm, name: &str) {
    let named = |err: Error, what: &str| match err {
        Error::BadHyperparameter { name: got, .. } => assert_eq!(got, name, "{what}"),
        other => panic!("{what}: expected BadHyperparameter naming {name}, got {other:?}"),
    };
    named(bad.validate().expect_err("validate"), "validate");
    let ctx = ctx();
    let values = vec![0.5, -0.25, 1.0];
    let param = ctx.upload("param", &values, DType::F32);
    named(
        Optimizer::builder().build(&ctx, bad, std::slice::from_ref(&param)).expect_err("GPU build"),
        "GPU build",
    );
    let cpu_param = host(&values, DType::F32);
    named(CpuOptimizer::builder().build(bad, &[cpu_param.as_slice()]).expect_err("CPU build"), "CPU build");

    let mut gpu = Optimizer::builder().build(&ctx, good, std::slice::from_ref(&param)).unwrap();
    let grad = ctx.upload("grad", &[0.5, 0.5, -0.5], DType::F32);
    gpu.step(std::slice::from_ref(&grad)).unwrap();
    let before = gpu.save_to_bytes().unwrap();
    let param_before = download(&ctx, &param);
    named(gpu.set_group_algorithm(0, bad).expect_err("set_group_algorithm"), "set_group_algorithm");
    assert_eq!(gpu.group_algorithm(0), Some(&good));
    assert_eq!(gpu.save_to_bytes().unwrap(), before, "the refused change changed the state");
    gpu.step(std::slice::from_ref(&grad)).unwrap();
    assert_ne!(download(&ctx, &param), param_before, "the optimizer still steps");

    let mut cpu = CpuOptimizer::builder().build(good, &[cpu_param.as_slice()]).unwrap();
    named(cpu.set_group_algorithm(0, bad).expect_err("CPU set_group_algorithm"), "CPU set_group_algorithm");
    assert_eq!(cpu.group_algorithm(0), Some(&good));
}

/// `Algorithm::to_json` and `from_json` round-trip the configuration exactly.
pub fn json_round_trips(algorithm: Algorithm) {
    let json = algorithm.to_json();
    assert_eq!(json.get("optimizer").and_then(|v| v.as_str()), Some(algorithm.name()), "{json:?}");
    assert_eq!(Algorithm::from_json(&json).unwrap(), algorithm, "{json:?}");
}
