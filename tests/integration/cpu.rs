//! The CPU backend against the f64 oracle: 30-step f32 trajectories for every Adam switch
//! combination, the SGD and Adagrad variants, every 16-bit storage mix checked step by step
//! to the last ulp, many small tensors of mixed dtypes in one step, and typed refusals that
//! change nothing. No GPU is needed.

use crate::common;

use common::{adagrad_variants, adam_switch_combinations, assert_close, sgd_variants, Rng, Tolerance};
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut, HostTensor};
use wgpu_optim::{Adagrad, Adam, Algorithm, DType, Error, Sgd, StateKind, StateStorage};
use wgpu_optim_testkit::oracle::{Storage, ToOracle, TorchState};

/// Around the GPU's workgroup size, with vector-loop tails.
const SIZES: [usize; 4] = [1, 255, 256, 257];
/// Several of the CPU's work items (32 Ki elements) and conversion blocks (1 Ki), with a
/// tail in each. The oracle is slow in debug builds, so fewer runs take this size.
const LARGE: usize = 100_003;
const STEPS: u64 = 30;

fn host(values: &[f64], dtype: DType) -> HostTensor {
    HostTensor::from_f64(dtype, values).expect("a CPU storage type")
}

fn slices(tensors: &[HostTensor]) -> Vec<HostSlice<'_>> {
    tensors.iter().map(HostTensor::as_slice).collect()
}

fn slices_mut(tensors: &mut [HostTensor]) -> Vec<HostSliceMut<'_>> {
    tensors.iter_mut().map(HostTensor::as_mut_slice).collect()
}

/// Steps f32 parameters of `sizes` `STEPS` times and compares parameters and state with
/// the oracle's f64 trajectory from the same start.
fn check_trajectory(algorithm: Algorithm, sizes: &[usize], seed: u64) {
    let mut rng = Rng::new(seed);
    let mut want: Vec<Vec<f64>> = sizes.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let mut params: Vec<HostTensor> = want.iter().map(|p| host(p, DType::F32)).collect();
    let mut optimizer = CpuOptimizer::builder().build(algorithm, &slices(&params)).expect("optimizer");
    let mut oracles: Vec<TorchState> =
        sizes.iter().map(|&n| TorchState::new(algorithm.to_oracle(), n)).collect();
    for _ in 0..STEPS {
        let g: Vec<Vec<f64>> = sizes.iter().map(|&n| rng.vec(n, 1.0)).collect();
        let grads: Vec<HostTensor> = g.iter().map(|g| host(g, DType::F32)).collect();
        optimizer.step(&mut slices_mut(&mut params), &slices(&grads)).expect("step");
        for ((p, oracle), g) in want.iter_mut().zip(&mut oracles).zip(&g) {
            oracle.step(p, g);
        }
    }
    assert_eq!(optimizer.step_count(), STEPS);
    for (i, n) in sizes.iter().enumerate() {
        let what = format!("{algorithm:?} param[{i}] (n = {n})");
        assert_close(&what, &params[i].to_f64(), &want[i], Tolerance::F32);
        for (kind, want) in algorithm.state_kinds().iter().zip(oracles[i].tensors()) {
            let got = optimizer.state(i, *kind).and_then(|s| s.dense()).expect("state").to_f64();
            assert_close(&format!("{what} {kind:?}"), &got, &want, Tolerance::F32);
        }
    }
}

#[test]
fn adam_every_switch_combination_follows_the_oracle_for_30_steps() {
    for (k, algorithm) in adam_switch_combinations().into_iter().enumerate() {
        check_trajectory(algorithm, &SIZES, 100 + k as u64);
    }
}

#[test]
fn a_tensor_of_many_work_items_follows_the_oracle_for_30_steps() {
    // The loop with the most operands; the work split does not depend on the loop.
    let adam = Adam { lr: 1e-2, amsgrad: true, maximize: true, weight_decay: 0.05, ..Adam::adamw() };
    check_trajectory(adam.into(), &[LARGE, 3], 99);
}

#[test]
fn sgd_variants_follow_the_oracle_for_30_steps() {
    for (k, algorithm) in sgd_variants().into_iter().enumerate() {
        check_trajectory(algorithm, &SIZES, 300 + k as u64);
    }
}

