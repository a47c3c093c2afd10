//! A complete trainer that embeds `wgpu-optim` the way an application would: it opens its
//! own device, owns its model's parameter and gradient buffers, records forward and backward
//! passes with its own kernels, and hands the crate only its encoder and buffer ranges.
//!
//! ```text
//! cargo run --release --example train_mlp [-- --optimizer adam|adamw|amsgrad|sgd|nesterov|lion|rmsprop|ademamix|sf-adamw|lamb|adafactor|muon]
//!     [--lr LR] [--steps N] [--dtype f32|f16|bf16] [--no-master-weights]
//!     [--rounding nearest|stochastic|kahan] [--seed S] [--save DIR] [--resume DIR]
//!     [--log-every N] [--states f32|q8|q4] [--quiet]
//! ```
//! The model is a 2 → 64 → 64 → 3 ReLU MLP on CS231n's three spirals (600 points, full
//! batch). Each step is one command encoder (forward, backward, the optimizer's fused
//! update) and one submit; the loss and accuracy are read back only every `--log-every`
//! steps. `--dtype f16` (or `bf16`) keeps the model's parameters in f16 (bf16) and runs the
//! optimizer in master-weight mode (f32 master weights and state; the 16-bit copy written
//! in the same dispatch). `--no-master-weights` updates the 16-bit parameters in place
//! instead, with state in the same dtype (pure 16-bit training), rounded as `--rounding`
//! says: `nearest` (even; small updates are lost), `stochastic` (parameters and state, seeded
//! with `--seed`) or `kahan` (a 16-bit compensation per parameter). `--states q8` keeps the
//! optimizer's state in blockwise 8 bits (bitsandbytes' format; f32 parameters, Adam, AdamW
//! or SGD with momentum): every weight matrix's moments, the biases' in f32. `--states q4`
//! keeps Adam's or AdamW's moments in blockwise 4 bits (torchao's `AdamW4bit` format with its
//! defaults: the 64x64 matrix's; the smaller tensors' in f32), at twice Adam's rate unless
//! `--lr` is given (`Q4_LR`).
//!
//! `--steps N` counts the steps of this run (default 300, enough for Adam to pass 95 %
//! training accuracy). `--save DIR` writes `DIR/optimizer.safetensors` (the crate's
//! `Optimizer::save`) and `DIR/model.safetensors` (the parameters under `torch.nn.Linear`'s
//! names, with the step, seed, dtype and optimizer), each atomically. `--resume DIR` loads
//! both and continues the step count; the result is bit-identical to an uninterrupted run.
//! Without a terminal (CI, pipes) the progress bar becomes about ten plain lines.

mod checkpoint;
mod gpu;
mod model;
mod spirals;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use checkpoint::{dtype_name, RunState};
use gpu::{Gpu, Source, StepClock};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use model::{BoxError, Metrics, Mlp};
use spirals::Spirals;
use wgpu_optim::q4::Q4States;
use wgpu_optim::q4::{BLOCK_SIZE, MIN_SIZE};
use wgpu_optim::q8::Q8States;
use wgpu_optim::Adafactor;
use wgpu_optim::Lamb;
use wgpu_optim::{
    AdEMAMix, Adam, Algorithm, DType, GpuContext, Lion, Optimizer, RmsProp, Rounding, ScheduleFreeAdamW, Sgd,
    StateStorage,
};
use wgpu_optim::{Muon, ParamGroup};

/// Steps of the default run. Adam with PyTorch's defaults passes 95 % training accuracy
/// between steps 120 and 160 for seed 0 and ends at 99.2 % here (98.8 % to 99.2 % for seeds
/// 1 to 4), about 10 s on lavapipe.
const DEFAULT_STEPS: u64 = 300;

