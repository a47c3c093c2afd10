//! The library's API for a framework's front end (the Burn crate is one): steps whose
//! scalars the front end makes (`ops::StepScalars`) and records (`ops::record_updates`),
//! against the oracle, and what it refuses.

use crate::common::{assert_close, ctx, download, upload, Rng, Tolerance};
use wgpu_optim::ops::{self, StepScalars, Update};
use wgpu_optim::{
    Adafactor, Adam, Algorithm, DType, Error, GpuContext, ScheduleFreeAdamW, ScheduleFreeMode,
    ScheduleFreeScalars, StateKind, StepProblem, Tensor,
};
use wgpu_optim_testkit::oracle::{ScheduleFreeOracle, ToOracle, TorchState};

const LEN: usize = 257;

/// A step recorded in place over `param`, `grad` and `states`.
fn record(
    ctx: &GpuContext,
    step: &StepScalars,
    kinds: &[StateKind],
    param: &Tensor,
    grad: &Tensor,
    states: &[Tensor],
) {
    ctx.submit("front-end step", |encoder| {
        ops::record_updates(ctx, encoder, step, kinds, &[Update::in_place(param, grad, states)])
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

fn zeros(ctx: &GpuContext, kinds: &[StateKind]) -> Vec<Tensor> {
    kinds.iter().map(|_| upload(ctx, &[0.0; LEN], DType::F32)).collect()
}

/// AdamW's steps from the step count, as a front end that counts steps per parameter
/// records them, follow PyTorch's.
#[test]
fn steps_from_the_step_count_follow_the_oracle() {
    let ctx = ctx();
    let algorithm: Algorithm = Adam { lr: 1e-2, weight_decay: 0.5, ..Adam::adamw() }.into();
    let kinds = algorithm.state_kinds();
    let mut rng = Rng::new(41);
    let mut want = rng.vec(LEN, 1.0);
    let param = upload(&ctx, &want, DType::F32);
    let states = zeros(&ctx, kinds);
    let mut oracle = TorchState::new(algorithm.to_oracle(), LEN);
    for t in 1..=4 {
        let grad = rng.vec(LEN, 1.0);
        let step = StepScalars::at(&algorithm, t).unwrap_or_else(|e| panic!("{e}"));
        record(&ctx, &step, kinds, &param, &upload(&ctx, &grad, DType::F32), &states);
        oracle.step(&mut want, &grad);
    }
    assert_close("AdamW through StepScalars::at", &download(&ctx, &param), &want, Tolerance::F32);
}

/// Schedule-Free AdamW's steps from running values the front end keeps (`StepScalars::after`
/// hands back the next ones), then its swap to the average x, follow the package's.
#[test]
fn steps_from_running_values_and_the_swap_follow_the_oracle() {
    let ctx = ctx();
    let config =
        ScheduleFreeAdamW { lr: 2e-2, warmup_steps: 2, weight_decay: 0.25, ..ScheduleFreeAdamW::default() };
    let algorithm: Algorithm = config.into();
    assert!(algorithm.keeps_group_values());
    let kinds = algorithm.state_kinds();
    let mut rng = Rng::new(43);
    let mut want = vec![rng.vec(LEN, 1.0)];
    let param = upload(&ctx, &want[0], DType::F32);
    let states: Vec<Tensor> = kinds.iter().map(|_| upload(&ctx, &want[0], DType::F32)).collect();
    // The package starts z at the parameters and the second moment at zero.
    ctx.write(&states[1], &[0.0; LEN]).unwrap_or_else(|e| panic!("{e}"));
    let mut oracle = ScheduleFreeOracle::new(config.to_oracle(), 1);
    let mut values = ScheduleFreeScalars::default();
    for _ in 0..4 {
        let grad = vec![rng.vec(LEN, 1.0)];
        let (step, next) =
            StepScalars::after(&algorithm, &values).expect("Schedule-Free keeps running values");
        record(&ctx, &step, kinds, &param, &upload(&ctx, &grad[0], DType::F32), &states);
        oracle.step(&mut want, &grad);
        values = next;
    }
    assert_eq!(values.k, oracle.k);
    assert_close("weight_sum", &[values.weight_sum], &[oracle.weight_sum], Tolerance::F64);
    assert_close("lr_max", &[values.lr_max], &[oracle.lr_max], Tolerance::F64);
    assert_close("y after four steps", &download(&ctx, &param), &want[0], Tolerance::F32);

    let swap = StepScalars::mode_swap(&algorithm, ScheduleFreeMode::Eval)
        .expect("Schedule-Free has modes")
        .unwrap_or_else(|e| panic!("{e}"));
    // The swap reads no gradient; the parameter stands in for it.
    record(&ctx, &swap, kinds, &param, &param, &states);
    oracle.eval(&mut want);
    assert_close("x after eval()", &download(&ctx, &param), &want[0], Tolerance::F32);
}

/// What a front end cannot make: step 0, a step of an algorithm whose steps need what only
/// an optimizer keeps, Schedule-Free's step from a step count; and the algorithms without
/// running values or modes say so with `None`.
#[test]
fn steps_that_cannot_run_are_refused_by_name() {
    let adam: Algorithm = Adam::adamw().into();
    let err = StepScalars::at(&adam, 0).unwrap_err();
    assert!(matches!(err, Error::BadStep { problem: StepProblem::Zero, .. }), "{err}");
    for algorithm in [Algorithm::from(Adafactor::default()), ScheduleFreeAdamW::default().into()] {
        let err = StepScalars::at(&algorithm, 1).unwrap_err();
        assert!(
            matches!(err, Error::ConflictingOptions { first: "ops::StepScalars", second: "algorithm", .. }),
            "{}: {err}",
            algorithm.name()
        );
    }
    let bad: Algorithm = Adam { beta1: 1.5, ..Adam::adamw() }.into();
    let err = StepScalars::at(&bad, 1).unwrap_err();
    assert!(matches!(err, Error::BadHyperparameter { name: "beta1", .. }), "{err}");
    assert!(!adam.keeps_group_values());
    assert!(StepScalars::after(&adam, &ScheduleFreeScalars::default()).is_none());
    assert!(StepScalars::mode_swap(&adam, ScheduleFreeMode::Eval).is_none());
    // Running values that cannot be the algorithm's are refused where a front end restores them.
    let stale = ScheduleFreeScalars { k: 0, weight_sum: 1.0, lr_max: 0.5 };
    assert!(stale.check_fits(&ScheduleFreeAdamW::default().into()).is_err());
    assert!(ScheduleFreeScalars::default().check_fits(&adam).is_err());
}
