//! A step whose submission wgpu refuses (here: a gradient buffer destroyed after the step
//! that bound it, so recording creates nothing and only the submission fails) is an error
//! that changes nothing: not the step count (the host's, or the device's in capturable
//! mode), not a parameter, not a state, not Schedule-Free's values or mode; no error reaches
//! the device's uncaptured-error handler; and the next step runs as the CPU backend's
//! second. The same for `eval()`, whose swap pass fails to submit.

use crate::common;

use wgpu_optim::cpu::{CpuOptimizer, CpuOptimizerBuilder, HostSlice, HostSliceMut};
use wgpu_optim::q4::Q4States;
use wgpu_optim::q8::Q8States;
use wgpu_optim::{
    Adafactor, Adam, Algorithm, DType, Error, GpuContext, Lamb, Optimizer, OptimizerBuilder,
    ScheduleFreeAdamW, ScheduleFreeMode, StateKind, StateStorage, Tensor,
};

/// Every state kind the cases below keep.
const KINDS: [StateKind; 7] = [
    StateKind::ExpAvg,
    StateKind::ExpAvgSq,
    StateKind::MomentumBuffer,
    StateKind::Z,
    StateKind::RowVar,
    StateKind::ColVar,
    StateKind::Variance,
];

/// A matrix above the 8-bit and 4-bit states' minimum size, and a vector below it (which
/// keeps f32 state).
const SHAPES: [&[usize]; 2] = [&[50, 100], &[64]];

/// What a refused step must leave as it was, as text: f64's `Debug` round-trips, so equal
/// text is equal values, bit for bit.
fn snapshot(ctx: &GpuContext, opt: &Optimizer, params: &[Tensor]) -> String {
    let mut out = format!(
        "step {} device step {:?} mode {:?} scalars {:?}\n",
        opt.step_count(),
        opt.read_device_step().ok(),
        opt.mode(),
        opt.schedule_free_scalars(0)
    );
    for (i, param) in params.iter().enumerate() {
        out += &format!("param {i}: {:?}\n", ctx.read(param).unwrap());
        for kind in KINDS {
            if let Some(t) = opt.state(i, kind).unwrap().and_then(|s| s.dense()) {
                out += &format!("{kind:?} {i}: {:?}\n", ctx.read(t).unwrap());
            }
            if let Ok(Some(q)) = opt.state(i, kind).map(|s| s.and_then(|v| v.q8())) {
                out += &format!("8-bit {kind:?} {i}: {q:?}\n");
            }
            if let Ok(Some(q)) = opt.state(i, kind).map(|s| s.and_then(|v| v.q4())) {
                out += &format!("4-bit {kind:?} {i}: {q:?}\n");
            }
        }
    }
    out
}

