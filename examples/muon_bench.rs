//! Muon's speed: the WGSL matrix product's GFLOP/s beside the CPU backend's (faer, on
//! `gemm`'s kernels) at 1024x1024 and 4096x1024, and one Muon step of a 4096x1024 f32
//! matrix on the adapter and on the CPU backend.
//!
//! ```text
//! cargo run --release --example muon_bench [-- --reps N] [--gpu-step] [--cpu-step-only]
//! ```
//!
//! `--gpu-step` times the Muon step on the adapter too (about 130 GFLOP in bfloat16 mode's
//! 15 products: minutes on a CPU adapter such as lavapipe, milliseconds on a GPU).
//! `--cpu-step-only` times only the CPU backend's step (to alternate run by run with a
//! peer's, such as PyTorch's `torch.optim.Muon` on the same threads).
//!
//! The WGSL products run twice: with f32 operands, and with every operand stored as bfloat16
//! (as Muon's Newton-Schulz scratch is in bfloat16 mode; half the bytes, the same f32
//! accumulation).
//!
//! A product `m x k` times `k x n` is `2 m n k` floating-point operations; "4096x1024" is a
//! 4096x1024 matrix times a 1024x1024 one. The Muon step is torch's defaults (Newton-Schulz
//! in bfloat16, 5 iterations): per step 15 products of 1024-row matrices plus the
//! elementwise passes. Times are the fastest of `--reps` repetitions (GPU timestamps where
//! the adapter has them, else the submission's wall time).

use std::time::{Duration, Instant};

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut};
use wgpu_optim::matmul::{Matmul, MatrixView, Product};
use wgpu_optim::{DType, GpuContext, Muon, Optimizer};
use wgpu_optim_testkit::GpuTimer;

fn fastest(reps: usize, mut f: impl FnMut() -> Duration) -> Duration {
    (0..reps.max(1)).map(|_| f()).min().unwrap_or_default()
}

fn gflops(flops: f64, time: Duration) -> f64 {
    flops / time.as_secs_f64() / 1e9
}

fn usage() -> ! {
    eprintln!("usage: muon_bench [--reps N] [--gpu-step] [--cpu-step-only]");
    std::process::exit(2);
}

/// The WGSL product's GFLOP/s (f32 operands, then bfloat16 ones) beside faer's.
fn product_table(ctx: &GpuContext, timer: &mut GpuTimer, reps: usize) -> wgpu_optim::Result<()> {
    println!(
        "| product | WGSL GFLOP/s, f32 operands | WGSL GFLOP/s, bf16 operands | CPU backend (faer) GFLOP/s |"
    );
    println!("|---|---|---|---|");
    for (m, n, k) in [(1024u32, 1024u32, 1024u32), (4096, 1024, 1024)] {
        let (a_len, b_len, c_len) = (m * k, k * n, m * n);
        let values: Vec<f64> = (0..a_len + b_len + c_len).map(|i| ((i % 7) as f64 - 3.0) / 8.0).collect();
        let mut gpu_gflops = Vec::new();
        for storage in [DType::F32, DType::BF16] {
            let data = ctx.upload("data", &values, DType::F32);
            let view = |offset: u32, rows: u32, cols: u32| {
                MatrixView::row_major(offset, rows, cols).stored_as(storage)
            };
            let product =
                Product::plain(m, n, k, view(0, m, k), view(a_len, k, n), view(a_len + b_len, m, n));
            let gpu = Matmul::new(ctx, &data, &[product])?;
            let gpu_time = fastest(reps, || {
                let timing = timer
                    .time(|encoder| {
                        gpu.record(encoder);
                        Ok(())
                    })
                    .expect("a timed product");
                timing.gpu.unwrap_or(timing.wall)
            });
            gpu_gflops.push(gflops(gpu.flops(), gpu_time));
        }
        let flops = 2.0 * f64::from(m) * f64::from(n) * f64::from(k);
        let (m, n, k) = (m as usize, n as usize, k as usize);
        let a: Vec<f32> = values[..m * k].iter().map(|v| *v as f32).collect();
        let b: Vec<f32> = values[m * k..m * k + k * n].iter().map(|v| *v as f32).collect();
        let mut c = vec![0f32; m * n];
        let cpu_time = fastest(reps, || {
            let start = Instant::now();
            matmul(
                MatMut::from_row_major_slice_mut(&mut c, m, n),
                Accum::Replace,
                MatRef::from_row_major_slice(&a, m, k),
                MatRef::from_row_major_slice(&b, k, n),
                1.0,
                Par::rayon(0),
            );
            start.elapsed()
        });
        println!(
            "| {m}x{k} x {k}x{n} | {:.1} | {:.1} | {:.1} |",
            gpu_gflops[0],
            gpu_gflops[1],
            gflops(flops, cpu_time)
        );
    }
    Ok(())
}

fn main() -> wgpu_optim::Result<()> {
    let mut reps = 5;
    let mut gpu_step = false;
    let mut products = true;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--gpu-step" => gpu_step = true,
            "--cpu-step-only" => products = false,
            "--reps" => match args.next().and_then(|v| v.parse().ok()) {
                Some(n) => reps = n,
                None => usage(),
            },
            _ => usage(),
        }
    }
    let ctx = GpuContext::headless_blocking()?;
    let mut timer = GpuTimer::new(&ctx);
    if products {
        println!("adapter: {:?}; CPU threads: {}", ctx.report(), rayon::current_num_threads());
        product_table(&ctx, &mut timer, reps)?;
    }

    let (rows, cols) = (4096usize, 1024usize);
    let len = rows * cols;
    let p0: Vec<f64> = (0..len).map(|i| ((i % 13) as f64 - 6.0) / 64.0).collect();
    let g: Vec<f64> = (0..len).map(|i| ((i % 11) as f64 - 5.0) / 512.0).collect();
    let shapes = vec![vec![rows, cols]];
    let mut host: Vec<f32> = p0.iter().map(|v| *v as f32).collect();
    let host_grad: Vec<f32> = g.iter().map(|v| *v as f32).collect();
    let mut cpu = CpuOptimizer::builder()
        .param_shapes(shapes.clone())
        .build(Muon::default(), &[HostSlice::from(&host[..])])?;
    let mut cpu_step = Duration::MAX;
    for _ in 0..reps.max(1) {
        let start = Instant::now();
        cpu.step(&mut [HostSliceMut::from(&mut host[..])], &[HostSlice::from(&host_grad[..])])?;
        cpu_step = cpu_step.min(start.elapsed());
    }
    if products {
        println!();
    }
    println!("| Muon step, {rows}x{cols} f32, torch's defaults | ms |");
    println!("|---|---|");
    println!("| CPU backend | {:.1} |", cpu_step.as_secs_f64() * 1e3);
    if gpu_step {
        let param = ctx.upload("param", &p0, DType::F32);
        let grads = [ctx.upload("grad", &g, DType::F32)];
        let mut gpu = Optimizer::builder().param_shapes(shapes).build(&ctx, Muon::default(), &[param])?;
        let time = fastest(reps, || {
            let timing = timer.time(|encoder| gpu.record_step(encoder, &grads)).expect("a timed step");
            timing.gpu.unwrap_or(timing.wall)
        });
        println!("| WGSL | {:.1} |", time.as_secs_f64() * 1e3);
    }
    Ok(())
}
