//! Why AMSGrad exists: the counterexample of Reddi et al. (2018), on the GPU.
//!
//! ```text
//! cargo run --release --example amsgrad [-- --steps 50000 --paddle-steps 30000 --plot amsgrad.svg]
//! ```
//! Part 1 runs Adam and AMSGrad with the same betas on the paper's projected online problem
//! and plots x against t. Part 2 reproduces the unprojected run of PaddlePaddle's AMSGrad
//! design document and prints it beside the float64 values that document reports.

mod counterexample;

use std::path::PathBuf;
use std::process::ExitCode;

use counterexample::{average_regret, run, Problem};
use plotters::prelude::*;
use wgpu_optim::{Adam, GpuContext};

struct Options {
    steps: u64,
    paddle_steps: u64,
    plot: Option<PathBuf>,
}

fn options() -> Result<Options, String> {
    let mut options = Options { steps: 50_000, paddle_steps: 30_000, plot: Some("amsgrad.svg".into()) };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--steps" => options.steps = value()?.parse().map_err(|e| format!("--steps: {e}"))?,
            "--paddle-steps" => {
                options.paddle_steps = value()?.parse().map_err(|e| format!("--paddle-steps: {e}"))?
            }
            "--plot" => options.plot = Some(value()?.into()),
            "--no-plot" => options.plot = None,
            other => return Err(format!("unknown option {other}")),
        }
    }
    if options.steps == 0 {
        return Err("--steps must be at least 1".into());
    }
    Ok(options)
}

fn main() -> ExitCode {
    env_logger::init();
    let options = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}\nusage: amsgrad [--steps N] [--paddle-steps N] [--plot FILE.svg | --no-plot]");
            return ExitCode::from(2);
        }
    };
    match main_with(&options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn main_with(options: &Options) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = GpuContext::headless_blocking()?;
    println!("adapter: {}", ctx.report());

    // Part 1: the paper's problem, projected onto [-1, 1], step size 0.5 / sqrt(t).
    println!(
        "\nReddi et al. (2018): f_t(x) = 1010 x if t mod 101 = 1 else -10 x, x in [-1, 1]; optimum x = -1"
    );
    println!("betas (0.9, 0.99), lr 0.5 / sqrt(t), {} steps", options.steps);
    let adam = Adam { lr: 0.5, beta1: 0.9, beta2: 0.99, ..Adam::default() };
    let mut curves = Vec::new();
    for (name, amsgrad) in [("Adam", false), ("AMSGrad", true)] {
        let problem = Problem {
            adam: Adam { amsgrad, ..adam },
            steps: options.steps,
            first_t: 1,
            projected: true,
            decaying_lr: true,
        };
        let xs = run(&ctx, &problem)?;
        let end = xs.last().copied().unwrap_or_default();
        println!("  {name:8} ends at x = {end:+.4}, average regret {:.4}", average_regret(&xs, 1));
        curves.push((name, xs));
    }
    if let Some(path) = &options.plot {
        plot(path, &curves)?;
        println!("  plot of x against t: {}", path.display());
    }

    // Part 2: PaddlePaddle's AMSGrad design document, unprojected, lr 0.1, betas (0.9, 0.999).
    println!(
        "\nPaddlePaddle design doc: x0 = 0, gradient 1010 when i mod 101 = 1 else -10 (i from 0), lr 0.1"
    );
    let reported = [(0u64, 0.1), (10_000, -0.36995566), (20_000, -1.40548992), (30_000, -2.43216356)];
    let paddle = Adam { lr: 0.1, beta1: 0.9, beta2: 0.999, eps: 1e-8, ..Adam::default() };
    let steps = options.paddle_steps + 1;
    let amsgrad = run(
        &ctx,
        &Problem {
            adam: Adam { amsgrad: true, ..paddle },
            steps,
            first_t: 0,
            projected: false,
            decaying_lr: false,
        },
    )?;
    let plain =
        run(&ctx, &Problem { adam: paddle, steps, first_t: 0, projected: false, decaying_lr: false })?;
    println!(
        "  {:>9} {:>14} {:>16} {:>12} {:>14}",
        "iteration", "AMSGrad (GPU)", "PyTorch/Paddle", "rel. diff", "Adam (GPU)"
    );
    for (i, want) in reported.iter().filter(|(i, _)| *i <= options.paddle_steps) {
        let got = amsgrad[*i as usize];
        println!(
            "  {i:>9} {got:>14.8} {want:>16.8} {:>12.2e} {:>14.8}",
            ((got - want) / want).abs(),
            plain[*i as usize]
        );
    }
    println!("  (PyTorch's Adam without amsgrad reaches +1.61 at 10,000: it drifts the other way)");
    Ok(())
}

fn plot(path: &PathBuf, curves: &[(&str, Vec<f64>)]) -> Result<(), Box<dyn std::error::Error>> {
    let steps = curves.iter().map(|(_, xs)| xs.len()).max().unwrap_or(1);
    let root = SVGBackend::new(path, (900, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Reddi et al. (2018): Adam vs AMSGrad on the GPU", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..steps as f64, -1.1f64..1.1f64)?;
    chart.configure_mesh().x_desc("step t").y_desc("x_t").draw()?;
    for ((name, xs), color) in curves.iter().zip([RED, BLUE]) {
        // Every point would make a 100,000-segment path; a few thousand show the same.
        let stride = (xs.len() / 4000).max(1);
        let points = xs.iter().enumerate().step_by(stride).map(|(k, x)| ((k + 1) as f64, *x));
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .draw_series(LineSeries::new([(0.0, -1.0), (steps as f64, -1.0)], BLACK.mix(0.4)))?
        .label("optimum x = -1")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.4)));
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}