const USAGE: &str =
    "usage: train_mlp [--optimizer adam|adamw|amsgrad|sgd|nesterov|lion|rmsprop|ademamix|sf-adamw|lamb|adafactor|muon] [--lr LR] [--steps N] \
                     [--dtype f32|f16|bf16] [--no-master-weights] [--rounding nearest|stochastic|kahan] \
                     [--seed S] [--save DIR] [--resume DIR] [--log-every N] [--states f32|q8|q4] [--quiet]";

/// `min_8bit_size` of `--states q8`: every weight matrix of the model, no bias.
pub const Q8_MIN_SIZE: u64 = 128;

/// `--states q4`: torchao's defaults, as `AdamW4bit(model.parameters())` takes them (blocks
/// of 128; a tensor of at least 4096 elements in whole blocks keeps 4-bit state): the
/// hidden 64x64 matrix, 90 % of the parameters; the other tensors keep f32 state.
pub const Q4_STATES: Q4States = Q4States { block_size: BLOCK_SIZE, min_size: MIN_SIZE };

/// `--states q4`'s rate (unless `--lr` says otherwise): twice Adam's. torchao's linear map
/// for `exp_avg_sq` stores a second moment below a sixteenth of its block's largest as that
/// sixteenth, so the elements with small moments take smaller steps than with f32 state; at
/// Adam's own 1e-3 this model reaches 97.7 % in 300 steps (seeds 0 to 4: 96.7 to 98.3 %)
/// against f32 state's 99.1 %. At 2e-3 it reaches 99.4 % (99.2 to 99.5 %), and f32 state at
/// the same rate 99.7 % (PERF.md, "8-bit and 4-bit state").
pub const Q4_LR: f64 = 2e-3;

/// Lion's rate for this model. Lion's update is a sign, every element moving by the full
/// rate, and the paper advises a rate 3-10x smaller than AdamW's; lion-pytorch's default,
/// 1e-4, reaches 52 % here after 300 steps and 3e-4 73 %, while AdamW's own rate, 1e-3,
/// reaches AdamW's 99.2 % (this model is small and its 300 steps few).
const LION_LR: f64 = 1e-3;

/// LAMB's rate for this model (torch-optimizer's default is 1e-3). LAMB's step moves each
/// tensor by `lr` times its own norm (the trust ratio), so its rate is a relative one.
const LAMB_LR: f64 = 1e-2;

/// Adafactor's rate for this model: its step is relative, `min(lr, 1/sqrt(t))` times the
/// tensor's RMS, so the rate caps the first steps only (from step 25 on, 1/sqrt(t) < 0.2).
/// With 0.2 it ends at 99.5 %, 99.5 % and 99.3 % for seeds 0 to 2 (AdamW: 99.2 %, 98.8 %,
/// 99.2 %); torch's default cap, 1e-2, moves this small model too slowly for 300 steps
/// (0.05: 95.7 % for seed 0; 0.1: 99.3 % for seed 0 but 94.7 % for seed 1).
const ADAFACTOR_LR: f64 = 0.2;

/// Muon's rate for the hidden layer (Keller Jordan's 0.02 with torch's "original" scaling,
/// which is 1 for a square matrix); the other tensors take AdamW's defaults (lr 1e-3).
const MUON_LR: f64 = 0.02;

/// The `--optimizer` choices, each with its source's defaults (SGD: momentum 0.9; Lion:
/// [`LION_LR`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Choice {
    Adam,
    AdamW,
    AmsGrad,
    Sgd,
    Nesterov,
    Lion,
    RmsProp,
    AdEMAMix,
    ScheduleFreeAdamW,
    Lamb,
    Adafactor,
    /// Muon on the hidden layer's weight matrix (`fc2.weight`), AdamW on the input layer,
    /// the head and the biases: three groups, in the model's order.
    Muon,
}