#[test]
fn adagrad_variants_follow_the_oracle_for_30_steps() {
    for (k, algorithm) in adagrad_variants().into_iter().enumerate() {
        check_trajectory(algorithm, &SIZES, 500 + k as u64);
    }
}

/// One parameter of a mixed-precision step: its length and the dtypes of its parameter
/// and gradient.
#[derive(Clone, Copy, Debug)]
struct Spec {
    len: usize,
    param: DType,
    grad: DType,
}

/// Runs `steps` steps and checks every step against the oracle resumed from the
/// parameters and state the CPU stored before it, so 1-ulp differences do not compound.
fn check_steps(algorithm: Algorithm, specs: &[Spec], state_dtype: Option<DType>, steps: u64, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut params: Vec<HostTensor> = specs.iter().map(|s| host(&rng.vec(s.len, 1.0), s.param)).collect();
    let options = CpuOptimizer::builder()
        .state_storage(state_dtype.map_or(StateStorage::ParamDtype, StateStorage::Dtype));
    let mut optimizer = options.build(algorithm, &slices(&params)).expect("optimizer");
    let kinds = algorithm.state_kinds();
    for (i, spec) in specs.iter().enumerate() {
        for kind in kinds {
            let dtype = optimizer.state(i, *kind).and_then(|s| s.dense()).expect("state").dtype();
            assert_eq!(dtype, state_dtype.unwrap_or(spec.param), "{kind:?} of param[{i}]");
        }
    }
    for t in 1..=steps {
        let grads: Vec<HostTensor> = specs.iter().map(|s| host(&rng.vec(s.len, 1.0), s.grad)).collect();
        type Before = (Vec<f64>, Vec<Vec<f64>>);
        let before: Vec<Before> = (0..specs.len())
            .map(|i| {
                let state = kinds
                    .iter()
                    .map(|k| optimizer.state(i, *k).and_then(|s| s.dense()).expect("state").to_f64())
                    .collect();
                (params[i].to_f64(), state)
            })
            .collect();
        optimizer.step(&mut slices_mut(&mut params), &slices(&grads)).expect("step");
        for (i, ((mut p, state), spec)) in before.into_iter().zip(specs).enumerate() {
            let stored_state = state_dtype.unwrap_or(spec.param);
            let mut oracle = TorchState::resume(algorithm.to_oracle(), t - 1, &state)
                .storing(spec.param.to_oracle(), stored_state.to_oracle());
            oracle.step(&mut p, &grads[i].to_f64());
            let what = format!("{algorithm:?} {spec:?} state {stored_state:?} step {t} param[{i}]");
            assert_close(&what, &params[i].to_f64(), &p, Tolerance::stored(spec.param));
            for (kind, want) in kinds.iter().zip(oracle.tensors()) {
                let got = optimizer.state(i, *kind).and_then(|s| s.dense()).expect("state").to_f64();
                assert_close(&format!("{what} {kind:?}"), &got, &want, Tolerance::stored(stored_state));
            }
        }
    }
}

fn every_algorithm() -> Vec<Algorithm> {
    let mut all = adam_switch_combinations();
    all.extend(sgd_variants());
    all.extend(adagrad_variants());
    all
}

/// (param, grad, state): all f16; 16-bit parameters with f32 state; bf16 state (the
/// parameter's, as PyTorch keeps it); f32 parameters with 16-bit gradients and state;
/// and all f32, through the same per-step check.
const MIXES: [(DType, DType, Option<DType>); 7] = [
    (DType::F16, DType::F16, Some(DType::F16)),
    (DType::F16, DType::F16, Some(DType::F32)),
    (DType::BF16, DType::BF16, Some(DType::F32)),
    (DType::BF16, DType::BF16, None),
    (DType::F32, DType::BF16, Some(DType::F16)),
    (DType::BF16, DType::F32, Some(DType::BF16)),
    (DType::F32, DType::F32, None),
];

