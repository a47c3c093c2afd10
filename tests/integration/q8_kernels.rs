//! The rules of bitsandbytes' CUDA kernels (`kOptimizerStatic8bit2StateBlockwise`,
//! `kOptimizerStatic8bit1StateBlockwise`, `quantize_2D` in `csrc/kernels.cu`) that its
//! pure-PyTorch reference does not follow, on both backends against the oracle's
//! transcription of the kernels: the sign rule, decoupled decay after the update, a
//! non-finite gradient restarting its element in the 2-state kernel (and staying in its
//! element in the 1-state one), RMSprop8bit's weight decay, and a block of zeros with -0.0
//! in it. (The GPU kernels' variants, which a unit test can pick, are checked the same way in
//! `src/gpu/q8/tests/`; the codes themselves in `src/q8/tests.rs`.)

use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut};
use wgpu_optim::q8::{Q8States, StoredState};
use wgpu_optim::{AdEMAMix, Adam, Algorithm, Lion, Optimizer, RmsProp, Sgd, StateKind, StateStorage};
use wgpu_optim_testkit::oracle::bnb::{self, bnb_8bit_step, State8bit};
use wgpu_optim_testkit::{assert_close, compare_codes, Tolerance};

use crate::common;
use wgpu_optim_testkit::oracle::{ToLibrary, ToOracle};

/// Asserts that `state` is 8-bit with every absmax finite, and follows the oracle's `want`
/// as the vectors' format compares 8-bit state.
fn assert_state_follows(what: &str, state: &StoredState, want: &StoredState) {
    let (StoredState::Q8 { codes, absmax }, StoredState::Q8 { codes: want_codes, absmax: want_absmax }) =
        (state, want)
    else {
        panic!("{what}: not 8-bit");
    };
    assert!(absmax.iter().all(|a| a.is_finite()), "{what}: absmax {absmax:?}");
    let widen = |c: &[u8]| c.iter().map(|&c| f64::from(c)).collect::<Vec<_>>();
    let codes_match = compare_codes(&widen(codes), &widen(want_codes));
    assert!(codes_match.passed(), "{what}: codes {codes_match}");
    let widen = |a: &[f32]| a.iter().map(|&a| f64::from(a)).collect::<Vec<_>>();
    assert_close(what, &widen(absmax), &widen(want_absmax), Tolerance::Close { rtol: 1e-4, atol: 0.0 });
}

/// The oracle's quantization leaves a NaN or infinite value out of its block's absmax and
/// stores it as the code of 0. (The crate's own is checked the same way in `src/q8/tests.rs`.)
#[test]
fn the_oracle_leaves_a_non_finite_value_out_of_its_blocks_absmax_and_stores_it_as_zero() {
    for map in [bnb::signed_map(), bnb::unsigned_map()] {
        let zero = map.iter().position(|&c| c == 0.0).unwrap_or_else(|| panic!("no 0")) as u8;
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            assert_eq!(bnb::nearest_code(&map, bad), zero, "{bad}");
            let mut values = vec![0.25f32; 300];
            values[5] = bad;
            values[260] = bad;
            let (mut codes, mut absmax) = (vec![7u8; 300], vec![0.0f32; 2]);
            bnb::quantize(&values, &map, &mut codes, &mut absmax);
            assert_eq!(absmax, [0.25, 0.25], "{bad}");
            assert_eq!((codes[5], codes[260]), (zero, zero), "{bad}");
            assert_eq!(codes[4], 255, "{bad}: a finite value keeps its code");
            // A block of nothing finite has no scale: absmax 1, as an all-zero block.
            bnb::quantize(&[bad; 3], &map, &mut [7u8; 3], &mut absmax[..1]);
            assert_eq!(absmax[0], 1.0, "{bad}");
        }
    }
}

/// Parameters and states after a run.
struct Run {
    params: Vec<Vec<f64>>,
    states: Vec<Vec<StoredState>>,
}

/// `steps[k][i]`: tensor i's gradient at step k.
type Steps = [Vec<Vec<f32>>];

