//! One CPU-backend Adam step on one tensor, timed, next to the host roofline for the same
//! bytes; for pairing run by run with PyTorch's fused CPU Adam on the same dtype.
//!
//! ```text
//! cargo run --release --example cpu_step -- [--dtype f32|f16|bf16] [--n N] [--steps K] [--roofline]
//! ```
//! Parameters, gradients and state are all of `--dtype` (the state keeps the parameter's
//! dtype, as PyTorch's `Adam(fused=True)` does). Prints the median milliseconds per step
//! and, with `--roofline`, the median of a plain in-place f32 streaming pass over the same
//! number of bytes (7 per element: p, g, m, v read; p, m, v written), timed alternately
//! with the steps because this machine's bandwidth drifts.

#[allow(dead_code)] // Only the host loop is used here; the GPU half serves `examples/bench`.
#[path = "bench/rooflines.rs"]
mod rooflines;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use wgpu_optim::cpu::{CpuOptimizer, HostTensor};
use wgpu_optim::{Adam, DType};

const USAGE: &str = "usage: cpu_step [--dtype f32|f16|bf16] [--n N] [--steps K] [--roofline]";

struct Options {
    dtype: DType,
    n: usize,
    steps: usize,
    roofline: bool,
}

fn parse() -> Result<Options, String> {
    let mut options = Options { dtype: DType::F32, n: 16 << 20, steps: 20, roofline: false };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--dtype" => {
                options.dtype = match value()?.as_str() {
                    "f32" => DType::F32,
                    "f16" => DType::F16,
                    "bf16" => DType::BF16,
                    other => return Err(format!("--dtype: {other} is not f32, f16 or bf16")),
                }
            }
            "--n" => options.n = value()?.parse().map_err(|e| format!("--n: {e}"))?,
            "--steps" => options.steps = value()?.parse().map_err(|e| format!("--steps: {e}"))?,
            "--roofline" => options.roofline = true,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    if options.steps == 0 {
        return Err("--steps must be at least 1".into());
    }
    Ok(options)
}

/// `n` values of about `scale` in magnitude and of both signs, like the peer's
/// `randn * scale` (a fixed sequence, so runs are comparable).
fn values(n: usize, seed: u64, scale: f64) -> Vec<f64> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            // xorshift64*: cheap, and spread enough that no branch or cache sees a pattern.
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let u = (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64;
            (2.0 * u - 1.0) * 1.7 * scale
        })
        .collect()
}

/// The median of `times`, which it leaves sorted.
fn median(times: &mut [Duration]) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn run(o: &Options) -> wgpu_optim::Result<()> {
    let mut param = HostTensor::from_f64(o.dtype, &values(o.n, 1, 0.02))?;
    let grad = HostTensor::from_f64(o.dtype, &values(o.n, 2, 0.01))?;
    let mut optimizer =
        CpuOptimizer::builder().build(Adam { lr: 1e-3, ..Adam::default() }, &[param.as_slice()])?;
    let grads = [grad.as_slice()];
    let mut step = || -> wgpu_optim::Result<Duration> {
        let start = Instant::now();
        optimizer.step(&mut [param.as_mut_slice()], &grads)?;
        Ok(start.elapsed())
    };
    // The first step touches the state's pages for the first time.
    step()?;

    let bytes = 7 * o.dtype.size() * o.n as u64;
    let mut rooflines = rooflines::Rooflines::default();
    let mut host = o.roofline.then(|| rooflines.host(bytes, 4, 3));
    let (mut steps, mut passes) = (Vec::new(), Vec::new());
    for _ in 0..o.steps {
        steps.push(step()?);
        if let Some(host) = &mut host {
            passes.push(host.time());
        }
    }
    let step = median(&mut steps);
    print!(
        "{:?} n={} steps={}: {:.3} ms per step (min {:.3})",
        o.dtype,
        o.n,
        o.steps,
        ms(step),
        ms(steps[0])
    );
    if let Some(host) = &host {
        let pass = median(&mut passes);
        print!(
            "; host roofline {:.3} ms (min {:.3}) for the same {} bytes ({:.1} GB/s); step at {:.1}% of it",
            ms(pass),
            ms(passes[0]),
            host.bytes,
            rooflines::gbps(host.bytes, pass),
            100.0 * pass.as_secs_f64() / step.as_secs_f64()
        );
    }
    println!();
    Ok(())
}

fn main() -> ExitCode {
    let options = match parse() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::FAILURE;
        }
    };
    match run(&options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
