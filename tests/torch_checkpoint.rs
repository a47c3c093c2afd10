//! PyTorch's optimizer state resumed here: fixtures written by `tools/make_torch_fixture.py`
//! (PyTorch's state after 5 steps, converted by `tools/torch_checkpoint.py from-torch`, and
//! PyTorch's parameters over 5 more steps) are loaded and continued on the GPU and on the
//! CPU backend. Also: checkpoints hold each state in its parameter's shape.

mod common;

use common::{assert_close, ctx, download, Tolerance};
use safetensors::SafeTensors;
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut};
use wgpu_optim::{Adam, Algorithm, Checkpoint, DType, Error, Optimizer, OptimizerOptions, Tensor};

const CASES: [&str; 5] = ["adam", "adamw", "amsgrad", "sgd_momentum", "sgd_nesterov"];
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

fn with_shapes(shapes: Vec<Vec<usize>>) -> OptimizerOptions {
    OptimizerOptions { param_shapes: shapes, ..Default::default() }
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
        let mut optimizer =
            Optimizer::with_options(&ctx, fixture.algorithm(), &params, with_shapes(shapes)).unwrap();
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
        let algorithm = fixture.algorithm();
        let slices: Vec<HostSlice<'_>> = params.iter().map(|p| HostSlice::F32(p)).collect();
        let mut optimizer =
            CpuOptimizer::with_options(algorithm, &slices, OptimizerOptions::default()).unwrap();
        // The CPU backend writes no checkpoint file; its state is loaded from the same one.
        let file = SafeTensors::deserialize(&fixture.checkpoint).unwrap();
        for i in 0..params.len() {
            for kind in algorithm.state_kinds() {
                let view = file.tensor(&format!("state.{i}.{}", kind.torch_name())).unwrap();
                let Some(HostSliceMut::F32(state)) = optimizer.state_mut(i, *kind) else {
                    panic!("{case}: no f32 {kind:?}")
                };
                state.copy_from_slice(&bytemuck::pod_collect_to_vec::<u8, f32>(view.data()));
            }
        }
        optimizer.set_step_count(5).unwrap();
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

#[test]
fn a_checkpoint_keeps_each_state_in_its_parameters_shape_and_loads_back_flat_or_shaped() {
    let ctx = ctx();
    let shapes = vec![vec![8, 5], vec![5], vec![3, 4, 2]];
    let lens: Vec<usize> = shapes.iter().map(|s| s.iter().product()).collect();
    let params: Vec<Tensor> = lens.iter().map(|&n| ctx.upload("param", &vec![0.5; n], DType::F32)).collect();
    let grads: Vec<Tensor> = lens.iter().map(|&n| ctx.upload("grad", &vec![0.25; n], DType::F32)).collect();
    let adam = Adam { amsgrad: true, ..Adam::default() };
    let mut shaped = Optimizer::with_options(&ctx, adam, &params, with_shapes(shapes.clone())).unwrap();
    shaped.step(&grads).unwrap();
    let saved = shaped.save_to_bytes().unwrap();
    let file = SafeTensors::deserialize(&saved).unwrap();
    for (i, shape) in shapes.iter().enumerate() {
        for name in ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"] {
            assert_eq!(file.tensor(&format!("state.{i}.{name}")).unwrap().shape(), shape.as_slice());
        }
    }
    // Loads into an optimizer with the shapes and into one without (flat), bit for bit.
    for options in [with_shapes(shapes.clone()), OptimizerOptions::default()] {
        let flat = options.param_shapes.is_empty();
        let mut other = Optimizer::with_options(&ctx, adam, &params, options).unwrap();
        other.load_from_bytes(&saved).unwrap();
        assert_eq!(contents(&other.save_to_bytes().unwrap()), contents(&saved), "flat: {flat}");
    }
    // A flat checkpoint loads into the shaped optimizer too.
    let flat = Optimizer::with_options(&ctx, adam, &params, OptimizerOptions::default()).unwrap();
    shaped.load_from_bytes(&flat.save_to_bytes().unwrap()).unwrap();
}

#[test]
fn shapes_that_do_not_fit_are_refused_and_change_nothing() {
    let ctx = ctx();
    let params =
        vec![ctx.upload("param", &[0.5; 40], DType::F32), ctx.upload("param", &[0.5; 5], DType::F32)];
    let refused = |shapes: Vec<Vec<usize>>| {
        Optimizer::with_options(&ctx, Adam::default(), &params, with_shapes(shapes))
    };
    match refused(vec![vec![8, 5], vec![6]]) {
        Err(e @ Error::LengthMismatch { .. }) => {
            let message = e.to_string();
            assert!(
                message.contains("param_shapes[1]") && message.contains("has 6 elements, expected 5"),
                "{message}"
            );
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
    assert!(matches!(refused(vec![vec![8, 5]]), Err(Error::CountMismatch { .. })));
    let slices = [HostSlice::F32(&[0.5; 40]), HostSlice::F32(&[0.5; 5])];
    let cpu = CpuOptimizer::with_options(Adam::default(), &slices, with_shapes(vec![vec![4, 10], vec![6]]));
    assert!(matches!(cpu, Err(Error::LengthMismatch { .. })));

    // A file whose tensor has another shape of the same length is refused before any write.
    let shapes = vec![vec![8, 5], vec![5]];
    let mut optimizer = Optimizer::with_options(&ctx, Adam::default(), &params, with_shapes(shapes)).unwrap();
    optimizer
        .step(&[ctx.upload("g", &[0.1; 40], DType::F32), ctx.upload("g", &[0.1; 5], DType::F32)])
        .unwrap();
    let other_shape =
        Optimizer::with_options(&ctx, Adam::default(), &params, with_shapes(vec![vec![5, 8], vec![5]]))
            .unwrap()
            .save_to_bytes()
            .unwrap();
    let before = contents(&optimizer.save_to_bytes().unwrap());
    match optimizer.load_from_bytes(&other_shape) {
        Err(Error::BadFile { problem, .. }) => {
            assert!(problem.contains("[5, 8]") && problem.contains("[8, 5]"), "{problem}")
        }
        other => panic!("{other:?}"),
    }
    assert!(contents(&optimizer.save_to_bytes().unwrap()) == before, "a refused load changed the optimizer");
}