fn gpu_run(algorithm: Algorithm, config: Q8States, initial: &[Vec<f32>], steps: &Steps) -> Run {
    let ctx = common::ctx();
    let params: Vec<_> = initial.iter().map(|p| ctx.upload_f32("param", p)).collect();
    let mut opt = Optimizer::builder()
        .state_storage(StateStorage::Q8(config))
        .build(&ctx, algorithm, &params)
        .unwrap_or_else(|e| panic!("{e}"));
    for grads in steps {
        let grads: Vec<_> = grads.iter().map(|g| ctx.upload_f32("grad", g)).collect();
        opt.step(&grads).unwrap_or_else(|e| panic!("{e}"));
    }
    let states = (0..params.len())
        .map(|i| {
            let state = |kind: &StateKind| {
                opt.state(i, *kind).map(|s| s.and_then(|v| v.q8())).unwrap_or_else(|e| panic!("{e}"))
            };
            algorithm
                .state_kinds()
                .iter()
                .map(|kind| state(kind).unwrap_or_else(|| panic!("no state")))
                .collect()
        })
        .collect();
    let params = params.iter().map(|p| common::download(&ctx, p)).collect();
    Run { params, states }
}

fn cpu_run(algorithm: Algorithm, config: Q8States, initial: &[Vec<f32>], steps: &Steps) -> Run {
    let mut params = initial.to_vec();
    let views: Vec<_> = params.iter().map(|p| HostSlice::F32(p)).collect();
    let mut opt = CpuOptimizer::builder()
        .state_storage(StateStorage::Q8(config))
        .build(algorithm, &views)
        .unwrap_or_else(|e| panic!("{e}"));
    for grads in steps {
        let mut views: Vec<_> = params.iter_mut().map(|p| HostSliceMut::F32(p)).collect();
        let grads: Vec<_> = grads.iter().map(|g| HostSlice::F32(g)).collect();
        opt.step(&mut views, &grads).unwrap_or_else(|e| panic!("{e}"));
    }
    let states = (0..params.len())
        .map(|i| {
            let state = |kind: &StateKind| {
                opt.state(i, *kind).and_then(|s| s.q8()).cloned().unwrap_or_else(|| panic!("no state"))
            };
            algorithm.state_kinds().iter().map(state).collect()
        })
        .collect();
    let params = params.iter().map(|p| p.iter().map(|&x| f64::from(x)).collect()).collect();
    Run { params, states }
}