impl Choice {
    fn parse(name: &str) -> Result<Self, String> {
        Ok(match name {
            "adam" => Choice::Adam,
            "adamw" => Choice::AdamW,
            "amsgrad" => Choice::AmsGrad,
            "sgd" => Choice::Sgd,
            "nesterov" => Choice::Nesterov,
            "lion" => Choice::Lion,
            "rmsprop" => Choice::RmsProp,
            "ademamix" => Choice::AdEMAMix,
            "sf-adamw" => Choice::ScheduleFreeAdamW,
            "lamb" => Choice::Lamb,
            "adafactor" => Choice::Adafactor,
            "muon" => Choice::Muon,
            other => return Err(format!("--optimizer: unknown optimizer `{other}`")),
        })
    }

    fn name(self) -> &'static str {
        match self {
            Choice::Adam => "adam",
            Choice::AdamW => "adamw",
            Choice::AmsGrad => "amsgrad",
            Choice::Sgd => "sgd",
            Choice::Nesterov => "nesterov",
            Choice::Lion => "lion",
            Choice::RmsProp => "rmsprop",
            Choice::AdEMAMix => "ademamix",
            Choice::ScheduleFreeAdamW => "sf-adamw",
            Choice::Lamb => "lamb",
            Choice::Adafactor => "adafactor",
            Choice::Muon => "muon",
        }
    }

    fn algorithm(self) -> Algorithm {
        let sgd = Sgd { momentum: 0.9, ..Sgd::default() };
        match self {
            Choice::Adam => Adam::default().into(),
            Choice::AdamW => Adam::adamw().into(),
            Choice::AmsGrad => Adam { amsgrad: true, ..Adam::default() }.into(),
            Choice::Sgd => sgd.into(),
            Choice::Nesterov => Sgd { nesterov: true, ..sgd }.into(),
            Choice::Lion => Lion { lr: LION_LR, ..Lion::default() }.into(),
            Choice::RmsProp => RmsProp::default().into(),
            Choice::AdEMAMix => AdEMAMix::default().into(),
            Choice::ScheduleFreeAdamW => ScheduleFreeAdamW::default().into(),
            Choice::Lamb => Lamb { lr: LAMB_LR, ..Lamb::default() }.into(),
            Choice::Adafactor => Adafactor { lr: ADAFACTOR_LR, ..Adafactor::default() }.into(),
            // The other groups' algorithm (`groups` puts Muon on the hidden layer).
            Choice::Muon => Adam::adamw().into(),
        }
    }

    /// The parameter groups over `params` (the model's, in its order): one group for most
    /// choices; for Muon, AdamW on `fc1`, Muon on `fc2.weight`, AdamW on the rest.
    fn groups(self, model: &Mlp, params: &[wgpu_optim::Tensor]) -> Vec<ParamGroup> {
        let algorithm = self.algorithm();
        if self != Choice::Muon {
            return vec![ParamGroup::new(algorithm, params)];
        }
        let hidden = model.layout().iter().position(|s| s.name == "fc2.weight").unwrap_or(0);
        let muon = Muon { lr: MUON_LR, ..Muon::default() };
        vec![
            ParamGroup::new(algorithm, &params[..hidden]),
            ParamGroup::new(muon, &params[hidden..hidden + 1]),
            ParamGroup::new(algorithm, &params[hidden + 1..]),
        ]
    }
}

/// The command line. `None` means "not given": a resumed run takes it from the checkpoint.
#[derive(Debug, Default)]
struct Options {
    optimizer: Option<Choice>,
    lr: Option<f64>,
    steps: Option<u64>,
    dtype: Option<DType>,
    /// 16-bit parameters updated in place, without f32 masters.
    no_master_weights: bool,
    rounding: RoundingChoice,
    seed: Option<u64>,
    save: Option<PathBuf>,
    resume: Option<PathBuf>,
    log_every: u64,
    /// Blockwise 8-bit optimizer state (`--states q8`) instead of f32.
    q8_states: bool,
    /// Blockwise 4-bit optimizer state (`--states q4`).
    q4_states: bool,
    quiet: bool,
}