/// One step with a first gradient set, two refused steps with it (one of its buffers
/// destroyed), then one with a second set: the refused ones change nothing, and the
/// parameters end as the CPU backend's after two steps, within `rtol`.
fn a_refused_step_changes_nothing(
    algorithm: impl Into<Algorithm>,
    gpu: OptimizerBuilder,
    cpu: CpuOptimizerBuilder,
    rtol: f64,
) {
    let algorithm = algorithm.into();
    let what = algorithm.name();
    let _turn = common::gpu_turn();
    let (ctx, seen) = common::watched_ctx();
    let shapes: Vec<Vec<usize>> = SHAPES.iter().map(|s| s.to_vec()).collect();
    let lens: Vec<usize> = shapes.iter().map(|s| s.iter().product()).collect();
    let mut rng = common::Rng::new(3);
    let p0: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grads: Vec<Vec<Vec<f64>>> = (0..2).map(|_| lens.iter().map(|&n| rng.vec(n, 0.1)).collect()).collect();
    let params: Vec<Tensor> = p0.iter().map(|v| ctx.upload("p", v, DType::F32)).collect();
    let upload =
        |set: &[Vec<f64>]| -> Vec<Tensor> { set.iter().map(|g| ctx.upload("g", g, DType::F32)).collect() };
    let (first, second) = (upload(&grads[0]), upload(&grads[1]));
    let mut opt = gpu.param_shapes(shapes.clone()).build(&ctx, algorithm, &params).unwrap();
    opt.step(&first).unwrap_or_else(|e| panic!("{what}: {e}"));
    let before = snapshot(&ctx, &opt, &params);
    assert!(before.starts_with("step 1 "), "{what}: {before}");
    first[0].buffer.destroy();
    for _ in 0..2 {
        match opt.step(&first) {
            Err(Error::Gpu { .. }) => {}
            other => panic!("{what}: expected a GPU error from a destroyed gradient, got {other:?}"),
        }
        assert_eq!(snapshot(&ctx, &opt, &params), before, "{what}: a refused step changed something");
    }
    opt.step(&second).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(opt.step_count(), 2, "{what}");

    let mut hosts: Vec<Vec<f32>> = p0.iter().map(|p| common::to_f32(p)).collect();
    let views: Vec<HostSlice<'_>> = hosts.iter().map(|p| HostSlice::F32(p)).collect();
    let mut cpu = cpu.param_shapes(shapes).build(algorithm, &views).unwrap();
    for set in &grads {
        let g: Vec<Vec<f32>> = set.iter().map(|g| common::to_f32(g)).collect();
        let g: Vec<HostSlice<'_>> = g.iter().map(|g| HostSlice::F32(g)).collect();
        let mut p: Vec<HostSliceMut<'_>> = hosts.iter_mut().map(|p| HostSliceMut::F32(p)).collect();
        cpu.step(&mut p, &g).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    for (i, host) in hosts.iter().enumerate() {
        let got = ctx.read(&params[i]).unwrap();
        for (e, (g, w)) in got.iter().zip(host).enumerate() {
            let w = f64::from(*w);
            assert!((g - w).abs() <= rtol * (1e-1 + w.abs()), "{what}: param {i}[{e}]: GPU {g}, CPU {w}");
        }
    }
    common::assert_no_uncaptured(&seen);
}

fn adam() -> Adam {
    Adam { lr: 1e-2, ..Adam::adamw() }
}

#[test]
fn a_refused_adamw_step_changes_nothing_and_is_not_counted() {
    a_refused_step_changes_nothing(adam(), Optimizer::builder(), CpuOptimizer::builder(), 1e-5);
}

#[test]
fn a_refused_capturable_step_leaves_the_device_step_counter_too() {
    a_refused_step_changes_nothing(
        adam(),
        Optimizer::builder().capturable(true),
        CpuOptimizer::builder(),
        1e-5,
    );
}

#[test]
fn a_refused_8bit_step_changes_nothing_and_is_not_counted() {
    let q8 = Q8States::default();
    let (gpu, cpu) = (
        Optimizer::builder().state_storage(StateStorage::Q8(q8)),
        CpuOptimizer::builder().state_storage(StateStorage::Q8(q8)),
    );
    a_refused_step_changes_nothing(adam(), gpu, cpu, 1e-5);
}

#[test]
fn a_refused_4bit_step_changes_nothing_and_is_not_counted() {
    let q4 = Q4States::default();
    let (gpu, cpu) = (
        Optimizer::builder().state_storage(StateStorage::Q4(q4)),
        CpuOptimizer::builder().state_storage(StateStorage::Q4(q4)),
    );
    a_refused_step_changes_nothing(adam(), gpu, cpu, 1e-5);
}

#[test]
fn refused_lamb_adafactor_and_schedule_free_steps_change_nothing() {
    let lamb = Lamb { lr: 1e-2, ..Lamb::default() };
    a_refused_step_changes_nothing(lamb, Optimizer::builder(), CpuOptimizer::builder(), 1e-5);
    let adafactor = Adafactor { lr: 1e-2, ..Adafactor::default() };
    a_refused_step_changes_nothing(adafactor, Optimizer::builder(), CpuOptimizer::builder(), 1e-5);
    let schedule_free = ScheduleFreeAdamW { lr: 1e-2, ..ScheduleFreeAdamW::default() };
    a_refused_step_changes_nothing(schedule_free, Optimizer::builder(), CpuOptimizer::builder(), 1e-5);
}

/// An `eval()` whose swap pass wgpu refuses (a parameter destroyed after the pass was
/// built) is an error, with the mode, the other parameter and the running values as they
/// were and nothing at the device's handler.
#[test]
fn a_refused_eval_leaves_the_mode_and_the_parameters() {
    let _turn = common::gpu_turn();
    let (ctx, seen) = common::watched_ctx();
    let mut rng = common::Rng::new(9);
    let params: Vec<Tensor> = (0..2).map(|_| ctx.upload("p", &rng.vec(256, 1.0), DType::F32)).collect();
    let grads: Vec<Tensor> = (0..2).map(|_| ctx.upload("g", &rng.vec(256, 0.1), DType::F32)).collect();
    let config = ScheduleFreeAdamW { lr: 1e-2, ..ScheduleFreeAdamW::default() };
    let mut opt = Optimizer::builder().build(&ctx, config, &params).unwrap();
    opt.step(&grads).unwrap();
    // The first eval builds the swap pass; the next one only records it.
    opt.eval().unwrap();
    opt.train().unwrap();
    let kept = (ctx.read(&params[0]).unwrap(), opt.schedule_free_scalars(0), opt.step_count());
    params[1].buffer.destroy();
    match opt.eval() {
        Err(Error::Gpu { .. }) => {}
        other => panic!("expected a GPU error from a destroyed parameter, got {other:?}"),
    }
    assert_eq!(opt.mode(), ScheduleFreeMode::Train, "a refused eval changed the mode");
    assert_eq!((ctx.read(&params[0]).unwrap(), opt.schedule_free_scalars(0), opt.step_count()), kept);
    common::assert_no_uncaptured(&seen);
}
