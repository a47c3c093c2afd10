//! Checkpoints of blockwise 8-bit state ([`Q8States`]) on both backends: bitsandbytes'
//! `state_dict` names (`state1`/`absmax1`, `state2`/`absmax2`, `qmap1`/`qmap2`) with U8
//! codes and F32 absmax, f32 state below `min_8bit_size`; a save-load-continue run identical
//! bit for bit to an uninterrupted one; a checkpoint of either backend loading into the
//! other; and every mismatched file refused with a typed error that leaves the optimizer as
//! it was.

use crate::common;

use std::collections::HashMap;

use common::{assert_close, ctx, Rng, Tolerance};
use safetensors::{Dtype, SafeTensors};
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut, HostTensor};
use wgpu_optim::q8::{self, Q8States, StoredState};
use wgpu_optim::{
    Adam, Algorithm, DType, Error, GpuContext, Optimizer, OptimizerBuilder, QuantizedState, Sgd, StateKind,
    StateStorage, Tensor,
};
use wgpu_optim_testkit::checkpoint::canonical;
use wgpu_optim_testkit::oracle::bnb;

/// A tensor of 8-bit state (5000 = 19 full blocks of 256 and a partial one of 136) and one
/// below bitsandbytes' default `min_8bit_size` of 4096, which keeps f32 state.
const SHAPES: [&[usize]; 2] = [&[50, 100], &[100]];

fn lens() -> Vec<usize> {
    SHAPES.iter().map(|s| s.iter().product()).collect()
}

/// One way to build an 8-bit optimizer on either backend.
#[derive(Clone, Copy, Debug)]
struct Setup {
    algorithm: Algorithm,
    /// Whether the optimizer is given [`SHAPES`] (checkpoints then keep codes in them).
    shaped: bool,
    min_8bit_size: u64,
}

impl Setup {
    fn new(algorithm: impl Into<Algorithm>) -> Self {
        Setup { algorithm: algorithm.into(), shaped: true, min_8bit_size: q8::MIN_8BIT_SIZE }
    }

    fn options(&self) -> OptimizerBuilder {
        Optimizer::builder()
            .state_storage(StateStorage::Q8(Q8States { min_8bit_size: self.min_8bit_size }))
            .param_shapes(self.shapes())
    }

    fn shapes(&self) -> Vec<Vec<usize>> {
        if self.shaped {
            SHAPES.iter().map(|s| s.to_vec()).collect()
        } else {
            Vec::new()
        }
    }

    fn cpu(&self, params: &[HostTensor]) -> CpuOptimizer {
        let params: Vec<HostSlice<'_>> = params.iter().map(HostTensor::as_slice).collect();
        CpuOptimizer::builder()
            .state_storage(StateStorage::Q8(Q8States { min_8bit_size: self.min_8bit_size }))
            .param_shapes(self.shapes())
            .build(self.algorithm, &params)
            .unwrap()
    }

    fn gpu(&self, ctx: &GpuContext, params: &[Tensor]) -> Optimizer {
        self.options().build(ctx, self.algorithm, params).unwrap()
    }
}

fn adam() -> Algorithm {
    Adam { lr: 1e-2, ..Adam::default() }.into()
}

fn setups() -> Vec<Setup> {
    vec![
        Setup::new(adam()),
        Setup { shaped: false, ..Setup::new(Adam { lr: 1e-2, weight_decay: 0.1, ..Adam::adamw() }) },
        Setup::new(Sgd { lr: 0.1, momentum: 0.9, ..Sgd::default() }),
    ]
}

/// Random values, one vector per parameter.
fn values(rng: &mut Rng) -> Vec<Vec<f64>> {
    lens().iter().map(|&n| rng.vec(n, 1.0)).collect()
}

fn host(values: &[Vec<f64>]) -> Vec<HostTensor> {
    values.iter().map(|v| HostTensor::from_f64(DType::F32, v).unwrap()).collect()
}

fn cpu_steps(optimizer: &mut CpuOptimizer, params: &mut [HostTensor], rng: &mut Rng, steps: usize) {
    for _ in 0..steps {
        let grads = host(&values(rng));
        let grads: Vec<HostSlice<'_>> = grads.iter().map(HostTensor::as_slice).collect();
        let mut params: Vec<HostSliceMut<'_>> = params.iter_mut().map(HostTensor::as_mut_slice).collect();
        optimizer.step(&mut params, &grads).unwrap();
    }
}

