//! One Burn model, one initialization, three optimizers: Burn's own AdamW, this crate's
//! per-tensor drop-in (`FusedOptimizer` behind Burn's `ModuleOptimizer`) and its fused
//! module step (`ModuleStep`). Prints the three loss curves side by side, then times one
//! optimizer step of each on a 16.8 M-parameter model (4 Linear 2048x2048) and on 200
//! parameters of 4,096 elements.
//!
//! The loss curves drift apart (Adam amplifies the last-bit differences of f32 bias
//! corrections over the steps), so the check is per step: from Burn's own state and
//! gradients at every step of its trajectory, the drop-in's step (Burn's record loaded into
//! it) must land within 1e-4 of a step (`lr`) of Burn's.
//!
//! ```text
//! cargo run --release -p wgpu-optim-burn --example burn_mlp [-- --steps 100 --reps 5 --no-timing]
//! ```

use std::time::Instant;

use burn::module::{Module, Param};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{AdamWConfig, GradientsParams, ModuleOptimizer};
use burn::tensor::{Device, Distribution, Tensor};
use wgpu_optim::Adam;
use wgpu_optim_burn::{FusedOptimizer, ModuleStep, SharedDevice};

const LR: f64 = 3e-3;

#[derive(Module, Debug)]
struct Mlp {
    layers: Vec<Linear>,
}

impl Mlp {
    fn new(widths: &[usize], device: &Device) -> Self {
        let layers = widths.windows(2).map(|w| LinearConfig::new(w[0], w[1]).init(device)).collect();
        Mlp { layers }
    }

    fn forward(&self, mut x: Tensor<2>) -> Tensor<2> {
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward(x);
            if i + 1 < self.layers.len() {
                x = Relu::new().forward(x);
            }
        }
        x
    }
}

/// Many small parameters: the case where per-tensor launches dominate.
#[derive(Module, Debug)]
struct Many {
    params: Vec<Param<Tensor<1>>>,
}

/// Burn's AdamW defaults (`AdamWConfig::new()`), as this crate's AdamW.
fn adamw() -> Adam {
    Adam { lr: LR, ..Adam::burn_adamw() }
}

fn burn_adamw() -> ModuleOptimizer {
    AdamWConfig::new().init()
}

/// The three ways of stepping a module.
enum Stepper {
    Burn(ModuleOptimizer),
    PerTensor(ModuleOptimizer),
    Module(Box<ModuleStep>),
}

impl Stepper {
    fn all(shared: &SharedDevice) -> wgpu_optim::Result<[Stepper; 3]> {
        Ok([
            Stepper::Burn(burn_adamw()),
            Stepper::PerTensor(FusedOptimizer::new(shared, adamw())?.init()),
            Stepper::Module(Box::new(ModuleStep::builder().build(shared, adamw())?)),
        ])
    }

    fn name(&self) -> &'static str {
        match self {
            Stepper::Burn(_) => "Burn AdamW",
            Stepper::PerTensor(_) => "per-tensor drop-in",
            Stepper::Module(_) => "module step",
        }
    }

    fn step<M: Module>(&mut self, model: M, grads: GradientsParams) -> wgpu_optim::Result<M> {
        match self {
            Stepper::Burn(optim) | Stepper::PerTensor(optim) => Ok(optim.step(LR, model, grads)),
            Stepper::Module(step) => Ok(step.step(LR, model, grads)?),
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("RUST_LOG").is_some() {
        env_logger::init();
    }
    let args: Vec<String> = std::env::args().collect();
    let flag =
        |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).map(|v| v.parse());
    let steps: usize = flag("--steps").transpose()?.unwrap_or(100);
    let reps: usize = flag("--reps").transpose()?.unwrap_or(5);
    let timing = !args.iter().any(|a| a == "--no-timing");

    let shared = SharedDevice::init()?;
    println!("device: {}", shared.context().report());
    loss_curves(&shared, steps)?;
    step_agreement(&shared, steps)?;
    if timing {
        println!();
        println!("optimizer step time, median of {reps} after 2 warm-up steps, same adapter:");
        let device = shared.device().clone().autodiff();
        let big = Mlp::new(&[2048, 2048, 2048, 2048, 2048], &device);
        time_case(&shared, "16.8 M parameters (4 Linear 2048x2048)", big, reps)?;
        let params =
            (0..200).map(|_| Param::from_tensor(Tensor::random([4096], Distribution::Default, &device)));
        let many = Many { params: params.collect() };
        time_case(&shared, "200 parameters of 4,096", many, reps * 2)?;
    }
    Ok(())
}