#[test]
fn every_algorithm_and_storage_mix_matches_the_oracle_at_every_step() {
    // 1025: one conversion block and one element.
    let sizes = [1, 255, 256, 257, 1025];
    for (a, algorithm) in every_algorithm().into_iter().enumerate() {
        for (m, (param, grad, state)) in MIXES.into_iter().enumerate() {
            let specs: Vec<Spec> = sizes.iter().map(|&len| Spec { len, param, grad }).collect();
            check_steps(algorithm, &specs, state, 3, (a * 10 + m) as u64);
        }
    }
}

#[test]
fn large_tensors_of_every_storage_mix_cross_work_items_and_blocks() {
    let algorithms: [Algorithm; 3] = [
        Adam { lr: 1e-2, amsgrad: true, weight_decay: 0.0625, ..Adam::default() }.into(),
        Sgd { lr: 0.01, momentum: 0.9, nesterov: true, weight_decay: 0.015625, ..Sgd::default() }.into(),
        Adagrad { lr_decay: 0.1, initial_accumulator_value: 0.1, ..Adagrad::default() }.into(),
    ];
    for (a, algorithm) in algorithms.into_iter().enumerate() {
        // A third of the mixes per algorithm, in rotation, to keep debug builds fast.
        for (m, (param, grad, state)) in MIXES.into_iter().enumerate().filter(|(m, _)| m % 3 == a) {
            let specs = [Spec { len: LARGE, param, grad }];
            check_steps(algorithm, &specs, state, 2, (700 + a * 10 + m) as u64);
        }
    }
}

#[test]
fn many_small_tensors_of_mixed_dtypes_step_together() {
    // 200 tensors of 0 to 2048 elements with every parameter and gradient dtype, in one
    // step's work list, each checked against its own oracle.
    let dtypes = [DType::F32, DType::F16, DType::BF16];
    let mut rng = Rng::new(77);
    let specs: Vec<Spec> = (0..200)
        .map(|i| Spec {
            len: if i % 50 == 0 { 0 } else { (rng.next_u64() % 2049) as usize },
            param: dtypes[i % 3],
            grad: dtypes[(i / 3) % 3],
        })
        .collect();
    let adam: Algorithm = Adam { lr: 1e-2, amsgrad: true, ..Adam::adamw() }.into();
    check_steps(adam, &specs, None, 2, 1);
    check_steps(adam, &specs, Some(DType::F32), 2, 2);
    let nesterov: Algorithm = Sgd { lr: 0.01, momentum: 0.9, nesterov: true, ..Sgd::default() }.into();
    check_steps(nesterov, &specs, Some(DType::BF16), 2, 3);
}

#[test]
fn adagrad_starts_from_its_initial_accumulator_rounded_to_the_state_dtype() {
    let algorithm = Adagrad { initial_accumulator_value: 0.1, ..Adagrad::default() };
    let params = [host(&[0.5; 5], DType::F32)];
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let optimizer = (CpuOptimizer::builder().state_storage(StateStorage::Dtype(dtype)))
            .build(algorithm, &slices(&params))
            .unwrap();
        let sum = optimizer.state(0, StateKind::Sum).and_then(|s| s.dense()).unwrap();
        assert_eq!(sum.dtype(), dtype);
        assert_eq!(sum.to_f64(), vec![dtype.to_oracle().round(0.1); 5], "{dtype:?}");
    }
}

#[test]
fn sgd_without_momentum_keeps_no_state_and_state_lookups_miss_cleanly() {
    let params = [host(&[0.5; 4], DType::F32)];
    let plain = CpuOptimizer::builder().build(Sgd { lr: 0.1, ..Sgd::default() }, &slices(&params)).unwrap();
    assert!(plain.state(0, StateKind::MomentumBuffer).is_none());
    let momentum = CpuOptimizer::builder()
        .build(Sgd { lr: 0.1, momentum: 0.9, ..Sgd::default() }, &slices(&params))
        .unwrap();
    assert!(momentum.state(0, StateKind::MomentumBuffer).is_some());
    assert!(momentum.state(1, StateKind::MomentumBuffer).is_none(), "no parameter 1");
    assert!(momentum.state(0, StateKind::ExpAvg).is_none(), "SGD keeps no exp_avg");
    assert_eq!(momentum.param_count(), 1);
}

