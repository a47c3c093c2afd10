//! Checkpoints of 4-bit state under torchao's names (`state.{i}.exp_avg.codes`, `.scale`,
//! `.qmap`; f32 state as `state.{i}.exp_avg`), loadable by the other backend, refused
//! whole where the settings differ.

use crate::common;

use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut};
use wgpu_optim::q4::{Q4State, Q4States};
use wgpu_optim::{Adam, Checkpoint, DType, Error, Optimizer, StateKind, StateStorage, Tensor};
use wgpu_optim_testkit::oracle::ao4;

const SIZES: [usize; 2] = [4096, 300];

fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut x = seed.wrapping_add(0x9e37_79b9);
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

/// A CPU optimizer two steps in, and its parameters.
fn stepped_cpu(config: Q4States) -> (CpuOptimizer, Vec<Vec<f32>>) {
    let mut params: Vec<Vec<f32>> = SIZES.iter().map(|&n| values(n, n as u64, 1.0)).collect();
    let views: Vec<HostSlice<'_>> = params.iter().map(|p| HostSlice::F32(p)).collect();
    let mut opt = CpuOptimizer::builder()
        .state_storage(StateStorage::Q4(config))
        .build(Adam::adamw(), &views)
        .unwrap_or_else(|e| panic!("{e}"));
    for t in 0..2 {
        let grads: Vec<Vec<f32>> = SIZES.iter().map(|&n| values(n, 10 + t, 0.1)).collect();
        let g: Vec<HostSlice<'_>> = grads.iter().map(|g| HostSlice::F32(g)).collect();
        let mut p: Vec<HostSliceMut<'_>> = params.iter_mut().map(|p| HostSliceMut::F32(p)).collect();
        opt.step(&mut p, &g).unwrap_or_else(|e| panic!("{e}"));
    }
    (opt, params)
}

#[test]
fn a_checkpoint_holds_torchaos_names_and_loads_into_the_other_backend() {
    let ctx = common::ctx();
    let config = Q4States::default();
    let (cpu, params) = stepped_cpu(config);
    let bytes = cpu.save_to_bytes().unwrap_or_else(|e| panic!("{e}"));
    let checkpoint = Checkpoint::parse(&bytes).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(checkpoint.q4_states, Some(config));
    assert_eq!(checkpoint.step, 2);

    // The file's tensors are torchao's: packed codes, one scale per block, the map; f32 below.
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap_or_else(|e| panic!("{e}"));
    let codes = file.tensor("state.0.exp_avg.codes").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((codes.dtype(), codes.shape()), (safetensors::Dtype::U8, &[2048usize][..]));
    let Some(Q4State::Q4 { codes: held, scale }) = cpu.state(0, StateKind::ExpAvg).and_then(|s| s.q4())
    else {
        panic!("4-bit")
    };
    assert_eq!(codes.data(), &held[..]);
    assert_eq!(file.tensor("state.0.exp_avg_sq.scale").map(|t| t.shape().to_vec()).ok(), Some(vec![32]));
    assert_eq!(scale.len(), 32);
    let qmap1: Vec<f32> = file
        .tensor("state.0.exp_avg.qmap")
        .unwrap_or_else(|e| panic!("{e}"))
        .data()
        .chunks(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(qmap1, ao4::signed_map());
    assert!(file.tensor("state.1.exp_avg").is_ok(), "f32 state under PyTorch's name");

    // Into the GPU: the same states, and the next step agrees with the CPU's.
    let tensors: Vec<Tensor> = params.iter().map(|p| ctx.upload("p", &f64s(p), DType::F32)).collect();
    let mut gpu = Optimizer::builder()
        .state_storage(StateStorage::Q4(config))
        .build(&ctx, Adam::adamw(), &tensors)
        .unwrap_or_else(|e| panic!("{e}"));
    gpu.load_from_bytes(&bytes).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(gpu.step_count(), 2);
    for i in 0..SIZES.len() {
        for kind in [StateKind::ExpAvg, StateKind::ExpAvgSq] {
            let got = gpu.state(i, kind).map(|s| s.and_then(|v| v.q4())).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(got.as_ref(), cpu.state(i, kind).and_then(|s| s.q4()), "tensor {i} {kind:?}");
        }
    }
    // And back: the GPU's checkpoint is the CPU's byte for byte.
    assert_eq!(gpu.save_to_bytes().unwrap_or_else(|e| panic!("{e}")), bytes);
    let (mut other, _) = stepped_cpu(config);
    other.set_step_count(0).unwrap_or_else(|e| panic!("{e}"));
    other.load_from_bytes(&bytes).unwrap_or_else(|e| panic!("{e}"));
    for kind in [StateKind::ExpAvg, StateKind::ExpAvgSq] {
        assert_eq!(other.state(0, kind).and_then(|s| s.q4()), cpu.state(0, kind).and_then(|s| s.q4()));
    }
}

#[test]
fn a_checkpoint_of_other_settings_is_refused_and_changes_nothing() {
    let (cpu, _) = stepped_cpu(Q4States::default());
    let bytes = cpu.save_to_bytes().unwrap_or_else(|e| panic!("{e}"));
    let (mut other, _) = stepped_cpu(Q4States { block_size: 64, ..Q4States::default() });
    let before = other.state(0, StateKind::ExpAvg).and_then(|s| s.q4()).cloned();
    let err = other.load_from_bytes(&bytes).unwrap_err();
    assert!(matches!(err, Error::BadFile { .. }) && err.to_string().contains("block_size"), "{err}");
    assert_eq!(other.state(0, StateKind::ExpAvg).and_then(|s| s.q4()).cloned(), before);

    let weights: Vec<Vec<f32>> = SIZES.iter().map(|&n| vec![0.0; n]).collect();
    let views: Vec<HostSlice<'_>> = weights.iter().map(|p| HostSlice::F32(p)).collect();
    let mut plain = CpuOptimizer::builder().build(Adam::adamw(), &views).unwrap_or_else(|e| panic!("{e}"));
    let err = plain.load_from_bytes(&bytes).unwrap_err();
    assert!(err.to_string().contains("4-bit"), "{err}");
    assert_eq!(plain.step_count(), 0);

    // A scale that cannot scale a block is refused by name.
    let mut bad = bytes.clone();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap_or_else(|e| panic!("{e}"));
    let scale = file.tensor("state.0.exp_avg.scale").unwrap_or_else(|e| panic!("{e}")).data();
    let at = bytes.windows(scale.len()).position(|w| w == scale).unwrap_or_else(|| panic!("scale bytes"));
    bad[at..at + 4].copy_from_slice(&(-1.0f32).to_le_bytes());
    let (mut fresh, _) = stepped_cpu(Q4States::default());
    let err = fresh.load_from_bytes(&bad).unwrap_err();
    assert!(err.to_string().contains("state.0.exp_avg.scale[0]"), "{err}");
}