/// The same regression task from the same initial model under each optimizer.
fn loss_curves(shared: &SharedDevice, steps: usize) -> wgpu_optim::Result<()> {
    let device = shared.device().clone().autodiff();
    device.seed(11);
    let initial = Mlp::new(&[16, 32, 32, 1], &device);
    let x = Tensor::<2>::random([128, 16], Distribution::Normal(0.0, 1.0), &device);
    let y = x.clone().sum_dim(1).sin();
    let mut curves = Vec::new();
    for mut stepper in Stepper::all(shared)? {
        let mut model = initial.clone();
        let mut losses = Vec::with_capacity(steps);
        for _ in 0..steps {
            let loss = (model.forward(x.clone()) - y.clone()).powi_scalar(2).mean();
            losses.push(loss.clone().into_scalar::<f32>());
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = stepper.step(model, grads)?;
        }
        curves.push((stepper.name(), losses));
    }
    println!("loss, MLP 16-32-32-1 on 128 samples, AdamW lr {LR}:");
    println!("{:>5}  {:>14}  {:>18}  {:>14}", "step", curves[0].0, curves[1].0, curves[2].0);
    for s in (0..steps).filter(|s| s % 5 == 0 || s + 1 == steps) {
        println!("{s:>5}  {:>14.7}  {:>18.7}  {:>14.7}", curves[0].1[s], curves[1].1[s], curves[2].1[s]);
    }
    let worst = |other: &[f32]| {
        curves[0]
            .1
            .iter()
            .zip(other)
            .map(|(a, b)| ((a - b).abs() / a.abs().max(1e-12)) as f64)
            .fold(0.0, f64::max)
    };
    let (per_tensor, module) = (worst(&curves[1].1), worst(&curves[2].1));
    println!(
        "largest relative difference from Burn's AdamW over {steps} steps: per-tensor {per_tensor:.1e}, module step {module:.1e}"
    );
    Ok(())
}

/// Along Burn's trajectory, each step once more by the drop-in from Burn's state (its
/// record loaded) and gradients: how far the two steps land apart.
fn step_agreement(shared: &SharedDevice, steps: usize) -> Result<(), Box<dyn std::error::Error>> {
    let device = shared.device().clone().autodiff();
    device.seed(11);
    let mut model = Mlp::new(&[16, 32, 32, 1], &device);
    let x = Tensor::<2>::random([128, 16], Distribution::Normal(0.0, 1.0), &device);
    let y = x.clone().sum_dim(1).sin();
    let mut burn = burn_adamw();
    let mut worst = 0f32;
    for _ in 0..steps {
        let loss = (model.forward(x.clone()) - y.clone()).powi_scalar(2).mean();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        let copy = copy_grads(&model, &grads);
        let mut ours = FusedOptimizer::new(shared, adamw())?.load_bytes(burn.into_bytes()?)?;
        let mine = ours.step(LR, model.clone(), copy);
        model = burn.step(LR, model, grads);
        for (a, b) in param_values(&mine).iter().zip(&param_values(&model)) {
            worst = worst.max((a - b).abs());
        }
    }
    let relative = f64::from(worst) / LR;
    println!(
        "each of {steps} steps from Burn's state and gradients: the drop-in lands within {worst:.1e} of \
         Burn's AdamW, {relative:.1e} of a step of lr"
    );
    if relative > MAX_STEP_DIFFERENCE {
        return Err(format!(
            "a step differs from Burn's AdamW by {relative:.1e} of lr: it is not Burn's AdamW"
        )
        .into());
    }
    Ok(())
}

