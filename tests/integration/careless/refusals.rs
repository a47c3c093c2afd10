//! Every step input the backends refuse, for every family and storage: a gradient one
//! element short or long in each position, too few or too many gradients, a dtype the step
//! cannot take, memory shared with what the step writes (GPU), and on the CPU backend
//! parameters of another count, dtype or length. Each is a typed error naming the argument
//! and both sizes; it changes nothing (the step count, the parameters and every state, bit
//! for bit), no error reaches the GPU device's handler, and the next good step gives the
//! bits of a run that never saw the refusals.

use wgpu_optim::cpu::{HostSlice, HostSliceMut};
use wgpu_optim::{DType, Error, Tensor};

use super::cases::{assert_clean, assert_same, cases, lens, shapes, values, Case, Cpu, Gpu, Storage};

/// The start and two good gradient sets of a case.
fn data(case: &Case) -> (Vec<Vec<f32>>, [Vec<Vec<f32>>; 2]) {
    let lens = lens(&shapes(case));
    let set = |seed: u64| lens.iter().enumerate().map(|(i, &n)| values(n, seed + i as u64, 0.5)).collect();
    (lens.iter().enumerate().map(|(i, &n)| values(n, 1 + i as u64, 1.0)).collect(), [set(10), set(20)])
}

/// Whether `err` is a length mismatch of `argument` (`got` elements against `expected`)
/// with the reference `reference`.
fn is_length(err: &Error, argument: &str, got: usize, expected: usize, reference: &str) -> bool {
    matches!(err, Error::LengthMismatch { argument: a, got: g, expected: e, reference: r }
        if a == argument && *g == got as u64 && *e == expected as u64 && r == reference)
}

/// A gradient set the GPU optimizer must refuse: what it is, the set, the argument the
/// error's message names, and the error it must be.
struct Bad {
    name: String,
    grads: Vec<Tensor>,
    argument: String,
    expected: Box<dyn Fn(&Error) -> bool>,
}

fn bad(name: String, grads: Vec<Tensor>, argument: &str, expected: impl Fn(&Error) -> bool + 'static) -> Bad {
    Bad { name, grads, argument: argument.into(), expected: Box::new(expected) }
}

fn dtype_is(err: &Error, argument: &str, dtype: DType) -> bool {
    matches!(err, Error::DTypeMismatch { argument: a, got, .. } if a == argument && *got == dtype)
}

fn count_is(err: &Error, argument: &str, got: usize) -> bool {
    matches!(err, Error::CountMismatch { argument: a, got: g, expected: 3 } if a == argument && *g == got)
}

fn overlap_is(err: &Error, grad: &str, param: &str) -> bool {
    matches!(err, Error::OverlapsWritten { tensor, written } if tensor == grad && written == param)
}

