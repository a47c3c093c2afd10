//! `cargo bench`: one Adam step on the GPU (submit to completion) and on the f64 oracle,
//! so regressions show in criterion's usual reports.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use wgpu_optim::oracle::{torch_adam_step, TorchAdamState};
use wgpu_optim::{Adam, GpuContext, Optimizer};

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

criterion_group!(benches, gpu_adam, oracle_adam);
criterion_main!(benches);