fn gpu_steps(ctx: &GpuContext, optimizer: &mut Optimizer, rng: &mut Rng, steps: usize) {
    for _ in 0..steps {
        let grads: Vec<Tensor> = values(rng).iter().map(|g| ctx.upload("grad", g, DType::F32)).collect();
        optimizer.step(&grads).unwrap();
    }
}

/// A checkpoint taken apart, to write files that differ from a good one in one place.
struct File {
    tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)>,
    metadata: HashMap<String, String>,
}

impl File {
    fn parse(bytes: &[u8]) -> File {
        let file = SafeTensors::deserialize(bytes).unwrap();
        let (_, metadata) = SafeTensors::read_metadata(bytes).unwrap();
        let tensors = file
            .tensors()
            .into_iter()
            .map(|(name, view)| (name, view.dtype(), view.shape().to_vec(), view.data().to_vec()))
            .collect();
        File { tensors, metadata: metadata.metadata().clone().unwrap_or_default() }
    }

    fn bytes(&self) -> Vec<u8> {
        let views = self.tensors.iter().map(|(name, dtype, shape, data)| {
            (name.clone(), safetensors::tensor::TensorView::new(*dtype, shape.clone(), data).unwrap())
        });
        safetensors::serialize(views, Some(self.metadata.clone())).unwrap()
    }

    fn data(&self, name: &str) -> &[u8] {
        let found = self.tensors.iter().find(|(n, ..)| n == name);
        &found.unwrap_or_else(|| panic!("no `{name}`")).3
    }

    /// The file with tensor `name` replaced.
    fn with(&self, name: &str, dtype: Dtype, shape: &[usize], data: Vec<u8>) -> Vec<u8> {
        let mut tensors = self.tensors.clone();
        let slot = tensors.iter_mut().find(|(n, ..)| n == name).unwrap_or_else(|| panic!("no `{name}`"));
        *slot = (name.to_string(), dtype, shape.to_vec(), data);
        File { tensors, metadata: self.metadata.clone() }.bytes()
    }

    /// The file without tensor `name`.
    fn without(&self, name: &str) -> Vec<u8> {
        let tensors = self.tensors.iter().filter(|(n, ..)| n != name).cloned().collect();
        File { tensors, metadata: self.metadata.clone() }.bytes()
    }

