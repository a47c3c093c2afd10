//! GPU vs CPU optimizer steps: time, bandwidth, and the fraction of each side's roofline.
//!
//! ```text
//! cargo run --release --example bench [-- --full --json out.json --plot out.svg]
//! ```
//! For each algorithm, dtype and case: the GPU step (timestamps where the adapter has them,
//! and wall time to completion), the CPU backend, and the f64 oracle for small sizes. GB/s
//! counts the bytes each step must read and write; the rooflines are measured in the same
//! run, between the repetitions. The default run (Adam and SGD momentum; f32, f16, bf16;
//! 4 Ki, 1 Mi and 16 Mi elements and 200 tensors of 4096) takes about two minutes on two
//! cores with lavapipe; `--full` adds every algorithm, 64 Mi elements and GPT-2 small's 148
//! tensors. Progress goes to stderr, the summary table to stdout.

mod options;
mod report;
mod rooflines;
mod shapes;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use options::Options;
use report::Row;
use rooflines::Rooflines;
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostTensor};
use wgpu_optim::q4::Q4States;
use wgpu_optim::q8::Q8States;
use wgpu_optim::Adafactor;
use wgpu_optim::Lamb;
use wgpu_optim::Muon;
use wgpu_optim::{
    AdEMAMix, Adam, Algorithm, DType, GpuContext, GradClip, Lion, Optimizer, RmsProp, ScheduleFreeAdamW, Sgd,
    StateStorage, Tensor,
};
use wgpu_optim_testkit::oracle::{clip_grad_norm, ToOracle, TorchState};
use wgpu_optim_testkit::{CopyRoofline, GpuTimer};

fn algorithm(name: &str) -> Algorithm {
    match name {
        "adamw" => Adam::adamw().into(),
        "amsgrad" => Adam { amsgrad: true, ..Adam::default() }.into(),
        "sgdm" => Sgd { lr: 1e-2, momentum: 0.9, ..Sgd::default() }.into(),
        "nesterov" => Sgd { lr: 1e-2, momentum: 0.9, nesterov: true, ..Sgd::default() }.into(),
        "lion" => Lion::default().into(),
        "rmsprop" => RmsProp::default().into(),
        "ademamix" => AdEMAMix::default().into(),
        "sf-adamw" => ScheduleFreeAdamW::default().into(),
        "lamb" => Lamb::default().into(),
        "adafactor" => Adafactor::default().into(),
        "muon" => Muon::default().into(),
        _ => Adam::default().into(),
    }
}

/// `adam+clip`: PyTorch's default Adam after `clip_grad_norm_(params, 1.0)`, which clips
/// every step of the bench's gradients.
fn grad_clip(name: &str) -> Option<GradClip> {
    name.ends_with("+clip").then(|| GradClip::l2(1.0))
}

fn dtype(name: &str) -> DType {
    match name {
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        _ => DType::F32,
    }
}

/// Arrays read and written per element: the parameter, the gradient and each state tensor
/// are read; the parameter and the state are written. Clipping reads the gradient once
/// more, for its norm.
fn traffic(algorithm: &Algorithm, clip: Option<GradClip>) -> (u32, u32) {
    // Adafactor's states are sublinear (a row and a column per matrix); its update's scale
    // needs the whole tensor's RMS of the parameter and of the update, so a step reads the
    // gradient and the parameter twice (their sums, then the update) and writes the
    // parameter once.
    if let Algorithm::Adafactor(_) = algorithm {
        return (4 + u32::from(clip.is_some()), 1);
    }
    if let Algorithm::Muon(_) = algorithm {
        // The elementwise passes around Newton-Schulz: the momentum pass reads g and the
        // buffer and writes the buffer and the update U; the apply pass reads p and U and
        // writes p. (Muon's rows report the products' GFLOP/s, not this traffic's fraction.)
        return (4, 3);
    }
    let states = algorithm.state_kinds().len() as u32;
    if matches!(algorithm, Algorithm::Lamb(_)) {
        // Two passes, since no element can change before its tensor's norms are known: the
        // moments pass reads p, g, m, v and writes m, v; the apply pass reads p, m, v and
        // writes p.
        return (7, 3);
    }
    (2 + states + u32::from(clip.is_some()), 1 + states)
}

