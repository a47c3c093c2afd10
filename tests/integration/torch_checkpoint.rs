//! PyTorch's optimizer state resumed here: fixtures written by `tools/make_torch_fixture.py`
//! (PyTorch's state after 5 steps, converted by `tools/torch_checkpoint.py from-torch`, and
//! PyTorch's parameters over 5 more steps) are loaded and continued on the GPU and on the
//! CPU backend. Also: checkpoints of both backends hold each state in its parameter's
//! shape and load on either, shaped or flat; shapes that do not fit are refused.

use crate::common;

use common::{assert_close, ctx, download, Tolerance};
use safetensors::SafeTensors;
use wgpu_optim::cpu::{CpuOptimizer, CpuOptimizerBuilder, HostSlice, HostSliceMut};
use wgpu_optim::{Adam, Algorithm, Checkpoint, DType, Error, Optimizer, OptimizerBuilder, Tensor};

const CASES: [&str; 10] = [
    "adam",
    "adamw",
    "amsgrad",
    "sgd_momentum",
    "sgd_nesterov",
    "adagrad",
    "rmsprop",
    "rmsprop_centered_momentum",
    "adafactor",
    "adafactor_eps1_maximize",
];
const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/torch");
/// Steps PyTorch took after the checkpoint.
const STEPS: usize = 5;

/// One case's files: the checkpoint bytes and PyTorch's trajectory.
struct Fixture {
    checkpoint: Vec<u8>,
    trajectory: Vec<u8>,
}

impl Fixture {
    fn read(case: &str) -> Self {
        let read = |kind: &str| {
            let path = format!("{DIR}/{case}.{kind}.safetensors");
            std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
        };
        Fixture { checkpoint: read("optimizer"), trajectory: read("trajectory") }
    }

    fn algorithm(&self) -> Algorithm {
        let checkpoint = Checkpoint::parse(&self.checkpoint).unwrap();
        assert_eq!(checkpoint.groups.len(), 1);
        checkpoint.groups[0].0
    }

    /// An f32 tensor of the trajectory and its shape.
    fn tensor(&self, name: &str) -> (Vec<f32>, Vec<usize>) {
        let file = SafeTensors::deserialize(&self.trajectory).unwrap();
        let view = file.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        (bytemuck::pod_collect_to_vec(view.data()), view.shape().to_vec())
    }

    fn params(&self) -> Vec<(Vec<f32>, Vec<usize>)> {
        (0..3).map(|i| self.tensor(&format!("param.{i}"))).collect()
    }

    fn grads(&self, k: usize) -> Vec<Vec<f32>> {
        (0..3).map(|i| self.tensor(&format!("grad.{k}.{i}")).0).collect()
    }

    fn expected(&self, k: usize, i: usize) -> Vec<f64> {
        widen(&self.tensor(&format!("expected.{k}.{i}")).0)
    }
}

/// Named tensor data and metadata entries, each sorted by name.
type Contents = (Vec<(String, Vec<u8>)>, Vec<(String, String)>);

/// Every tensor's data and the metadata of checkpoint bytes, without the shapes (whose
/// metadata map serializes in no fixed order).
fn contents(bytes: &[u8]) -> Contents {
    let (_, metadata) = SafeTensors::read_metadata(bytes).unwrap();
    let mut meta: Vec<(String, String)> =
        metadata.metadata().clone().unwrap_or_default().into_iter().collect();
    meta.sort();
    let file = SafeTensors::deserialize(bytes).unwrap();
    let mut tensors: Vec<(String, Vec<u8>)> =
        file.tensors().into_iter().map(|(name, view)| (name, view.data().to_vec())).collect();
    tensors.sort();
    (tensors, meta)
}

fn widen(values: &[f32]) -> Vec<f64> {
    values.iter().map(|x| f64::from(*x)).collect()
}

fn f32_slices(values: &[Vec<f32>]) -> Vec<HostSlice<'_>> {
    values.iter().map(|v| HostSlice::F32(v)).collect()
}

fn with_shapes(shapes: Vec<Vec<usize>>) -> OptimizerBuilder {
    Optimizer::builder().param_shapes(shapes)
}

fn cpu_with_shapes(shapes: Vec<Vec<usize>>) -> CpuOptimizerBuilder {
    CpuOptimizer::builder().param_shapes(shapes)
}