#[test]
fn a_learning_rate_schedule_takes_effect_at_the_next_step() {
    let mut rng = Rng::new(4);
    let mut want = rng.vec(513, 1.0);
    let mut params = vec![host(&want, DType::F32)];
    let mut config = Adam::adamw();
    let mut optimizer = CpuOptimizer::builder().build(config, &slices(&params)).unwrap();
    let mut oracle = TorchState::new(config.to_oracle().into(), 513);
    for k in 0..10 {
        config.lr = 1e-3 * (1.0 + k as f64);
        optimizer.set_lr(config.lr).unwrap();
        oracle.set_algorithm(config.to_oracle().into());
        let g = rng.vec(513, 1.0);
        optimizer.step(&mut slices_mut(&mut params), &slices(&[host(&g, DType::F32)])).unwrap();
        oracle.step(&mut want, &g);
    }
    assert_eq!(optimizer.group_algorithm(0).unwrap(), &Algorithm::from(config));
    assert_close("param under a schedule", &params[0].to_f64(), &want, Tolerance::F32);
}

#[test]
fn resuming_from_loaded_state_continues_the_trajectory() {
    // Take 3 steps on one optimizer, copy its state and step count into a fresh one, and
    // take 3 more on each: the same bits.
    let algorithm: Algorithm = Adam { lr: 1e-2, amsgrad: true, ..Adam::default() }.into();
    let mut rng = Rng::new(6);
    let mut params = vec![host(&rng.vec(300, 1.0), DType::BF16)];
    let options = CpuOptimizer::builder().state_storage(StateStorage::Dtype(DType::F32));
    let mut first = options.clone().build(algorithm, &slices(&params)).unwrap();
    let grads: Vec<HostTensor> = (0..6).map(|_| host(&rng.vec(300, 1.0), DType::BF16)).collect();
    for g in &grads[..3] {
        first.step(&mut slices_mut(&mut params), std::slice::from_ref(&g.as_slice())).unwrap();
    }
    let mut resumed = options.build(algorithm, &slices(&params)).unwrap();
    resumed.set_step_count(first.step_count()).unwrap();
    for kind in algorithm.state_kinds() {
        let saved = first.state(0, *kind).and_then(|s| s.dense()).unwrap().to_f64();
        match resumed.state_mut(0, *kind).unwrap() {
            HostSliceMut::F32(values) => values.iter_mut().zip(&saved).for_each(|(v, s)| *v = *s as f32),
            other => panic!("state stored as {:?}", other.dtype()),
        }
    }
    let mut params_resumed = params.clone();
    for g in &grads[3..] {
        first.step(&mut slices_mut(&mut params), std::slice::from_ref(&g.as_slice())).unwrap();
        resumed.step(&mut slices_mut(&mut params_resumed), std::slice::from_ref(&g.as_slice())).unwrap();
    }
    assert_eq!(params, params_resumed);
    for kind in algorithm.state_kinds() {
        assert_eq!(first.state(0, *kind), resumed.state(0, *kind), "{kind:?}");
    }
}

#[test]
fn nan_and_infinite_gradients_propagate_through_16_bit_storage() {
    for dtype in [DType::F16, DType::BF16] {
        let mut params = vec![host(&[0.5, 0.5, 0.5], dtype)];
        let grads = [host(&[f64::NAN, 1.0, f64::INFINITY], dtype)];
        let mut optimizer =
            CpuOptimizer::builder().build(Sgd { lr: 0.1, ..Sgd::default() }, &slices(&params)).unwrap();
        optimizer.step(&mut slices_mut(&mut params), &slices(&grads)).unwrap();
        let got = params[0].to_f64();
        assert!(got[0].is_nan(), "{dtype:?}: a NaN gradient gives a NaN parameter, got {}", got[0]);
        assert_eq!(got[1], dtype.to_oracle().round(f64::from(0.5f32 - 0.1f32)), "{dtype:?}");
        assert_eq!(got[2], f64::NEG_INFINITY, "{dtype:?}");
    }
}