/// Floating-point operations of Muon's Newton-Schulz products over `shapes` (each `A x B`,
/// `r = min(A, B)`, `k = max(A, B)`): per iteration `X Xᵀ` and `N X` (`2 r r k` each) and
/// `M M` (`2 r r r`).
fn muon_flops(algorithm: &Algorithm, shapes: &[Vec<usize>]) -> Option<f64> {
    let Algorithm::Muon(config) = algorithm else { return None };
    let per_iteration: f64 = shapes
        .iter()
        .map(|shape| {
            let (r, k) =
                (shape[0].min(shape[shape.len() - 1]) as f64, shape[0].max(shape[shape.len() - 1]) as f64);
            4.0 * r * r * k + 2.0 * r * r * r
        })
        .sum();
    Some(per_iteration * f64::from(config.ns_steps))
}

/// Bytes an 8-bit-state step moves for `elements` f32 parameters: the parameter read and
/// written, the gradient read, and per state one code read and written and one absmax per
/// block read and written.
fn q8_bytes(algorithm: &Algorithm, elements: u64) -> u64 {
    let states = algorithm.state_kinds().len() as u64;
    12 * elements + states * (2 * elements + 8 * elements.div_ceil(256))
}

/// Bytes a 4-bit-state step moves for `elements` f32 parameters: as [`q8_bytes`], with half
/// a byte of codes per element and one scale per block of 128, each read and written.
fn q4_bytes(algorithm: &Algorithm, elements: u64) -> u64 {
    let states = algorithm.state_kinds().len() as u64;
    12 * elements + states * (elements + 8 * elements.div_ceil(128))
}

/// The roofline's arrays for an 8-bit-state step: three read and two of them written back,
/// whose 3 : 2 split of the same bytes is nearest the step's (Adam reads 10 and writes 6
/// bytes per element; SGD with momentum 9 and 5).
const Q8_TRAFFIC: (u32, u32) = (3, 2);

/// The repetitions of one measurement: the median is what a trainer sees; the fastest is
/// what the hardware allows, since noise (a neighbour on the memory bus, a preempted
/// thread) only ever slows a repetition. Fractions of a roofline compare the fastest step
/// with the fastest roofline pass: against median passes, rows of a noisy run read up to
/// 117 % of the roofline.
#[derive(Clone, Copy, Default)]
struct Times {
    median: Duration,
    fastest: Duration,
}

impl Times {
    fn of(mut times: Vec<Duration>) -> Option<Times> {
        times.sort();
        Some(Times { median: *times.get(times.len() / 2)?, fastest: times[0] })
    }
}

/// Repeats `f` at least 3 and at most `reps` times, stopping after `budget`.
fn repeat(
    reps: usize,
    budget: Duration,
    mut f: impl FnMut() -> wgpu_optim::Result<Duration>,
) -> wgpu_optim::Result<Times> {
    let start = Instant::now();
    let mut times = Vec::new();
    while times.len() < reps && (times.len() < 3 || start.elapsed() < budget) {
        times.push(f()?);
    }
    Ok(Times::of(times).unwrap_or_default())
}

struct Case {
    sizes: Vec<u64>,
}

impl Case {
    fn elements(&self) -> u64 {
        self.sizes.iter().sum()
    }
}

struct Bench {
    options: Options,
    ctx: Option<GpuContext>,
    timer: Option<GpuTimer>,
    rooflines: Rooflines,
    /// Evicts the caches before each timed CPU step and roofline pass.
    flush: rooflines::CacheFlush,
    rows: Vec<Row>,
}

impl Bench {
    fn budget(&self) -> Duration {
        Duration::from_secs_f64(self.options.budget_s)
    }

    fn push(&mut self, row: Row) {
        eprintln!("{}", report::progress(&row));
        self.rows.push(row);
    }

