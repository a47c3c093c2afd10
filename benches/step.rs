//! `cargo bench`: one Adam step on the GPU (submit to completion: f32, f16 on both paths,
//! bf16, many tensors) and on the f64 oracle, and the host time to record a step, so
//! regressions show in criterion's usual reports. The CPU backend's steps (f32, f16, bf16,
//! one tensor and many) are in `benches/cpu_half.rs`.

#[path = "../examples/bench/shapes.rs"]
mod shapes;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use wgpu_optim::{Adam, DType, GpuContext, Optimizer, Tensor};
use wgpu_optim_testkit::oracle::{torch_adam_step, ToOracle, TorchAdamState};

/// `sizes` tensors of `dtype` with every element `value`.
fn gpu_tensors(ctx: &GpuContext, label: &str, sizes: &[usize], dtype: DType, value: f64) -> Vec<Tensor> {
    sizes.iter().map(|&n| ctx.upload(label, &vec![value; n], dtype)).collect()
}

/// One step submitted and waited for: single tensors of each storage path (f32, f16 native
/// and packed, bf16), and many tensors in one step (200 x 4096, GPT-2 small at 1/4 width),
/// which the multi-tensor dispatch updates with one dispatch per pipeline variant.
fn gpu_adam(c: &mut Criterion) {
    let base = GpuContext::headless_blocking().unwrap_or_else(|e| panic!("{e}"));
    let mut group = c.benchmark_group("gpu_step");
    let amsgrad = Adam { amsgrad: true, ..Adam::default() };
    let quarter_gpt2: Vec<usize> = shapes::gpt2_small(4).into_iter().map(|n| n as usize).collect();
    let cases: Vec<(String, Adam, Vec<usize>, DType, GpuContext)> = vec![
        ("adam_f32_4Ki".into(), Adam::default(), vec![1 << 12], DType::F32, base.clone()),
        ("adam_f32_1Mi".into(), Adam::default(), vec![1 << 20], DType::F32, base.clone()),
        ("amsgrad_f32_1Mi".into(), amsgrad, vec![1 << 20], DType::F32, base.clone()),
        (
            "adam_f16_native_1Mi".into(),
            Adam::default(),
            vec![1 << 20],
            DType::F16,
            base.with_packed_f16(false),
        ),
        (
            "adam_f16_packed_1Mi".into(),
            Adam::default(),
            vec![1 << 20],
            DType::F16,
            base.with_packed_f16(true),
        ),
        ("adam_bf16_1Mi".into(), Adam::default(), vec![1 << 20], DType::BF16, base.clone()),
        ("adam_f32_200x4096".into(), Adam::default(), vec![4096; 200], DType::F32, base.clone()),
        ("adam_bf16_200x4096".into(), Adam::default(), vec![4096; 200], DType::BF16, base.clone()),
        ("adam_f32_gpt2_quarter".into(), Adam::default(), quarter_gpt2, DType::F32, base.clone()),
    ];
    for (name, config, sizes, dtype, ctx) in cases {
        let params = gpu_tensors(&ctx, "param", &sizes, dtype, 0.5);
        let grads = gpu_tensors(&ctx, "grad", &sizes, dtype, 0.01);
        let mut optimizer =
            Optimizer::builder().build(&ctx, config, &params).unwrap_or_else(|e| panic!("{e}"));
        group.throughput(Throughput::Elements(sizes.iter().sum::<usize>() as u64));
        group.bench_function(name, |b| {
            b.iter(|| {
                optimizer.step(&grads).unwrap_or_else(|e| panic!("{e}"));
                ctx.device().poll(wgpu::PollType::wait_indefinitely()).unwrap_or_else(|e| panic!("{e}"));
            })
        });
    }
    group.finish();
}

fn oracle_adam(c: &mut Criterion) {
    let mut group = c.benchmark_group("oracle_step");
    let n = 1usize << 12;
    let config = Adam::default().to_oracle();
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
        let mut optimizer =
            Optimizer::builder().build(&ctx, Adam::adamw(), &params).unwrap_or_else(|e| panic!("{e}"));
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

criterion_group!(benches, gpu_adam, oracle_adam, record_step);
criterion_main!(benches);