/// Everything a refused call could have touched.
fn snapshot(optimizer: &CpuOptimizer, params: &[HostTensor]) -> (Vec<Vec<f64>>, Vec<Vec<f64>>, u64) {
    let kinds = optimizer.group_algorithm(0).unwrap().state_kinds();
    let state = (0..params.len())
        .flat_map(|i| {
            kinds.iter().map(move |k| optimizer.state(i, *k).and_then(|s| s.dense()).unwrap().to_f64())
        })
        .collect();
    (params.iter().map(HostTensor::to_f64).collect(), state, optimizer.step_count())
}

#[test]
fn mismatched_inputs_are_typed_errors_that_change_nothing() {
    let algorithm: Algorithm = Adam { lr: 0.1, amsgrad: true, ..Adam::default() }.into();
    let mut rng = Rng::new(11);
    let start = [rng.vec(8, 1.0), rng.vec(3, 1.0)];
    let mut params = vec![host(&start[0], DType::F32), host(&start[1], DType::F16)];
    let grads = vec![host(&rng.vec(8, 1.0), DType::F32), host(&rng.vec(3, 1.0), DType::BF16)];
    let mut optimizer = CpuOptimizer::builder().build(algorithm, &slices(&params)).unwrap();
    optimizer.step(&mut slices_mut(&mut params), &slices(&grads)).unwrap();
    let before = snapshot(&optimizer, &params);

    let message = |err: Error| err.to_string();
    // Too few parameters, too few gradients.
    let err = optimizer.step(&mut slices_mut(&mut params[..1]), &slices(&grads)).unwrap_err();
    assert!(
        matches!(&err, Error::CountMismatch { argument, got: 1, expected: 2 } if argument == "params"),
        "{err}"
    );
    let err = optimizer.step(&mut slices_mut(&mut params), &slices(&grads[..1])).unwrap_err();
    assert!(
        matches!(&err, Error::CountMismatch { argument, got: 1, expected: 2 } if argument == "grads"),
        "{err}"
    );
    assert!(message(err).contains("`grads`"));

    // A parameter of another dtype than at construction; the valid parameter before it is
    // not touched either.
    let mut other_dtype = vec![params[0].clone(), host(&start[1], DType::BF16)];
    let err = optimizer.step(&mut slices_mut(&mut other_dtype), &slices(&grads)).unwrap_err();
    assert!(
        matches!(&err, Error::DTypeMismatch { argument, got: DType::BF16, .. } if argument == "params[1]"),
        "{err}"
    );
    assert!(message(err).contains("F16"), "the message names the expected dtype");
    assert_eq!(other_dtype[0], params[0]);

    // A parameter of another length, a gradient of another length.
    let mut shorter = vec![host(&start[0][..7], DType::F32), params[1].clone()];
    let err = optimizer.step(&mut slices_mut(&mut shorter), &slices(&grads)).unwrap_err();
    assert!(
        matches!(&err, Error::LengthMismatch { argument, got: 7, expected: 8, .. } if argument == "params[0]"),
        "{err}"
    );
    let long_grad = vec![grads[0].clone(), host(&[0.1; 4], DType::BF16)];
    let err = optimizer.step(&mut slices_mut(&mut params), &slices(&long_grad)).unwrap_err();
    assert!(
        matches!(&err, Error::LengthMismatch { argument, got: 4, expected: 3, reference } if argument == "grads[1]" && reference == "params[1]"),
        "{err}"
    );
    assert_eq!(snapshot(&optimizer, &params), before, "a refused step changes nothing");

    // The next valid step is the second step.
    let kinds = algorithm.state_kinds();
    let mut oracles: Vec<(Vec<f64>, TorchState)> = (0..2)
        .map(|i| {
            let state: Vec<Vec<f64>> = kinds
                .iter()
                .map(|k| optimizer.state(i, *k).and_then(|s| s.dense()).unwrap().to_f64())
                .collect();
            let dtype = params[i].dtype();
            (
                params[i].to_f64(),
                TorchState::resume(algorithm.to_oracle(), 1, &state)
                    .storing(dtype.to_oracle(), dtype.to_oracle()),
            )
        })
        .collect();
    optimizer.step(&mut slices_mut(&mut params), &slices(&grads)).unwrap();
    for (i, (p, oracle)) in oracles.iter_mut().enumerate() {
        oracle.step(p, &grads[i].to_f64());
        assert_close(
            &format!("param[{i}] after the refusals"),
            &params[i].to_f64(),
            p,
            Tolerance::stored(params[i].dtype()),
        );
    }
    assert_eq!(optimizer.step_count(), 2);
}

