//! RMSprop (PyTorch's `torch.optim.RMSprop`) on the GPU and on the CPU backend against the
//! f64 oracle (`oracle/src/rmsprop.rs`): plain, centered, momentum, maximize and
//! weight decay; f32, f16 and bf16 storage with the state in another dtype than the
//! parameter's; master weights; two groups with different hyperparameters; capturable mode
//! (the device's learning rate); global clipping; Kahan and stochastic rounding; checkpoints
//! from the GPU to the CPU and back; and the refusals of PyTorch's constructor.

use crate::common;

use common::{assert_close, ctx, download, Rng, Tolerance};
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut, HostTensor};
use wgpu_optim::{
    Adam, Algorithm, DType, Error, GpuContext, GradClip, NormType, Optimizer, ParamGroup, RmsProp, Rounding,
    StateKind, StateStorage, Tensor,
};
use wgpu_optim_testkit::checkpoint::canonical;
use wgpu_optim_testkit::oracle::{clip_grad_norm, Storage, ToOracle, TorchState};

/// Around the GPU's workgroup size, with vector-loop tails, and one CPU conversion block
/// and one element.
const SIZES: [usize; 5] = [1, 255, 256, 257, 1025];
const STEPS: u64 = 30;

/// Plain (PyTorch's defaults), centered, momentum, both, maximize with weight decay, and
/// `alpha` below 0.5 (ATen's other form of lerp for `grad_avg`). Weight decays are powers
/// of two, so `g + wd * p` is exact in f32 before its one rounding (see
/// `common::adam_switch_combinations`).
fn variants() -> Vec<Algorithm> {
    let base = RmsProp::default();
    vec![
        base.into(),
        RmsProp { centered: true, ..base }.into(),
        RmsProp { momentum: 0.9, ..base }.into(),
        RmsProp { centered: true, momentum: 0.9, eps: 1e-6, ..base }.into(),
        RmsProp { maximize: true, weight_decay: 0.015625, alpha: 0.9, ..base }.into(),
        RmsProp { centered: true, momentum: 0.5, maximize: true, weight_decay: 0.125, ..base }.into(),
        RmsProp { centered: true, alpha: 0.25, lr: 1e-3, ..base }.into(),
    ]
}

/// The tolerance of a state tensor stored in `dtype`. The momentum buffer sums terms
/// `g / avg` of magnitude up to about `1 / sqrt(1 - alpha)` (10 at the first step) that
/// cancel to values near 0: f32's rounding of those terms, not of the sum, bounds its error,
/// so its absolute tolerance is 1e-6 of the terms' size.
fn state_tolerance(kind: StateKind, dtype: DType) -> Tolerance {
    match (kind, dtype) {
        (StateKind::MomentumBuffer, DType::F32) => Tolerance::Close { rtol: 1e-5, atol: 1e-5 },
        (StateKind::MomentumBuffer, _) => Tolerance::Ulps { dtype, ulps: 1, abs: 1e-5 },
        _ => Tolerance::stored(dtype),
    }
}

fn host(values: &[f64], dtype: DType) -> HostTensor {
    HostTensor::from_f64(dtype, values).expect("a CPU storage type")
}

fn slices(tensors: &[HostTensor]) -> Vec<HostSlice<'_>> {
    tensors.iter().map(HostTensor::as_slice).collect()
}

fn slices_mut(tensors: &mut [HostTensor]) -> Vec<HostSliceMut<'_>> {
    tensors.iter_mut().map(HostTensor::as_mut_slice).collect()
}

#[test]
fn the_state_kept_is_pytorchs_in_its_state_dict_order() {
    let base = RmsProp::default();
    assert_eq!(Algorithm::from(base).state_kinds(), &[StateKind::SquareAvg]);
    let momentum = RmsProp { momentum: 0.9, ..base };
    assert_eq!(Algorithm::from(momentum).state_kinds(), &[StateKind::SquareAvg, StateKind::MomentumBuffer]);
    let centered = RmsProp { centered: true, ..base };
    assert_eq!(Algorithm::from(centered).state_kinds(), &[StateKind::SquareAvg, StateKind::GradAvg]);
    let both = RmsProp { centered: true, momentum: 0.9, ..base };
    assert_eq!(
        Algorithm::from(both).state_kinds(),
        &[StateKind::SquareAvg, StateKind::MomentumBuffer, StateKind::GradAvg]
    );
    assert_eq!(StateKind::SquareAvg.torch_name(), "square_avg");
    assert_eq!(StateKind::GradAvg.torch_name(), "grad_avg");
    assert_eq!(Algorithm::from(base).name(), "RMSprop");
    assert_eq!(
        (base.lr, base.alpha, base.eps, base.weight_decay, base.momentum, base.centered, base.maximize),
        (1e-2, 0.99, 1e-8, 0.0, 0.0, false, false)
    );
}

#[test]
fn every_variant_follows_the_oracle_for_30_steps_on_the_gpu() {
    let ctx = ctx();
    for (k, algorithm) in variants().into_iter().enumerate() {
        let mut rng = Rng::new(700 + k as u64);
        let mut want: Vec<Vec<f64>> = SIZES.iter().map(|&n| rng.vec(n, 1.0)).collect();
        let params: Vec<Tensor> = want.iter().map(|p| ctx.upload("param", p, DType::F32)).collect();
        let grads: Vec<Tensor> = SIZES.iter().map(|&n| ctx.zeros("grad", n as u64, DType::F32)).collect();
        let mut optimizer = Optimizer::builder().build(&ctx, algorithm, &params).unwrap();
        let mut oracles: Vec<TorchState> =
            SIZES.iter().map(|&n| TorchState::new(algorithm.to_oracle(), n)).collect();
        for _ in 0..STEPS {
            for ((g, grad), (p, oracle)) in grads.iter().zip(&SIZES).zip(want.iter_mut().zip(&mut oracles)) {
                let values = rng.vec(*grad, 1.0);
                ctx.write(g, &values).unwrap();
                oracle.step(p, &values);
            }
            optimizer.step(&grads).unwrap();
        }
        for (i, n) in SIZES.iter().enumerate() {
            let what = format!("GPU {algorithm:?} param[{i}] (n = {n})");
            assert_close(&what, &download(&ctx, &params[i]), &want[i], Tolerance::F32);
            for (kind, want) in algorithm.state_kinds().iter().zip(oracles[i].tensors()) {
                let got = download(&ctx, optimizer.state(i, *kind).unwrap().and_then(|s| s.dense()).unwrap());
                assert_close(&format!("{what} {kind:?}"), &got, &want, state_tolerance(*kind, DType::F32));
            }
        }
    }
}

