//! A NaN or infinite gradient element with 8-bit state, on the CPU backend and in the oracle:
//! its parameter goes non-finite as with f32 state, its state takes the code of 0 (so it
//! restarts from zero) and its block's absmax leaves it out, so the block's other elements
//! and the steps after it follow the oracle. (The GPU's two kernels are checked the same way
//! in `src/gpu/q8/tests.rs`, where a test can pick the kernel.)

use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut};
use wgpu_optim::q8::{self, Q8States, StoredState};
use wgpu_optim::{Adam, Algorithm, Sgd, StateKind};
use wgpu_optim_testkit::oracle::bnb::{self, bnb_8bit_step};
use wgpu_optim_testkit::{assert_close, compare_codes, Tolerance};

/// Four blocks, the last partial.
const N: usize = 1000;
/// The element whose gradient is not finite, in the second block.
const BAD: usize = 300;

fn algorithms() -> [Algorithm; 3] {
    [
        Adam { lr: 1e-2, ..Adam::default() }.into(),
        Adam { lr: 1e-2, weight_decay: 0.1, decoupled_weight_decay: true, ..Adam::default() }.into(),
        Sgd { lr: 1e-2, momentum: 0.9, ..Sgd::default() }.into(),
    ]
}

/// A good step's gradients, then `bad_value` at [`BAD`], then good ones again.
fn gradients(bad_value: f32) -> Vec<Vec<f32>> {
    (0..3)
        .map(|k| {
            let mut g: Vec<f32> =
                (0..N).map(|i| (((i * 104_729 + k * 31) % 997) as f64 * 1e-4 - 0.05) as f32).collect();
            if k == 1 {
                g[BAD] = bad_value;
            }
            g
        })
        .collect()
}

fn initial() -> Vec<f32> {
    (0..N).map(|i| (((i * 7919) % 1000) as f64 * 1e-3 - 0.5) as f32).collect()
}

/// The code of 0 in the map of `kind` (the signed map's is not its first code).
fn zero_code(kind: StateKind) -> u8 {
    let map = bnb::map_for(kind);
    map.iter().position(|&c| c == 0.0).unwrap_or_else(|| panic!("no 0 in the map")) as u8
}

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

/// The bad element's own state: the code of 0 under a finite absmax.
fn assert_restarts_from_zero(what: &str, state: &StoredState, kind: StateKind) {
    let StoredState::Q8 { codes, absmax } = state else { panic!("{what}: not 8-bit") };
    assert_eq!(codes[BAD], zero_code(kind), "{what}: the bad element's code");
    assert!(absmax[BAD / q8::BLOCK_SIZE].is_finite(), "{what}: its block's absmax");
}

/// (The crate's own quantization is checked the same way in `src/q8/mod.rs`.)
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

#[test]
fn a_non_finite_gradient_element_makes_only_its_own_parameter_non_finite_on_the_cpu() {
    let config = Q8States { min_8bit_size: 256 };
    for algorithm in algorithms() {
        let kinds = algorithm.state_kinds();
        for bad_value in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let what = format!("{algorithm:?}, gradient {bad_value}");
            let options = CpuOptimizer::builder().q8_states(config);
            let mut weights = initial();
            let mut opt =
                options.build(algorithm, &[HostSlice::F32(&weights)]).unwrap_or_else(|e| panic!("{e}"));
            let mut want: Vec<f64> = weights.iter().map(|&w| f64::from(w)).collect();
            let mut want_states: Vec<StoredState> =
                kinds.iter().map(|_| StoredState::zeros(N, true)).collect();
            for (k, grad) in gradients(bad_value).iter().enumerate() {
                let what = format!("{what}, after step {}", k + 1);
                opt.step(&mut [HostSliceMut::F32(&mut weights)], &[HostSlice::F32(grad)])
                    .unwrap_or_else(|e| panic!("{e}"));
                let grad: Vec<f64> = grad.iter().map(|&g| f64::from(g)).collect();
                bnb_8bit_step(&algorithm, k as u64 + 1, &mut want, &grad, &mut want_states)
                    .unwrap_or_else(|e| panic!("{e}"));
                let non_finite: Vec<usize> = (0..N).filter(|&i| !weights[i].is_finite()).collect();
                let expected: &[usize] = if k == 0 { &[] } else { &[BAD] };
                assert_eq!(non_finite, expected, "{what}: non-finite parameters");
                let got: Vec<f64> = weights.iter().map(|&w| f64::from(w)).collect();
                assert_close(&what, &got, &want, Tolerance::Close { rtol: 0.0, atol: 1e-4 });
                for (kind, want) in kinds.iter().zip(&want_states) {
                    let what = format!("{what}: {kind:?}");
                    let state = opt.q8_state(0, *kind).unwrap_or_else(|| panic!("{what}: no state"));
                    if k == 1 {
                        assert_restarts_from_zero(&what, state, *kind);
                        assert_restarts_from_zero(&format!("{what} (oracle)"), want, *kind);
                    }
                    assert_state_follows(&what, state, want);
                }
            }
        }
    }
}