#[test]
fn missing_groups_are_refused_with_typed_errors() {
    // The GPU-only options (capturable, master weights, model copies) have no setter on
    // `CpuOptimizerBuilder`: `compile_fail` doctests there show each is refused at compile time.
    let params = [host(&[0.5; 4], DType::F32)];
    let mut optimizer = CpuOptimizer::builder().build(Adam::default(), &slices(&params)).unwrap();
    assert_eq!(optimizer.group_count(), 1);
    assert!(optimizer.group_algorithm(1).is_none());
    let err = optimizer.set_group_lr(1, 0.1).unwrap_err();
    assert!(matches!(err, Error::NoSuchGroup { index: 1, groups: 1 }), "{err}");
    optimizer.set_group_lr(0, 0.1).unwrap();
    assert_eq!(optimizer.group_algorithm(0).map(|a| a.lr()), Some(0.1));
}

#[test]
fn f64_and_invalid_hyperparameters_are_refused_with_typed_errors() {
    let params = [host(&[0.5; 4], DType::F32)];
    let options = CpuOptimizer::builder().state_storage(StateStorage::Dtype(DType::F64));
    let err = options.build(Adam::default(), &slices(&params)).unwrap_err();
    assert!(
        matches!(&err, Error::DTypeMismatch { argument, got: DType::F64, .. } if argument == "options.state_storage"),
        "{err}"
    );
    let err = HostTensor::from_f64(DType::F64, &[1.0]).unwrap_err();
    assert!(matches!(&err, Error::DTypeMismatch { argument, .. } if argument == "dtype"), "{err}");
    let err = HostTensor::filled(DType::F64, 3, 0.0).unwrap_err();
    assert!(matches!(&err, Error::DTypeMismatch { .. }), "{err}");

    let err =
        CpuOptimizer::builder().build(Adam { lr: -1.0, ..Adam::default() }, &slices(&params)).unwrap_err();
    assert!(matches!(err, Error::BadHyperparameter { name: "lr", .. }), "{err}");
    let bad_nesterov = Sgd { nesterov: true, momentum: 0.9, dampening: 0.1, ..Sgd::default() };
    let err = CpuOptimizer::builder().build(bad_nesterov, &slices(&params)).unwrap_err();
    assert!(matches!(err, Error::BadHyperparameter { name: "dampening", .. }), "{err}");

    // Refused schedule changes keep the algorithm.
    let mut optimizer = CpuOptimizer::builder().build(Adam::default(), &slices(&params)).unwrap();
    let err = optimizer.set_lr(f64::NAN).unwrap_err();
    assert!(matches!(err, Error::BadHyperparameter { name: "lr", .. }), "{err}");
    let err = optimizer.set_group_algorithm(0, Adam { amsgrad: true, ..Adam::default() }).unwrap_err();
    assert!(
        matches!(&err, Error::StateMismatch { got, expected, .. }
            if got == &[StateKind::ExpAvg, StateKind::ExpAvgSq, StateKind::MaxExpAvgSq]
                && expected == &[StateKind::ExpAvg, StateKind::ExpAvgSq]),
        "{err}"
    );
    assert!(
        err.to_string().contains("[exp_avg, exp_avg_sq, max_exp_avg_sq], expected [exp_avg, exp_avg_sq]"),
        "{err}"
    );
    let err = optimizer.set_group_algorithm(0, Sgd::default()).unwrap_err();
    assert!(matches!(err, Error::StateMismatch { .. }), "{err}");
    assert_eq!(optimizer.group_algorithm(0).unwrap(), &Algorithm::from(Adam::default()));
}