    fn run_case(
        &mut self,
        algo: &str,
        dtype_name: &str,
        state_name: &str,
        case_name: &str,
        case: &Case,
    ) -> wgpu_optim::Result<()> {
        let algorithm = algorithm(algo);
        let clip = grad_clip(algo);
        let dtype = dtype(dtype_name);
        let q8 = (state_name == "q8").then(Q8States::default);
        let q4 = (state_name == "q4").then(Q4States::default);
        let elements = case.elements();
        let ((reads, writes), bytes) = match q8 {
            Some(_) => (Q8_TRAFFIC, q8_bytes(&algorithm, elements)),
            // The same 3 : 2 split of the roofline's arrays as 8-bit state's.
            None if q4.is_some() => (Q8_TRAFFIC, q4_bytes(&algorithm, elements)),
            None => {
                let (reads, writes) = traffic(&algorithm, clip);
                ((reads, writes), elements * dtype.size() * u64::from(reads + writes))
            }
        };
        let state = if q8.is_some() { "q8" } else { dtype_name };
        let state = if q4.is_some() { "q4" } else { state };
        let first_row = self.rows.len();
        let row = |backend: &str, time: Times, roofline_gbps: f64| Row {
            algo: algo.to_string(),
            dtype: dtype_name.to_string(),
            state: state.to_string(),
            case: case_name.to_string(),
            speedup: None,
            elements,
            tensors: case.sizes.len(),
            backend: backend.to_string(),
            ms_median: time.median.as_secs_f64() * 1e3,
            ms_fastest: time.fastest.as_secs_f64() * 1e3,
            gbps: bytes as f64 / time.median.as_secs_f64() / 1e9,
            roofline_gbps,
            refused: None,
            gflops: muon_flops(&algorithm, &shapes::matrices(&case.sizes))
                .map(|f| f / time.median.as_secs_f64() / 1e9),
        };
        // A backend that refuses the case (a limit of the device, say) is a row of the table,
        // and the run goes on.
        let refused = |backend: &str, e: wgpu_optim::Error| Row {
            ms_median: f64::NAN,
            ms_fastest: f64::NAN,
            gbps: f64::NAN,
            refused: Some(e.to_string()),
            gflops: None,
            ..row(backend, Times::default(), f64::NAN)
        };
        let (reps, budget) = (self.options.reps, self.budget());
        let job = Job { algorithm, clip, dtype, q8, q4, case, reps, budget };
        if let (Some(ctx), Some(timer)) = (self.ctx.clone(), self.timer.as_mut()) {
            let measured = self.rooflines.gpu(&ctx, bytes, reads, writes).and_then(|roofline| {
                let timing = gpu_step(&ctx, timer, roofline, &job)?;
                let roofline_gbps = rooflines::gbps(roofline.bytes, timing.roofline);
                Ok((timing, roofline_gbps))
            });
            match measured {
                Ok((timing, roofline_gbps)) => {
                    if let Some(gpu) = timing.gpu {
                        self.push(row("gpu", gpu, roofline_gbps));
                    }
                    self.push(row("gpu-wall", timing.wall, roofline_gbps));
                }
                Err(e) => self.push(refused("gpu", e)),
            }
        }
        if self.options.cpu {
            let host = self.rooflines.host(bytes, reads, writes);
            match cpu_step(&job, host, &self.flush) {
                Ok((cpu, roofline)) => {
                    let roofline_gbps = rooflines::gbps(host.bytes, roofline);
                    self.push(row("cpu", cpu, roofline_gbps));
                    if elements <= 1 << 20
                        && q8.is_none()
                        && q4.is_none()
                        && per_tensor_oracle(&job.algorithm)
                    {
                        let oracle = oracle_step(&job);
                        self.push(row("oracle", oracle, roofline_gbps));
                    }
                }
                Err(e) => self.push(refused("cpu", e)),
            }
        }
        let cpu_ms = self.rows[first_row..]
            .iter()
            .find(|r| r.backend == "cpu" && r.refused.is_none())
            .map(|r| r.ms_median);
        for r in &mut self.rows[first_row..] {
            r.speedup = cpu_ms.map(|cpu| cpu / r.ms_median);
        }
        Ok(())
    }
}