#[test]
fn pytorchs_state_after_five_steps_continues_on_the_gpu_as_pytorch_continued() {
    let ctx = ctx();
    for case in CASES {
        let fixture = Fixture::read(case);
        let start = fixture.params();
        let params: Vec<Tensor> =
            start.iter().map(|(v, _)| ctx.upload("param", &widen(v), DType::F32)).collect();
        let shapes = start.iter().map(|(_, s)| s.clone()).collect();
        let mut optimizer = with_shapes(shapes).build(&ctx, fixture.algorithm(), &params).unwrap();
        optimizer.load_from_bytes(&fixture.checkpoint).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(optimizer.step_count(), 5, "{case}");
        for k in 0..STEPS {
            let grads: Vec<Tensor> =
                fixture.grads(k).iter().map(|g| ctx.upload("grad", &widen(g), DType::F32)).collect();
            optimizer.step(&grads).unwrap();
            for (i, param) in params.iter().enumerate() {
                let what = format!("{case}: step {}, param {i}", 6 + k);
                assert_close(&what, &download(&ctx, param), &fixture.expected(k, i), Tolerance::F32);
            }
        }
    }
}

#[test]
fn pytorchs_state_after_five_steps_continues_on_the_cpu_backend_as_pytorch_continued() {
    for case in CASES {
        let fixture = Fixture::read(case);
        let start = fixture.params();
        let mut params: Vec<Vec<f32>> = start.iter().map(|(v, _)| v.clone()).collect();
        let shapes = start.iter().map(|(_, s)| s.clone()).collect();
        let slices: Vec<HostSlice<'_>> = params.iter().map(|p| HostSlice::F32(p)).collect();
        let mut optimizer = cpu_with_shapes(shapes).build(fixture.algorithm(), &slices).unwrap();
        optimizer.load_from_bytes(&fixture.checkpoint).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(optimizer.step_count(), 5, "{case}");
        for k in 0..STEPS {
            let grads = fixture.grads(k);
            let grads: Vec<HostSlice<'_>> = grads.iter().map(|g| HostSlice::F32(g)).collect();
            let mut slices: Vec<HostSliceMut<'_>> = params.iter_mut().map(|p| HostSliceMut::F32(p)).collect();
            optimizer.step(&mut slices, &grads).unwrap();
            for (i, param) in params.iter().enumerate() {
                let what = format!("{case}: step {}, param {i}", 6 + k);
                assert_close(&what, &widen(param), &fixture.expected(k, i), Tolerance::F32);
            }
        }
    }
}

/// Asserts that every Adam (AMSGrad) state of `bytes` has its parameter's shape.
#[track_caller]
fn assert_shaped(what: &str, bytes: &[u8], shapes: &[Vec<usize>]) {
    let file = SafeTensors::deserialize(bytes).unwrap();
    for (i, shape) in shapes.iter().enumerate() {
        for name in ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"] {
            let view = file.tensor(&format!("state.{i}.{name}")).unwrap();
            assert_eq!(view.shape(), shape.as_slice(), "{what}: state.{i}.{name}");
        }
    }
}

#[test]
fn a_checkpoint_keeps_each_state_in_its_parameters_shape_and_loads_back_flat_or_shaped() {
    let ctx = ctx();
    let shapes = vec![vec![8, 5], vec![5], vec![3, 4, 2]];
    let lens: Vec<usize> = shapes.iter().map(|s| s.iter().product()).collect();
    let adam = Adam { amsgrad: true, ..Adam::default() };
    // One step on each backend, from the same values.
    let params: Vec<Tensor> = lens.iter().map(|&n| ctx.upload("param", &vec![0.5; n], DType::F32)).collect();
    let grads: Vec<Tensor> = lens.iter().map(|&n| ctx.upload("grad", &vec![0.25; n], DType::F32)).collect();
    let mut gpu = with_shapes(shapes.clone()).build(&ctx, adam, &params).unwrap();
    gpu.step(&grads).unwrap();
    let mut host_params: Vec<Vec<f32>> = lens.iter().map(|&n| vec![0.5; n]).collect();
    let host_grads: Vec<Vec<f32>> = lens.iter().map(|&n| vec![0.25; n]).collect();
    let mut cpu = cpu_with_shapes(shapes.clone()).build(adam, &f32_slices(&host_params)).unwrap();
    let mut slices: Vec<HostSliceMut<'_>> = host_params.iter_mut().map(|p| HostSliceMut::F32(p)).collect();
    cpu.step(&mut slices, &f32_slices(&host_grads)).unwrap();

    let saved = [("GPU", gpu.save_to_bytes().unwrap()), ("CPU", cpu.save_to_bytes().unwrap())];
    for (backend, bytes) in &saved {
        assert_shaped(backend, bytes, &shapes);
        // Loads into an optimizer of either backend with the shapes and into one without
        // (flat), bit for bit; the shaped ones save the shapes back.
        for other_shapes in [shapes.clone(), Vec::new()] {
            let flat = other_shapes.is_empty();
            let mut other_gpu = with_shapes(other_shapes.clone()).build(&ctx, adam, &params).unwrap();
            other_gpu.load_from_bytes(bytes).unwrap();
            let mut other_cpu = cpu_with_shapes(other_shapes).build(adam, &f32_slices(&host_params)).unwrap();
            other_cpu.load_from_bytes(bytes).unwrap();
            for (loader, again) in
                [("GPU", other_gpu.save_to_bytes().unwrap()), ("CPU", other_cpu.save_to_bytes().unwrap())]
            {
                let what = format!("saved on the {backend}, loaded on the {loader}, flat: {flat}");
                assert_eq!(contents(&again), contents(bytes), "{what}");
                if !flat {
                    assert_shaped(&what, &again, &shapes);
                }
            }
        }
    }
    // A flat checkpoint loads into the shaped optimizers too.
    let flat = Optimizer::builder().build(&ctx, adam, &params).unwrap();
    let flat = flat.save_to_bytes().unwrap();
    gpu.load_from_bytes(&flat).unwrap();
    cpu.load_from_bytes(&flat).unwrap();
    assert_eq!(contents(&cpu.save_to_bytes().unwrap()), contents(&flat));
}

