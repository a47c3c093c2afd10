//! Gradients GPU Adafactor refuses as the elementwise families (here Adam) and the CPU
//! backend do, with the same error, before anything is recorded: the step count, the
//! parameters and the states stay as they were.

use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut};
use wgpu_optim::{Adafactor, Adam, Algorithm, DType, Error, Optimizer, StateKind, Tensor};

use crate::common::{ctx, download, Rng};

/// A matrix and a vector; the matrix in a buffer one element longer, so that a gradient one
/// element past it still lies in the buffer.
const SHAPES: [&[usize]; 2] = [&[8, 15], &[33]];
const LENS: [u64; 2] = [120, 33];

/// The parameters (the first in a buffer of 121 elements), and a good set of gradients.
fn tensors(ctx: &wgpu_optim::GpuContext, start: &[Vec<f64>]) -> (Vec<Tensor>, Vec<Tensor>) {
    let roomy = ctx.zeros("param 0", LENS[0] + 1, DType::F32);
    let first = Tensor { len: LENS[0], ..roomy };
    ctx.write(&first, &start[0]).unwrap();
    let params = vec![first, ctx.upload("param 1", &start[1], DType::F32)];
    let grads = LENS.iter().map(|&n| ctx.upload("grad", &vec![0.25; n as usize], DType::F32)).collect();
    (params, grads)
}

/// The gradient sets to refuse, named: `state` is a state tensor of parameter 1.
fn bad_sets(
    ctx: &wgpu_optim::GpuContext,
    params: &[Tensor],
    grads: &[Tensor],
    state: &Tensor,
) -> Vec<(&'static str, Vec<Tensor>)> {
    let with_first = |g: Tensor| vec![g, grads[1].clone()];
    let bytes = |len: u64| len * 4;
    let copy_only = ctx.device().create_buffer(&wgpu::BufferDescriptor {
        label: Some("no storage"),
        size: bytes(LENS[0]),
        usage: wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    vec![
        ("one element short", with_first(Tensor { len: LENS[0] - 1, ..grads[0].clone() })),
        ("one element long", with_first(Tensor { len: LENS[0] + 1, ..params[0].clone() })),
        ("f64", with_first(ctx.upload("g64", &vec![0.25; LENS[0] as usize], DType::F64))),
        ("one gradient", vec![grads[0].clone()]),
        ("partly its parameter", with_first(Tensor { offset: 4, ..params[0].clone() })),
        ("another parameter", vec![grads[0].clone(), Tensor { len: LENS[1], ..params[0].clone() }]),
        ("a state", vec![grads[0].clone(), state.clone()]),
        (
            "no STORAGE usage",
            with_first(Tensor { buffer: copy_only, offset: 0, len: LENS[0], dtype: DType::F32 }),
        ),
    ]
}

/// What a GPU optimizer holds: its step count, parameters and states.
fn snapshot(ctx: &wgpu_optim::GpuContext, opt: &Optimizer, params: &[Tensor]) -> (u64, Vec<Vec<f64>>) {
    let mut values: Vec<Vec<f64>> = params.iter().map(|p| download(ctx, p)).collect();
    for i in 0..params.len() {
        let kinds = [StateKind::RowVar, StateKind::ColVar, StateKind::Variance, StateKind::ExpAvg];
        values.extend(
            kinds
                .iter()
                .filter_map(|k| opt.state(i, *k).unwrap().and_then(|s| s.dense()))
                .map(|t| download(ctx, t)),
        );
    }
    (opt.step_count(), values)
}

#[test]
fn gpu_adafactor_refuses_a_wrong_gradient_as_adam_does_and_changes_nothing() {
    let ctx = ctx();
    let mut rng = Rng::new(31);
    let start: Vec<Vec<f64>> = LENS.iter().map(|&n| rng.vec(n as usize, 1.0)).collect();
    let shapes: Vec<Vec<usize>> = SHAPES.iter().map(|s| s.to_vec()).collect();
    let algorithms: [Algorithm; 2] = [Adafactor::default().into(), Adam::default().into()];
    let mut errors: Vec<Vec<String>> = Vec::new();
    for algorithm in algorithms {
        let (params, grads) = tensors(&ctx, &start);
        let mut opt =
            Optimizer::builder().param_shapes(shapes.clone()).build(&ctx, algorithm, &params).unwrap();
        // A step first, so that the states are not their zeros.
        opt.step(&grads).unwrap();
        let before = snapshot(&ctx, &opt, &params);
        let kind = if matches!(algorithm, Algorithm::Adafactor(_)) {
            StateKind::Variance
        } else {
            StateKind::ExpAvg
        };
        let state = opt.state(1, kind).unwrap().and_then(|s| s.dense()).unwrap().clone();
        let mut seen = Vec::new();
        for (case, set) in bad_sets(&ctx, &params, &grads, &state) {
            let err = opt.step(&set).expect_err(case);
            assert!(before == snapshot(&ctx, &opt, &params), "{case}: a refused step changed something");
            seen.push(format!("{err:?}"));
            if !matches!(algorithm, Algorithm::Adafactor(_)) {
                continue;
            }
            let expected = match case {
                "one element short" => {
                    matches!(&err, Error::LengthMismatch { argument, got: 119, expected: 120, reference }
                    if argument == "grads[0]" && reference == "params[0]")
                }
                "one element long" => {
                    matches!(&err, Error::LengthMismatch { argument, got: 121, expected: 120, .. }
                    if argument == "grads[0]")
                }
                "f64" => {
                    matches!(&err, Error::DTypeMismatch { argument, got: DType::F64, .. } if argument == "grads[0]")
                }
                "one gradient" => matches!(err, Error::CountMismatch { got: 1, expected: 2, .. }),
                "partly its parameter" => matches!(&err, Error::PartialOverlap { output, other }
                    if output == "params[0]" && other == "grads[0]"),
                "another parameter" => matches!(&err, Error::OverlapsWritten { tensor, written }
                    if tensor == "grads[1]" && written == "params[0]"),
                "a state" => matches!(&err, Error::OverlapsWritten { tensor, written }
                    if tensor == "grads[1]" && written == "variance[1]"),
                _ => matches!(&err, Error::MissingUsage { argument, .. } if argument == "grads[0]"),
            };
            assert!(expected, "{case}: {err:?}");
        }
        // And a good step still runs.
        opt.step(&grads).unwrap();
        assert_eq!(opt.step_count(), 2);
        errors.push(seen);
    }
    // Adam's errors are the same, but for the name of the state.
    let adam: Vec<String> = errors[1].iter().map(|e| e.replace("exp_avg[1]", "variance[1]")).collect();
    assert_eq!(errors[0], adam);

    // The CPU backend refuses a short gradient with the same error.
    let values: Vec<Vec<f32>> = start.iter().map(|v| v.iter().map(|&x| x as f32).collect()).collect();
    let views: Vec<HostSlice<'_>> = values.iter().map(|v| HostSlice::F32(v)).collect();
    let mut cpu = CpuOptimizer::builder().param_shapes(shapes).build(Adafactor::default(), &views).unwrap();
    let mut owned = values.clone();
    let mut params: Vec<HostSliceMut<'_>> = owned.iter_mut().map(|v| HostSliceMut::F32(v)).collect();
    let short = [HostSlice::F32(&[0.25; 119]), HostSlice::F32(&[0.25; 33])];
    let err = cpu.step(&mut params, &short).expect_err("short");
    assert_eq!(format!("{err:?}"), errors[0][0]);
}