/// One measurement: what to step and how long to keep repeating.
#[derive(Clone, Copy)]
struct Job<'a> {
    algorithm: Algorithm,
    clip: Option<GradClip>,
    dtype: DType,
    /// 8-bit state, or the parameter's dtype.
    q8: Option<Q8States>,
    /// 4-bit state.
    q4: Option<Q4States>,
    case: &'a Case,
    reps: usize,
    budget: Duration,
}

/// One measurement: the step and the roofline timed alternately.
struct GpuTiming {
    gpu: Option<Times>,
    wall: Times,
    roofline: Duration,
}

/// The GPU step (timestamps, if any, and wall time to completion), each repetition followed
/// by a copy-roofline dispatch, and the fastest of those copies.
fn gpu_step(
    ctx: &GpuContext,
    timer: &mut GpuTimer,
    roofline: &CopyRoofline,
    job: &Job<'_>,
) -> wgpu_optim::Result<GpuTiming> {
    let Job { algorithm, clip, dtype, q8, q4, case, reps, budget } = *job;
    let params = flat(ctx, "params", &case.sizes, dtype);
    let grads = flat(ctx, "grads", &case.sizes, dtype);
    let options = Optimizer::builder().grad_clip(clip).state_storage(state_storage(q8, q4));
    let options = options.param_shapes(shapes::matrices(&case.sizes));
    let mut optimizer = options.build(ctx, algorithm, &params)?;
    timer.time(|encoder| optimizer.record_step(encoder, &grads))?; // pipelines, bind groups, first touch
    roofline.median_time(timer, 1)?;
    let (mut gpu, mut copies) = (Vec::new(), Vec::new());
    let wall = repeat(reps, budget, || {
        let t = timer.time(|encoder| optimizer.record_step(encoder, &grads))?;
        gpu.extend(t.gpu);
        copies.push(roofline.median_time(timer, 1)?);
        Ok(t.wall)
    })?;
    let roofline = Times::of(copies).unwrap_or_default().fastest;
    Ok(GpuTiming { gpu: Times::of(gpu), wall, roofline })
}

/// Tensors of `sizes` elements packed into as few buffers as the adapter's largest storage
/// binding allows, each at a 256-byte boundary: a trainer's flat parameter (or gradient)
/// buffer, which lets the optimizer update many tensors in one dispatch.
/// The storage a job's optimizer keeps its state in: 8-bit or 4-bit when the job asks for
/// it (never both), each parameter's dtype otherwise.
fn state_storage(q8: Option<Q8States>, q4: Option<Q4States>) -> StateStorage {
    match (q8, q4) {
        (Some(q8), _) => StateStorage::Q8(q8),
        (None, Some(q4)) => StateStorage::Q4(q4),
        (None, None) => StateStorage::ParamDtype,
    }
}

