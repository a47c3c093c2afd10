//! Checkpoints in the middle of a trajectory, on both backends.

use crate::common::{ctx, download, Rng};
use wgpu_optim::cpu::{CpuOptimizer, HostTensor};
use wgpu_optim::{Algorithm, DType, Optimizer, Tensor};

use super::{assert_bits_eq, host, slices, slices_mut, SIZES};

/// Saving after 1 and after 3 steps and loading into a fresh optimizer continues the very
/// trajectory of an uninterrupted run of `algorithm`, bit for bit, on each backend: the step
/// count comes back (the step after the first is not a first step) and so does every state.
pub fn a_loaded_checkpoint_continues_the_same_trajectory(algorithm: Algorithm, seed: u64) {
    let ctx = ctx();
    let mut rng = Rng::new(seed);
    let start: Vec<Vec<f64>> = SIZES.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grads: Vec<Vec<Vec<f64>>> =
        (0..5).map(|_| SIZES.iter().map(|&n| rng.vec(n, 1.0)).collect()).collect();
    for saved_after in [1, 3] {
        let gpu_run = |interrupt: bool| -> Vec<Vec<f64>> {
            let params: Vec<Tensor> = start.iter().map(|p| ctx.upload("param", p, DType::F32)).collect();
            let mut opt = Optimizer::builder().build(&ctx, algorithm, &params).unwrap();
            for (k, g) in grads.iter().enumerate() {
                if interrupt && k == saved_after {
                    let bytes = opt.save_to_bytes().unwrap();
                    opt = Optimizer::builder().build(&ctx, algorithm, &params).unwrap();
                    opt.load_from_bytes(&bytes).unwrap();
                    assert_eq!(opt.step_count(), saved_after as u64);
                }
                let g: Vec<Tensor> = g.iter().map(|g| ctx.upload("grad", g, DType::F32)).collect();
                opt.step(&g).unwrap();
            }
            let kinds = algorithm.state_kinds();
            let states = (0..SIZES.len()).flat_map(|i| kinds.iter().map(move |k| (i, *k)));
            let states: Vec<Vec<f64>> = states
                .map(|(i, k)| download(&ctx, opt.state(i, k).unwrap().and_then(|s| s.dense()).unwrap()))
                .collect();
            params.iter().map(|p| download(&ctx, p)).chain(states).collect()
        };
        let cpu_run = |interrupt: bool| -> Vec<Vec<f64>> {
            let mut params: Vec<HostTensor> = start.iter().map(|p| host(p, DType::F32)).collect();
            let mut opt = CpuOptimizer::builder().build(algorithm, &slices(&params)).unwrap();
            for (k, g) in grads.iter().enumerate() {
                if interrupt && k == saved_after {
                    let bytes = opt.save_to_bytes().unwrap();
                    opt = CpuOptimizer::builder().build(algorithm, &slices(&params)).unwrap();
                    opt.load_from_bytes(&bytes).unwrap();
                    assert_eq!(opt.step_count(), saved_after as u64);
                }
                let g: Vec<HostTensor> = g.iter().map(|g| host(g, DType::F32)).collect();
                opt.step(&mut slices_mut(&mut params), &slices(&g)).unwrap();
            }
            let kinds = algorithm.state_kinds();
            let states = (0..SIZES.len()).flat_map(|i| kinds.iter().map(move |k| (i, *k)));
            let states: Vec<Vec<f64>> =
                states.map(|(i, k)| opt.state(i, k).and_then(|s| s.dense()).unwrap().to_f64()).collect();
            params.iter().map(HostTensor::to_f64).chain(states).collect()
        };
        for (backend, resumed, whole) in
            [("GPU", gpu_run(true), gpu_run(false)), ("CPU", cpu_run(true), cpu_run(false))]
        {
            for (k, (got, want)) in resumed.iter().zip(&whole).enumerate() {
                let what = format!("{backend} {algorithm:?} saved after {saved_after}: tensor {k}");
                assert_bits_eq(&what, got, want);
            }
        }
    }
}
