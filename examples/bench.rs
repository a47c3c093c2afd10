//! GPU vs CPU-oracle timing of one optimizer step.
//!
//! ```text
//! cargo run --release --example bench [-- --sizes 4096,262144,4194304 --reps 20 --algos adam,adamw,amsgrad]
//! ```
//! For each algorithm and size: the median wall time of one GPU step (submit to
//! completion), the effective bandwidth (bytes read plus written per step over the time),
//! and the f64 oracle's time for the sizes where it is quick.

use std::time::{Duration, Instant};

use wgpu_optim::oracle::{torch_adam_step, TorchAdamState};
use wgpu_optim::{Adam, GpuContext, Optimizer, Result};

struct Options {
    sizes: Vec<usize>,
    reps: usize,
    algos: Vec<String>,
}

fn parse_options() -> std::result::Result<Options, String> {
    let mut options = Options {
        sizes: vec![4096, 262_144, 4_194_304],
        reps: 20,
        algos: vec!["adam".into(), "adamw".into(), "amsgrad".into()],
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--sizes" => {
                options.sizes = value()?
                    .split(',')
                    .map(|s| s.trim().parse().map_err(|e| format!("--sizes: {s}: {e}")))
                    .collect::<std::result::Result<_, _>>()?
            }
            "--reps" => options.reps = value()?.parse().map_err(|e| format!("--reps: {e}"))?,
            "--algos" => options.algos = value()?.split(',').map(str::to_string).collect(),
            "--help" | "-h" => return Err(String::new()),
            other => return Err(format!("unknown option {other}")),
        }
    }
    if options.reps == 0 {
        return Err("--reps must be at least 1".into());
    }
    Ok(options)
}

fn config(name: &str) -> std::result::Result<Adam, String> {
    match name {
        "adam" => Ok(Adam::default()),
        "adamw" => Ok(Adam::adamw()),
        "amsgrad" => Ok(Adam { amsgrad: true, ..Adam::default() }),
        other => Err(format!("unknown algorithm {other} (adam, adamw, amsgrad)")),
    }
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn gpu_step_time(ctx: &GpuContext, config: Adam, n: usize, reps: usize) -> Result<Duration> {
    let params = vec![ctx.upload_f32("param", &vec![0.5; n])];
    let grads = vec![ctx.upload_f32("grad", &vec![0.01; n])];
    let mut optimizer = Optimizer::new(ctx, config, &params)?;
    optimizer.step(&grads)?; // compiles the pipeline and builds the bind groups
    wait(ctx)?;
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        optimizer.step(&grads)?;
        wait(ctx)?;
        times.push(start.elapsed());
    }
    Ok(median(times))
}

fn wait(ctx: &GpuContext) -> Result<()> {
    ctx.device()
        .poll(wgpu::PollType::wait_indefinitely())
        .map(|_| ())
        .map_err(|e| wgpu_optim::Error::Readback(e.to_string()))
}

fn oracle_step_time(config: Adam, n: usize, reps: usize) -> Duration {
    let mut param = vec![0.5; n];
    let grad = vec![0.01; n];
    let mut state = TorchAdamState::zeros(n, config.amsgrad);
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        torch_adam_step(&config, &mut param, &grad, &mut state);
        times.push(start.elapsed());
    }
    median(times)
}

fn main() -> std::process::ExitCode {
    env_logger::init();
    let options = match parse_options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}\nusage: bench [--sizes N,N,..] [--reps R] [--algos adam,adamw,amsgrad]");
            return std::process::ExitCode::from(2);
        }
    };
    let ctx = match GpuContext::headless_blocking() {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("{e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    println!("adapter: {}", ctx.report());
    println!(
        "{:<9} {:>10} {:>12} {:>10} {:>12} {:>10} {:>8}",
        "algo", "elements", "gpu ms", "gpu GB/s", "oracle ms", "oracle GB/s", "speedup"
    );
    for name in &options.algos {
        let config = match config(name) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("{e}");
                return std::process::ExitCode::from(2);
            }
        };
        // Adam reads p, g, m, v and writes p, m, v; AMSGrad also reads and writes v_max.
        let bytes_per_element = if config.amsgrad { 36.0 } else { 28.0 };
        for &n in &options.sizes {
            let gpu = match gpu_step_time(&ctx, config, n, options.reps) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("{name} at {n}: {e}");
                    return std::process::ExitCode::FAILURE;
                }
            };
            let gbps = |t: Duration| bytes_per_element * n as f64 / t.as_secs_f64() / 1e9;
            let (oracle_ms, oracle_gbps, speedup) = if n <= 4 << 20 {
                let oracle = oracle_step_time(config, n, options.reps.min(5));
                (
                    format!("{:.3}", oracle.as_secs_f64() * 1e3),
                    format!("{:.2}", gbps(oracle)),
                    format!("{:.1}x", oracle.as_secs_f64() / gpu.as_secs_f64()),
                )
            } else {
                ("-".into(), "-".into(), "-".into())
            };
            println!(
                "{name:<9} {n:>10} {:>12.3} {:>10.2} {oracle_ms:>12} {oracle_gbps:>10} {speedup:>8}",
                gpu.as_secs_f64() * 1e3,
                gbps(gpu)
            );
        }
    }
    std::process::ExitCode::SUCCESS
}
