//! Devices smaller than the adapter: on a device created with wgpu's downlevel limits (4
//! storage buffers per shader stage, as WebGL2-class hardware), every algorithm either runs
//! and matches the oracle, or is refused with `TooManyBindings` naming the limit and the
//! number of bindings it needs, having changed nothing.

use crate::common;

use common::{assert_close, ctx_with_limits, download, Rng, Tolerance};
use wgpu_optim::{Adagrad, Adam, Algorithm, DType, Error, GpuContext, Optimizer, OptimizerBuilder, Sgd};
use wgpu_optim_testkit::oracle::{Storage, ToOracle, TorchState};

/// What an algorithm's step needs on a device of 4 storage bindings per stage.
enum Outcome {
    Runs,
    /// Refused: the step needs this many storage bindings.
    Needs(u32),
}

const STEPS: usize = 3;
const LEN: usize = 37;

/// Runs `STEPS` steps of `algorithm` with `options` and checks the outcome: the oracle's
/// parameters, or the typed refusal with every tensor and the step count unchanged.
fn check(ctx: &GpuContext, what: &str, algorithm: Algorithm, options: OptimizerBuilder, outcome: Outcome) {
    let mut rng = Rng::new(11);
    // With master weights (the case named so) the optimizer's parameter is the bf16 model copy.
    let dtype = if what.ends_with("with master weights") { DType::BF16 } else { DType::F32 };
    let start: Vec<f64> = rng.vec(LEN, 1.0).into_iter().map(|x| dtype.to_oracle().round(x)).collect();
    let grads: Vec<Vec<f64>> = (0..STEPS).map(|_| rng.vec(LEN, 0.1)).collect();
    let param = ctx.upload("param", &start, dtype);
    let before = download(ctx, &param);
    let mut optimizer =
        options.build(ctx, algorithm, std::slice::from_ref(&param)).unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut outcomes = Vec::new();
    for grad in &grads {
        outcomes.push(optimizer.step(&[ctx.upload("grad", grad, DType::F32)]));
    }
    match outcome {
        Outcome::Runs => {
            for result in outcomes {
                result.unwrap_or_else(|e| panic!("{what}: {e}"));
            }
            let mut want = start.clone();
            let mut oracle = TorchState::new(algorithm.to_oracle(), LEN)
                .storing(DType::F32.to_oracle(), DType::F32.to_oracle());
            for grad in &grads {
                oracle.step(&mut want, grad);
            }
            let want: Vec<f64> = want.iter().map(|x| dtype.to_oracle().round(*x)).collect();
            assert_close(what, &download(ctx, &param), &want, Tolerance::stored(dtype));
            assert_eq!(optimizer.step_count(), STEPS as u64, "{what}");
        }
        Outcome::Needs(needed) => {
            for result in outcomes {
                match result {
                    Err(Error::TooManyBindings { needed: n, limit: 4 }) if n == needed => {
                        let message = Error::TooManyBindings { needed, limit: 4 }.to_string();
                        assert!(
                            message.contains(&format!("needs {needed} storage"))
                                && message.contains("allows 4 per")
                                && message.contains("max_storage_buffers_per_shader_stage"),
                            "{what}: the message should name both numbers and the limit: {message}"
                        );
                    }
                    other => panic!(
                        "{what}: expected TooManyBindings {{ needed: {needed}, limit: 4 }}, got {other:?}"
                    ),
                }
            }
            assert_eq!(download(ctx, &param), before, "{what}: a refused step changed the parameter");
            assert_eq!(optimizer.step_count(), 0, "{what}: a refused step counted");
        }
    }
}

#[test]
fn on_downlevel_limits_each_algorithm_runs_or_is_refused_naming_the_limit() {
    let ctx = ctx_with_limits(wgpu::Limits::downlevel_defaults());
    assert_eq!(ctx.device().limits().max_storage_buffers_per_shader_stage, 4);
    let plain = Optimizer::builder();
    let adam = Adam { lr: 1e-2, weight_decay: 0.01, ..Adam::default() };
    let adamw = Adam { decoupled_weight_decay: true, ..adam };
    let amsgrad = Adam { amsgrad: true, ..adam };
    let sgd = Sgd { lr: 1e-2, ..Sgd::default() };
    let momentum = Sgd { momentum: 0.9, weight_decay: 0.01, ..sgd };
    let nesterov = Sgd { nesterov: true, ..momentum };
    let adagrad = Adagrad { lr: 1e-2, ..Adagrad::default() };
    let cases: [(&str, Algorithm, OptimizerBuilder, Outcome); 9] = [
        // Parameter, gradient and the state tensors, one binding each.
        ("Adam", adam.into(), plain.clone(), Outcome::Runs),
        ("AdamW", adamw.into(), plain.clone(), Outcome::Runs),
        ("AMSGrad", amsgrad.into(), plain.clone(), Outcome::Needs(5)),
        ("SGD", sgd.into(), plain.clone(), Outcome::Runs),
        ("SGD momentum", momentum.into(), plain.clone(), Outcome::Runs),
        ("SGD Nesterov", nesterov.into(), plain.clone(), Outcome::Runs),
        ("Adagrad", adagrad.into(), plain.clone(), Outcome::Runs),
        // Capturable mode binds the device state and the learning rate as well.
        ("capturable Adam", adam.into(), plain.clone().capturable(true), Outcome::Needs(6)),
        // Master weights bind the f32 masters and the bf16 model copy.
        ("Adam with master weights", adam.into(), plain.master_weights(true), Outcome::Needs(5)),
    ];
    for (what, algorithm, options, outcome) in cases {
        check(&ctx, what, algorithm, options, outcome);
    }
}
