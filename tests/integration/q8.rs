//! Blockwise 8-bit states against bitsandbytes' own: the maps bit for bit, and the oracle's
//! 8-bit Adam, AdamW and SGD with momentum against the trajectories bitsandbytes 0.50.2
//! produced (the public `bnb_*` conformance vectors in `tests/vectors/`, which the conformance
//! runner also runs on both backends).
//!
//! Codes and absmax compare as the vectors' format says: every code within 1 of the expected
//! one and at most 1 % of them different (a value near the midpoint of two codes takes either
//! depending on the last bit of f32 arithmetic), each absmax within a relative 1e-4. Then what
//! both backends refuse with 8-bit state.

use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};
use serde_json::Value;
use wgpu_optim::q8::{self, StoredState};
use wgpu_optim_testkit::oracle::bnb::{
    self, bnb_8bit_step, bnb_adam8bit_step, bnb_sgd8bit_step, BnbAdam, BnbSgd, State8bit,
};
use wgpu_optim_testkit::{assert_close, Tolerance};

use crate::common;

use wgpu_optim::cpu::{CpuOptimizer, CpuOptimizerBuilder, HostSlice, HostSliceMut};
use wgpu_optim::q8::Q8States;
use wgpu_optim::{
    Adagrad, Adam, Algorithm, DType, Error, GradClip, Optimizer, OptimizerBuilder, QuantizedState, StateKind,
    StateStorage,
};
use wgpu_optim_testkit::oracle::{ToLibrary, ToOracle};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors").join(name)
}

/// One vector file: its tensors by name and its metadata.
struct Vector {
    bytes: Vec<u8>,
}

impl Vector {
    fn load(name: &str) -> Vector {
        let path = fixture(name);
        Vector { bytes: std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())) }
    }

    fn tensors(&self) -> SafeTensors<'_> {
        SafeTensors::deserialize(&self.bytes).unwrap_or_else(|e| panic!("{e}"))
    }

    fn metadata(&self, key: &str) -> String {
        let (_, metadata) = SafeTensors::read_metadata(&self.bytes).unwrap_or_else(|e| panic!("{e}"));
        metadata.metadata().as_ref().and_then(|m| m.get(key)).cloned().unwrap_or_else(|| panic!("no {key}"))
    }

    fn attribute(&self, name: &str) -> Value {
        let attributes: Value =
            serde_json::from_str(&self.metadata("attributes")).unwrap_or_else(|e| panic!("{e}"));
        attributes[name].clone()
    }

    fn number(&self, name: &str) -> f64 {
        self.attribute(name).as_f64().unwrap_or_else(|| panic!("attribute {name} is not a number"))
    }

    fn has(&self, name: &str) -> bool {
        self.tensors().names().contains(&name)
    }

    fn f32s(&self, name: &str) -> Vec<f32> {
        let tensors = self.tensors();
        let view = tensors.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(view.dtype(), Dtype::F32, "{name}");
        view.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
    }

    fn f64s(&self, name: &str) -> Vec<f64> {
        self.f32s(name).into_iter().map(f64::from).collect()
    }

    fn codes(&self, name: &str) -> Vec<u8> {
        let tensors = self.tensors();
        let view = tensors.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(view.dtype(), Dtype::U8, "{name}");
        view.data().to_vec()
    }

    fn tolerance(&self) -> Tolerance {
        let parse = |key: &str| self.metadata(key).parse::<f64>().unwrap_or_else(|e| panic!("{key}: {e}"));
        Tolerance::Close { rtol: parse("rtol"), atol: parse("atol") }
    }

    fn count(&self) -> usize {
        self.metadata("count").parse().unwrap_or_else(|e| panic!("count: {e}"))
    }

    fn steps(&self) -> usize {
        self.metadata("steps").parse().unwrap_or_else(|e| panic!("steps: {e}"))
    }

    /// Tensor `i`'s gradient at every step.
    fn grads(&self, i: usize) -> Vec<Vec<f64>> {
        let all = self.f64s(&format!("grad.{i}"));
        let len = all.len() / self.steps();
        all.chunks(len).map(<[f64]>::to_vec).collect()
    }

    fn min_8bit_size(&self) -> usize {
        self.number("min_8bit_size") as usize
    }
}