fn options() -> Result<Options, String> {
    let mut options = Options { log_every: 50, ..Options::default() };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--optimizer" => options.optimizer = Some(Choice::parse(&value()?)?),
            "--lr" => options.lr = Some(parse(&flag, &value()?)?),
            "--steps" => options.steps = Some(parse(&flag, &value()?)?),
            "--dtype" => options.dtype = Some(parse_dtype(&value()?)?),
            "--no-master-weights" => options.no_master_weights = true,
            "--rounding" => options.rounding = RoundingChoice::parse(&value()?)?,
            "--seed" => options.seed = Some(parse(&flag, &value()?)?),
            "--save" => options.save = Some(value()?.into()),
            "--resume" => options.resume = Some(value()?.into()),
            "--log-every" => options.log_every = parse(&flag, &value()?)?,
            "--states" => {
                let states = value()?;
                options.q4_states = states == "q4";
                options.q8_states = match states.as_str() {
                    "f32" | "q4" => false,
                    "q8" => true,
                    other => return Err(format!("--states: `{other}` is not f32, q8 or q4")),
                }
            }
            "--quiet" | "-q" => options.quiet = true,
            // An empty error is the request for help.
            "--help" | "-h" => return Err(String::new()),
            other => return Err(format!("unknown option {other}")),
        }
    }
    if options.log_every == 0 {
        return Err("--log-every must be at least 1".into());
    }
    if options.lr.is_some_and(|lr| !(lr.is_finite() && lr >= 0.0)) {
        return Err("--lr must be a finite number >= 0".into());
    }
    Ok(options)
}

fn parse<T: std::str::FromStr>(flag: &str, value: &str) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    value.parse().map_err(|e| format!("{flag} {value}: {e}"))
}

fn parse_dtype(value: &str) -> Result<DType, String> {
    match value {
        "f32" => Ok(DType::F32),
        "f16" => Ok(DType::F16),
        "bf16" => Ok(DType::BF16),
        other => Err(format!("--dtype: `{other}` is not f32, f16 or bf16")),
    }
}

/// The `--rounding` choices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum RoundingChoice {
    #[default]
    Nearest,
    Stochastic,
    Kahan,
}

impl RoundingChoice {
    fn parse(name: &str) -> Result<Self, String> {
        Ok(match name {
            "nearest" => RoundingChoice::Nearest,
            "stochastic" => RoundingChoice::Stochastic,
            "kahan" => RoundingChoice::Kahan,
            other => return Err(format!("--rounding: `{other}` is not nearest, stochastic or kahan")),
        })
    }

    /// The crate's rounding; stochastic rounding is seeded with the run's seed and rounds the
    /// 16-bit state too.
    fn rounding(self, seed: u64) -> Rounding {
        match self {
            RoundingChoice::Nearest => Rounding::NearestEven,
            RoundingChoice::Stochastic => Rounding::Stochastic { seed, state: true },
            RoundingChoice::Kahan => Rounding::Kahan,
        }
    }
}

