//! Data-parallel training of `train_mlp`'s model with the optimizer sharded across ranks
//! (ZeRO-1): each rank has its own wgpu device, the whole model and a part of the data; its
//! gradients are reduce-scattered, it steps its shard of the parameters with its shard of
//! the AdamW state (global gradient clipping over every rank's gradients), and the updated
//! shards are all-gathered.
//!
//! ```sh
//! # ranks on threads of one process (any build)
//! cargo run --example train_mlp_sharded -- --in-process 3
//! # one rank per process under MPI
//! cargo build --features mpi --example train_mlp_sharded
//! mpirun --allow-run-as-root --oversubscribe -np 3 target/debug/examples/train_mlp_sharded
//! ```
//!
//! Every rank prints its state bytes and its step split (communication against update, the
//! bytes it sent against ZeRO-1's `2 (N - 1) / N` of the parameters). `--save FILE` writes
//! the trained parameters (rank 0, f32 little-endian) and `--compare FILE` checks them
//! against such a file within `--tolerance` (default 1e-3, relative to the largest
//! parameter): a run on N ranks against the run on one. `--panic-rank R --at-step S`
//! makes rank R panic at step S, which ends the run with an error (under MPI the job
//! aborts; on threads the others' steps fail); `--die-rank R --at-step S` makes its process
//! die by a signal (under MPI, `mpirun` ends the others). `--checkpoint-at S
//! --checkpoint-dir DIR` saves a checkpoint after step S (one optimizer file per rank and
//! the parameters) and `--resume DIR` continues from one, on any number of ranks. `--lamb`
//! trains with LAMB, each tensor's sums combined across the ranks' pieces of it;
//! `--adafactor` with Adafactor, each matrix's row and column sums combined alike.

#[allow(dead_code)]
#[path = "../train_mlp/gpu.rs"]
mod gpu;
#[allow(dead_code)]
#[path = "../train_mlp/model.rs"]
mod model;
#[allow(dead_code)]
#[path = "../train_mlp/spirals.rs"]
mod spirals;

use std::process::ExitCode;
use std::time::Duration;

use gpu::Gpu;
use model::{BoxError, Mlp};
use spirals::{Spirals, FEATURES};
use wgpu_optim::shard::{Communicator, GradReduction, InProcess, ReduceOp, ShardedOptimizer, StepSplit};
use wgpu_optim::{Adafactor, Adam, Algorithm, DType, GpuContext, GradClip, Lamb, Optimizer, ParamGroup};

struct Options {
    steps: u64,
    in_process: Option<usize>,
    save: Option<String>,
    compare: Option<String>,
    tolerance: f64,
    panic_at: Option<(usize, u64)>,
    die_at: Option<(usize, u64)>,
    /// Save a checkpoint (the optimizer's files and the parameters) after this step.
    checkpoint: Option<(u64, String)>,
    /// Resume from a checkpoint directory.
    resume: Option<String>,
    /// The optimizer.
    family: Family,
}

/// The optimizer a run trains with.
#[derive(Clone, Copy, PartialEq)]
enum Family {
    /// AdamW with global clipping.
    AdamW,
    /// LAMB, whose norms are each tensor's.
    Lamb,
    /// Adafactor, whose factors are each matrix's rows and columns.
    Adafactor,
}

fn options() -> Result<Options, String> {
    let mut options = Options {
        steps: 200,
        in_process: None,
        save: None,
        compare: None,
        tolerance: 1e-3,
        panic_at: None,
        die_at: None,
        checkpoint: None,
        resume: None,
        family: Family::AdamW,
    };
    let mut checkpoint_at = None;
    let (mut panic_rank, mut die_rank, mut at_step) = (None, None, 1);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} takes a value"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--steps" => options.steps = number(value()?)?,
            "--in-process" => options.in_process = Some(number(value()?)? as usize),
            "--save" => options.save = Some(value()?),
            "--compare" => options.compare = Some(value()?),
            "--tolerance" => options.tolerance = value()?.parse().map_err(|e| format!("--tolerance: {e}"))?,
            "--panic-rank" => panic_rank = Some(number(value()?)? as usize),
            "--die-rank" => die_rank = Some(number(value()?)? as usize),
            "--checkpoint-at" => checkpoint_at = Some(number(value()?)?),
            "--checkpoint-dir" => options.checkpoint = Some((0, value()?)),
            "--resume" => options.resume = Some(value()?),
            "--lamb" => options.family = Family::Lamb,
            "--adafactor" => options.family = Family::Adafactor,
            "--at-step" => at_step = number(value()?)?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    options.checkpoint = match (checkpoint_at, options.checkpoint.take()) {
        (Some(step), Some((_, dir))) => Some((step, dir)),
        (None, None) => None,
        _ => return Err("--checkpoint-at and --checkpoint-dir go together".into()),
    };
    options.panic_at = panic_rank.map(|rank| (rank, at_step));
    options.die_at = die_rank.map(|rank| (rank, at_step));
    Ok(options)
}