#[test]
fn host_slices_report_their_dtype_and_length() {
    let mut f16s = [half::f16::from_f32(1.5); 3];
    let bf16s = [half::bf16::from_f32(-2.0); 2];
    let f32s = [0.25f32];
    let mut m = HostSliceMut::from(&mut f16s[..]);
    assert_eq!((m.dtype(), m.len(), m.is_empty()), (DType::F16, 3, false));
    assert_eq!(m.reborrow().to_f64(), vec![1.5; 3]);
    assert_eq!(HostSlice::from(m).dtype(), DType::F16);
    assert_eq!(
        (HostSlice::from(&bf16s[..]).dtype(), HostSlice::from(&bf16s[..]).to_f64()),
        (DType::BF16, vec![-2.0; 2])
    );
    assert_eq!(HostSlice::from(&f32s[..]).len(), 1);
    assert!(HostSliceMut::default().is_empty());
    let t = HostTensor::from(vec![half::bf16::from_f32(3.0)]);
    assert_eq!((t.dtype(), t.len(), t.to_f64()), (DType::BF16, 1, vec![3.0]));
}

#[test]
fn clipping_follows_the_oracles_clip_grad_norm_over_every_tensor() {
    use wgpu_optim::{GradClip, NormType};
    use wgpu_optim_testkit::oracle::clip_grad_norm;
    let sizes = [1000usize, 257, 3, 200_000];
    for (algorithm, clip) in [
        (Algorithm::from(Adam { lr: 1e-2, ..Adam::default() }), GradClip::l2(1.0)),
        (
            Algorithm::from(Sgd { lr: 0.01, momentum: 0.9, nesterov: true, ..Sgd::default() }),
            GradClip { max_norm: 0.5, norm_type: NormType::Inf },
        ),
    ] {
        let mut rng = Rng::new(21);
        let mut want: Vec<Vec<f64>> = sizes.iter().map(|&n| rng.vec(n, 1.0)).collect();
        let mut params: Vec<HostTensor> = want.iter().map(|p| host(p, DType::F32)).collect();
        let options = CpuOptimizer::builder().grad_clip(clip);
        let mut optimizer = options.build(algorithm, &slices(&params)).expect("optimizer");
        assert_eq!(optimizer.grad_norm(), None);
        let mut oracles: Vec<TorchState> =
            sizes.iter().map(|&n| TorchState::new(algorithm.to_oracle(), n)).collect();
        for step in 0..5 {
            let g: Vec<Vec<f64>> = sizes
                .iter()
                .map(|&n| rng.vec(n, 2.0).iter().map(|x| f64::from(*x as f32)).collect())
                .collect();
            let grads: Vec<HostTensor> = g.iter().map(|g| host(g, DType::F32)).collect();
            optimizer.step(&mut slices_mut(&mut params), &slices(&grads)).expect("step");
            let mut clipped = g.clone();
            let norm = clip_grad_norm(&mut clipped, &clip.to_oracle());
            assert!(norm > 2.0 * clip.max_norm, "the case clips");
            let got = optimizer.grad_norm().expect("a norm");
            assert!(
                (got - norm).abs() <= 1e-6 * norm,
                "{algorithm:?} step {step}: norm {got}, oracle {norm}"
            );
            for ((p, oracle), g) in want.iter_mut().zip(&mut oracles).zip(&clipped) {
                oracle.step(p, g);
            }
            // The caller's gradients are not rewritten.
            assert_eq!(grads[0].to_f64(), g[0]);
        }
        for (i, n) in sizes.iter().enumerate() {
            let what = format!("{algorithm:?} clipped param[{i}] (n = {n})");
            assert_close(&what, &params[i].to_f64(), &want[i], Tolerance::F32);
        }
    }
}

#[test]
fn a_bad_max_norm_is_refused_by_the_cpu_backend() {
    let params = [host(&[1.0; 4], DType::F32)];
    for max_norm in [0.0, -2.0, f64::NAN] {
        let options = CpuOptimizer::builder().grad_clip(wgpu_optim::GradClip::l2(max_norm));
        assert!(matches!(
            options.build(Adam::default(), &slices(&params)),
            Err(Error::BadHyperparameter { name: "max_norm", .. })
        ));
    }
}
