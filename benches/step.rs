//! `cargo bench`: one Adam step on the GPU (submit to completion), on the CPU backend and
//! on the f64 oracle, and the host time to record a step, so regressions show in
//! criterion's usual reports.

#[path = "../examples/bench/shapes.rs"]
mod shapes;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostTensor};
use wgpu_optim::oracle::{torch_adam_step, TorchAdamState};
use wgpu_optim::{Adam, DType, GpuContext, Optimizer, Tensor};

fn gpu_adam(c: &mut Criterion) {
    let ctx = GpuContext::headless_blocking().unwrap_or_else(|e| panic!("{e}"));
    let mut group = c.benchmark_group("gpu_step");
    for (name, config) in [("adam", Adam::default()), ("amsgrad", Adam { amsgrad: true, ..Adam::default() })]
    {
        for n in [1usize << 12, 1 << 20] {
            let params = vec![ctx.upload_f32("param", &vec![0.5; n])];
            let grads = vec![ctx.upload_f32("grad", &vec![0.01; n])];
            let mut optimizer = Optimizer::new(&ctx, config, &params).unwrap_or_else(|e| panic!("{e}"));
            group.throughput(Throughput::Elements(n as u64));
            group.bench_with_input(BenchmarkId::new(name, n), &n, |b, _| {
                b.iter(|| {
                    optimizer.step(&grads).unwrap_or_else(|e| panic!("{e}"));
                    ctx.device().poll(wgpu::PollType::wait_indefinitely()).unwrap_or_else(|e| panic!("{e}"));
                })
            });
        }
    }
    group.finish();
}

fn cpu_adam(c: &mut Criterion) {
    let mut group = c.benchmark_group("cpu_step");
    let cases: [(&str, Vec<usize>); 2] = [("adam_1Mi", vec![1 << 20]), ("adam_200x4096", vec![4096; 200])];
    for (name, sizes) in cases {
        for dtype in [DType::F32, DType::BF16] {
            let mut params: Vec<HostTensor> = sizes
                .iter()
                .map(|&n| HostTensor::filled(dtype, n, 0.5).unwrap_or_else(|e| panic!("{e}")))
                .collect();
            let grads: Vec<HostTensor> = sizes
                .iter()
                .map(|&n| HostTensor::filled(dtype, n, 1e-3).unwrap_or_else(|e| panic!("{e}")))
                .collect();
            let views: Vec<HostSlice<'_>> = params.iter().map(HostTensor::as_slice).collect();
            let mut optimizer = CpuOptimizer::new(Adam::default(), &views).unwrap_or_else(|e| panic!("{e}"));
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

fn oracle_adam(c: &mut Criterion) {
    let mut group = c.benchmark_group("oracle_step");
    let n = 1usize << 12;
    let config = Adam::default();
    let mut param = vec![0.5; n];
    let grad = vec![0.01; n];
    let mut state = TorchAdamState::zeros(n, false);
    group.throughput(Throughput::Elements(n as u64));
    group.bench_function(BenchmarkId::new("adam", n), |b| {
        b.iter(|| torch_adam_step(&config, &mut param, &grad, &mut state))
    });
    group.finish();
}

/// Host time to record one step (one compute pass, no submit) for many tensors: what a
/// trainer pays on the CPU per step, whatever the GPU does.
fn record_step(c: &mut Criterion) {
    let ctx = GpuContext::headless_blocking().unwrap_or_else(|e| panic!("{e}"));
    let mut group = c.benchmark_group("record_step");
    let models = [("gpt2_small_148_tensors", shapes::gpt2_small(1)), ("200x4096", vec![4096; 200])];
    for (name, sizes) in models {
        let params: Vec<Tensor> = sizes.iter().map(|&n| ctx.zeros("param", n, DType::F32)).collect();
        let grads: Vec<Tensor> = sizes.iter().map(|&n| ctx.zeros("grad", n, DType::F32)).collect();
        let mut optimizer = Optimizer::new(&ctx, Adam::adamw(), &params).unwrap_or_else(|e| panic!("{e}"));
        let mut encoder = ctx.device().create_command_encoder(&Default::default());
        optimizer.record_step(&mut encoder, &grads).unwrap_or_else(|e| panic!("{e}")); // builds the bind groups
        group.bench_function(name, |b| {
            b.iter_with_large_drop(|| {
                let mut encoder = ctx.device().create_command_encoder(&Default::default());
                optimizer.record_step(&mut encoder, &grads).unwrap_or_else(|e| panic!("{e}"));
                encoder
            })
        });
        // wgpu validates and encodes a pass when the encoder is finished; a trainer pays that too.
        group.bench_function(format!("{name}_and_finish"), |b| {
            b.iter_with_large_drop(|| {
                let mut encoder = ctx.device().create_command_encoder(&Default::default());
                optimizer.record_step(&mut encoder, &grads).unwrap_or_else(|e| panic!("{e}"));
                encoder.finish()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, gpu_adam, cpu_adam, oracle_adam, record_step);
criterion_main!(benches);