fn oracle_run(algorithm: Algorithm, config: Q8States, initial: &[Vec<f32>], steps: &Steps) -> Run {
    let mut params: Vec<Vec<f64>> =
        initial.iter().map(|p| p.iter().map(|&x| f64::from(x)).collect()).collect();
    let mut states: Vec<Vec<State8bit>> = params
        .iter()
        .map(|p| {
            let quantized = config.quantizes(p.len() as u64);
            algorithm.state_kinds().iter().map(|_| State8bit::zeros(p.len(), quantized)).collect()
        })
        .collect();
    for (k, grads) in steps.iter().enumerate() {
        for ((param, state), grad) in params.iter_mut().zip(&mut states).zip(grads) {
            let grad: Vec<f64> = grad.iter().map(|&g| f64::from(g)).collect();
            bnb_8bit_step(&algorithm.to_oracle(), k as u64 + 1, param, &grad, state)
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }
    let states = states.iter().map(|s| s.iter().map(ToLibrary::to_library).collect()).collect();
    Run { params, states }
}

/// Both backends' runs.
fn backends(
    algorithm: Algorithm,
    config: Q8States,
    initial: &[Vec<f32>],
    steps: &Steps,
) -> [(&'static str, Run); 2] {
    [("gpu", gpu_run(algorithm, config, initial, steps)), ("cpu", cpu_run(algorithm, config, initial, steps))]
}

/// Deterministic values in `[low, high)`.
fn spread(n: usize, seed: usize, low: f32, high: f32) -> Vec<f32> {
    (0..n).map(|i| low + (high - low) * ((i * 7919 + seed * 104_729) % 1000) as f32 / 1000.0).collect()
}

/// The minimal case, numbers from bitsandbytes' kernel: AdamW on two elements, one
/// with a tiny negative gradient. Its first moment is stored as code 126, below the code of
/// 0, so with a second moment of about 0 the next step divides it by eps and moves the
/// parameter by +2.563e-3; with code 127 (the nearest code alone) it moved by +1.30e-4.
#[test]
fn a_tiny_negative_first_moment_keeps_its_sign_and_moves_its_parameter_as_the_kernel_does() {
    let adamw = Adam { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01, ..Adam::adamw() };
    let config = Q8States { min_8bit_size: 0 };
    let steps = vec![vec![vec![0.1f32, -1e-9]]; 2];
    let want = oracle_run(adamw.into(), config, &[vec![0.5, 0.5]], &steps);
    for (backend, run) in backends(adamw.into(), config, &[vec![0.5, 0.5]], &steps) {
        let StoredState::Q8 { codes, .. } = &run.states[0][0] else { panic!("{backend}: not 8-bit") };
        assert_eq!(codes, &[255, 126], "{backend}: exp_avg's codes");
        let moved = run.params[0][1] - 0.5;
        assert!((moved - 2.563e-3).abs() < 1e-6, "{backend}: p[1] moved by {moved:e}");
        assert_close(backend, &run.params[0], &want.params[0], Tolerance::Close { rtol: 1e-6, atol: 0.0 });
    }
}

/// AdamW's and AdEMAMix's 8-bit kernels decay after the update (`p += step; p *= 1 - lr wd`),
/// on 8-bit state and on f32 state below `min_8bit_size` alike. At lr 0.1 and weight decay 1
/// the first step tells the orders apart by about 0.01: it is checked tightly (the first
/// update reads no quantized state), the next two within the codes' rounding.
#[test]
fn decoupled_decay_comes_after_the_update() {
    let config = Q8States { min_8bit_size: 256 };
    let initial = vec![spread(600, 1, -0.5, 0.5), spread(100, 2, -0.5, 0.5)];
    let steps: Vec<Vec<Vec<f32>>> =
        (0..3).map(|k| vec![spread(600, k + 3, -0.1, 0.1), spread(100, k + 4, -0.1, 0.1)]).collect();
    let algorithms: [Algorithm; 2] = [
        Adam { lr: 0.1, weight_decay: 1.0, ..Adam::adamw() }.into(),
        AdEMAMix { lr: 0.1, weight_decay: 1.0, ..AdEMAMix::default() }.into(),
    ];
    for algorithm in algorithms {
        let first = oracle_run(algorithm, config, &initial, &steps[..1]);
        let decay_first = |p: f32, g: f32| {
            // The update is lr sign(g) at the first step (bias-corrected moments are g and g^2).
            f64::from(p) * 0.9 - 0.1 * f64::from(g.signum())
        };
        let distinct = (first.params[0][7] - decay_first(initial[0][7], steps[0][0][7])).abs();
        assert!(distinct > 5e-3, "{algorithm:?}: the orders give {distinct:e} apart");
        for (backend, run) in backends(algorithm, config, &initial, &steps[..1]) {
            for (i, (got, want)) in run.params.iter().zip(&first.params).enumerate() {
                let what = format!("{backend} {algorithm:?}: tensor {i} after step 1");
                assert_close(&what, got, want, Tolerance::Close { rtol: 2e-6, atol: 1e-7 });
            }
        }
        let all = oracle_run(algorithm, config, &initial, &steps);
        for (backend, run) in backends(algorithm, config, &initial, &steps) {
            for (i, (got, want)) in run.params.iter().zip(&all.params).enumerate() {
                let what = format!("{backend} {algorithm:?}: tensor {i} after step 3");
                assert_close(&what, got, want, Tolerance::Close { rtol: 0.0, atol: 2e-3 });
            }
        }
    }
}

/// A NaN or infinite gradient in one element: in bitsandbytes' 2-state kernel (Adam, AdEMAMix)
/// its parameter stays as it was (no decay either) and its states restart from 0; the 1-state
/// kernel's families (SGD with momentum, Lion, RMSprop) step it, and its non-finite states are
/// stored as the code of 0. Either way the rest of its block follows the oracle, and a tensor
/// below `min_8bit_size` (f32 state, bitsandbytes' 32-bit kernel) takes the update as it is.
#[test]
fn a_non_finite_gradient_changes_its_own_element_only_as_the_kernels_say() {
    let config = Q8States { min_8bit_size: 256 };
    let (n, bad) = (600usize, 300usize);
    let initial = vec![spread(n, 5, -0.5, 0.5), spread(100, 6, -0.5, 0.5)];
    let algorithms: [Algorithm; 5] = [
        Adam { lr: 1e-2, weight_decay: 0.1, ..Adam::adamw() }.into(),
        AdEMAMix { lr: 1e-2, weight_decay: 0.1, ..AdEMAMix::default() }.into(),
        Sgd { lr: 1e-2, momentum: 0.9, ..Sgd::default() }.into(),
        Lion { lr: 1e-3, weight_decay: 0.1, ..Lion::default() }.into(),
        RmsProp { lr: 1e-3, ..RmsProp::default() }.into(),
    ];
    for bad_value in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let steps: Vec<Vec<Vec<f32>>> = (0..3)
            .map(|k| {
                let mut g = vec![spread(n, k + 7, -0.05, 0.05), spread(100, k + 8, -0.05, 0.05)];
                if k == 1 {
                    g[0][bad] = bad_value;
                    g[1][50] = bad_value;
                }
                g
            })
            .collect();
        for algorithm in algorithms {
            let restarts = matches!(algorithm, Algorithm::Adam(_) | Algorithm::AdEMAMix(_));
            let want = oracle_run(algorithm, config, &initial, &steps[..2]);
            let before = oracle_run(algorithm, config, &initial, &steps[..1]);
            for (backend, run) in backends(algorithm, config, &initial, &steps[..2]) {
                let what = format!("{backend} {algorithm:?}, gradient {bad_value}");
                if restarts {
                    assert_eq!(run.params[0][bad], before.params[0][bad], "{what}: the parameter kept");
                    for state in &run.states[0] {
                        let StoredState::Q8 { codes, .. } = state else { panic!("{what}: not 8-bit") };
                        assert!(
                            codes[bad] == 127 || codes[bad] == 0,
                            "{what}: code {} restarted",
                            codes[bad]
                        );
                    }
                }
                for (i, (got, want)) in run.params.iter().zip(&want.params).enumerate() {
                    let finite = |p: &[f64]| p.iter().map(|x| x.is_finite()).collect::<Vec<_>>();
                    assert_eq!(finite(got), finite(want), "{what}: tensor {i}'s finite parameters");
                    assert_close(
                        &format!("{what}: tensor {i}"),
                        got,
                        want,
                        Tolerance::Close { rtol: 0.0, atol: 1e-4 },
                    );
                }
                for (t, (got, want)) in run.states.iter().zip(&want.states).enumerate() {
                    for (k, (got, want)) in got.iter().zip(want).enumerate() {
                        if matches!(got, StoredState::Q8 { .. }) {
                            assert_state_follows(&format!("{what}: tensor {t} state {k}"), got, want);
                        }
                    }
                }
            }
        }
    }
}

/// bitsandbytes' RMSprop8bit: the 8-bit kernel decays the gradient into the state only and
/// steps the parameter with the raw gradient; its 32-bit kernel (a tensor below
/// `min_8bit_size`) steps with the decayed one, as PyTorch does. Both backends follow the
/// oracle tightly after the first step and within the codes' rounding after three, and the
/// raw gradient's step is a visible distance from PyTorch's.
#[test]
fn rmsprop8bit_decays_the_gradient_into_the_state_only() {
    let rmsprop = RmsProp { lr: 1e-2, alpha: 0.9, weight_decay: 0.5, ..RmsProp::default() };
    let config = Q8States { min_8bit_size: 256 };
    let initial = vec![spread(600, 9, 0.1, 0.5), spread(100, 10, 0.1, 0.5)];
    let steps: Vec<Vec<Vec<f32>>> =
        (0..3).map(|k| vec![spread(600, k + 11, 0.01, 0.05), spread(100, k + 12, 0.01, 0.05)]).collect();
    let first = oracle_run(rmsprop.into(), config, &initial, &steps[..1]);
    // PyTorch's first step: p - lr g' / (sqrt(0.1 g'^2) + eps), g' = g + wd p.
    let torch = |p: f32, g: f32| {
        let decayed = f64::from(g) + 0.5 * f64::from(p);
        f64::from(p) - 1e-2 * decayed / (0.1 * decayed * decayed).sqrt()
    };
    let raw = (first.params[0][3] - torch(initial[0][3], steps[0][0][3])).abs();
    assert!(raw > 1e-3, "the raw gradient's step is {raw:e} from PyTorch's");
    let small = (first.params[1][3] - torch(initial[1][3], steps[0][1][3])).abs();
    assert!(small < 1e-6, "below min_8bit_size the step is PyTorch's ({small:e} apart)");
    for (backend, run) in backends(rmsprop.into(), config, &initial, &steps[..1]) {
        for (i, (got, want)) in run.params.iter().zip(&first.params).enumerate() {
            let what = format!("{backend}: tensor {i} after step 1");
            assert_close(&what, got, want, Tolerance::Close { rtol: 2e-6, atol: 1e-7 });
        }
    }
    let all = oracle_run(rmsprop.into(), config, &initial, &steps);
    for (backend, run) in backends(rmsprop.into(), config, &initial, &steps) {
        for (i, (got, want)) in run.params.iter().zip(&all.params).enumerate() {
            assert_close(
                &format!("{backend}: tensor {i} after step 3"),
                got,
                want,
                Tolerance::Close { rtol: 0.0, atol: 1e-3 },
            );
        }
        for (t, (got, want)) in run.states.iter().zip(&all.states).enumerate() {
            let what = format!("{backend}: tensor {t}'s square_avg");
            match (&got[0], &want[0]) {
                (StoredState::F32(got), StoredState::F32(want)) => {
                    let widen = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
                    assert_close(
                        &what,
                        &widen(got),
                        &widen(want),
                        Tolerance::Close { rtol: 1e-5, atol: 0.0 },
                    );
                }
                (got, want) => assert_state_follows(&what, got, want),
            }
        }
    }
}

/// A block whose new first moments are all zero, some of them -0.0 (a -0.0 gradient on the
/// fresh state, whose codes read back -0.0 under absmax 0), stores absmax 1 and the code of 0
/// throughout, as the kernel's absmax 0 reads back zeros; in a block with a non-zero value
/// the same -0.0 keeps its sign, code 126.
#[test]
fn a_block_of_zeros_stores_the_code_of_zero_and_minus_zero_elsewhere_keeps_its_sign() {
    let config = Q8States { min_8bit_size: 256 };
    let mut grad = vec![-0.0f32; 512];
    grad[300] = 0.25;
    let steps = vec![vec![grad]];
    let algorithms: [Algorithm; 2] = [Adam::adamw().into(), Sgd { momentum: 0.9, ..Sgd::default() }.into()];
    for algorithm in algorithms {
        for (backend, run) in backends(algorithm, config, &[vec![0.5; 512]], &steps) {
            let StoredState::Q8 { codes, absmax } = &run.states[0][0] else { panic!("{backend}: not 8-bit") };
            let what = format!("{backend} {algorithm:?}");
            assert_eq!(absmax[0], 1.0, "{what}: the block of zeros' absmax");
            assert!(codes[..256].iter().all(|&c| c == 127), "{what}: the block of zeros' codes");
            assert_eq!((codes[299], codes[300], codes[301]), (126, 255, 126), "{what}: the other block's");
        }
    }
}