/// What a rank reports at the end.
struct Report {
    params: Vec<f32>,
    loss: f64,
    accuracy: f64,
}

/// Rank `rank`'s part of the data: every `size`-th point, so that each part has every class.
fn part(data: &Spirals, rank: usize, size: usize) -> Spirals {
    let points = (rank..data.len()).step_by(size);
    Spirals {
        features: points
            .clone()
            .flat_map(|i| data.features[i * FEATURES..(i + 1) * FEATURES].to_vec())
            .collect(),
        labels: points.map(|i| data.labels[i]).collect(),
    }
}

fn train<C: Communicator>(comm: C, options: &Options) -> Result<Report, BoxError> {
    let (rank, size) = (comm.rank(), comm.size());
    let data = Spirals::generate(1);
    if !data.len().is_multiple_of(size) {
        return Err(format!("{} points do not split evenly over {size} ranks", data.len()).into());
    }
    let gpu = Gpu::open()?;
    let model = Mlp::new(&gpu.device, &gpu.queue, &part(&data, rank, size), DType::F32, 2)?;
    let ctx = GpuContext::from_device(gpu.device.clone(), gpu.queue.clone());
    let params = model.param_tensors();
    // AdamW with global clipping, or LAMB or Adafactor (which clip nothing) with each
    // tensor's sums combined across the ranks' pieces of it.
    let shapes: Vec<Vec<usize>> = model.layout().iter().map(|p| p.shape.clone()).collect();
    let (algorithm, builder): (Algorithm, _) = match options.family {
        Family::AdamW => {
            (Adam { lr: 1e-2, ..Adam::adamw() }.into(), Optimizer::builder().grad_clip(GradClip::l2(1.0)))
        }
        Family::Lamb => {
            (Lamb { lr: 1e-2, weight_decay: 1e-2, ..Lamb::default() }.into(), Optimizer::builder())
        }
        // `eps1` 1e-2 floors the second moment at 1e-4, so that the vanishing gradients of
        // rarely active units are not scaled up to whole steps: with the default floor
        // (f32's epsilon squared) the trajectory turns chaotic within a few dozen steps.
        Family::Adafactor => (
            Adafactor { lr: 0.1, eps1: Some(1e-2), ..Adafactor::default() }.into(),
            Optimizer::builder().param_shapes(shapes.clone()),
        ),
    };
    let groups = vec![ParamGroup::new(algorithm, &params)];
    let mut optimizer = ShardedOptimizer::build(&ctx, comm, builder, GradReduction::Mean, groups)?;
    let grads = model.grad_tensors();
    let mut first = 1;
    if let Some(dir) = &options.resume {
        // The optimizer's files of any number of ranks, and the parameters rank 0 saved.
        optimizer.load(dir)?;
        model.write_params(&std::fs::read(std::path::Path::new(dir).join("params.bin"))?)?;
        first = optimizer.step_count() + 1;
    }
    let mut total = StepSplit::default();
    for step in first..=options.steps {
        if options.panic_at == Some((rank, step)) {
            panic!("rank {rank} fails at step {step} (--panic-rank)");
        }
        if options.die_at == Some((rank, step)) {
            eprintln!("rank {rank} dies at step {step} (--die-rank)");
            // A crash: the process ends by a signal, running no destructor.
            std::process::abort();
        }
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        model.record_forward(&mut encoder);
        model.record_backward(&mut encoder);
        gpu.queue.submit([encoder.finish()]);
        optimizer.step(&grads)?;
        let last = optimizer.last_step();
        total.communication += last.communication;
        total.update += last.update;
        total.sent_bytes += last.sent_bytes;
        if let Some((_, dir)) = options.checkpoint.as_ref().filter(|(at, _)| *at == step) {
            optimizer.save(dir)?;
            if rank == 0 {
                let mut bytes = Vec::new();
                for tensor in &params {
                    bytes.extend(ctx.read_bytes(tensor)?);
                }
                std::fs::write(std::path::Path::new(dir).join("params.bin"), bytes)?;
            }
        }
    }
    let metrics = model.evaluate()?;
    // The loss and accuracy over every rank's part (equal parts: the mean of the means).
    let mut sums = [metrics.loss, metrics.correct as f64];
    optimizer.communicator().all_reduce_f64(&mut sums, ReduceOp::Sum)?;
    let param_bytes: u64 = params.iter().map(|p| p.byte_len()).sum();
    // AdamW's and LAMB's two moments per parameter; Adafactor's factors of each matrix
    // (rows and columns) and variance of each vector.
    let unsharded: u64 = match options.family {
        Family::Adafactor => {
            shapes.iter().map(|s| 4 * if s.len() >= 2 { s[0] + s[1] } else { s[0] } as u64).sum()
        }
        _ => 2 * param_bytes,
    };
    let steps = (options.steps + 1).saturating_sub(first).max(1) as u32;
    println!(
        "rank {rank} of {size}: state {} bytes (unsharded: {}); per step: communication {:.2} ms, \
         update {:.2} ms, sent {} bytes (ZeRO-1's 2 (N - 1) / N of the parameters: {})",
        optimizer.state_bytes()?,
        unsharded,
        (total.communication / steps).as_secs_f64() * 1e3,
        (total.update / steps).as_secs_f64() * 1e3,
        total.sent_bytes / u64::from(steps),
        2 * (size as u64 - 1) * param_bytes / size as u64,
    );
    let mut values = Vec::new();
    for tensor in &params {
        values.extend(ctx.read_f32(tensor)?);
    }
    Ok(Report { params: values, loss: sums[0] / size as f64, accuracy: sums[1] / data.len() as f64 })
}