fn check_gpu(case: &Case) {
    let (start, [first, second]) = data(case);
    let shapes = shapes(case);
    let lens = lens(&shapes);
    let what = |bad: &str| format!("GPU {} ({:?}): {bad}", case.name, case.storage);
    // Parameters and gradients in buffers one element longer, so that a gradient one element
    // past its parameter's still lies in its buffer.
    let mut gpu = Gpu::build(case, &shapes, &start, &[shapes.len()], 1);
    gpu.step(&first);
    let before = gpu.held();
    let ctx = gpu.ctx.clone();
    let grads = gpu.grads.clone();
    let with = |i: usize, g: Tensor| {
        let mut set = grads.clone();
        set[i] = g;
        set
    };
    let mut sets = Vec::new();
    for (i, &n) in lens.iter().enumerate() {
        let (arg, reference) = (format!("grads[{i}]"), format!("params[{i}]"));
        for len in [n - 1, n + 1] {
            let (a, r) = (arg.clone(), reference.clone());
            let wrong = Tensor { len: len as u64, ..grads[i].clone() };
            sets.push(bad(format!("{arg} of {len}"), with(i, wrong), &arg, move |e| {
                is_length(e, &a, len, n, &r)
            }));
        }
        // F64 on every storage; F16, which f32 state takes, with 8-bit and 4-bit state.
        let dtypes: &[DType] =
            if case.storage == Storage::F32 { &[DType::F64] } else { &[DType::F64, DType::F16] };
        for &dtype in dtypes {
            let a = arg.clone();
            let g = ctx.upload(&arg, &vec![0.25; n], dtype);
            sets.push(bad(format!("{arg} {dtype:?}"), with(i, g), &arg, move |e| dtype_is(e, &a, dtype)));
        }
    }
    sets.push(bad("two gradients".into(), grads[..2].to_vec(), "grads", |e| count_is(e, "grads", 2)));
    let four = [grads.clone(), vec![grads[0].clone()]].concat();
    sets.push(bad("four gradients".into(), four, "grads", |e| count_is(e, "grads", 4)));
    let partly = Tensor { offset: 4, ..gpu.params[0].clone() };
    sets.push(bad("grads[0] partly its parameter".into(), with(0, partly), "grads[0]", |e| {
        matches!(e, Error::PartialOverlap { output, other } if output == "params[0]" && other == "grads[0]")
    }));
    let inside = Tensor { len: lens[1] as u64, ..gpu.params[0].clone() };
    sets.push(bad("grads[1] inside params[0]".into(), with(1, inside), "grads[1]", |e| {
        overlap_is(e, "grads[1]", "params[0]")
    }));
    if let (Some(&kind), Storage::F32) = (case.kinds(&shapes[2]).first(), case.storage) {
        let state = gpu
            .opt
            .state(2, kind)
            .unwrap()
            .and_then(|s| s.dense())
            .unwrap_or_else(|| panic!("{}", what(&format!("no {kind:?}"))));
        assert_eq!(state.len, lens[2] as u64, "{}", what(&format!("{kind:?}")));
        let name = format!("{}[2]", kind.torch_name());
        sets.push(bad(format!("grads[2] is {name}"), with(2, state.clone()), "grads[2]", move |e| {
            overlap_is(e, "grads[2]", &name)
        }));
    }
    let copy_only = ctx.device().create_buffer(&wgpu::BufferDescriptor {
        label: Some("no storage"),
        size: 4 * lens[1] as u64,
        usage: wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let unbindable = Tensor { buffer: copy_only, offset: 0, len: lens[1] as u64, dtype: DType::F32 };
    sets.push(bad(
        "grads[1] without STORAGE".into(),
        with(1, unbindable),
        "grads[1]",
        |e| matches!(e, Error::MissingUsage { argument, .. } if argument == "grads[1]"),
    ));
    // Each set twice: a set refused once is refused again, whatever the first refusal kept.
    for set in sets.iter().chain(&sets) {
        let err = gpu.opt.step(&set.grads).expect_err(&what(&set.name));
        assert!((set.expected)(&err), "{}: {err:?}", what(&set.name));
        assert!(
            err.to_string().contains(&set.argument),
            "{}: the message names {}: {err}",
            what(&set.name),
            set.argument
        );
        assert_same(&gpu.held(), &before, &what(&format!("{} changed something", set.name)));
    }

    gpu.step(&second);
    let mut fresh = Gpu::build(case, &shapes, &start, &[shapes.len()], 1);
    fresh.step(&first);
    fresh.step(&second);
    assert_same(&gpu.held(), &fresh.held(), &what("the next step after the refusals"));
}

fn check_cpu(case: &Case) {
    let (start, [first, second]) = data(case);
    let shapes = shapes(case);
    let lens = lens(&shapes);
    let what = |bad: &str| format!("CPU {} ({:?}): {bad}", case.name, case.storage);
    let mut cpu = Cpu::new(case, &shapes, &start);
    cpu.step(&first);
    let (held, debug) = (cpu.held(), format!("{:?}", cpu.opt));
    let mut params = cpu.params.clone();
    let halves: Vec<Vec<half::f16>> =
        params.iter().map(|p| p.iter().map(|&x| half::f16::from_f32(x)).collect()).collect();
    let brains: Vec<Vec<half::bf16>> =
        second.iter().map(|g| g.iter().map(|&x| half::bf16::from_f32(x)).collect()).collect();
    // Refuses `params` and `grads` as `expected` says, with `argument` in the message.
    let mut refuse = |name: String,
                      argument: &str,
                      mut params: Vec<HostSliceMut<'_>>,
                      grads: Vec<HostSlice<'_>>,
                      expected: &dyn Fn(&Error) -> bool| {
        let err = cpu.opt.step(&mut params, &grads).expect_err(&what(&name));
        assert!(expected(&err), "{}: {err:?}", what(&name));
        assert!(err.to_string().contains(argument), "{}: the message names {argument}: {err}", what(&name));
        assert_same(&cpu.held(), &held, &what(&format!("{name} changed something")));
        assert_eq!(format!("{:?}", cpu.opt), debug, "{}", what(&format!("{name} changed the optimizer")));
    };
    for (i, &n) in lens.iter().enumerate() {
        let (arg, param) = (format!("grads[{i}]"), format!("params[{i}]"));
        for len in [n - 1, n + 1] {
            let mut grads = second.clone();
            grads[i] = vec![0.25; len];
            refuse(format!("{arg} of {len}"), &arg, views(&mut params), grad_views(&grads), &|e| {
                is_length(e, &arg, len, n, &param)
            });
        }
        let mut short = params.clone();
        short[i].pop();
        let built = format!("{param} when the optimizer was built");
        refuse(format!("{param} one short"), &param, views(&mut short), grad_views(&second), &|e| {
            is_length(e, &param, n - 1, n, &built)
        });
        let mut halves = halves.clone();
        let mut mixed = views(&mut params);
        mixed[i] = HostSliceMut::F16(&mut halves[i]);
        refuse(format!("{param} F16"), &param, mixed, grad_views(&second), &|e| {
            dtype_is(e, &param, DType::F16)
        });
        if case.storage != Storage::F32 {
            let mut grads = grad_views(&second);
            grads[i] = HostSlice::BF16(&brains[i]);
            refuse(format!("{arg} BF16 with low-bit state"), &arg, views(&mut params), grads, &|e| {
                dtype_is(e, &arg, DType::BF16)
            });
        }
    }
    let four = [second.clone(), vec![second[0].clone()]].concat();
    for (name, argument, got, params, grads) in [
        ("two gradients", "grads", 2, views(&mut params.clone()), grad_views(&second[..2])),
        ("four gradients", "grads", 4, views(&mut params.clone()), grad_views(&four)),
        ("two parameters", "params", 2, views(&mut params[..2]), grad_views(&second)),
    ] {
        refuse(name.into(), argument, params, grads, &|e| count_is(e, argument, got));
    }

    cpu.step(&second);
    let mut fresh = Cpu::new(case, &shapes, &start);
    fresh.step(&first);
    fresh.step(&second);
    assert_same(&cpu.held(), &fresh.held(), &what("the next step after the refusals"));
}

#[test]
fn refused_steps_name_the_argument_and_change_nothing_on_the_gpu() {
    let _turn = crate::common::gpu_turn();
    for case in cases() {
        check_gpu(&case);
    }
    assert_clean();
}

#[test]
fn refused_steps_name_the_argument_and_change_nothing_on_the_cpu() {
    for case in cases() {
        check_cpu(&case);
    }
}

fn views(params: &mut [Vec<f32>]) -> Vec<HostSliceMut<'_>> {
    params.iter_mut().map(|p| HostSliceMut::F32(p)).collect()
}

fn grad_views(grads: &[Vec<f32>]) -> Vec<HostSlice<'_>> {
    grads.iter().map(|g| HostSlice::F32(g)).collect()
}