#[test]
fn every_variant_follows_the_oracle_for_30_steps_on_the_cpu() {
    for (k, algorithm) in variants().into_iter().enumerate() {
        let mut rng = Rng::new(800 + k as u64);
        let mut want: Vec<Vec<f64>> = SIZES.iter().map(|&n| rng.vec(n, 1.0)).collect();
        let mut params: Vec<HostTensor> = want.iter().map(|p| host(p, DType::F32)).collect();
        let mut optimizer = CpuOptimizer::builder().build(algorithm, &slices(&params)).unwrap();
        let mut oracles: Vec<TorchState> =
            SIZES.iter().map(|&n| TorchState::new(algorithm.to_oracle(), n)).collect();
        for _ in 0..STEPS {
            let g: Vec<Vec<f64>> = SIZES.iter().map(|&n| rng.vec(n, 1.0)).collect();
            let grads: Vec<HostTensor> = g.iter().map(|g| host(g, DType::F32)).collect();
            optimizer.step(&mut slices_mut(&mut params), &slices(&grads)).unwrap();
            for ((p, oracle), g) in want.iter_mut().zip(&mut oracles).zip(&g) {
                oracle.step(p, g);
            }
        }
        assert_eq!(optimizer.step_count(), STEPS);
        for (i, n) in SIZES.iter().enumerate() {
            let what = format!("CPU {algorithm:?} param[{i}] (n = {n})");
            assert_close(&what, &params[i].to_f64(), &want[i], Tolerance::F32);
            for (kind, want) in algorithm.state_kinds().iter().zip(oracles[i].tensors()) {
                let got = optimizer.state(i, *kind).and_then(|s| s.dense()).unwrap().to_f64();
                assert_close(&format!("{what} {kind:?}"), &got, &want, state_tolerance(*kind, DType::F32));
            }
        }
    }
}

/// A parameter, gradient and state dtype combination.
#[derive(Clone, Copy, Debug)]
struct Mix {
    param: DType,
    grad: DType,
    state: DType,
}

/// f16 throughout; 16-bit parameters with f32 state; bf16 throughout; f32 parameters with
/// 16-bit gradients and f16 state.
const MIXES: [Mix; 5] = [
    Mix { param: DType::F16, grad: DType::F16, state: DType::F16 },
    Mix { param: DType::F16, grad: DType::F16, state: DType::F32 },
    Mix { param: DType::BF16, grad: DType::BF16, state: DType::F32 },
    Mix { param: DType::BF16, grad: DType::BF16, state: DType::BF16 },
    Mix { param: DType::F32, grad: DType::BF16, state: DType::F16 },
];

/// The variants of the storage tests: every state slot in use, and the plain form.
fn storage_variants() -> [Algorithm; 3] {
    [
        RmsProp::default().into(),
        RmsProp { centered: true, momentum: 0.9, weight_decay: 0.015625, ..RmsProp::default() }.into(),
        RmsProp { momentum: 0.9, maximize: true, alpha: 0.9, ..RmsProp::default() }.into(),
    ]
}

/// Lengths around the workgroup and conversion block sizes, odd ones included.
const LENGTHS: [usize; 4] = [1, 3, 257, 1025];

/// Steps `steps` times on the GPU, checking each step against the oracle resumed from what
/// the GPU stored before it (so 1-ulp differences do not compound).
fn gpu_steps(ctx: &GpuContext, algorithm: Algorithm, mix: Mix, steps: u64, seed: u64) {
    let mut rng = Rng::new(seed);
    let params: Vec<Tensor> =
        LENGTHS.iter().map(|&n| ctx.upload("param", &rng.vec(n, 1.0), mix.param)).collect();
    let grads: Vec<Tensor> = LENGTHS.iter().map(|&n| ctx.zeros("grad", n as u64, mix.grad)).collect();
    let mut optimizer = Optimizer::builder()
        .state_storage(StateStorage::Dtype(mix.state))
        .build(ctx, algorithm, &params)
        .unwrap();
    let kinds = algorithm.state_kinds();
    for t in 1..=steps {
        for (g, &n) in grads.iter().zip(&LENGTHS) {
            ctx.write(g, &rng.vec(n, 1.0)).unwrap();
        }
        type Before = (Vec<f64>, Vec<Vec<f64>>, Vec<f64>);
        let before: Vec<Before> = (0..LENGTHS.len())
            .map(|i| {
                let state = kinds
                    .iter()
                    .map(|k| download(ctx, optimizer.state(i, *k).unwrap().and_then(|s| s.dense()).unwrap()))
                    .collect();
                (download(ctx, &params[i]), state, download(ctx, &grads[i]))
            })
            .collect();
        optimizer.step(&grads).unwrap();
        for (i, (mut p, state, g)) in before.into_iter().enumerate() {
            for k in kinds {
                assert_eq!(
                    optimizer.state(i, *k).unwrap().and_then(|s| s.dense()).unwrap().dtype,
                    mix.state,
                    "{k:?}"
                );
            }
            let mut oracle = TorchState::resume(algorithm.to_oracle(), t - 1, &state)
                .storing(mix.param.to_oracle(), mix.state.to_oracle());
            oracle.step(&mut p, &g);
            let what = format!("GPU {algorithm:?} {mix:?} step {t} param[{i}]");
            assert_close(&what, &download(ctx, &params[i]), &p, Tolerance::stored(mix.param));
            for (kind, want) in kinds.iter().zip(oracle.tensors()) {
                let got = download(ctx, optimizer.state(i, *kind).unwrap().and_then(|s| s.dense()).unwrap());
                assert_close(&format!("{what} {kind:?}"), &got, &want, state_tolerance(*kind, mix.state));
            }
        }
    }
}

#[test]
fn f16_and_bf16_storage_with_state_in_another_dtype_match_the_oracle_on_the_gpu() {
    let mut contexts = vec![ctx().with_packed_f16(true)];
    let native = ctx().with_packed_f16(false);
    if common::has_feature_unless_gl(&native, wgpu::Features::SHADER_F16, "SHADER_F16") {
        contexts.push(native);
    }
    for (c, ctx) in contexts.iter().enumerate() {
        for (a, algorithm) in storage_variants().into_iter().enumerate() {
            for (m, mix) in MIXES.into_iter().enumerate() {
                gpu_steps(ctx, algorithm, mix, 3, (1000 + 100 * c + 10 * a + m) as u64);
            }
        }
    }
}