/// Rank 0's report: the summary line, `--save` and `--compare`.
fn finish(report: &Report, size: usize, options: &Options) -> Result<(), BoxError> {
    println!(
        "{size} rank(s), {} steps: loss {:.4}, accuracy {:.1}%",
        options.steps,
        report.loss,
        100.0 * report.accuracy
    );
    if let Some(path) = &options.save {
        let bytes: Vec<u8> = report.params.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(path, bytes)?;
    }
    if let Some(path) = &options.compare {
        let bytes = std::fs::read(path)?;
        let want: Vec<f32> =
            bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        if want.len() != report.params.len() {
            return Err(
                format!("{path} holds {} parameters, the model {}", want.len(), report.params.len()).into()
            );
        }
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
        let worst = report.params.iter().zip(&want).map(|(g, w)| (g - w).abs() as f64).fold(0.0, f64::max);
        println!(
            "largest difference from {path}: {worst:.3e} ({:.3e} of the largest parameter)",
            worst / scale
        );
        if worst > options.tolerance * scale {
            return Err(
                format!("the parameters differ from {path} by more than {}", options.tolerance).into()
            );
        }
    }
    Ok(())
}

fn run(options: &Options) -> Result<(), BoxError> {
    #[cfg(feature = "mpi")]
    if options.in_process.is_none() && std::env::var_os("OMPI_COMM_WORLD_SIZE").is_some() {
        let universe = wgpu_optim::mpi::initialize().ok_or("MPI could not be initialized")?;
        wgpu_optim::shard::Mpi::abort_on_panic(101);
        let comm = wgpu_optim::shard::Mpi::new(universe.world());
        let (rank, size) = (comm.rank(), comm.size());
        let report = train(comm, options)?;
        return if rank == 0 { finish(&report, size, options) } else { Ok(()) };
    }
    let size = options.in_process.unwrap_or(1);
    let group = InProcess::group(size, Duration::from_secs(60))?;
    let reports: Vec<Result<Report, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> =
            group.into_iter().map(|comm| scope.spawn(move || train(comm, options))).collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| match h.join() {
                Ok(report) => report.map_err(|e| format!("rank {rank}: {e}")),
                Err(_) => Err(format!("rank {rank} panicked")),
            })
            .collect()
    });
    let failures: Vec<&String> = reports.iter().filter_map(|r| r.as_ref().err()).collect();
    if !failures.is_empty() {
        return Err(failures.iter().map(|f| f.as_str()).collect::<Vec<_>>().join("; ").into());
    }
    match &reports[0] {
        Ok(report) => finish(report, size, options),
        Err(e) => Err(e.clone().into()),
    }
}

fn main() -> ExitCode {
    let options = match options() {
        Ok(options) => options,
        Err(problem) => {
            eprintln!("train_mlp_sharded: {problem}");
            return ExitCode::from(2);
        }
    };
    match run(&options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("train_mlp_sharded: {e}");
            ExitCode::FAILURE
        }
    }
}