fn flat(ctx: &GpuContext, label: &str, sizes: &[u64], dtype: DType) -> Vec<Tensor> {
    let limit = ctx.device().limits().max_storage_buffer_binding_size;
    let mut groups: Vec<Vec<(u64, u64)>> = Vec::new();
    // The end of the last buffer's tensors, once there is one.
    let mut end: Option<u64> = None;
    for &n in sizes {
        let bytes = n * dtype.size();
        match (end.map(|e| e.next_multiple_of(256)), groups.last_mut()) {
            (Some(at), Some(group)) if at + bytes <= limit => {
                group.push((at, n));
                end = Some(at + bytes);
            }
            _ => {
                groups.push(vec![(0, n)]);
                end = Some(bytes);
            }
        }
    }
    groups
        .iter()
        .flat_map(|group| {
            let (last_at, last_n) = group[group.len() - 1];
            let buffer =
                ctx.zeros(label, (last_at + last_n * dtype.size()).div_ceil(dtype.size()), dtype).buffer;
            group
                .iter()
                .map(move |&(at, n)| Tensor { buffer: buffer.clone(), offset: at, len: n, dtype })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The CPU-backend step and the fastest host-roofline pass, timed alternately, each from
/// cold caches.
fn cpu_step(
    job: &Job<'_>,
    host: &mut rooflines::HostLoop,
    flush: &rooflines::CacheFlush,
) -> wgpu_optim::Result<(Times, Duration)> {
    let Job { algorithm, clip, dtype, q8, q4, case, reps, budget } = *job;
    let mut params: Vec<HostTensor> =
        case.sizes.iter().map(|&n| HostTensor::filled(dtype, n as usize, 0.5)).collect::<Result<_, _>>()?;
    let grads: Vec<HostTensor> =
        case.sizes.iter().map(|&n| HostTensor::filled(dtype, n as usize, 1e-3)).collect::<Result<_, _>>()?;
    let views: Vec<HostSlice<'_>> = params.iter().map(HostTensor::as_slice).collect();
    let builder = CpuOptimizer::builder().grad_clip(clip).state_storage(state_storage(q8, q4));
    let mut optimizer = builder.param_shapes(shapes::matrices(&case.sizes)).build(algorithm, &views)?;
    let grad_views: Vec<HostSlice<'_>> = grads.iter().map(HostTensor::as_slice).collect();
    let mut step = |params: &mut Vec<HostTensor>| -> wgpu_optim::Result<Duration> {
        let mut views: Vec<_> = params.iter_mut().map(HostTensor::as_mut_slice).collect();
        let start = Instant::now();
        optimizer.step(&mut views, &grad_views)?;
        Ok(start.elapsed())
    };
    step(&mut params)?; // first touch of the state
    let mut passes = Vec::new();
    let cpu = repeat(reps, budget, || {
        flush.flush();
        let t = step(&mut params)?;
        flush.flush();
        passes.push(host.time());
        Ok(t)
    })?;
    Ok((cpu, Times::of(passes).unwrap_or_default().fastest))
}

/// Whether `TorchState` runs `algorithm` one tensor at a time. Schedule-Free's oracle keeps
/// per-group values (`k`, `weight_sum`, `lr_max`) and has no row here.
/// LAMB's oracle is `LambOracle`, not a `TorchState`: no row either.
fn per_tensor_oracle(algorithm: &Algorithm) -> bool {
    if matches!(algorithm, Algorithm::Lamb(_)) {
        return false;
    }
    // Adafactor's and Muon's oracles need shapes (`AdafactorOracle`, `muon_step`).
    if let Algorithm::Adafactor(_) | Algorithm::Muon(_) = algorithm {
        return false;
    }
    !matches!(algorithm, Algorithm::ScheduleFreeAdamW(_))
}

fn oracle_step(job: &Job<'_>) -> Times {
    let Job { algorithm, clip, case, reps, budget, .. } = *job;
    let mut params: Vec<Vec<f64>> = case.sizes.iter().map(|&n| vec![0.5; n as usize]).collect();
    let mut grads: Vec<Vec<f64>> = case.sizes.iter().map(|&n| vec![1e-3; n as usize]).collect();
    let mut states: Vec<TorchState> =
        case.sizes.iter().map(|&n| TorchState::new(algorithm.to_oracle(), n as usize)).collect();
    repeat(reps.min(5), budget, || {
        let start = Instant::now();
        if let Some(clip) = &clip {
            clip_grad_norm(&mut grads, &clip.to_oracle());
        }
        for ((p, g), s) in params.iter_mut().zip(&grads).zip(&mut states) {
            s.step(p, g);
        }
        Ok(start.elapsed())
    })
    .unwrap_or_default()
}

fn main() -> ExitCode {
    env_logger::init();
    let options = match options::parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}\n{}", options::USAGE);
            return ExitCode::from(2);
        }
    };
    match run(options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// Mesa's loaders print two alarming lines when `XDG_RUNTIME_DIR` is unset (a plain shell,
/// a container); give them a private directory instead. Mesa writes nothing there, so one
/// directory serves every run (a directory per process was left behind by each).
fn quiet_mesa() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        let dir = std::env::temp_dir().join("wgpu-optim-bench-runtime");
        if std::fs::create_dir_all(&dir).is_ok() {
            std::env::set_var("XDG_RUNTIME_DIR", &dir);
        }
    }
}