#[test]
fn f16_and_bf16_storage_with_state_in_another_dtype_match_the_oracle_on_the_cpu() {
    for (a, algorithm) in storage_variants().into_iter().enumerate() {
        for (m, mix) in MIXES.into_iter().enumerate() {
            let mut rng = Rng::new((2000 + 10 * a + m) as u64);
            let mut params: Vec<HostTensor> =
                LENGTHS.iter().map(|&n| host(&rng.vec(n, 1.0), mix.param)).collect();
            let options = CpuOptimizer::builder().state_storage(StateStorage::Dtype(mix.state));
            let mut optimizer = options.build(algorithm, &slices(&params)).unwrap();
            let kinds = algorithm.state_kinds();
            for t in 1..=3 {
                let grads: Vec<HostTensor> =
                    LENGTHS.iter().map(|&n| host(&rng.vec(n, 1.0), mix.grad)).collect();
                type Before = (Vec<f64>, Vec<Vec<f64>>);
                let before: Vec<Before> = (0..LENGTHS.len())
                    .map(|i| {
                        let state = kinds
                            .iter()
                            .map(|k| optimizer.state(i, *k).and_then(|s| s.dense()).unwrap().to_f64())
                            .collect();
                        (params[i].to_f64(), state)
                    })
                    .collect();
                optimizer.step(&mut slices_mut(&mut params), &slices(&grads)).unwrap();
                for (i, (mut p, state)) in before.into_iter().enumerate() {
                    let mut oracle = TorchState::resume(algorithm.to_oracle(), t - 1, &state)
                        .storing(mix.param.to_oracle(), mix.state.to_oracle());
                    oracle.step(&mut p, &grads[i].to_f64());
                    let what = format!("CPU {algorithm:?} {mix:?} step {t} param[{i}]");
                    assert_close(&what, &params[i].to_f64(), &p, Tolerance::stored(mix.param));
                    for (kind, want) in kinds.iter().zip(oracle.tensors()) {
                        let got = optimizer.state(i, *kind).and_then(|s| s.dense()).unwrap();
                        assert_eq!(got.dtype(), mix.state, "{what} {kind:?}");
                        assert_close(
                            &format!("{what} {kind:?}"),
                            &got.to_f64(),
                            &want,
                            state_tolerance(*kind, mix.state),
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn master_weights_update_f32_masters_and_write_the_model_copy() {
    let mut rng = Rng::new(30);
    let ctx = ctx();
    for dtype in [DType::F16, DType::BF16] {
        let n = 777;
        let model = ctx.upload("model", &rng.vec(n, 1.0), dtype);
        let algorithm: Algorithm =
            RmsProp { lr: 1e-3, centered: true, momentum: 0.9, ..RmsProp::default() }.into();
        let mut optimizer = Optimizer::builder()
            .master_weights(true)
            .build(&ctx, algorithm, std::slice::from_ref(&model))
            .unwrap();
        let master = optimizer.params()[0].clone();
        assert_eq!(master.dtype, DType::F32);
        assert_eq!(
            optimizer.state(0, StateKind::GradAvg).unwrap().and_then(|s| s.dense()).unwrap().dtype,
            DType::F32
        );
        let mut p = download(&ctx, &model);
        let mut oracle =
            TorchState::new(algorithm.to_oracle(), n).storing(DType::F32.to_oracle(), DType::F32.to_oracle());
        let grad = ctx.zeros("grad", n as u64, DType::F32);
        for _ in 0..10 {
            let g = rng.vec(n, 1e-3);
            ctx.write(&grad, &g).unwrap();
            optimizer.step(std::slice::from_ref(&grad)).unwrap();
            oracle.step(&mut p, &g);
        }
        let masters = download(&ctx, &master);
        assert_close(&format!("{dtype:?} masters"), &masters, &p, Tolerance::F32);
        let rounded: Vec<f64> = masters.iter().map(|m| dtype.to_oracle().round(*m)).collect();
        assert_close(
            &format!("{dtype:?} model copy"),
            &download(&ctx, &model),
            &rounded,
            Tolerance::exact(dtype),
        );
    }
}

#[test]
fn two_groups_with_different_hyperparameters_each_follow_their_own_oracle() {
    let ctx = ctx();
    let mut rng = Rng::new(31);
    let sizes = [300usize, 7, 64];
    let algorithms: [Algorithm; 2] = [
        RmsProp { lr: 1e-2, centered: true, ..RmsProp::default() }.into(),
        RmsProp { lr: 3e-3, alpha: 0.9, momentum: 0.8, weight_decay: 0.125, ..RmsProp::default() }.into(),
    ];
    let group_of = [0usize, 0, 1];
    let mut want: Vec<Vec<f64>> = sizes.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let params: Vec<Tensor> = want.iter().map(|p| ctx.upload("param", p, DType::F32)).collect();
    let groups =
        vec![ParamGroup::new(algorithms[0], &params[..2]), ParamGroup::new(algorithms[1], &params[2..])];
    let mut optimizer = Optimizer::builder().build_groups(&ctx, groups).unwrap();
    let mut oracles: Vec<TorchState> =
        sizes.iter().zip(group_of).map(|(&n, g)| TorchState::new(algorithms[g].to_oracle(), n)).collect();
    let grads: Vec<Tensor> = sizes.iter().map(|&n| ctx.zeros("grad", n as u64, DType::F32)).collect();
    for _ in 0..10 {
        for ((g, p), oracle) in grads.iter().zip(&mut want).zip(&mut oracles) {
            let values = rng.vec(g.len as usize, 1.0);
            ctx.write(g, &values).unwrap();
            oracle.step(p, &values);
        }
        optimizer.step(&grads).unwrap();
    }
    for (i, g) in group_of.iter().enumerate() {
        let algorithm = algorithms[*g];
        let what = format!("group {g} param[{i}]");
        assert_close(&what, &download(&ctx, &params[i]), &want[i], Tolerance::F32);
        for (kind, want) in algorithm.state_kinds().iter().zip(oracles[i].tensors()) {
            assert_close(
                &format!("{what} {kind:?}"),
                &download(&ctx, optimizer.state(i, *kind).unwrap().and_then(|s| s.dense()).unwrap()),
                &want,
                state_tolerance(*kind, DType::F32),
            );
        }
    }
    // The second group keeps a momentum buffer, the first does not.
    assert!(optimizer.state(0, StateKind::MomentumBuffer).unwrap().and_then(|s| s.dense()).is_none());
    assert!(optimizer.state(2, StateKind::MomentumBuffer).unwrap().and_then(|s| s.dense()).is_some());
    assert!(optimizer.state(2, StateKind::GradAvg).unwrap().and_then(|s| s.dense()).is_none());
}

#[test]
fn capturable_mode_reads_the_learning_rate_from_the_device() {
    let ctx = ctx();
    let mut rng = Rng::new(32);
    let n = 513;
    for (k, algorithm) in [
        Algorithm::from(RmsProp { centered: true, momentum: 0.9, ..RmsProp::default() }),
        Algorithm::from(RmsProp { weight_decay: 0.015625, maximize: true, ..RmsProp::default() }),
    ]
    .into_iter()
    .enumerate()
    {
        let mut p = rng.vec(n, 1.0);
        let param = ctx.upload("param", &p, DType::F32);
        let grad = ctx.zeros("grad", n as u64, DType::F32);
        let options = Optimizer::builder().capturable(true);
        let mut optimizer = options.build(&ctx, algorithm, std::slice::from_ref(&param)).unwrap();
        let mut oracle =
            TorchState::new(algorithm.to_oracle(), n).storing(DType::F32.to_oracle(), DType::F32.to_oracle());
        for step in 0..8u32 {
            // A schedule: the rate halves every other step, written to the device.
            let lr = 1e-2 / f64::from(1 << (step / 2));
            optimizer.set_lr(lr).unwrap();
            oracle.set_algorithm(algorithm.with_lr(lr).to_oracle());
            let g = rng.vec(n, 1.0);
            ctx.write(&grad, &g).unwrap();
            optimizer.step(std::slice::from_ref(&grad)).unwrap();
            oracle.step(&mut p, &g);
        }
        assert_eq!(optimizer.read_device_step().unwrap(), 8);
        let what = format!("capturable {k}: {algorithm:?}");
        assert_close(&what, &download(&ctx, &param), &p, Tolerance::F32);
        for (kind, want) in algorithm.state_kinds().iter().zip(oracle.tensors()) {
            assert_close(
                &format!("{what} {kind:?}"),
                &download(&ctx, optimizer.state(0, *kind).unwrap().and_then(|s| s.dense()).unwrap()),
                &want,
                state_tolerance(*kind, DType::F32),
            );
        }
    }
}

/// Five clipped steps on both backends against the oracle's `clip_grad_norm_` and step.
#[test]
fn global_clipping_scales_every_gradient_as_clip_grad_norm_does_on_both_backends() {
    let ctx = ctx();
    let sizes = [1000usize, 257, 3];
    let algorithm: Algorithm = RmsProp { centered: true, momentum: 0.9, ..RmsProp::default() }.into();
    for clip in [GradClip::l2(1.0), GradClip { max_norm: 0.5, norm_type: NormType::Inf }] {
        let mut rng = Rng::new(33);
        let mut want: Vec<Vec<f64>> = sizes.iter().map(|&n| rng.vec(n, 1.0)).collect();
        let gpu_params: Vec<Tensor> = want.iter().map(|p| ctx.upload("param", p, DType::F32)).collect();
        let mut cpu_params: Vec<HostTensor> = want.iter().map(|p| host(p, DType::F32)).collect();
        let mut gpu = Optimizer::builder().grad_clip(clip).build(&ctx, algorithm, &gpu_params).unwrap();
        let mut cpu = CpuOptimizer::builder().grad_clip(clip).build(algorithm, &slices(&cpu_params)).unwrap();
        let mut oracles: Vec<TorchState> =
            sizes.iter().map(|&n| TorchState::new(algorithm.to_oracle(), n)).collect();
        for _ in 0..5 {
            let g: Vec<Vec<f64>> = sizes.iter().map(|&n| rng.vec(n, 2.0)).collect();
            let gpu_grads: Vec<Tensor> = g.iter().map(|g| ctx.upload("grad", g, DType::F32)).collect();
            gpu.step(&gpu_grads).unwrap();
            let cpu_grads: Vec<HostTensor> = g.iter().map(|g| host(g, DType::F32)).collect();
            cpu.step(&mut slices_mut(&mut cpu_params), &slices(&cpu_grads)).unwrap();
            let mut clipped = g.clone();
            let norm = clip_grad_norm(&mut clipped, &clip.to_oracle());
            assert!(norm > 2.0 * clip.max_norm, "the case clips");
            for ((p, oracle), g) in want.iter_mut().zip(&mut oracles).zip(&clipped) {
                oracle.step(p, g);
            }
        }
        for (i, n) in sizes.iter().enumerate() {
            let what = format!("{clip:?} param[{i}] (n = {n})");
            assert_close(&format!("GPU {what}"), &download(&ctx, &gpu_params[i]), &want[i], Tolerance::F32);
            assert_close(&format!("CPU {what}"), &cpu_params[i].to_f64(), &want[i], Tolerance::F32);
        }
    }
}

/// bf16 parameters whose updates are far below half a bf16 ulp: nearest rounding stalls,
/// Kahan compensation follows the oracle's unrounded run on both backends.
#[test]
fn kahan_compensation_follows_the_oracle_where_nearest_rounding_stalls() {
    let ctx = ctx();
    let n = 300;
    let steps = 60;
    let algorithm: Algorithm = RmsProp { lr: 1e-4, momentum: 0.5, ..RmsProp::default() }.into();
    let mut rng = Rng::new(34);
    // In [1, 2): a bf16 ulp is 2^-7; each step moves a parameter by about 1e-4 to 2e-4.
    let start: Vec<f64> = (0..n).map(|_| DType::BF16.to_oracle().round(1.5 + 0.25 * rng.uniform())).collect();
    let grads: Vec<Vec<f64>> =
        (0..steps).map(|_| rng.vec(n, 1.0).iter().map(|g| 0.5 + g.abs()).collect()).collect();
    let mut exact = start.clone();
    let mut oracle =
        TorchState::new(algorithm.to_oracle(), n).storing(DType::F32.to_oracle(), DType::F32.to_oracle());
    for g in &grads {
        oracle.step(&mut exact, g);
    }
    let mean_error = |got: &[f64]| got.iter().zip(&exact).map(|(a, b)| (a - b).abs()).sum::<f64>() / n as f64;
    let run_gpu = |rounding: Rounding| {
        let param = ctx.upload("param", &start, DType::BF16);
        let grad = ctx.zeros("grad", n as u64, DType::F32);
        let options = Optimizer::builder().rounding(rounding);
        let mut optimizer = options.build(&ctx, algorithm, std::slice::from_ref(&param)).unwrap();
        for g in &grads {
            ctx.write(&grad, g).unwrap();
            optimizer.step(std::slice::from_ref(&grad)).unwrap();
        }
        download(&ctx, &param)
    };
    let run_cpu = |rounding: Rounding| {
        let mut params = [host(&start, DType::BF16)];
        let mut optimizer =
            CpuOptimizer::builder().rounding(rounding).build(algorithm, &slices(&params)).unwrap();
        for g in &grads {
            let grad = [host(g, DType::F32)];
            optimizer.step(&mut slices_mut(&mut params), &slices(&grad)).unwrap();
        }
        params[0].to_f64()
    };
    let moved = mean_error(&start);
    assert!(moved > 0.005, "the run moves the parameters by {moved}");
    for (backend, kahan, nearest) in [
        ("GPU", run_gpu(Rounding::Kahan), run_gpu(Rounding::NearestEven)),
        ("CPU", run_cpu(Rounding::Kahan), run_cpu(Rounding::NearestEven)),
    ] {
        let (kahan, nearest) = (mean_error(&kahan), mean_error(&nearest));
        // Within half a bf16 ulp of the exact run; nearest rounding never moves at all.
        assert!(kahan < 2f64.powi(-8), "{backend}: Kahan's mean error {kahan}");
        assert!(nearest > 10.0 * kahan, "{backend}: nearest {nearest} against Kahan {kahan}");
    }
}

/// Asserts that every `got` is a bf16 value no further from the exact `want` than one bf16
/// spacing at `want` (the two neighbours of `want`), up to f32's rounding of the step.
#[track_caller]
fn assert_neighbours(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(DType::BF16.to_oracle().round(*g), *g, "{what}[{i}] is not a bf16 value");
        let spacing = 2f64.powi(w.abs().max(1e-30).log2().floor() as i32 - 7);
        assert!(
            (g - w).abs() <= spacing * (1.0 + 1e-4) + 1e-6 * w.abs() + 1e-12,
            "{what}[{i}]: {g} is not a neighbour of {w}"
        );
    }
}

/// Stochastic rounding of the parameter and every state: each stored value is one of the two
/// neighbours of the oracle's exact step from the stored inputs, and the two backends store
/// the same bits for a seed.
#[test]
fn stochastic_rounding_stores_a_neighbour_of_the_oracles_value_and_the_same_bits_on_both_backends() {
    let ctx = ctx();
    let n = 1025;
    let dtype = DType::BF16;
    let algorithm: Algorithm = RmsProp { centered: true, momentum: 0.9, ..RmsProp::default() }.into();
    let rounding = Rounding::Stochastic { seed: 99, state: true };
    let mut rng = Rng::new(35);
    let start = rng.vec(n, 1.0);
    let param = ctx.upload("param", &start, dtype);
    let grad = ctx.zeros("grad", n as u64, DType::F32);
    let mut gpu =
        Optimizer::builder().rounding(rounding).build(&ctx, algorithm, std::slice::from_ref(&param)).unwrap();
    let mut cpu_params = [host(&start, dtype)];
    let mut cpu = CpuOptimizer::builder().rounding(rounding).build(algorithm, &slices(&cpu_params)).unwrap();
    let kinds = algorithm.state_kinds();
    for t in 1..=4 {
        let g = rng.vec(n, 1.0);
        let mut p = download(&ctx, &param);
        let state: Vec<Vec<f64>> = kinds
            .iter()
            .map(|k| download(&ctx, gpu.state(0, *k).unwrap().and_then(|s| s.dense()).unwrap()))
            .collect();
        ctx.write(&grad, &g).unwrap();
        gpu.step(std::slice::from_ref(&grad)).unwrap();
        cpu.step(&mut slices_mut(&mut cpu_params), &slices(&[host(&g, DType::F32)])).unwrap();
        let mut oracle = TorchState::resume(algorithm.to_oracle(), t - 1, &state)
            .storing(DType::F64.to_oracle(), DType::F64.to_oracle());
        oracle.step(&mut p, &g);
        let what = format!("step {t}");
        let got = download(&ctx, &param);
        assert_neighbours(&format!("{what} param"), &got, &p);
        assert_eq!(cpu_params[0].to_f64(), got, "{what}: CPU and GPU parameters");
        for (kind, want) in kinds.iter().zip(oracle.tensors()) {
            let got = download(&ctx, gpu.state(0, *kind).unwrap().and_then(|s| s.dense()).unwrap());
            assert_neighbours(&format!("{what} {kind:?}"), &got, &want);
            assert_eq!(
                cpu.state(0, *kind).and_then(|s| s.dense()).unwrap().to_f64(),
                got,
                "{what} {kind:?}: CPU and GPU"
            );
        }
    }
}

#[test]
fn a_gpu_checkpoint_continues_on_the_cpu_and_a_cpu_checkpoint_on_the_gpu() {
    let ctx = ctx();
    let shapes = vec![vec![8, 5], vec![5], vec![3, 4, 2]];
    let lens: Vec<usize> = shapes.iter().map(|s| s.iter().product()).collect();
    for algorithm in [
        Algorithm::from(RmsProp { centered: true, momentum: 0.9, weight_decay: 0.01, ..RmsProp::default() }),
        Algorithm::from(RmsProp { alpha: 0.9, maximize: true, ..RmsProp::default() }),
    ] {
        let mut rng = Rng::new(36);
        let mut want: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
        let params: Vec<Tensor> = want.iter().map(|v| ctx.upload("param", v, DType::F32)).collect();
        let options = Optimizer::builder().param_shapes(shapes.clone());
        let mut gpu = options.build(&ctx, algorithm, &params).unwrap();
        let mut oracles: Vec<TorchState> =
            lens.iter().map(|&n| TorchState::new(algorithm.to_oracle(), n)).collect();
        let step = |gpu: &mut Optimizer, rng: &mut Rng| {
            let g: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
            let grads: Vec<Tensor> = g.iter().map(|g| ctx.upload("grad", g, DType::F32)).collect();
            gpu.step(&grads).unwrap();
            g
        };
        for _ in 0..3 {
            let g = step(&mut gpu, &mut rng);
            for ((p, oracle), g) in want.iter_mut().zip(&mut oracles).zip(&g) {
                oracle.step(p, g);
            }
        }
        let from_gpu = gpu.save_to_bytes().unwrap();
        let json = String::from_utf8_lossy(&from_gpu).into_owned();
        for key in ["RMSprop", "alpha", "centered", "momentum"] {
            assert!(json.contains(key), "the param group names {key}");
        }
        // On the CPU, from the GPU's parameters.
        let now: Vec<Vec<f64>> = params.iter().map(|p| ctx.read(p).unwrap()).collect();
        let mut cpu_params: Vec<HostTensor> = now.iter().map(|v| host(v, DType::F32)).collect();
        let mut cpu = CpuOptimizer::builder()
            .param_shapes(shapes.clone())
            .build(algorithm, &slices(&cpu_params))
            .unwrap();
        cpu.load_from_bytes(&from_gpu).unwrap();
        assert_eq!(cpu.step_count(), 3);
        assert_eq!(canonical(&cpu.save_to_bytes().unwrap()), canonical(&from_gpu), "GPU -> CPU");
        for _ in 0..2 {
            let g: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
            let grads: Vec<HostTensor> = g.iter().map(|g| host(g, DType::F32)).collect();
            cpu.step(&mut slices_mut(&mut cpu_params), &slices(&grads)).unwrap();
            for ((p, oracle), g) in want.iter_mut().zip(&mut oracles).zip(&g) {
                oracle.step(p, g);
            }
        }
        for (i, p) in cpu_params.iter().enumerate() {
            assert_close(
                &format!("{algorithm:?} CPU param[{i}] after the GPU's 3 steps"),
                &p.to_f64(),
                &want[i],
                Tolerance::F32,
            );
        }
        // And back to a fresh GPU optimizer.
        let from_cpu = cpu.save_to_bytes().unwrap();
        let back_params: Vec<Tensor> =
            cpu_params.iter().map(|p| ctx.upload("param", &p.to_f64(), DType::F32)).collect();
        let mut back =
            Optimizer::builder().param_shapes(shapes.clone()).build(&ctx, algorithm, &back_params).unwrap();
        back.load_from_bytes(&from_cpu).unwrap();
        assert_eq!(back.step_count(), 5);
        assert_eq!(canonical(&back.save_to_bytes().unwrap()), canonical(&from_cpu), "CPU -> GPU");
        let g = step(&mut back, &mut rng);
        for ((p, oracle), g) in want.iter_mut().zip(&mut oracles).zip(&g) {
            oracle.step(p, g);
        }
        for (i, p) in back_params.iter().enumerate() {
            assert_close(
                &format!("{algorithm:?} GPU param[{i}] at step 6"),
                &download(&ctx, p),
                &want[i],
                Tolerance::F32,
            );
        }
    }
}

#[test]
fn another_algorithms_checkpoint_is_refused_and_changes_nothing() {
    let ctx = ctx();
    let n = 16;
    let rmsprop: Algorithm = RmsProp { momentum: 0.9, ..RmsProp::default() }.into();
    let param = ctx.upload("param", &vec![0.5; n], DType::F32);
    let grad = ctx.upload("grad", &vec![0.25; n], DType::F32);
    let mut adam = Optimizer::builder().build(&ctx, Adam::default(), std::slice::from_ref(&param)).unwrap();
    adam.step(std::slice::from_ref(&grad)).unwrap();
    let adam_bytes = adam.save_to_bytes().unwrap();
    // A centered RMSprop keeps other tensors than a plain one: also another algorithm.
    let mut centered = Optimizer::builder()
        .build(&ctx, RmsProp { centered: true, ..RmsProp::default() }, std::slice::from_ref(&param))
        .unwrap();
    centered.step(std::slice::from_ref(&grad)).unwrap();
    let centered_bytes = centered.save_to_bytes().unwrap();

    let target = ctx.upload("target", &vec![0.5; n], DType::F32);
    let mut gpu = Optimizer::builder().build(&ctx, rmsprop, std::slice::from_ref(&target)).unwrap();
    gpu.step(std::slice::from_ref(&grad)).unwrap();
    let mut cpu_params = [host(&vec![0.5; n], DType::F32)];
    let mut cpu = CpuOptimizer::builder().build(rmsprop, &slices(&cpu_params)).unwrap();
    cpu.step(&mut slices_mut(&mut cpu_params), &slices(&[host(&vec![0.25; n], DType::F32)])).unwrap();
    for bytes in [&adam_bytes, &centered_bytes] {
        let before = canonical(&gpu.save_to_bytes().unwrap());
        let err = gpu.load_from_bytes(bytes).expect_err("another algorithm's checkpoint");
        assert!(matches!(&err, Error::BadFile { problem, .. } if problem.contains("RMSprop")), "{err:?}");
        assert_eq!(
            canonical(&gpu.save_to_bytes().unwrap()),
            before,
            "a refused load changed the GPU optimizer"
        );
        let before = canonical(&cpu.save_to_bytes().unwrap());
        let err = cpu.load_from_bytes(bytes).expect_err("another algorithm's checkpoint");
        assert!(matches!(&err, Error::BadFile { problem, .. } if problem.contains("RMSprop")), "{err:?}");
        assert_eq!(
            canonical(&cpu.save_to_bytes().unwrap()),
            before,
            "a refused load changed the CPU optimizer"
        );
    }
    assert_eq!(gpu.step_count(), 1);
    assert_eq!(gpu.group_algorithm(0), Some(&rmsprop));
}

#[test]
fn pytorchs_constructor_refusals_are_typed_errors_that_change_nothing() {
    let ctx = ctx();
    let n = 8;
    let base = RmsProp::default();
    let bad = [
        ("alpha", RmsProp { alpha: -0.1, ..base }),
        ("eps", RmsProp { eps: -1e-8, ..base }),
        ("lr", RmsProp { lr: -1e-2, ..base }),
        ("momentum", RmsProp { momentum: -0.9, ..base }),
        ("weight_decay", RmsProp { weight_decay: -0.1, ..base }),
        ("alpha", RmsProp { alpha: f64::NAN, ..base }),
    ];
    let param = ctx.upload("param", &vec![0.5; n], DType::F32);
    let grad = ctx.upload("grad", &vec![0.25; n], DType::F32);
    let mut gpu = Optimizer::builder().build(&ctx, base, std::slice::from_ref(&param)).unwrap();
    gpu.step(std::slice::from_ref(&grad)).unwrap();
    let mut cpu_params = [host(&vec![0.5; n], DType::F32)];
    let mut cpu = CpuOptimizer::builder().build(base, &slices(&cpu_params)).unwrap();
    let stepped = download(&ctx, &param);
    for (name, config) in bad {
        let err = Algorithm::from(config).validate().unwrap_err();
        assert!(matches!(err, Error::BadHyperparameter { name: n, .. } if n == name), "{name}: {err}");
        assert!(err.to_string().contains(name), "{err}");
        let err = Optimizer::builder().build(&ctx, config, std::slice::from_ref(&param)).unwrap_err();
        assert!(matches!(err, Error::BadHyperparameter { name: n, .. } if n == name), "{name}: {err}");
        let err = CpuOptimizer::builder().build(config, &slices(&cpu_params)).unwrap_err();
        assert!(matches!(err, Error::BadHyperparameter { name: n, .. } if n == name), "{name}: {err}");
        // Refused schedule changes keep the algorithm and the state.
        let before = canonical(&gpu.save_to_bytes().unwrap());
        let err = gpu.set_group_algorithm(0, config).unwrap_err();
        assert!(matches!(err, Error::BadHyperparameter { name: n, .. } if n == name), "{name}: {err}");
        assert_eq!(canonical(&gpu.save_to_bytes().unwrap()), before, "{name}");
        let err = cpu.set_group_algorithm(0, config).unwrap_err();
        assert!(matches!(err, Error::BadHyperparameter { name: n, .. } if n == name), "{name}: {err}");
    }
    assert_eq!(gpu.group_algorithm(0), Some(&Algorithm::from(base)));
    assert_eq!(cpu.group_algorithm(0), Some(&Algorithm::from(base)));
    assert_eq!(download(&ctx, &param), stepped, "a refused call changed the parameter");
    // Momentum 0 and alpha 0 are PyTorch's edge values, accepted.
    let edge = RmsProp { momentum: 0.0, alpha: 0.0, eps: 0.0, lr: 0.0, ..base };
    Algorithm::from(edge).validate().unwrap();
    cpu.step(&mut slices_mut(&mut cpu_params), &slices(&[host(&vec![0.25; n], DType::F32)])).unwrap();
}

/// 8-bit RMSprop (bitsandbytes' `RMSprop8bit`): tensors at and above `min_8bit_size` keep
/// `square_avg` as codes of the signed map with one absmax per block, smaller ones in f32.
mod q8 {
    use super::*;
    use wgpu_optim::q8::{Q8States, StoredState};
    use wgpu_optim_testkit::oracle::{bnb_8bit_step, State8bit, ToLibrary};

    /// Two 8-bit tensors (one of whole blocks, one with a partial last block) and one below
    /// `min_8bit_size`.
    const LENGTHS: [usize; 3] = [5003, 4096, 300];
    const STEPS: usize = 4;

    fn algorithms() -> [Algorithm; 2] {
        [RmsProp::default().into(), RmsProp { lr: 3e-3, alpha: 0.9, eps: 1e-6, ..RmsProp::default() }.into()]
    }

    /// Codes within 1 of the oracle's and at most 1 % different (a value near the midpoint
    /// of two codes takes either), absmax within 1e-4; f32 states within f32's tolerance.
    fn assert_state_follows(what: &str, got: &StoredState, want: &StoredState) {
        match (got, want) {
            (
                StoredState::Q8 { codes, absmax },
                StoredState::Q8 { codes: want_codes, absmax: want_absmax },
            ) => {
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

    /// Parameters within 1e-4 of the oracle's except at most 1 % of them: a code one apart
    /// from the oracle's changes its element's `sqrt(square_avg)`, so its step, by up to a
    /// code's width. Every parameter stays within the largest steps RMSprop takes
    /// (`lr / sqrt(1 - alpha)` each).
    fn assert_params_follow(what: &str, got: &[f64], want: &[f64], algorithm: &Algorithm, steps: usize) {
        let close = wgpu_optim_testkit::compare(got, want, Tolerance::Close { rtol: 0.0, atol: 1e-4 });
        assert!(close.passed() || close.mismatches * 100 <= want.len(), "{what}: {close}");
        let Algorithm::RmsProp(r) = algorithm else { unreachable!() };
        let bound = r.lr / (1.0 - r.alpha).sqrt() * steps as f64;
        assert_close(what, got, want, Tolerance::Close { rtol: 0.0, atol: bound });
    }

    /// The oracle's run: bitsandbytes' kernels on fresh state (all-zero codes, absmax 0).
    struct Oracle {
        params: Vec<Vec<f64>>,
        states: Vec<State8bit>,
    }

    impl Oracle {
        fn new(params: &[Vec<f64>]) -> Self {
            let states = LENGTHS.iter().map(|&n| State8bit::zeros(n, n >= 4096)).collect();
            Oracle { params: params.to_vec(), states }
        }

        fn step(&mut self, algorithm: &Algorithm, step: u64, grads: &[Vec<f64>]) {
            for ((p, g), s) in self.params.iter_mut().zip(grads).zip(&mut self.states) {
                bnb_8bit_step(&algorithm.to_oracle(), step, p, g, std::slice::from_mut(s))
                    .unwrap_or_else(|e| panic!("{e}"));
            }
        }
    }

    #[test]
    fn rmsprop8bit_follows_the_bitsandbytes_oracle_on_the_gpu() {
        let ctx = ctx();
        for (a, algorithm) in algorithms().into_iter().enumerate() {
            let mut rng = Rng::new(900 + a as u64);
            let initial: Vec<Vec<f64>> = LENGTHS.iter().map(|&n| rng.vec(n, 1.0)).collect();
            let mut oracle = Oracle::new(&initial);
            let params: Vec<Tensor> = initial.iter().map(|p| ctx.upload("param", p, DType::F32)).collect();
            let options = Optimizer::builder().state_storage(StateStorage::Q8(Q8States::default()));
            let mut optimizer = options.build(&ctx, algorithm, &params).unwrap();
            for k in 0..STEPS {
                let g: Vec<Vec<f64>> = LENGTHS.iter().map(|&n| rng.vec(n, 1.0)).collect();
                let grads: Vec<Tensor> = g.iter().map(|g| ctx.upload("grad", g, DType::F32)).collect();
                optimizer.step(&grads).unwrap();
                oracle.step(&algorithm, k as u64 + 1, &g);
                for (i, param) in params.iter().enumerate() {
                    let what = format!("GPU {algorithm:?} step {} param[{i}]", k + 1);
                    assert_params_follow(&what, &download(&ctx, param), &oracle.params[i], &algorithm, k + 1);
                    let got = optimizer
                        .state(i, StateKind::SquareAvg)
                        .map(|s| s.and_then(|v| v.q8()))
                        .unwrap()
                        .expect("square_avg");
                    assert_state_follows(&format!("{what} square_avg"), &got, &oracle.states[i].to_library());
                }
            }
        }
    }

    #[test]
    fn rmsprop8bit_follows_the_bitsandbytes_oracle_on_the_cpu() {
        for (a, algorithm) in algorithms().into_iter().enumerate() {
            let mut rng = Rng::new(950 + a as u64);
            let initial: Vec<Vec<f64>> = LENGTHS.iter().map(|&n| rng.vec(n, 1.0)).collect();
            let mut oracle = Oracle::new(&initial);
            let mut params: Vec<HostTensor> = initial.iter().map(|p| host(p, DType::F32)).collect();
            let options = CpuOptimizer::builder().state_storage(StateStorage::Q8(Q8States::default()));
            let mut optimizer = options.build(algorithm, &slices(&params)).unwrap();
            for k in 0..STEPS {
                let g: Vec<Vec<f64>> = LENGTHS.iter().map(|&n| rng.vec(n, 1.0)).collect();
                let grads: Vec<HostTensor> = g.iter().map(|g| host(g, DType::F32)).collect();
                optimizer.step(&mut slices_mut(&mut params), &slices(&grads)).unwrap();
                oracle.step(&algorithm, k as u64 + 1, &g);
                for (i, param) in params.iter().enumerate() {
                    let what = format!("CPU {algorithm:?} step {} param[{i}]", k + 1);
                    assert_params_follow(&what, &param.to_f64(), &oracle.params[i], &algorithm, k + 1);
                    let got =
                        optimizer.state(i, StateKind::SquareAvg).and_then(|s| s.q8()).expect("square_avg");
                    assert_state_follows(&format!("{what} square_avg"), got, &oracle.states[i].to_library());
                }
            }
        }
    }

    #[test]
    fn an_8bit_checkpoint_keeps_bitsandbytes_names_and_moves_between_backends() {
        let ctx = ctx();
        let algorithm: Algorithm = RmsProp::default().into();
        let mut rng = Rng::new(990);
        let initial: Vec<Vec<f64>> = LENGTHS.iter().map(|&n| rng.vec(n, 1.0)).collect();
        let params: Vec<Tensor> = initial.iter().map(|p| ctx.upload("param", p, DType::F32)).collect();
        let mut gpu = Optimizer::builder()
            .state_storage(StateStorage::Q8(Q8States::default()))
            .build(&ctx, algorithm, &params)
            .unwrap();
        for _ in 0..2 {
            let grads: Vec<Tensor> =
                LENGTHS.iter().map(|&n| ctx.upload("grad", &rng.vec(n, 1.0), DType::F32)).collect();
            gpu.step(&grads).unwrap();
        }
        let bytes = gpu.save_to_bytes().unwrap();
        let names: Vec<String> = canonical(&bytes).into_iter().map(|(name, _)| name).collect();
        for name in ["state.0.state1", "state.0.absmax1", "qmap1"] {
            assert!(names.iter().any(|n| n.contains(name)), "{name} among {names:?}");
        }
        let now: Vec<Vec<f64>> = params.iter().map(|p| download(&ctx, p)).collect();
        let cpu_params: Vec<HostTensor> = now.iter().map(|p| host(p, DType::F32)).collect();
        let mut cpu = CpuOptimizer::builder()
            .state_storage(StateStorage::Q8(Q8States::default()))
            .build(algorithm, &slices(&cpu_params))
            .unwrap();
        cpu.load_from_bytes(&bytes).unwrap();
        assert_eq!(canonical(&cpu.save_to_bytes().unwrap()), canonical(&bytes), "GPU -> CPU");
    }

    #[test]
    fn what_bitsandbytes_refuses_or_ignores_is_refused_by_name_on_both_backends() {
        let ctx = ctx();
        let param = ctx.upload("param", &vec![0.5; 4096], DType::F32);
        let cpu_params = [host(&vec![0.5; 4096], DType::F32)];
        let base = RmsProp::default();
        let refused = [
            (RmsProp { centered: true, ..base }, "centered"),
            (RmsProp { alpha: 0.0, ..base }, "alpha == 0"),
            (RmsProp { momentum: 0.9, ..base }, "momentum"),
            (RmsProp { maximize: true, ..base }, "maximize"),
        ];
        for (config, what) in refused {
            let gpu = Optimizer::builder().state_storage(StateStorage::Q8(Q8States::default())).build(
                &ctx,
                config,
                std::slice::from_ref(&param),
            );
            let cpu = CpuOptimizer::builder()
                .state_storage(StateStorage::Q8(Q8States::default()))
                .build(config, &slices(&cpu_params));
            for err in [gpu.map(|_| ()).unwrap_err(), cpu.map(|_| ()).unwrap_err()] {
                assert!(
                    matches!(&err, Error::ConflictingOptions { first: "state_storage", reason, .. } if reason.contains(what)),
                    "{what}: {err}"
                );
            }
        }
        let clipped = Optimizer::builder()
            .state_storage(StateStorage::Q8(Q8States::default()))
            .grad_clip(GradClip::l2(1.0));
        let err = clipped.build(&ctx, base, std::slice::from_ref(&param)).map(|_| ()).unwrap_err();
        assert!(
            matches!(&err, Error::ConflictingOptions { reason, .. } if reason.contains("grad_clip")),
            "{err}"
        );
        assert_eq!(download(&ctx, &param), vec![0.5; 4096]);
        // A schedule cannot switch maximize on either; weight decay runs as bitsandbytes'
        // kernel runs it (`tests/q8_kernels.rs`).
        let mut gpu = Optimizer::builder()
            .state_storage(StateStorage::Q8(Q8States::default()))
            .build(&ctx, base, std::slice::from_ref(&param))
            .unwrap();
        let mut cpu = CpuOptimizer::builder()
            .state_storage(StateStorage::Q8(Q8States::default()))
            .build(base, &slices(&cpu_params))
            .unwrap();
        for config in [RmsProp { maximize: true, ..base }, RmsProp { momentum: 0.9, ..base }] {
            let err = gpu.set_group_algorithm(0, config).unwrap_err();
            assert!(matches!(&err, Error::ConflictingOptions { first: "state_storage", .. }), "{err}");
            let err = cpu.set_group_algorithm(0, config).unwrap_err();
            assert!(matches!(&err, Error::ConflictingOptions { first: "state_storage", .. }), "{err}");
        }
        assert_eq!(gpu.group_algorithm(0), Some(&Algorithm::from(base)));
        assert_eq!(cpu.group_algorithm(0), Some(&Algorithm::from(base)));
        gpu.set_group_algorithm(0, RmsProp { lr: 1e-3, weight_decay: 0.01, ..base }).unwrap();
        cpu.set_group_algorithm(0, RmsProp { lr: 1e-3, weight_decay: 0.01, ..base }).unwrap();
    }
}