#[test]
fn shapes_that_do_not_fit_are_refused_and_change_nothing() {
    let ctx = ctx();
    let params =
        vec![ctx.upload("param", &[0.5; 40], DType::F32), ctx.upload("param", &[0.5; 5], DType::F32)];
    let host_params = [vec![0.5f32; 40], vec![0.5f32; 5]];
    let host = || host_params.iter().map(|p| HostSlice::F32(p)).collect::<Vec<_>>();
    let gpu = |shapes: Vec<Vec<usize>>| with_shapes(shapes).build(&ctx, Adam::default(), &params);
    let cpu = |shapes: Vec<Vec<usize>>| cpu_with_shapes(shapes).build(Adam::default(), &host());
    let wrong = vec![vec![8, 5], vec![6]];
    for (backend, refused) in [("GPU", gpu(wrong.clone()).map(|_| ())), ("CPU", cpu(wrong).map(|_| ()))] {
        match refused {
            Err(e @ Error::LengthMismatch { .. }) => {
                let message = e.to_string();
                assert!(
                    message.contains("param_shapes[1] [6]") && message.contains("has 6 elements, expected 5"),
                    "{backend}: {message}"
                );
            }
            other => panic!("{backend}: {other:?}"),
        }
    }
    assert!(matches!(gpu(vec![vec![8, 5]]), Err(Error::CountMismatch { .. })));
    assert!(matches!(cpu(vec![vec![8, 5]]), Err(Error::CountMismatch { .. })));

    // A file whose tensor has another shape of the same length is refused before any write.
    let shapes = vec![vec![8, 5], vec![5]];
    let mut optimizer = gpu(shapes.clone()).unwrap();
    optimizer
        .step(&[ctx.upload("g", &[0.1; 40], DType::F32), ctx.upload("g", &[0.1; 5], DType::F32)])
        .unwrap();
    let mut cpu_optimizer = cpu(shapes).unwrap();
    let (mut p0, mut p1) = ([0.5f32; 40], [0.5f32; 5]);
    let mut slices = [HostSliceMut::F32(&mut p0), HostSliceMut::F32(&mut p1)];
    cpu_optimizer.step(&mut slices, &[HostSlice::F32(&[0.1; 40]), HostSlice::F32(&[0.1; 5])]).unwrap();
    let other_shape = gpu(vec![vec![5, 8], vec![5]]).unwrap().save_to_bytes().unwrap();
    let refused = |problem: Result<(), Error>, before: Contents, after: Contents, backend: &str| {
        match problem {
            Err(Error::BadFile { problem, .. }) => {
                assert!(
                    problem.contains("`state.0.exp_avg` is F32 [5, 8]") && problem.contains("[8, 5]"),
                    "{problem}"
                )
            }
            other => panic!("{backend}: {other:?}"),
        }
        assert!(after == before, "{backend}: a refused load changed the optimizer");
    };
    let before = contents(&optimizer.save_to_bytes().unwrap());
    let result = optimizer.load_from_bytes(&other_shape);
    refused(result, before, contents(&optimizer.save_to_bytes().unwrap()), "GPU");
    let before = contents(&cpu_optimizer.save_to_bytes().unwrap());
    let result = cpu_optimizer.load_from_bytes(&other_shape);
    refused(result, before, contents(&cpu_optimizer.save_to_bytes().unwrap()), "CPU");
}