/// The widest vector extension the CPU backend's loops use here: the figures of one machine
/// compare with another's only where this is the same.
#[cfg(target_arch = "x86_64")]
fn host_vectors() -> &'static str {
    if std::arch::is_x86_feature_detected!("avx512f") {
        "AVX-512"
    } else if std::arch::is_x86_feature_detected!("avx2") {
        "AVX2"
    } else {
        "SSE2"
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn host_vectors() -> &'static str {
    if cfg!(target_arch = "aarch64") {
        "NEON"
    } else {
        "baseline"
    }
}

fn run(options: Options) -> Result<(), Box<dyn std::error::Error>> {
    quiet_mesa();
    let ctx = match options.gpu {
        false => None,
        true => match GpuContext::headless_blocking() {
            Ok(ctx) => Some(ctx),
            Err(e) => {
                // The CPU backend and the oracle still run: the bench works with nothing but cargo.
                println!(
                    "no GPU adapter ({e}); running the CPU backend only. Without a GPU, Mesa's lavapipe \
                     provides one: apt-get install -y mesa-vulkan-drivers libvulkan1"
                );
                None
            }
        },
    };
    let adapter = ctx.as_ref().map_or("no GPU".to_string(), |c| c.report().adapter_name.clone());
    match &ctx {
        Some(c) => {
            let f16 = if c.native_f16() { "native array<f16>" } else { "packed in u32" };
            println!("adapter: {}; f16 storage {f16}", c.report())
        }
        None if !options.gpu => println!("adapter: none (--no-gpu)"),
        None => {}
    }
    println!("host: {} threads (rayon), {} vectors", rayon::current_num_threads(), host_vectors());
    let mut cases: Vec<(String, Case)> = Vec::new();
    for case in &options.cases {
        match case.as_str() {
            "single" => {
                cases.extend(options.sizes.iter().map(|&n| (format!("{n}"), Case { sizes: vec![n] })))
            }
            "gpt2" => cases.push(("gpt2-small".into(), Case { sizes: shapes::gpt2_small(1) })),
            _ => cases.push(("200x4096".into(), Case { sizes: vec![4096; 200] })),
        }
    }
    let timer = ctx.as_ref().map(GpuTimer::new);
    let mut bench = Bench {
        options,
        ctx,
        timer,
        rooflines: Rooflines::default(),
        flush: rooflines::CacheFlush::new(),
        rows: Vec::new(),
    };
    // 8-bit state applies to f32 parameters of the algorithms bitsandbytes has in 8 bits,
    // clipped or not (plain RMSprop: bitsandbytes' 8-bit RMSprop refuses the rest).
    let mut runs: Vec<(String, String, String)> = Vec::new();
    for algo in &bench.options.algos {
        for dtype in &bench.options.dtypes {
            for state in &bench.options.states {
                let unclipped = algo.trim_end_matches("+clip");
                let q8_applies = dtype == "f32"
                    && ["adam", "adamw", "sgdm", "nesterov", "lion", "rmsprop", "ademamix"]
                        .contains(&unclipped);
                // 4-bit state is torchao's: f32 Adam and AdamW.
                let q4_applies = dtype == "f32" && ["adam", "adamw"].contains(&algo.as_str());
                let q8_applies = q8_applies && state == "q8";
                let q4_applies = q4_applies && state == "q4";
                if state == "f32" || q8_applies || q4_applies {
                    runs.push((algo.clone(), dtype.clone(), state.clone()));
                }
            }
        }
    }
    let total = runs.len() * cases.len();
    let mut done = 0;
    let started = Instant::now();
    for (algo, dtype, state) in &runs {
        for (name, case) in &cases {
            done += 1;
            eprintln!(
                "[{done}/{total}, {:.0} s] {algo} {dtype} {state} {name}",
                started.elapsed().as_secs_f64()
            );
            bench.run_case(algo, dtype, state, name, case)?;
        }
    }
    println!("{}", report::summary(&bench.rows));
    eprintln!("finished in {:.0} s", started.elapsed().as_secs_f64());
    if let Some(path) = &bench.options.json {
        report::write_json(path, &adapter, &bench.rows)?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &bench.options.plot {
        report::write_plot(path, &adapter, &bench.rows)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