/// A state against the vector's `state{k}.{i}` (and `absmax{k}.{i}` when 8-bit).
fn assert_state(vector: &Vector, k: usize, i: usize, got: &StoredState) {
    let name = format!("state{k}.{i}");
    match got {
        StoredState::Q8 { codes, absmax } => {
            let want = vector.codes(&name);
            assert_eq!(codes.len(), want.len(), "{name}");
            let differing = codes.iter().zip(&want).filter(|(a, b)| a != b).count();
            let furthest = codes.iter().zip(&want).map(|(a, b)| a.abs_diff(*b)).max().unwrap_or(0);
            assert!(furthest <= 1, "{name}: a code {furthest} away from bitsandbytes'");
            assert!(differing * 100 <= want.len(), "{name}: {differing} of {} codes differ", want.len());
            let want_absmax = vector.f32s(&format!("absmax{k}.{i}"));
            assert_eq!(absmax.len(), want_absmax.len(), "absmax{k}.{i}");
            for (b, (got, want)) in absmax.iter().zip(&want_absmax).enumerate() {
                assert!((got - want).abs() <= 1e-4 * want.abs(), "absmax{k}.{i}[{b}]: {got} against {want}");
            }
        }
        StoredState::F32(values) => {
            assert!(!vector.has(&format!("absmax{k}.{i}")), "{name} is 8-bit in the vector, f32 here");
            let got: Vec<f64> = values.iter().map(|&v| f64::from(v)).collect();
            assert_close(&name, &got, &vector.f64s(&name), vector.tolerance());
        }
    }
}

/// The map wgpu-optim reads a state of `kind` back with: every code under absmax 1.
fn crate_map(kind: StateKind) -> Vec<f32> {
    let every_code = StoredState::Q8 { codes: (0..=255).collect(), absmax: vec![1.0] };
    every_code.values(kind).unwrap_or_else(|e| panic!("{e}"))
}

/// Both the crate's maps (as its states read back) and the oracle's own.
#[test]
fn the_signed_and_unsigned_maps_are_bitsandbytes_maps_bit_for_bit() {
    for name in ["bnb_adam8bit_n8192.safetensors", "bnb_adamw8bit_mixed.safetensors"] {
        let vector = Vector::load(name);
        let bits = |map: &[f32]| map.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&crate_map(StateKind::ExpAvg)), bits(&vector.f32s("qmap1")), "{name}: qmap1");
        assert_eq!(bits(&crate_map(StateKind::ExpAvgSq)), bits(&vector.f32s("qmap2")), "{name}: qmap2");
        assert_eq!(bits(&bnb::signed_map()), bits(&vector.f32s("qmap1")), "{name}: the oracle's qmap1");
        assert_eq!(bits(&bnb::unsigned_map()), bits(&vector.f32s("qmap2")), "{name}: the oracle's qmap2");
    }
    let sgd = Vector::load("bnb_sgd8bit_momentum.safetensors");
    assert_eq!(crate_map(StateKind::MomentumBuffer), sgd.f32s("qmap1"));
    assert_eq!(bnb::signed_map().to_vec(), sgd.f32s("qmap1"));
}

#[test]
fn bitsandbytes_8bit_adam_and_adamw_trajectories_match_the_oracle() {
    for name in ["bnb_adam8bit_n8192.safetensors", "bnb_adamw8bit_mixed.safetensors"] {
        let vector = Vector::load(name);
        let betas = vector.attribute("betas");
        let config = BnbAdam {
            lr: vector.number("lr"),
            beta1: betas[0].as_f64().unwrap_or_else(|| panic!("betas")),
            beta2: betas[1].as_f64().unwrap_or_else(|| panic!("betas")),
            eps: vector.number("eps"),
            weight_decay: vector.number("weight_decay"),
        };
        assert_eq!(vector.number("block_size") as usize, q8::BLOCK_SIZE);
        for i in 0..vector.count() {
            let mut param = vector.f64s(&format!("param.{i}"));
            let len = param.len();
            let mut m = State8bit::zeros(len, len >= vector.min_8bit_size());
            let mut v = State8bit::zeros(len, len >= vector.min_8bit_size());
            for (step, grad) in vector.grads(i).iter().enumerate() {
                bnb_adam8bit_step(&config, step as u64 + 1, &mut param, grad, &mut m, &mut v)
                    .unwrap_or_else(|e| panic!("{e}"));
            }
            assert_close(
                &format!("{name}: param_out.{i}"),
                &param,
                &vector.f64s(&format!("param_out.{i}")),
                vector.tolerance(),
            );
            assert_state(&vector, 1, i, &m.to_library());
            assert_state(&vector, 2, i, &v.to_library());
        }
    }
}

