//! The sharded step's split on the CPU backend under MPI: AdamW over `--params` f32
//! parameters (default 16 Mi, in eight tensors) on every rank, each rank keeping the
//! state of its shard; prints each rank's state bytes and, per step, the time in
//! communication (the gradients' reduce-scatter and the parameters' all-gather, with their
//! host copies) against the time in its shard's update, and the bytes it sent against
//! ZeRO-1's `2 (N - 1) / N` of the parameters. `--adafactor` steps Adafactor instead (each
//! tensor a matrix of 1024 columns, cut mid-row by the shards). On one rank it also times
//! the unsharded optimizer's step over the same tensors.
//!
//! ```sh
//! cargo build --release --features mpi --example shard_bench
//! mpirun --allow-run-as-root --oversubscribe -np 2 target/release/examples/shard_bench
//! ```

use std::process::ExitCode;
use std::time::Duration;

use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut};
use wgpu_optim::shard::{Communicator, GradReduction, Mpi, ShardedCpuOptimizer};
use wgpu_optim::{Adafactor, Adam, Algorithm};

const TENSORS: usize = 8;

/// Columns of each of Adafactor's matrices.
const COLS: usize = 1024;

fn run(comm: Mpi, params: usize, steps: u32, adafactor: bool) -> wgpu_optim::Result<()> {
    let (rank, size) = (comm.rank(), comm.size());
    let len = params / TENSORS;
    let mut values: Vec<Vec<f32>> = (0..TENSORS).map(|t| vec![0.01 * t as f32; len]).collect();
    let grads: Vec<Vec<f32>> =
        (0..TENSORS).map(|t| (0..len).map(|e| 1e-3 * (rank + t + e % 7) as f32).collect()).collect();
    let slices: Vec<HostSlice<'_>> = values.iter().map(|v| HostSlice::from(&v[..])).collect();
    let (algorithm, builder): (Algorithm, _) = match adafactor {
        true => {
            let shape = if len.is_multiple_of(COLS) { vec![len / COLS, COLS] } else { vec![len] };
            (Adafactor::default().into(), CpuOptimizer::builder().param_shapes(vec![shape; TENSORS]))
        }
        false => (Adam::adamw().into(), CpuOptimizer::builder()),
    };
    let unsharded = match size {
        1 => Some((builder.clone().build(algorithm, &slices)?, values.clone())),
        _ => None,
    };
    let mut opt = ShardedCpuOptimizer::build(comm, builder, GradReduction::Mean, algorithm, &slices)?;
    let grads: Vec<HostSlice<'_>> = grads.iter().map(|g| HostSlice::from(&g[..])).collect();
    let (mut communication, mut update, mut sent) = (Duration::ZERO, Duration::ZERO, 0);
    // One step to warm up (first touches of the state and the buffers), then the timed ones.
    for step in 0..=steps {
        let mut params: Vec<HostSliceMut<'_>> =
            values.iter_mut().map(|v| HostSliceMut::from(&mut v[..])).collect();
        opt.step(&mut params, &grads)?;
        if step > 0 {
            let last = opt.last_step();
            (communication, update, sent) =
                (communication + last.communication, update + last.update, last.sent_bytes);
        }
    }
    let bytes = 4 * (len * TENSORS) as u64;
    println!(
        "rank {rank} of {size}: {} parameters, state {} bytes; per step: communication {:.1} ms, update {:.1} ms, \
         sent {sent} bytes (ZeRO-1's 2 (N - 1) / N of the parameters: {})",
        len * TENSORS,
        opt.state_bytes(),
        (communication / steps).as_secs_f64() * 1e3,
        (update / steps).as_secs_f64() * 1e3,
        2 * (size as u64 - 1) * bytes / size as u64,
    );
    if let Some((mut opt, mut values)) = unsharded {
        let mut took = Duration::ZERO;
        for step in 0..=steps {
            let mut params: Vec<HostSliceMut<'_>> =
                values.iter_mut().map(|v| HostSliceMut::from(&mut v[..])).collect();
            let started = std::time::Instant::now();
            opt.step(&mut params, &grads)?;
            if step > 0 {
                took += started.elapsed();
            }
        }
        println!("the unsharded optimizer's step: {:.1} ms", (took / steps).as_secs_f64() * 1e3);
    }
    Ok(())
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (mut params, mut steps, mut adafactor) = (16 << 20, 10u32, false);
    while let Some(flag) = args.next() {
        if flag == "--adafactor" {
            adafactor = true;
            continue;
        }
        let value = args.next().and_then(|v| v.parse::<usize>().ok());
        match (flag.as_str(), value) {
            ("--params", Some(v)) => params = v,
            ("--steps", Some(v)) => steps = v.max(1) as u32,
            _ => {
                eprintln!("shard_bench: usage: [--params N] [--steps N] [--adafactor]");
                return ExitCode::from(2);
            }
        }
    }
    let Some(universe) = wgpu_optim::mpi::initialize() else {
        eprintln!("shard_bench: MPI could not be initialized (run under mpirun)");
        return ExitCode::from(2);
    };
    Mpi::abort_on_panic(101);
    match run(Mpi::new(universe.world()), params, steps, adafactor) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shard_bench: {e}");
            ExitCode::FAILURE
        }
    }
}
