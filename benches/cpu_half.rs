//! `cargo bench --bench cpu_half`: one CPU-backend Adam step with parameters, gradients and
//! state all f16, resp. all bf16 (PyTorch's fused Adam keeps the state in the parameter's
//! dtype too), on one tensor of 1 Mi elements and on 200 tensors of 4096, with f32 beside
//! them for reference, so that regressions of the 16-bit paths show in criterion's reports.
//! (`examples/cpu_step.rs` times the 16 Mi-element step against the host roofline.)

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostTensor};
use wgpu_optim::{Adam, DType};

/// `n` values in [-scale, scale], different for each `seed`.
fn values(n: usize, seed: f64, scale: f64) -> Vec<f64> {
    (0..n).map(|i| ((i as f64 + 1.0) * seed).sin() * scale).collect()
}

fn tensors(sizes: &[usize], dtype: DType, seed: f64, scale: f64) -> Vec<HostTensor> {
    sizes
        .iter()
        .map(|&n| HostTensor::from_f64(dtype, &values(n, seed, scale)).unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

fn cpu_half_adam(c: &mut Criterion) {
    let mut group = c.benchmark_group("cpu_half_step");
    let cases: [(&str, Vec<usize>); 2] = [("adam_1Mi", vec![1 << 20]), ("adam_200x4096", vec![4096; 200])];
    for (name, sizes) in cases {
        for dtype in [DType::F16, DType::BF16, DType::F32] {
            let mut params = tensors(&sizes, dtype, 0.37, 0.02);
            let grads = tensors(&sizes, dtype, 1.37, 0.01);
            let views: Vec<HostSlice<'_>> = params.iter().map(HostTensor::as_slice).collect();
            let mut optimizer =
                CpuOptimizer::builder().build(Adam::default(), &views).unwrap_or_else(|e| panic!("{e}"));
            let grad_views: Vec<HostSlice<'_>> = grads.iter().map(HostTensor::as_slice).collect();
            group.throughput(Throughput::Elements(sizes.iter().sum::<usize>() as u64));
            group.bench_function(format!("{name}_{dtype:?}"), |b| {
                b.iter(|| {
                    let mut views: Vec<_> = params.iter_mut().map(HostTensor::as_mut_slice).collect();
                    optimizer.step(&mut views, &grad_views).unwrap_or_else(|e| panic!("{e}"));
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, cpu_half_adam);
criterion_main!(benches);
