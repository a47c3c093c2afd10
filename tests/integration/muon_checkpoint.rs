//! Muon's checkpoints: the momentum buffers under torch's name `momentum_buffer`, the
//! hyperparameters in the group's JSON, and a GPU checkpoint that loads on the CPU backend
//! (and back) and continues as the uninterrupted run does.

use crate::common;

use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut, HostTensor};
use wgpu_optim::{Algorithm, DType, Muon, MuonLrAdjust, NsPrecision, Optimizer, StateKind, Tensor};

const SHAPES: [[usize; 2]; 2] = [[12, 20], [30, 8]];

fn shapes() -> Vec<Vec<usize>> {
    SHAPES.iter().map(|s| s.to_vec()).collect()
}

#[test]
fn a_gpu_muon_checkpoint_loads_on_the_cpu_and_continues_with_the_same_buffers() {
    let ctx = common::ctx();
    let mut rng = common::Rng::new(3);
    let config = Muon {
        lr: 0.02,
        adjust_lr: MuonLrAdjust::MatchRmsAdamW,
        ns_precision: NsPrecision::F32,
        ..Muon::default()
    };
    let lens: Vec<usize> = SHAPES.iter().map(|s| s[0] * s[1]).collect();
    let initial: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let params: Vec<Tensor> = initial.iter().map(|v| ctx.upload("p", v, DType::F32)).collect();
    let mut gpu = Optimizer::builder().param_shapes(shapes()).build(&ctx, config, &params).unwrap();
    for _ in 0..2 {
        let grads: Vec<Tensor> =
            lens.iter().map(|&n| ctx.upload("g", &rng.vec(n, 0.1), DType::F32)).collect();
        gpu.step(&grads).unwrap();
    }
    let bytes = gpu.save_to_bytes().unwrap();
    // torch's state name and the hyperparameters under torch's names.
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.contains("momentum_buffer"), "no momentum_buffer in the checkpoint");
    assert!(text.contains("match_rms_adamw") && text.contains("ns_coefficients"));

    let mut host: Vec<HostTensor> =
        params.iter().map(|p| HostTensor::from_f64(DType::F32, &ctx.read(p).unwrap()).unwrap()).collect();
    let views: Vec<HostSlice<'_>> = host.iter().map(HostTensor::as_slice).collect();
    let mut cpu = CpuOptimizer::builder().param_shapes(shapes()).build(Muon::default(), &views).unwrap();
    cpu.load_from_bytes(&bytes).unwrap();
    assert_eq!(cpu.group_algorithm(0), Some(&Algorithm::Muon(config)));
    for i in 0..2 {
        let want = ctx
            .read(gpu.state(i, StateKind::MomentumBuffer).unwrap().and_then(|s| s.dense()).unwrap())
            .unwrap();
        assert_eq!(
            cpu.state(i, StateKind::MomentumBuffer).and_then(|s| s.dense()).unwrap().to_f64(),
            want,
            "buffer {i}"
        );
    }
    // One more step on both: the CPU's products are not the GPU's, so within f32 tolerance.
    let grads: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 0.1)).collect();
    let gpu_grads: Vec<Tensor> = grads.iter().map(|g| ctx.upload("g", g, DType::F32)).collect();
    gpu.step(&gpu_grads).unwrap();
    let host_grads: Vec<HostTensor> =
        grads.iter().map(|g| HostTensor::from_f64(DType::F32, g).unwrap()).collect();
    let grad_views: Vec<HostSlice<'_>> = host_grads.iter().map(HostTensor::as_slice).collect();
    let mut param_views: Vec<HostSliceMut<'_>> = host.iter_mut().map(HostTensor::as_mut_slice).collect();
    cpu.step(&mut param_views, &grad_views).unwrap();
    for (i, (p, h)) in params.iter().zip(&host).enumerate() {
        let (gpu_values, cpu_values) = (ctx.read(p).unwrap(), h.to_f64());
        for (e, (g, c)) in gpu_values.iter().zip(&cpu_values).enumerate() {
            assert!((g - c).abs() <= 1e-5 + 1e-4 * c.abs(), "param {i} element {e}: GPU {g}, CPU {c}");
        }
    }
    // And back: the CPU's checkpoint loads on a new GPU optimizer.
    let from_cpu = cpu.save_to_bytes().unwrap();
    let mut back = Optimizer::builder().param_shapes(shapes()).build(&ctx, Muon::default(), &params).unwrap();
    back.load_from_bytes(&from_cpu).unwrap();
    assert_eq!(back.group_algorithm(0), Some(&Algorithm::Muon(config)));
}

#[test]
fn a_muon_checkpoint_does_not_load_into_an_sgd_optimizer_and_changes_nothing() {
    let ctx = common::ctx();
    let params: Vec<Tensor> =
        SHAPES.iter().map(|s| ctx.upload("p", &vec![0.5; s[0] * s[1]], DType::F32)).collect();
    let muon = Optimizer::builder().param_shapes(shapes()).build(&ctx, Muon::default(), &params).unwrap();
    let bytes = muon.save_to_bytes().unwrap();
    let sgd = wgpu_optim::Sgd { momentum: 0.9, ..Default::default() };
    let mut gpu = Optimizer::builder().build(&ctx, sgd, &params).unwrap();
    let before = gpu.save_to_bytes().unwrap();
    assert!(gpu.load_from_bytes(&bytes).is_err());
    assert_eq!(gpu.save_to_bytes().unwrap(), before, "a refused load changed the GPU optimizer");
    let host: Vec<Vec<f32>> = SHAPES.iter().map(|s| vec![0.5; s[0] * s[1]]).collect();
    let views: Vec<HostSlice<'_>> = host.iter().map(|h| HostSlice::from(&h[..])).collect();
    let mut cpu = CpuOptimizer::builder().build(sgd, &views).unwrap();
    let before = cpu.save_to_bytes().unwrap();
    assert!(cpu.load_from_bytes(&bytes).is_err());
    assert_eq!(cpu.save_to_bytes().unwrap(), before, "a refused load changed the CPU optimizer");
}