fn main() -> ExitCode {
    env_logger::init();
    let options = match options() {
        Ok(o) => o,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match main_with(&options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What this run trains, after reconciling the flags with a checkpoint.
struct Plan {
    state: RunState,
    choice: Choice,
    steps: u64,
    /// The checkpoint's packed parameters, when resuming.
    params: Option<Vec<u8>>,
}

fn main_with(options: &Options) -> Result<(), BoxError> {
    let gpu = Gpu::open()?;
    say(options, &gpu.describe());
    let plan = plan(options)?;
    if plan.state.dtype == DType::F16 && !gpu.has_f16() {
        return Err(format!(
            "--dtype f16 needs the adapter feature SHADER_F16, which {} lacks; run with --dtype f32",
            gpu.info.name
        )
        .into());
    }
    let data = Spirals::generate(plan.state.seed);
    let model = Mlp::new(&gpu.device, &gpu.queue, &data, plan.state.dtype, plan.state.seed)?;
    if let Some(params) = &plan.params {
        model.write_params(params)?;
    }
    // The crate borrows the trainer's device; it never opens one of its own.
    let ctx = GpuContext::from_device(gpu.device.clone(), gpu.queue.clone());
    let mut optimizer = build_optimizer(options, &ctx, &model, &plan)?;
    say(options, &describe(&plan, &optimizer, &data));
    let initial = model.evaluate()?;
    let run = train(options, &gpu, &model, &mut optimizer, &plan, initial)?;
    // Schedule-Free trains at y and is evaluated at the average x, which `eval` swaps in
    // (a no-op for the other algorithms); `train` swaps y back before the checkpoint.
    optimizer.eval()?;
    let last = model.evaluate()?;
    optimizer.train()?;
    // Saved before anything more is printed: a closed stdout must not cost the checkpoint.
    let state = RunState { step: optimizer.step_count(), ..plan.state.clone() };
    if let Some(dir) = &options.save {
        checkpoint::save(dir, &ctx, &model, &optimizer, &state)?;
    }
    summarize(&plan, initial, last, &run);
    if let Some(dir) = &options.save {
        say(options, &format!("saved step {} to {}", state.step, dir.display()));
    }
    Ok(())
}

/// The run's settings: from the flags, or from the checkpoint when resuming (a flag that
/// contradicts the checkpoint is refused rather than silently ignored).
fn plan(options: &Options) -> Result<Plan, BoxError> {
    let steps = options.steps.unwrap_or(DEFAULT_STEPS);
    let Some(dir) = &options.resume else {
        let choice = options.optimizer.unwrap_or(Choice::Adam);
        let state = RunState {
            step: 0,
            seed: options.seed.unwrap_or(0),
            dtype: options.dtype.unwrap_or(DType::F32),
            optimizer: choice.name().into(),
        };
        return Ok(Plan { state, choice, steps, params: None });
    };
    let file = checkpoint::load_model(dir, &model::param_layout())?;
    let state = file.state;
    let choice = Choice::parse(&state.optimizer)?;
    let conflicts = [
        ("--optimizer", options.optimizer.is_some_and(|c| c != choice), state.optimizer.clone()),
        ("--seed", options.seed.is_some_and(|s| s != state.seed), state.seed.to_string()),
        ("--dtype", options.dtype.is_some_and(|d| d != state.dtype), dtype_name(state.dtype).into()),
    ];
    if let Some((flag, _, saved)) = conflicts.iter().find(|(_, differs, _)| *differs) {
        return Err(
            format!("{flag} differs from the checkpoint in {}, which has {saved}", dir.display()).into()
        );
    }
    Ok(Plan { state, choice, steps, params: Some(file.params) })
}

/// The crate's optimizer over the model's own parameter tensors (in place for f32, master
/// weights for f16), with the checkpoint's state when resuming and `--lr` applied last, so
/// it overrides the checkpoint's learning rate.
fn build_optimizer(
    options: &Options,
    ctx: &GpuContext,
    model: &Mlp,
    plan: &Plan,
) -> Result<Optimizer, BoxError> {
    let params = model.param_tensors();
    // The crate refuses stochastic or Kahan rounding of f32 parameters or with masters.
    let rounding = options.rounding.rounding(plan.state.seed);
    // Master weights read the model's 16-bit values (a checkpoint's, if written above) into
    // f32 masters; without them the 16-bit parameters are updated in place.
    let master_weights = model.dtype() != DType::F32 && !options.no_master_weights;
    // The layers' shapes, so that the optimizer checkpoint holds each state as PyTorch
    // would (`tools/torch_checkpoint.py to-torch` turns it into a state_dict).
    let param_shapes = model.layout().iter().map(|spec| spec.shape.clone()).collect();
    // This model's weight matrices are small (2x64 to 64x64): `--states q8` quantizes
    // every one of them (the smallest has 128 elements) and leaves the biases in f32.
    let state_storage = if options.q8_states {
        StateStorage::Q8(Q8States { min_8bit_size: Q8_MIN_SIZE })
    } else if options.q4_states {
        StateStorage::Q4(Q4_STATES)
    } else {
        StateStorage::ParamDtype
    };
    let optimizer_options = Optimizer::builder()
        .master_weights(master_weights)
        .rounding(rounding)
        .param_shapes(param_shapes)
        .state_storage(state_storage);
    let mut optimizer = optimizer_options.build_groups(ctx, plan.choice.groups(model, &params))?;
    if let Some(dir) = &options.resume {
        optimizer.load(dir.join(checkpoint::OPTIMIZER_FILE))?;
        checkpoint::check_step(&optimizer, &plan.state)?;
    }
    // A resumed run keeps its checkpoint's rate unless `--lr` is given.
    let q4_lr = (options.q4_states && options.resume.is_none()).then_some(Q4_LR);
    if let Some(lr) = options.lr.or(q4_lr) {
        optimizer.set_lr(lr)?;
    }
    Ok(optimizer)
}

/// The hyperparameters in PyTorch's terms.
fn hyperparameters(algorithm: &Algorithm) -> String {
    match algorithm {
        Algorithm::Adam(a) => format!(
            "lr {}, betas ({}, {}), eps {:e}, weight_decay {}{}, amsgrad {}",
            a.lr,
            a.beta1,
            a.beta2,
            a.eps,
            a.weight_decay,
            if a.decoupled_weight_decay { " (decoupled)" } else { "" },
            a.amsgrad
        ),
        Algorithm::Sgd(s) => format!(
            "lr {}, momentum {}, dampening {}, weight_decay {}, nesterov {}",
            s.lr, s.momentum, s.dampening, s.weight_decay, s.nesterov
        ),
        Algorithm::Muon(m) => format!(
            "lr {}, weight_decay {}, momentum {}, nesterov {}, ns_steps {}, Newton-Schulz in {}",
            m.lr,
            m.weight_decay,
            m.momentum,
            m.nesterov,
            m.ns_steps,
            m.ns_precision.torch_name()
        ),
        other => format!("{other:?}"),
    }
}

fn describe(plan: &Plan, optimizer: &Optimizer, data: &Spirals) -> String {
    let resumed = match plan.state.step {
        0 => String::new(),
        step => format!(", resuming at step {step}"),
    };
    format!(
        "model: MLP {:?}, {} parameters ({}{}); data: {} spiral points, seed {}\n\
         optimizer: {} ({}); {} steps{resumed}",
        model::WIDTHS,
        model::param_count(),
        dtype_name(plan.state.dtype),
        match (plan.state.dtype, optimizer.model_copies().is_empty()) {
            (DType::F32, _) => String::new(),
            (_, false) => ", f32 master weights and state".to_string(),
            (_, true) => format!(", no master weights, {:?} rounding", optimizer.rounding()),
        },
        data.len(),
        plan.state.seed,
        plan.choice.name(),
        (0..optimizer.group_count())
            .filter_map(|g| optimizer.group_algorithm(g).map(hyperparameters))
            .collect::<Vec<_>>()
            .join("; "),
        plan.steps,
    )
}

/// What the training loop measured.
struct Run {
    split: gpu::Split,
    source: Source,
    wall: Duration,
}

/// The training loop: per step one encoder with the forward pass, the backward pass and the
/// optimizer's update, and one submit. Loss and accuracy are read every `log_every` steps.
fn train(
    options: &Options,
    gpu: &Gpu,
    model: &Mlp,
    optimizer: &mut Optimizer,
    plan: &Plan,
    initial: Metrics,
) -> Result<Run, BoxError> {
    let grads = model.grad_tensors();
    let mut clock = StepClock::new(&gpu.device, &gpu.queue);
    let progress = Progress::new(options, plan.steps);
    progress.show(0, plan.state.step, initial);
    let started = Instant::now();
    for i in 1..=plan.steps {
        let (report, last) = (i.is_multiple_of(options.log_every) || i == plan.steps, i == plan.steps);
        let mut encoder =
            gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("train step") });
        clock.begin(&mut encoder);
        model.record_forward(&mut encoder);
        model.record_backward(&mut encoder);
        if report {
            model.record_metrics_copy(&mut encoder);
        }
        clock.before_optimizer(&mut encoder);
        optimizer.record_step(&mut encoder, &grads)?;
        clock.after_optimizer(&mut encoder, last);
        gpu.queue.submit([encoder.finish()]);
        clock.collect(&gpu.device)?;
        progress.advance();
        if report {
            progress.show(i, plan.state.step + i, model.read_metrics()?);
        }
    }
    let wall = started.elapsed();
    progress.finish();
    Ok(Run { split: clock.split(), source: clock.source(), wall })
}

/// A progress bar on a terminal; on anything else (CI logs, pipes) about ten plain lines;
/// nothing with `--quiet`.
struct Progress {
    bar: Option<ProgressBar>,
    /// Plain mode: print a line when this run's step is a multiple of this.
    plain_every: Option<u64>,
    steps: u64,
}

impl Progress {
    fn new(options: &Options, steps: u64) -> Self {
        if options.quiet {
            return Progress { bar: None, plain_every: None, steps };
        }
        let bar = ProgressBar::with_draw_target(Some(steps), ProgressDrawTarget::stderr());
        if bar.is_hidden() || !std::io::stderr().is_terminal() {
            let every = steps.div_ceil(10).div_ceil(options.log_every).max(1) * options.log_every;
            return Progress { bar: None, plain_every: Some(every), steps };
        }
        let style = ProgressStyle::with_template(
            "{bar:32.cyan/blue} {pos:>5}/{len} steps  {msg}  [{elapsed} < {eta}]",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        Progress { bar: Some(bar), plain_every: None, steps }
    }

    fn advance(&self) {
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
    }

    /// Shows the metrics of the forward pass of this run's step `i` (0: before training),
    /// labelled with the overall step number `step`, as a PyTorch loop prints the loss of
    /// the step it just took (computed before that step's update).
    fn show(&self, i: u64, step: u64, metrics: Metrics) {
        let text = format!("loss {:.4}  accuracy {:5.1} %", metrics.loss, 100.0 * metrics.accuracy());
        if let Some(bar) = &self.bar {
            bar.set_message(text);
        } else if let Some(every) = self.plain_every {
            if i == 0 || i.is_multiple_of(every) || i == self.steps {
                println!("step {step:>6}  {text}");
            }
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

fn summarize(plan: &Plan, initial: Metrics, last: Metrics, run: &Run) {
    let steps = plan.steps.max(1) as f64;
    println!(
        "final: loss {:.4} (from {:.4}), training accuracy {:.2} % ({}/{}) after {} steps",
        last.loss,
        initial.loss,
        100.0 * last.accuracy(),
        last.correct,
        last.samples,
        plan.state.step + plan.steps,
    );
    let split = run.split;
    let per_step = |d: Duration| d.as_secs_f64() * 1e6 / split.steps.max(1) as f64;
    let share = split.optimizer.as_secs_f64() / (split.optimizer + split.model).as_secs_f64().max(1e-12);
    let source = match run.source {
        Source::GpuTimestamps => "GPU timestamps",
        Source::HostRecording => "host recording time: the device has no TIMESTAMP_QUERY_INSIDE_ENCODERS",
    };
    println!(
        "time ({source}): optimizer steps {:.1} ms ({:.1} µs/step, {:.1} %), forward+backward {:.1} ms ({:.1} µs/step)",
        split.optimizer.as_secs_f64() * 1e3,
        per_step(split.optimizer),
        100.0 * share,
        split.model.as_secs_f64() * 1e3,
        per_step(split.model),
    );
    println!(
        "wall: {:.2} s for {} steps ({:.0} µs/step, including submits and readbacks)",
        run.wall.as_secs_f64(),
        plan.steps,
        run.wall.as_secs_f64() * 1e6 / steps
    );
}

/// Prints a line unless `--quiet`.
fn say(options: &Options, line: &str) {
    if !options.quiet {
        println!("{line}");
    }
}
