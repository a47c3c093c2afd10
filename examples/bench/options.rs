//! The bench's command line.

use std::path::PathBuf;

/// What to measure and where to write it.
pub struct Options {
    pub algos: Vec<String>,
    pub dtypes: Vec<String>,
    /// State storage: `f32` (full precision: the parameter's dtype, as PyTorch keeps it) and
    /// `q8` (blockwise 8-bit, for f32 Adam, AdamW and SGD with momentum), `q4` (blockwise
    /// 4-bit, torchao's format, for f32 Adam and AdamW).
    pub states: Vec<String>,
    pub sizes: Vec<u64>,
    pub cases: Vec<String>,
    pub reps: usize,
    /// Stop repeating a measurement after this long (at least 3 repetitions).
    pub budget_s: f64,
    pub json: Option<PathBuf>,
    pub plot: Option<PathBuf>,
    pub gpu: bool,
    pub cpu: bool,
}

/// Every `--algos` name (`main.rs`'s `algorithm` says what each runs); `--full` runs them all.
const ALGORITHMS: &[&str] = &[
    "adam",
    "adam+clip",
    "adamw",
    "amsgrad",
    "sgdm",
    "nesterov",
    "lion",
    "rmsprop",
    "ademamix",
    "sf-adamw",
    "lamb",
    "adafactor",
    "muon",
];

pub const USAGE: &str =
    "usage: bench [--full] [--algos adam,adam+clip,adamw,amsgrad,sgdm,nesterov,lion,rmsprop,ademamix,sf-adamw,lamb,adafactor,muon] [--dtypes f32,f16,bf16]
             [--states f32,q8,q4]
             [--sizes 4096,65536,1048576,16777216,67108864] [--cases single,gpt2,small]
             [--reps N] [--budget SECONDS] [--json FILE] [--plot FILE.svg] [--no-gpu] [--no-cpu]
  default: --algos adam,adam+clip,sgdm --dtypes f32,f16,bf16 --states f32,q8 --sizes 4096,1048576,16777216
           --cases single,small (q8 state runs where bitsandbytes has it: f32 parameters; Adam, SGD, Lion, RMSprop, AdEMAMix)
  --full:  every algorithm, sizes 4 Ki to 64 Mi, and GPT-2 small's 148 tensors";

fn list(value: String) -> Vec<String> {
    value.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect()
}

/// Parses the command line.
pub fn parse() -> Result<Options, String> {
    let mut options = Options {
        algos: list("adam,adam+clip,sgdm".into()),
        dtypes: list("f32,f16,bf16".into()),
        states: list("f32,q8".into()),
        sizes: vec![4096, 1 << 20, 16 << 20],
        cases: list("single,small".into()),
        reps: 10,
        budget_s: 1.0,
        json: None,
        plot: None,
        gpu: true,
        cpu: true,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--algos" => options.algos = list(value()?),
            "--dtypes" => options.dtypes = list(value()?),
            "--states" => options.states = list(value()?),
            "--cases" => options.cases = list(value()?),
            "--sizes" => {
                options.sizes = list(value()?)
                    .iter()
                    .map(|s| s.parse().map_err(|e| format!("--sizes: {s}: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--reps" => options.reps = value()?.parse().map_err(|e| format!("--reps: {e}"))?,
            "--budget" => options.budget_s = value()?.parse().map_err(|e| format!("--budget: {e}"))?,
            "--json" => options.json = Some(value()?.into()),
            "--plot" => options.plot = Some(value()?.into()),
            "--no-gpu" => options.gpu = false,
            "--no-cpu" => options.cpu = false,
            "--full" => {
                options.algos = ALGORITHMS.iter().map(|a| a.to_string()).collect();
                options.sizes = vec![4096, 65_536, 1 << 20, 16 << 20, 64 << 20];
                options.cases = list("single,gpt2,small".into());
            }
            "--help" | "-h" => return Err(String::new()),
            other => return Err(format!("unknown option {other}")),
        }
    }
    if options.reps == 0 {
        return Err("--reps must be at least 1".into());
    }
    for a in &options.algos {
        if !ALGORITHMS.contains(&a.as_str()) {
            return Err(format!("unknown algorithm {a}"));
        }
    }
    for d in &options.dtypes {
        if !["f32", "f16", "bf16"].contains(&d.as_str()) {
            return Err(format!("unknown dtype {d}"));
        }
    }
    for s in &options.states {
        if !["f32", "q8", "q4"].contains(&s.as_str()) {
            return Err(format!("unknown state storage {s}"));
        }
    }
    for c in &options.cases {
        if !["single", "gpt2", "small"].contains(&c.as_str()) {
            return Err(format!("unknown case {c}"));
        }
    }
    Ok(options)
}