/// The most a step may differ from Burn's, as a fraction of the learning rate (an AdamW
/// step moves a parameter by about `lr`). Burn computes `1 - beta2^t` in f32, which
/// cancels: at step 1 its relative error is an f32 ulp over 1e-3, 6e-5, and the step's
/// `sqrt` halves it.
const MAX_STEP_DIFFERENCE: f64 = 1e-4;

/// Every parameter's values, in module order.
fn param_values<M: Module>(model: &M) -> Vec<f32> {
    struct Read(Vec<f32>);
    impl burn::module::ModuleVisitor for Read {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0.extend(param.val().into_data().iter::<f32>());
        }
    }
    let mut read = Read(Vec::new());
    model.visit(&mut read);
    read.0
}

/// The same gradients, for a second optimizer (Burn's `GradientsParams` is not `Clone`).
fn copy_grads<M: Module>(model: &M, grads: &GradientsParams) -> GradientsParams {
    struct Copy<'a>(&'a GradientsParams, GradientsParams);
    impl burn::module::ModuleVisitor for Copy<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if let Some(grad) = self.0.get::<D>(param.id) {
                self.1.register(param.id, grad);
            }
        }
    }
    let mut copy = Copy(grads, GradientsParams::new());
    model.visit(&mut copy);
    copy.1
}

/// Random gradients for every parameter of `model`, as a backward pass would give.
fn random_grads<M: Module>(model: &M) -> GradientsParams {
    struct Fill<'a>(&'a mut GradientsParams);
    impl burn::module::ModuleVisitor for Fill<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let value = param.val();
            let grad = Tensor::<D>::random(value.shape(), Distribution::Normal(0.0, 1.0), &value.device());
            self.0.register(param.id, grad.inner());
        }
    }
    let mut grads = GradientsParams::new();
    model.visit(&mut Fill(&mut grads));
    grads
}

/// Median step time of each optimizer on `initial`, and the module step's speedup.
fn time_case<M: Module>(
    shared: &SharedDevice,
    case: &str,
    initial: M,
    reps: usize,
) -> wgpu_optim::Result<()> {
    let device = shared.device();
    let mut medians = Vec::new();
    for mut stepper in Stepper::all(shared)? {
        let mut model = initial.clone();
        let mut times = Vec::with_capacity(reps);
        for rep in 0..reps + 2 {
            let grads = random_grads(&model);
            device.sync().map_err(|e| wgpu_optim::Error::Burn {
                cause: wgpu_optim::BurnFailure::Device,
                detail: format!("{e:?}"),
            })?;
            let start = Instant::now();
            model = stepper.step(model, grads)?;
            device.sync().map_err(|e| wgpu_optim::Error::Burn {
                cause: wgpu_optim::BurnFailure::Device,
                detail: format!("{e:?}"),
            })?;
            if rep >= 2 {
                times.push(start.elapsed().as_secs_f64() * 1e3);
            }
        }
        times.sort_by(f64::total_cmp);
        medians.push((stepper.name(), times[times.len() / 2]));
    }
    let [(_, burn_ms), (_, per_tensor_ms), (_, module_ms)] = medians[..] else {
        unreachable!("three optimizers were timed")
    };
    println!(
        "  {case}: Burn AdamW {burn_ms:.1} ms, per-tensor drop-in {per_tensor_ms:.1} ms ({:.1}x), module step \
         {module_ms:.1} ms",
        burn_ms / per_tensor_ms
    );
    println!("{case}: module step speedup {:.1}x over Burn's AdamW", burn_ms / module_ms);
    Ok(())
}