#[test]
fn bitsandbytes_8bit_sgd_with_momentum_trajectory_matches_the_oracle() {
    let vector = Vector::load("bnb_sgd8bit_momentum.safetensors");
    assert_eq!(vector.number("dampening"), 0.0, "the 8-bit update has no dampening");
    let config = BnbSgd {
        lr: vector.number("lr"),
        momentum: vector.number("momentum"),
        weight_decay: vector.number("weight_decay"),
    };
    let mut param = vector.f64s("param.0");
    let mut buffer = State8bit::zeros(param.len(), param.len() >= vector.min_8bit_size());
    for (step, grad) in vector.grads(0).iter().enumerate() {
        bnb_sgd8bit_step(&config, step as u64 + 1, &mut param, grad, &mut buffer)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    assert_close("param_out.0", &param, &vector.f64s("param_out.0"), vector.tolerance());
    assert_state(&vector, 1, 0, &buffer.to_library());
}

#[test]
fn a_state_or_gradient_of_another_length_is_refused_and_nothing_changes() {
    let config = BnbAdam { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 };
    let mut param = vec![0.5; 300];
    let mut m = State8bit::zeros(300, true);
    let mut short = State8bit::Q8 { codes: vec![0; 300], absmax: vec![0.0; 1] };
    let err = bnb_adam8bit_step(&config, 1, &mut param, &[0.1; 300], &mut m, &mut short).unwrap_err();
    assert!(err.to_string().contains("absmax"), "{err}");
    let mut v = State8bit::zeros(300, true);
    let err = bnb_adam8bit_step(&config, 1, &mut param, &[0.1; 299], &mut m, &mut v).unwrap_err();
    assert!(err.to_string().contains("grad"), "{err}");
    assert_eq!((param, m, v), (vec![0.5; 300], State8bit::zeros(300, true), State8bit::zeros(300, true)));

    let sgd = BnbSgd { lr: 0.01, momentum: 0.9, weight_decay: 0.0 };
    let mut param = vec![0.5; 10];
    let mut buffer = State8bit::F32(vec![0.0; 9]);
    let err = bnb_sgd8bit_step(&sgd, 1, &mut param, &[0.1; 10], &mut buffer).unwrap_err();
    assert!(err.to_string().contains("momentum_buffer"), "{err}");
    assert_eq!(param, vec![0.5; 10]);
}

fn q8_options() -> OptimizerBuilder {
    Optimizer::builder().state_storage(StateStorage::Q8(Q8States::default()))
}

fn cpu_q8_options() -> CpuOptimizerBuilder {
    CpuOptimizer::builder().state_storage(StateStorage::Q8(Q8States::default()))
}

/// What 8-bit state cannot run is refused at construction by both backends, by name.
#[test]
fn algorithms_options_and_dtypes_without_an_8bit_form_are_refused_by_both_backends() {
    let ctx = common::ctx();
    let f32_param = ctx.upload_f32("p", &[0.5; 4096]);
    let host = vec![0.5f32; 4096];
    let amsgrad = Adam { amsgrad: true, ..Adam::default() };
    let cases: Vec<(wgpu_optim::Algorithm, OptimizerBuilder, CpuOptimizerBuilder, &str)> = vec![
        (amsgrad.into(), q8_options(), cpu_q8_options(), "AMSGrad"),
        (Adagrad::default().into(), q8_options(), cpu_q8_options(), "Adagrad"),
    ];
    for (algorithm, options, cpu_options, named) in cases {
        let err = options.build(&ctx, algorithm, std::slice::from_ref(&f32_param)).unwrap_err();
        assert!(matches!(err, Error::ConflictingOptions { .. }) && err.to_string().contains(named), "{err}");
        let err = cpu_options.build(algorithm, &[HostSlice::F32(&host)]).unwrap_err();
        assert!(err.to_string().contains(named), "{err}");
    }
    let f16_param = ctx.upload("p16", &[0.5; 4096], DType::F16);
    let err = q8_options().build(&ctx, Adam::default(), &[f16_param]).unwrap_err();
    assert!(matches!(err, Error::DTypeMismatch { .. }) && err.to_string().contains("params[0]"), "{err}");
}

/// A gradient the 8-bit step cannot read is refused with nothing changed: not F32, or
/// overlapping its parameter.
#[test]
fn gradients_an_8bit_step_cannot_take_are_refused_and_nothing_changes() {
    let ctx = common::ctx();
    let param = ctx.upload_f32("p", &[0.5; 5000]);
    let mut opt = q8_options()
        .build(&ctx, Adam::default(), std::slice::from_ref(&param))
        .unwrap_or_else(|e| panic!("{e}"));
    let f16_grad = ctx.upload("g16", &[0.1; 5000], DType::F16);
    let err = opt.step(&[f16_grad]).unwrap_err();
    assert!(err.to_string().contains("grads[0]"), "{err}");
    let overlapping = wgpu_optim::Tensor {
        buffer: param.buffer.clone(),
        offset: 4 * 100,
        len: 5000 - 100,
        dtype: DType::F32,
    };
    assert!(opt.step(&[overlapping]).is_err());
    assert_eq!(opt.step_count(), 0);
    assert_eq!(ctx.read_f32(&param).unwrap_or_else(|e| panic!("{e}")), vec![0.5; 5000]);

    let mut host = vec![0.5f32; 5000];
    let mut cpu =
        cpu_q8_options().build(Adam::default(), &[HostSlice::F32(&host)]).unwrap_or_else(|e| panic!("{e}"));
    let half_grad = vec![half::bf16::from_f32(0.1); 5000];
    let err = cpu.step(&mut [HostSliceMut::F32(&mut host)], &[HostSlice::BF16(&half_grad)]).unwrap_err();
    assert!(matches!(err, Error::DTypeMismatch { .. }) && err.to_string().contains("grads[0]"), "{err}");
    assert_eq!((cpu.step_count(), host), (0, vec![0.5; 5000]));
}

/// Replacing a state refuses another storage, length or absmax count, and keeps the old one.
#[test]
fn a_replacement_state_of_the_wrong_form_is_refused_by_both_backends() {
    let ctx = common::ctx();
    let param = ctx.upload_f32("p", &[0.5; 5000]);
    let gpu = q8_options()
        .build(&ctx, Adam::default(), std::slice::from_ref(&param))
        .unwrap_or_else(|e| panic!("{e}"));
    let host = vec![0.5f32; 5000];
    let mut cpu =
        cpu_q8_options().build(Adam::default(), &[HostSlice::F32(&host)]).unwrap_or_else(|e| panic!("{e}"));
    let wrong = [
        (StoredState::F32(vec![0.0; 5000]), "f32 state"),
        (StoredState::Q8 { codes: vec![1; 4999], absmax: vec![1.0; 20] }, "4999"),
        (StoredState::Q8 { codes: vec![1; 5000], absmax: vec![1.0; 19] }, "absmax"),
    ];
    for (state, named) in wrong {
        let err = gpu.set_state(0, StateKind::ExpAvg, &QuantizedState::Q8(state.clone())).unwrap_err();
        assert!(err.to_string().contains(named), "{err}");
        let err = cpu.set_state(0, StateKind::ExpAvg, QuantizedState::Q8(state)).unwrap_err();
        assert!(err.to_string().contains(named), "{err}");
    }
    let zeros = StoredState::zeros(5000, true);
    assert_eq!(
        gpu.state(0, StateKind::ExpAvg).map(|s| s.and_then(|v| v.q8())).unwrap_or_else(|e| panic!("{e}")),
        Some(zeros.clone())
    );
    assert_eq!(cpu.state(0, StateKind::ExpAvg).and_then(|s| s.q8()), Some(&zeros));
    let plain = Optimizer::builder().build(&ctx, Adam::default(), &[param]).unwrap_or_else(|e| panic!("{e}"));
    let err = plain.set_state(0, StateKind::ExpAvg, &QuantizedState::Q8(zeros)).unwrap_err();
    assert!(matches!(err, Error::NeedsOption { option: "state_storage", .. }), "{err}");
}

/// `got` (read back) against the oracle's state as the vectors' format compares 8-bit
/// state: codes by `compare_codes`, absmax within 1e-4 relative; f32 state as f32 results.
fn assert_state_follows(what: &str, got: &StoredState, want: &StoredState) {
    match (got, want) {
        (StoredState::Q8 { codes, absmax }, StoredState::Q8 { codes: want_codes, absmax: want_absmax }) => {
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

/// Parameters after `steps` steps (at learning rate 1e-2) against the oracle's: within 1e-4,
/// except at most 1 % of them, which stay within a step's size per step. A state code one
/// apart from the oracle's (the vectors' format lets 1 % of codes differ: a value near the
/// midpoint of two codes takes either) moves its element's update by up to a code's width,
/// which for a small moment in a coarse part of the map is a good part of the step.
fn assert_params_follow(what: &str, got: &[f64], want: &[f64], steps: usize) {
    let close = wgpu_optim_testkit::compare(got, want, Tolerance::Close { rtol: 0.0, atol: 1e-4 });
    assert!(close.passed() || close.mismatches * 100 <= want.len(), "{what}: {close}");
    let lr = 1e-2;
    assert_close(what, got, want, Tolerance::Close { rtol: 0.0, atol: lr * steps as f64 });
}

/// Tensors of the clipping tests: 8-bit ones and ones below `min_8bit_size` (f32 state),
/// whose gradients count in the global norm all the same.
const CLIPPED_LENGTHS: [usize; 4] = [5003, 300, 4096, 100];

/// Three steps of gradients (rounded to f32) whose global L2 norm is about 3.
fn clipped_gradients() -> Vec<Vec<Vec<f64>>> {
    (0..3)
        .map(|k| {
            CLIPPED_LENGTHS
                .iter()
                .enumerate()
                .map(|(t, &n)| {
                    (0..n)
                        .map(|i| f64::from((((i * 104_729 + k * 31 + t) % 997) as f64 * 1e-4 - 0.05) as f32))
                        .collect()
                })
                .collect()
        })
        .collect()
}

fn clipped_initial() -> Vec<Vec<f64>> {
    CLIPPED_LENGTHS
        .iter()
        .enumerate()
        .map(|(t, &n)| {
            (0..n).map(|i| f64::from((((i * 7919 + t * 13) % 1000) as f64 * 1e-3 - 0.5) as f32)).collect()
        })
        .collect()
}

/// The oracle's clipped trajectory: each step's global norm, then each tensor (run by
/// `algorithms[t]`) stepped with the clipped gradients.
struct ClippedOracle {
    params: Vec<Vec<f64>>,
    states: Vec<Vec<State8bit>>,
}

impl ClippedOracle {
    fn new(algorithms: &[Algorithm]) -> Self {
        let states = CLIPPED_LENGTHS
            .iter()
            .zip(algorithms)
            .map(|(&n, a)| a.state_kinds().iter().map(|_| State8bit::zeros(n, n >= 4096)).collect())
            .collect();
        ClippedOracle { params: clipped_initial(), states }
    }

    /// Step `step` with `grads` clipped to `clip`; returns the norm before clipping.
    fn step(&mut self, algorithms: &[Algorithm], step: u64, grads: &[Vec<f64>], clip: &GradClip) -> f64 {
        let mut clipped = grads.to_vec();
        let norm = wgpu_optim_testkit::oracle::clip_grad_norm(&mut clipped, &clip.to_oracle());
        for (t, g) in clipped.iter().enumerate() {
            bnb_8bit_step(&algorithms[t].to_oracle(), step, &mut self.params[t], g, &mut self.states[t])
                .unwrap_or_else(|e| panic!("{e}"));
        }
        norm
    }
}

/// Global clipping with 8-bit state on the GPU: the norm over every tensor of both groups
/// (8-bit and f32-state ones), each gradient scaled by the coefficient as it is loaded, so
/// that parameters and states (whose absmax scales with the gradients) follow the oracle's
/// clipped trajectory.
#[test]
fn global_clipping_with_8bit_state_follows_the_oracles_clipped_trajectory_on_the_gpu() {
    let ctx = common::ctx();
    let adamw: Algorithm =
        Adam { lr: 1e-2, weight_decay: 0.1, decoupled_weight_decay: true, ..Adam::default() }.into();
    let sgd: Algorithm = wgpu_optim::Sgd { lr: 1e-2, momentum: 0.9, ..Default::default() }.into();
    let algorithms = [adamw, adamw, sgd, sgd];
    let clip = GradClip::l2(0.5);
    let mut oracle = ClippedOracle::new(&algorithms);
    let params: Vec<wgpu_optim::Tensor> =
        oracle.params.iter().map(|p| ctx.upload("param", p, DType::F32)).collect();
    let groups = vec![
        wgpu_optim::ParamGroup::new(adamw, &params[..2]),
        wgpu_optim::ParamGroup::new(sgd, &params[2..]),
    ];
    let options = q8_options().grad_clip(clip);
    let mut opt = options.build_groups(&ctx, groups).unwrap_or_else(|e| panic!("{e}"));
    for (k, grads) in clipped_gradients().iter().enumerate() {
        let tensors: Vec<wgpu_optim::Tensor> =
            grads.iter().map(|g| ctx.upload("grad", g, DType::F32)).collect();
        opt.step(&tensors).unwrap_or_else(|e| panic!("{e}"));
        let want_norm = oracle.step(&algorithms, k as u64 + 1, grads, &clip);
        assert!(want_norm > 4.0 * clip.max_norm, "the case clips (norm {want_norm})");
        let norm = opt.grad_norm().unwrap_or_else(|e| panic!("{e}"));
        assert!((norm - want_norm).abs() <= 1e-5 * want_norm, "step {k}: norm {norm}, oracle {want_norm}");
        for (t, param) in params.iter().enumerate() {
            let what = format!("step {k}: params[{t}]");
            let got = ctx.read(param).unwrap_or_else(|e| panic!("{e}"));
            assert_params_follow(&what, &got, &oracle.params[t], k + 1);
            for (kind, want) in algorithms[t].state_kinds().iter().zip(&oracle.states[t]) {
                let got =
                    opt.state(t, *kind).map(|s| s.and_then(|v| v.q8())).unwrap_or_else(|e| panic!("{e}"));
                let got = got.unwrap_or_else(|| panic!("{what}: no {kind:?}"));
                assert_state_follows(&format!("{what} {kind:?}"), &got, &want.to_library());
            }
        }
    }
}

/// Global clipping with 8-bit state on the CPU backend, for each 8-bit algorithm: the norm
/// over every tensor (8-bit and f32-state ones), the clipped trajectory as the oracle's.
#[test]
fn global_clipping_with_8bit_state_follows_the_oracles_clipped_trajectory_on_the_cpu() {
    let adamw: Algorithm =
        Adam { lr: 1e-2, weight_decay: 0.1, decoupled_weight_decay: true, ..Adam::default() }.into();
    let sgd: Algorithm = wgpu_optim::Sgd { lr: 1e-2, momentum: 0.9, ..Default::default() }.into();
    let clip = GradClip::l2(0.5);
    for algorithm in [adamw, sgd] {
        let algorithms = [algorithm; CLIPPED_LENGTHS.len()];
        let mut oracle = ClippedOracle::new(&algorithms);
        let mut weights: Vec<Vec<f32>> =
            oracle.params.iter().map(|p| p.iter().map(|&x| x as f32).collect()).collect();
        let host: Vec<HostSlice<'_>> = weights.iter().map(|w| HostSlice::F32(w)).collect();
        let options = cpu_q8_options().grad_clip(clip);
        let mut opt = options.build(algorithm, &host).unwrap_or_else(|e| panic!("{e}"));
        for (k, grads) in clipped_gradients().iter().enumerate() {
            let narrow: Vec<Vec<f32>> = grads.iter().map(|g| g.iter().map(|&x| x as f32).collect()).collect();
            let grad_slices: Vec<HostSlice<'_>> = narrow.iter().map(|g| HostSlice::F32(g)).collect();
            let mut param_slices: Vec<HostSliceMut<'_>> =
                weights.iter_mut().map(|w| HostSliceMut::F32(w)).collect();
            opt.step(&mut param_slices, &grad_slices).unwrap_or_else(|e| panic!("{e}"));
            let want_norm = oracle.step(&algorithms, k as u64 + 1, grads, &clip);
            assert!(want_norm > 4.0 * clip.max_norm, "the case clips (norm {want_norm})");
            let norm = opt.grad_norm().unwrap_or_else(|| panic!("step {k}: no norm"));
            assert!(
                (norm - want_norm).abs() <= 1e-5 * want_norm,
                "step {k}: norm {norm}, oracle {want_norm}"
            );
            for (t, w) in weights.iter().enumerate() {
                let what = format!("{algorithm:?} step {k}: params[{t}]");
                let got: Vec<f64> = w.iter().map(|&x| f64::from(x)).collect();
                assert_params_follow(&what, &got, &oracle.params[t], k + 1);
                for (kind, want) in algorithm.state_kinds().iter().zip(&oracle.states[t]) {
                    let got = opt
                        .state(t, *kind)
                        .and_then(|s| s.q8())
                        .unwrap_or_else(|| panic!("{what}: no {kind:?}"));
                    assert_state_follows(&format!("{what} {kind:?}"), got, &want.to_library());
                }
            }
        }
    }
}