    /// The file with metadata `key` set to `value`, or removed.
    fn with_metadata(&self, key: &str, value: Option<&str>) -> Vec<u8> {
        let mut metadata = self.metadata.clone();
        match value {
            Some(value) => metadata.insert(key.to_string(), value.to_string()),
            None => metadata.remove(key),
        };
        File { tensors: self.tensors.clone(), metadata }.bytes()
    }
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn f32s(data: &[u8]) -> Vec<f32> {
    data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

#[test]
fn a_gpu_8bit_checkpoint_resumed_continues_bit_identically_to_an_uninterrupted_run() {
    let ctx = ctx();
    for setup in setups() {
        let mut rng = Rng::new(21);
        let initial = values(&mut rng);
        let params: Vec<Tensor> = initial.iter().map(|v| ctx.upload("param", v, DType::F32)).collect();
        let mut first = setup.gpu(&ctx, &params);
        gpu_steps(&ctx, &mut first, &mut rng, 3);
        let dir = std::env::temp_dir().join(format!("wgpu-optim-q8-checkpoint-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("optimizer.safetensors");
        first.save(&path).unwrap();
        let model: Vec<Vec<u8>> = params.iter().map(|p| ctx.read_bytes(p).unwrap()).collect();

        // A restarted trainer: its parameters from its model file, a fresh optimizer.
        let resumed_params: Vec<Tensor> =
            initial.iter().map(|v| ctx.upload("param", v, DType::F32)).collect();
        for (p, bytes) in resumed_params.iter().zip(&model) {
            ctx.write_bytes(p, bytes).unwrap();
        }
        let mut resumed = setup.gpu(&ctx, &resumed_params);
        resumed.load(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(resumed.step_count(), 3, "{setup:?}");

        let mut rng_resumed = rng.clone();
        gpu_steps(&ctx, &mut first, &mut rng, 3);
        gpu_steps(&ctx, &mut resumed, &mut rng_resumed, 3);
        for (i, (a, b)) in params.iter().zip(&resumed_params).enumerate() {
            assert!(
                ctx.read_bytes(a).unwrap() == ctx.read_bytes(b).unwrap(),
                "{setup:?}: params[{i}] differ"
            );
        }
        for (i, kind) in (0..2).flat_map(|i| setup.algorithm.state_kinds().iter().map(move |k| (i, *k))) {
            assert_eq!(
                first.state(i, kind).map(|s| s.and_then(|v| v.q8())).unwrap(),
                resumed.state(i, kind).map(|s| s.and_then(|v| v.q8())).unwrap(),
                "{setup:?}: state {i} {kind:?}"
            );
        }
        assert!(
            canonical(&first.save_to_bytes().unwrap()) == canonical(&resumed.save_to_bytes().unwrap()),
            "{setup:?}: the checkpoints after 6 steps differ"
        );
    }
}

#[test]
fn a_cpu_8bit_checkpoint_resumed_continues_bit_identically_to_an_uninterrupted_run() {
    for setup in setups() {
        let mut rng = Rng::new(22);
        let mut params = host(&values(&mut rng));
        let mut first = setup.cpu(&params);
        cpu_steps(&mut first, &mut params, &mut rng, 3);
        let dir = std::env::temp_dir().join(format!("wgpu-optim-q8-cpu-checkpoint-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("optimizer.safetensors");
        first.save(&path).unwrap();
        let mut resumed_params = params.clone();
        let mut resumed = setup.cpu(&resumed_params);
        resumed.load(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(resumed.step_count(), 3, "{setup:?}");

        let mut rng_resumed = rng.clone();
        cpu_steps(&mut first, &mut params, &mut rng, 3);
        cpu_steps(&mut resumed, &mut resumed_params, &mut rng_resumed, 3);
        assert_eq!(params, resumed_params, "{setup:?}");
        for (i, kind) in (0..2).flat_map(|i| setup.algorithm.state_kinds().iter().map(move |k| (i, *k))) {
            assert_eq!(
                first.state(i, kind).and_then(|s| s.q8()),
                resumed.state(i, kind).and_then(|s| s.q8()),
                "{setup:?}: state {i} {kind:?}"
            );
        }
    }
}

#[test]
fn states_are_saved_under_bitsandbytes_names_as_u8_codes_with_f32_absmax() {
    let ctx = ctx();
    let lens = lens();
    for setup in setups() {
        let mut rng = Rng::new(23);
        let params: Vec<Tensor> = values(&mut rng).iter().map(|v| ctx.upload("p", v, DType::F32)).collect();
        let mut optimizer = setup.gpu(&ctx, &params);
        gpu_steps(&ctx, &mut optimizer, &mut rng, 2);
        let bytes = optimizer.save_to_bytes().unwrap();
        let file = SafeTensors::deserialize(&bytes).unwrap();
        let mut names = file.names();
        names.sort();
        let adam = setup.algorithm.state_kinds().len() == 2;
        let expected: &[&str] = if adam {
            &[
                "qmap1",
                "qmap2",
                "state.0.absmax1",
                "state.0.absmax2",
                "state.0.state1",
                "state.0.state2",
                "state.0.step",
                "state.1.state1",
                "state.1.state2",
                "state.1.step",
            ]
        } else {
            &["qmap1", "state.0.absmax1", "state.0.state1", "state.0.step", "state.1.state1", "state.1.step"]
        };
        assert_eq!(names, expected, "{setup:?}");

        let codes_shape = if setup.shaped { SHAPES[0].to_vec() } else { vec![lens[0]] };
        for (k, kind) in setup.algorithm.state_kinds().iter().enumerate() {
            let Some(StoredState::Q8 { codes, absmax }) =
                optimizer.state(0, *kind).map(|s| s.and_then(|v| v.q8())).unwrap()
            else {
                panic!("{setup:?}: params[0] keeps no 8-bit {kind:?}")
            };
            let state = file.tensor(&format!("state.0.state{}", k + 1)).unwrap();
            assert_eq!((state.dtype(), state.shape()), (Dtype::U8, &codes_shape[..]), "{setup:?}");
            assert_eq!(state.data(), codes, "{setup:?}: codes of {kind:?}");
            let saved = file.tensor(&format!("state.0.absmax{}", k + 1)).unwrap();
            // ceil(5000 / 256) = 20 blocks, the last one partial.
            assert_eq!((saved.dtype(), saved.shape()), (Dtype::F32, &[20][..]), "{setup:?}");
            assert_eq!(f32s(saved.data()), absmax, "{setup:?}: absmax of {kind:?}");
            assert!(absmax.iter().all(|a| *a > 0.0), "{setup:?}: a stepped state has nonzero blocks");

            let Some(StoredState::F32(values)) =
                optimizer.state(1, *kind).map(|s| s.and_then(|v| v.q8())).unwrap()
            else {
                panic!("{setup:?}: params[1] keeps no f32 {kind:?}")
            };
            let small = file.tensor(&format!("state.1.state{}", k + 1)).unwrap();
            assert_eq!((small.dtype(), small.shape()), (Dtype::F32, SHAPES[1]), "{setup:?}");
            assert_eq!(f32s(small.data()), values, "{setup:?}: f32 {kind:?}");

            let map = file.tensor(&format!("qmap{}", k + 1)).unwrap();
            assert_eq!((map.dtype(), map.shape()), (Dtype::F32, &[256][..]));
            assert_eq!(f32s(map.data()), bnb::map_for(kind.torch_name()), "{setup:?}: qmap{}", k + 1);
        }
        let (_, metadata) = SafeTensors::read_metadata(&bytes).unwrap();
        let metadata = metadata.metadata().clone().unwrap();
        assert_eq!(metadata["q8_min_8bit_size"], "4096");
        assert_eq!(metadata["q8_block_size"], "256");
    }
    // The maps are bitsandbytes' (the oracle's `map_for` above: signed for first moments,
    // unsigned for second moments); the crate's own choice by kind is checked in src/q8.
}

#[test]
fn an_8bit_gpu_checkpoint_loads_on_the_cpu_and_a_cpu_checkpoint_on_the_gpu_bit_for_bit() {
    let ctx = ctx();
    for setup in setups() {
        let mut rng = Rng::new(24);
        let initial = values(&mut rng);
        let gpu_params: Vec<Tensor> = initial.iter().map(|v| ctx.upload("param", v, DType::F32)).collect();
        let mut gpu = setup.gpu(&ctx, &gpu_params);
        gpu_steps(&ctx, &mut gpu, &mut rng, 3);
        let from_gpu = gpu.save_to_bytes().unwrap();

        let now: Vec<Vec<f64>> = gpu_params.iter().map(|p| ctx.read(p).unwrap()).collect();
        let mut cpu_params = host(&now);
        let mut cpu = setup.cpu(&cpu_params);
        cpu.load_from_bytes(&from_gpu).unwrap_or_else(|e| panic!("{setup:?}: {e}"));
        assert_eq!(cpu.step_count(), 3);
        for (i, kind) in (0..2).flat_map(|i| setup.algorithm.state_kinds().iter().map(move |k| (i, *k))) {
            let on_gpu = gpu.state(i, kind).map(|s| s.and_then(|v| v.q8())).unwrap();
            assert_eq!(
                cpu.state(i, kind).and_then(|s| s.q8()),
                on_gpu.as_ref(),
                "{setup:?}: state {i} {kind:?} GPU -> CPU"
            );
        }
        assert!(canonical(&cpu.save_to_bytes().unwrap()) == canonical(&from_gpu), "{setup:?}: GPU -> CPU");

        // Both continue from the same state with the same gradients.
        let grads = values(&mut rng);
        {
            let host_grads = host(&grads);
            let host_grads: Vec<HostSlice<'_>> = host_grads.iter().map(HostTensor::as_slice).collect();
            let mut params: Vec<HostSliceMut<'_>> =
                cpu_params.iter_mut().map(HostTensor::as_mut_slice).collect();
            cpu.step(&mut params, &host_grads).unwrap();
        }
        let gpu_grads: Vec<Tensor> = grads.iter().map(|g| ctx.upload("grad", g, DType::F32)).collect();
        gpu.step(&gpu_grads).unwrap();
        for (i, (cpu_param, gpu_param)) in cpu_params.iter().zip(&gpu_params).enumerate() {
            let what = format!("{setup:?}: params[{i}] after a step on each backend");
            assert_close(&what, &cpu_param.to_f64(), &ctx.read(gpu_param).unwrap(), Tolerance::F32);
        }

        // And back: the CPU's checkpoint on a fresh GPU optimizer.
        let from_cpu = cpu.save_to_bytes().unwrap();
        let mut back = setup.gpu(&ctx, &gpu_params);
        back.load_from_bytes(&from_cpu).unwrap_or_else(|e| panic!("{setup:?}: {e}"));
        assert_eq!(back.step_count(), 4);
        for (i, kind) in (0..2).flat_map(|i| setup.algorithm.state_kinds().iter().map(move |k| (i, *k))) {
            let on_gpu = back.state(i, kind).map(|s| s.and_then(|v| v.q8())).unwrap();
            assert_eq!(
                cpu.state(i, kind).and_then(|s| s.q8()),
                on_gpu.as_ref(),
                "{setup:?}: state {i} {kind:?} CPU -> GPU"
            );
        }
        assert!(canonical(&back.save_to_bytes().unwrap()) == canonical(&from_cpu), "{setup:?}: CPU -> GPU");
    }
}

/// A good 8-bit Adam checkpoint (after 2 steps) and files that differ from it in one way,
/// each with a piece of the refusal's message.
fn bad_files(good: &[u8]) -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let file = File::parse(good);
    let codes = file.data("state.0.state1").to_vec();
    let absmax = f32s(file.data("state.0.absmax1"));
    let small = file.data("state.1.state1").to_vec();
    let mut other_map = bnb::signed_map();
    other_map[17] = f32::from_bits(other_map[17].to_bits() + 1);
    let dequantized: Vec<f32> =
        codes.iter().enumerate().map(|(j, c)| bnb::signed_map()[usize::from(*c)] * absmax[j / 256]).collect();
    vec![
        (
            "codes one short",
            file.with("state.0.state1", Dtype::U8, &[4999], codes[..4999].to_vec()),
            "U8 [4999]",
        ),
        (
            "an absmax short",
            file.with("state.0.absmax1", Dtype::F32, &[19], f32_bytes(&absmax[..19])),
            "= 20",
        ),
        (
            "an absmax too many",
            file.with("state.0.absmax1", Dtype::F32, &[21], f32_bytes(&[absmax.clone(), vec![1.0]].concat())),
            "ceil(5000 / 256) = 20",
        ),
        (
            "block size 512",
            file.with_metadata("q8_block_size", Some("512")),
            "`q8_block_size` is `512`, expected 256",
        ),
        ("no block size", file.with_metadata("q8_block_size", None), "no `q8_block_size`"),
        ("another qmap1", file.with("qmap1", Dtype::F32, &[256], f32_bytes(&other_map)), "`qmap1`"),
        (
            "the maps swapped",
            file.with("qmap2", Dtype::F32, &[256], f32_bytes(&bnb::signed_map())),
            "`qmap2` is not the map",
        ),
        (
            "U8 codes for f32 state",
            file.with("state.1.state1", Dtype::U8, &[100], small[..100].to_vec()),
            "f32 state",
        ),
        (
            "f32 values for 8-bit codes",
            file.with("state.0.state1", Dtype::F32, &[50, 100], f32_bytes(&dequantized)),
            "8-bit codes",
        ),
        ("no absmax2", file.without("state.0.absmax2"), "`state.0.absmax2`"),
        ("no qmap2", file.without("qmap2"), "`qmap2`"),
        ("another min_8bit_size", file.with_metadata("q8_min_8bit_size", Some("100")), "min_8bit_size"),
    ]
}

/// The 8-bit states of both parameters as read back (`None` where there is none).
fn gpu_states(optimizer: &Optimizer) -> Vec<Option<StoredState>> {
    let kinds = [StateKind::ExpAvg, StateKind::ExpAvgSq];
    (0..2)
        .flat_map(|i| {
            kinds.map(|kind| optimizer.state(i, kind).map(|s| s.and_then(|v| v.q8())).ok().flatten())
        })
        .collect()
}

fn cpu_states(optimizer: &CpuOptimizer) -> Vec<Option<StoredState>> {
    let kinds = [StateKind::ExpAvg, StateKind::ExpAvgSq];
    (0..2).flat_map(|i| kinds.map(|kind| optimizer.state(i, kind).and_then(|s| s.q8()).cloned())).collect()
}

/// Checks that loading `bytes` fails with [`Error::BadFile`] whose message holds `says`, and
/// that the optimizer's checkpoint (every state, the step, the hyperparameters) and its
/// 8-bit states as read back are as before.
#[track_caller]
fn assert_gpu_refuses(ctx: &GpuContext, optimizer: &mut Optimizer, bytes: &[u8], what: &str, says: &str) {
    let before = (canonical(&optimizer.save_to_bytes().unwrap()), gpu_states(optimizer));
    let err = optimizer.load_from_bytes(bytes).expect_err(what);
    ctx.queue().submit([]);
    assert!(matches!(err, Error::BadFile { .. }), "{what}: {err}");
    assert!(err.to_string().contains(says), "{what}: `{err}` does not say `{says}`");
    let after = (canonical(&optimizer.save_to_bytes().unwrap()), gpu_states(optimizer));
    assert!(after == before, "{what}: a refused load changed the optimizer");
}

#[track_caller]
fn assert_cpu_refuses(optimizer: &mut CpuOptimizer, bytes: &[u8], what: &str, says: &str) {
    let before = (canonical(&optimizer.save_to_bytes().unwrap()), cpu_states(optimizer));
    let err = optimizer.load_from_bytes(bytes).expect_err(what);
    assert!(matches!(err, Error::BadFile { .. }), "{what}: {err}");
    assert!(err.to_string().contains(says), "{what}: `{err}` does not say `{says}`");
    let after = (canonical(&optimizer.save_to_bytes().unwrap()), cpu_states(optimizer));
    assert!(after == before, "{what}: a refused load changed the optimizer");
}

fn shaped_list() -> Vec<Vec<usize>> {
    SHAPES.iter().map(|s| s.to_vec()).collect()
}

fn shaped() -> OptimizerBuilder {
    Optimizer::builder().param_shapes(SHAPES.iter().map(|s| s.to_vec()).collect())
}

#[test]
fn mismatched_8bit_files_are_refused_by_the_gpu_backend_and_change_nothing() {
    let ctx = ctx();
    let setup = Setup::new(adam());
    let mut rng = Rng::new(25);
    let params: Vec<Tensor> = values(&mut rng).iter().map(|v| ctx.upload("p", v, DType::F32)).collect();
    let mut target = setup.gpu(&ctx, &params);
    gpu_steps(&ctx, &mut target, &mut rng, 2);
    let good = target.save_to_bytes().unwrap();
    // One step further, so that a load that wrote anything would show.
    gpu_steps(&ctx, &mut target, &mut rng, 1);
    for (what, bytes, says) in bad_files(&good) {
        assert_gpu_refuses(&ctx, &mut target, &bytes, what, says);
    }

    // 8-bit state into full precision and the other way round, and another min_8bit_size
    // (from 100 on, params[1] keeps 8-bit state too).
    let mut plain = shaped().build(&ctx, adam(), &params).unwrap();
    gpu_steps(&ctx, &mut plain, &mut rng, 1);
    assert_gpu_refuses(
        &ctx,
        &mut plain,
        &good,
        "8-bit into full precision",
        "OptimizerBuilder::state_storage",
    );
    let full = plain.save_to_bytes().unwrap();
    assert_gpu_refuses(&ctx, &mut target, &full, "full precision into 8-bit", "blockwise 8-bit state");
    let mut smaller = Setup { min_8bit_size: 100, ..setup }.gpu(&ctx, &params);
    gpu_steps(&ctx, &mut smaller, &mut rng, 1);
    assert_gpu_refuses(&ctx, &mut smaller, &good, "another min_8bit_size", "min_8bit_size 4096");

    // The unaltered file loads: the refusals were of the alterations.
    target.load_from_bytes(&good).unwrap();
    assert!(canonical(&target.save_to_bytes().unwrap()) == canonical(&good));
}

#[test]
fn mismatched_8bit_files_are_refused_by_the_cpu_backend_and_change_nothing() {
    let setup = Setup::new(adam());
    let mut rng = Rng::new(26);
    let mut params = host(&values(&mut rng));
    let mut target = setup.cpu(&params);
    cpu_steps(&mut target, &mut params, &mut rng, 2);
    let good = target.save_to_bytes().unwrap();
    cpu_steps(&mut target, &mut params, &mut rng, 1);
    for (what, bytes, says) in bad_files(&good) {
        assert_cpu_refuses(&mut target, &bytes, what, says);
    }

    let slices: Vec<HostSlice<'_>> = params.iter().map(HostTensor::as_slice).collect();
    let mut plain = CpuOptimizer::builder().param_shapes(shaped_list()).build(adam(), &slices).unwrap();
    let mut smaller = Setup { min_8bit_size: 100, ..setup }.cpu(&params);
    cpu_steps(&mut plain, &mut params, &mut rng, 1);
    cpu_steps(&mut smaller, &mut params, &mut rng, 1);
    assert_cpu_refuses(&mut plain, &good, "8-bit into full precision", "OptimizerBuilder::state_storage");
    let full = plain.save_to_bytes().unwrap();
    assert_cpu_refuses(&mut target, &full, "full precision into 8-bit", "blockwise 8-bit state");
    assert_cpu_refuses(&mut smaller, &good, "another min_8bit_size", "min_8bit_size 4096");

    target.load_from_bytes(&good).unwrap();
    assert!(canonical(&target.save_to_bytes().unwrap()) == canonical(&good));
}

#[test]
fn the_same_8bit_state_saves_to_the_same_bytes_on_either_backend() {
    let ctx = ctx();
    for setup in setups() {
        let mut rng = Rng::new(27);
        let initial = values(&mut rng);
        let params: Vec<Tensor> = initial.iter().map(|v| ctx.upload("param", v, DType::F32)).collect();
        let mut gpu = setup.gpu(&ctx, &params);
        gpu_steps(&ctx, &mut gpu, &mut rng, 2);
        let from_gpu = gpu.save_to_bytes().unwrap();
        for _ in 0..2 {
            assert!(gpu.save_to_bytes().unwrap() == from_gpu, "{setup:?}: two GPU saves differ");
        }
        let mut cpu = setup.cpu(&host(&initial));
        cpu.load_from_bytes(&from_gpu).unwrap();
        for _ in 0..3 {
            assert!(
                cpu.save_to_bytes().unwrap() == from_gpu,
                "{setup:?}: the CPU saves the GPU's state in other bytes"
            );
        }
        let mut back = setup.gpu(&ctx, &params);
        back.load_from_bytes(&from_gpu).unwrap();
        assert!(back.save_to_bytes().unwrap() == from_gpu, "{setup:?}: save, load, save changed the bytes");
    }
}

/// Files whose 8-bit state a step would turn into wrong numbers, each with a piece of the
/// refusal's message: a NaN absmax (its block's 256 values would all go NaN), a negative
/// one (they would step the wrong way), an infinite one, and a code flipped in the middle of
/// a state tensor (caught by the tensor's checksum).
fn invalid_states(good: &[u8]) -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let file = File::parse(good);
    let absmax = f32s(file.data("state.0.absmax1"));
    let with_absmax = |j: usize, value: f32| {
        let mut absmax = absmax.clone();
        absmax[j] = value;
        file.with("state.0.absmax1", Dtype::F32, &[20], f32_bytes(&absmax))
    };
    let mut flipped = good.to_vec();
    let (n, metadata) = SafeTensors::read_metadata(good).unwrap();
    let (start, end) = metadata.info("state.0.state2").unwrap().data_offsets;
    flipped[8 + n + (start + end) / 2] ^= 0x10;
    vec![
        ("a NaN absmax", with_absmax(3, f32::NAN), "`state.0.absmax1[3]` is NaN"),
        ("a negative absmax", with_absmax(7, -absmax[7]), "`state.0.absmax1[7]` is -"),
        ("an infinite absmax", with_absmax(19, f32::INFINITY), "`state.0.absmax1[19]` is inf"),
        ("a flipped code", flipped, "the data of `state.0.state2` is corrupt"),
    ]
}

#[test]
fn invalid_8bit_state_in_a_checkpoint_is_refused_by_name_and_changes_nothing() {
    let ctx = ctx();
    let setup = Setup::new(adam());
    let mut rng = Rng::new(28);
    let initial = values(&mut rng);
    let params: Vec<Tensor> = initial.iter().map(|v| ctx.upload("p", v, DType::F32)).collect();
    let mut gpu = setup.gpu(&ctx, &params);
    gpu_steps(&ctx, &mut gpu, &mut rng, 2);
    let good = gpu.save_to_bytes().unwrap();
    gpu_steps(&ctx, &mut gpu, &mut rng, 1);
    let mut host_params = host(&initial);
    let mut cpu = setup.cpu(&host_params);
    cpu_steps(&mut cpu, &mut host_params, &mut rng, 3);
    for (what, bytes, says) in invalid_states(&good) {
        assert_gpu_refuses(&ctx, &mut gpu, &bytes, what, says);
        assert_cpu_refuses(&mut cpu, &bytes, what, says);
    }

    // A file without checksums (format 1, or converted from PyTorch) still loads.
    let unchecked = File::parse(&good).with_metadata("crc32", None);
    gpu.load_from_bytes(&unchecked).unwrap();
    cpu.load_from_bytes(&unchecked).unwrap();
    let saved = File::parse(&good);
    for (i, kind) in (0..2).flat_map(|i| [StateKind::ExpAvg, StateKind::ExpAvgSq].map(|k| (i, k))) {
        let on_gpu = gpu.state(i, kind).map(|s| s.and_then(|v| v.q8())).unwrap();
        assert_eq!(cpu.state(i, kind).and_then(|s| s.q8()), on_gpu.as_ref(), "state {i} {kind:?}");
        let k = usize::from(kind == StateKind::ExpAvgSq) + 1;
        let want = match on_gpu {
            Some(StoredState::Q8 { codes, .. }) => codes,
            Some(StoredState::F32(values)) => f32_bytes(&values),
            None => panic!("params[{i}] keeps no {kind:?}"),
        };
        assert!(saved.data(&format!("state.{i}.state{k}")) == want, "state {i} {kind:?} as saved");
    }
}

#[test]
fn writing_an_invalid_absmax_is_refused_and_changes_nothing() {
    let ctx = ctx();
    let setup = Setup::new(adam());
    let mut rng = Rng::new(29);
    let initial = values(&mut rng);
    let params: Vec<Tensor> = initial.iter().map(|v| ctx.upload("p", v, DType::F32)).collect();
    let gpu = {
        let mut gpu = setup.gpu(&ctx, &params);
        gpu_steps(&ctx, &mut gpu, &mut rng, 2);
        gpu
    };
    let mut host_params = host(&initial);
    let mut cpu = setup.cpu(&host_params);
    cpu_steps(&mut cpu, &mut host_params, &mut rng, 2);
    let Some(StoredState::Q8 { codes, absmax }) =
        gpu.state(0, StateKind::ExpAvg).map(|s| s.and_then(|v| v.q8())).unwrap()
    else {
        panic!("params[0] keeps 8-bit state")
    };
    for bad in [f32::NAN, -0.5, f32::NEG_INFINITY] {
        let mut scales = absmax.clone();
        scales[5] = bad;
        let state = StoredState::Q8 { codes: codes.clone(), absmax: scales };
        let before = (gpu_states(&gpu), cpu_states(&cpu));
        let err = gpu.set_state(0, StateKind::ExpAvg, &QuantizedState::Q8(state.clone())).unwrap_err();
        assert!(matches!(&err, Error::BadValue { argument, .. } if argument.ends_with("absmax[5]")), "{err}");
        let err = cpu.set_state(0, StateKind::ExpAvg, QuantizedState::Q8(state)).unwrap_err();
        assert!(matches!(&err, Error::BadValue { argument, .. } if argument.ends_with("absmax[5]")), "{err}");
        assert!((gpu_states(&gpu), cpu_states(&cpu)) == before, "a refused write of {bad} changed a state");
    }
}
