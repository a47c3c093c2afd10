//! The sharding collectives over MPI, checked on every rank: the all-gather in rank order,
//! the reduce-scatter (over MPI's all-to-all), sums and maxima with the same bits on every rank as the rank-order fold, and the
//! refusal of ranks configured apart. Run with the `mpi` feature under `mpirun`:
//!
//! ```sh
//! cargo build --features mpi --example shard_mpi
//! mpirun --allow-run-as-root --oversubscribe -np 3 target/debug/examples/shard_mpi
//! mpirun --allow-run-as-root -np 2 target/debug/examples/shard_mpi --panic-rank 1   # fails at once
//! ```
//!
//! Each rank prints one line; a check that fails exits with status 1, and `--panic-rank R`
//! makes rank R panic after the first barrier, which aborts the job (`Mpi::abort_on_panic`).

use std::process::ExitCode;

use wgpu_optim::shard::{Communicator, Mpi, ReduceOp};

/// Values whose sum depends on the order they are added in.
fn contribution(rank: usize) -> [f64; 3] {
    [1e16 * if rank % 2 == 1 { 1.0 } else { -1.0 }, 0.1 * (rank + 1) as f64, 3e-17 * rank as f64 + 1.0]
}

fn check(comm: &dyn Communicator, panic_rank: Option<usize>) -> Result<(), String> {
    let (rank, size) = (comm.rank(), comm.size());
    let gathered = comm.all_gather_bytes(&[rank as u8, 0xA0 | rank as u8]).map_err(|e| e.to_string())?;
    let want: Vec<u8> = (0..size as u8).flat_map(|r| [r, 0xA0 | r]).collect();
    if gathered != want {
        return Err(format!("all_gather gave {gathered:?}, expected {want:?}"));
    }
    comm.barrier().map_err(|e| e.to_string())?;
    if panic_rank == Some(rank) {
        panic!("rank {rank} fails mid-step (--panic-rank)");
    }
    let mut sums = contribution(rank);
    comm.all_reduce_f64(&mut sums, ReduceOp::Sum).map_err(|e| e.to_string())?;
    let in_order: Vec<f64> =
        (0..3).map(|i| (1..size).fold(contribution(0)[i], |acc, r| acc + contribution(r)[i])).collect();
    if sums.iter().map(|v| v.to_bits()).ne(in_order.iter().map(|v| v.to_bits())) {
        return Err(format!("sums {sums:?}, expected the rank-order fold {in_order:?}"));
    }
    // The gradient reduce-scatter: two elements per shard, summed in rank order.
    let input = |r: usize| -> Vec<f32> {
        (0..2 * size).map(|i| [1e8f32, 1.0, -1e8, 0.1][(r + i) % 4] * (1 + i % 3) as f32).collect()
    };
    let shard = comm.reduce_scatter_f32(&input(rank)).map_err(|e| e.to_string())?;
    let want: Vec<f32> =
        (2 * rank..2 * rank + 2).map(|i| (1..size).fold(input(0)[i], |acc, r| acc + input(r)[i])).collect();
    if shard.iter().map(|v| v.to_bits()).ne(want.iter().map(|v| v.to_bits())) {
        return Err(format!("reduce-scatter shard {shard:?}, expected {want:?}"));
    }
    let mut largest = [rank as f64, -(rank as f64)];
    comm.all_reduce_f64(&mut largest, ReduceOp::Max).map_err(|e| e.to_string())?;
    if largest != [(size - 1) as f64, 0.0] {
        return Err(format!("maxima {largest:?}"));
    }
    comm.check_same("configuration", format!("{size} ranks, AdamW").as_bytes()).map_err(|e| e.to_string())?;
    let apart = if rank + 1 == size && size > 1 { "Lion" } else { "AdamW" };
    match comm.check_same("algorithm", apart.as_bytes()) {
        Err(e) if size > 1 && e.to_string().contains(&format!("rank {}'s algorithm differs", size - 1)) => {}
        Ok(()) if size == 1 => {}
        other => return Err(format!("a rank configured apart gave {other:?}")),
    }
    println!("rank {rank} of {size}: all_gather, sum, reduce-scatter, max and check_same as expected; sums {sums:?}");
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let panic_rank = args.iter().position(|a| a == "--panic-rank").map(|i| {
        args.get(i + 1).and_then(|r| r.parse().ok()).unwrap_or_else(|| {
            eprintln!("--panic-rank takes a rank");
            std::process::exit(2)
        })
    });
    let Some(universe) = wgpu_optim::mpi::initialize() else {
        eprintln!("MPI could not be initialized (run under mpirun)");
        return ExitCode::from(2);
    };
    Mpi::abort_on_panic(101);
    let comm = Mpi::new(universe.world());
    match check(&comm, panic_rank) {
        Ok(()) => ExitCode::SUCCESS,
        Err(problem) => {
            eprintln!("rank {}: {problem}", comm.rank());
            ExitCode::from(1)
        }
    }
}
