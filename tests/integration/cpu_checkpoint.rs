//! The CPU backend's checkpoints: the GPU optimizer's format, so a checkpoint saved by
//! either backend loads into the other and saves back the same bytes; a save-load-continue
//! run identical bit for bit to an uninterrupted one; and every mismatched, truncated or
//! corrupt file refused with a typed error that leaves the optimizer as it was.

use crate::common;

use common::{assert_close, ctx, Rng, Tolerance};
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut, HostTensor};
use wgpu_optim::{
    Adagrad, Adam, Algorithm, DType, Error, GpuContext, Optimizer, OptimizerBuilder, ParamGroup, Rounding,
    Sgd, StateStorage, Tensor,
};
use wgpu_optim_testkit::checkpoint::canonical;

/// Lengths and shapes of the parameters: 2-D, 1-D and 3-D.
const SHAPES: [&[usize]; 3] = [&[8, 5], &[5], &[3, 4, 2]];

/// One way to build an optimizer on either backend.
#[derive(Clone, Copy, Debug)]
struct Setup {
    algorithm: Algorithm,
    param_dtype: DType,
    state_dtype: Option<DType>,
    rounding: Rounding,
}

impl Setup {
    fn f32(algorithm: impl Into<Algorithm>) -> Self {
        Setup {
            algorithm: algorithm.into(),
            param_dtype: DType::F32,
            state_dtype: None,
            rounding: Rounding::NearestEven,
        }
    }

    fn options(&self) -> OptimizerBuilder {
        Optimizer::builder()
            .state_storage(self.state_dtype.map_or(StateStorage::ParamDtype, StateStorage::Dtype))
            .rounding(self.rounding)
            .param_shapes(SHAPES.iter().map(|s| s.to_vec()).collect())
    }

    fn cpu(&self, params: &[HostTensor]) -> CpuOptimizer {
        CpuOptimizer::builder()
            .state_storage(self.state_dtype.map_or(StateStorage::ParamDtype, StateStorage::Dtype))
            .rounding(self.rounding)
            .param_shapes(SHAPES.iter().map(|s| s.to_vec()).collect())
            .build(self.algorithm, &slices(params))
            .unwrap()
    }

    fn gpu(&self, ctx: &GpuContext, params: &[Tensor]) -> Optimizer {
        self.options().build(ctx, self.algorithm, params).unwrap()
    }
}

fn setups() -> Vec<Setup> {
    let amsgrad = Adam { lr: 1e-2, amsgrad: true, weight_decay: 0.01, ..Adam::default() };
    vec![
        Setup::f32(amsgrad),
        Setup::f32(Adam { lr: 1e-2, weight_decay: 0.1, ..Adam::adamw() }),
        Setup::f32(Sgd { lr: 0.1, momentum: 0.9, nesterov: true, ..Sgd::default() }),
        Setup::f32(Adagrad { lr: 0.1, lr_decay: 0.01, initial_accumulator_value: 0.1, ..Adagrad::default() }),
        Setup { state_dtype: Some(DType::BF16), ..Setup::f32(amsgrad) },
        Setup { param_dtype: DType::BF16, rounding: Rounding::Kahan, ..Setup::f32(Adam::adamw()) },
        Setup {
            param_dtype: DType::F16,
            rounding: Rounding::Stochastic { seed: 7, state: true },
            ..Setup::f32(Sgd { lr: 0.1, momentum: 0.9, ..Sgd::default() })
        },
    ]
}

fn lens() -> Vec<usize> {
    SHAPES.iter().map(|s| s.iter().product()).collect()
}

fn slices(tensors: &[HostTensor]) -> Vec<HostSlice<'_>> {
    tensors.iter().map(HostTensor::as_slice).collect()
}

fn slices_mut(tensors: &mut [HostTensor]) -> Vec<HostSliceMut<'_>> {
    tensors.iter_mut().map(HostTensor::as_mut_slice).collect()
}

/// Random values, one vector per parameter.
fn values(rng: &mut Rng) -> Vec<Vec<f64>> {
    lens().iter().map(|&n| rng.vec(n, 1.0)).collect()
}

fn host(values: &[Vec<f64>], dtype: DType) -> Vec<HostTensor> {
    values.iter().map(|v| HostTensor::from_f64(dtype, v).unwrap()).collect()
}

fn cpu_steps(
    optimizer: &mut CpuOptimizer,
    params: &mut [HostTensor],
    rng: &mut Rng,
    dtype: DType,
    steps: usize,
) {
    for _ in 0..steps {
        let grads = host(&values(rng), dtype);
        optimizer.step(&mut slices_mut(params), &slices(&grads)).unwrap();
    }
}

#[test]
fn a_cpu_checkpoint_resumed_continues_bit_identically_to_an_uninterrupted_run() {
    for setup in setups() {
        let mut rng = Rng::new(11);
        let mut params = host(&values(&mut rng), setup.param_dtype);
        let mut first = setup.cpu(&params);
        cpu_steps(&mut first, &mut params, &mut rng, setup.param_dtype, 3);
        let dir = std::env::temp_dir().join(format!("wgpu-optim-cpu-checkpoint-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("optimizer.safetensors");
        first.save(&path).unwrap();
        // A restarted trainer: its parameters from its model file, a fresh optimizer.
        let mut resumed_params = params.clone();
        let mut resumed = setup.cpu(&resumed_params);
        resumed.load(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(resumed.step_count(), 3, "{setup:?}");
        let mut rng_resumed = rng.clone();
        cpu_steps(&mut first, &mut params, &mut rng, setup.param_dtype, 3);
        cpu_steps(&mut resumed, &mut resumed_params, &mut rng_resumed, setup.param_dtype, 3);
        assert_eq!(params, resumed_params, "{setup:?}");
        assert_eq!(
            canonical(&first.save_to_bytes().unwrap()),
            canonical(&resumed.save_to_bytes().unwrap()),
            "{setup:?}"
        );
    }
}

#[test]
fn a_gpu_checkpoint_loads_on_the_cpu_and_a_cpu_checkpoint_on_the_gpu_bit_for_bit() {
    let ctx = ctx();
    for setup in setups() {
        let mut rng = Rng::new(12);
        let initial = values(&mut rng);
        let dtype = setup.param_dtype;
        let gpu_params: Vec<Tensor> = initial.iter().map(|v| ctx.upload("param", v, dtype)).collect();
        let mut gpu = setup.gpu(&ctx, &gpu_params);
        for _ in 0..3 {
            let grads: Vec<Tensor> = values(&mut rng).iter().map(|g| ctx.upload("grad", g, dtype)).collect();
            gpu.step(&grads).unwrap();
        }
        let from_gpu = gpu.save_to_bytes().unwrap();
        assert_every_tensor_shaped(&format!("{setup:?}"), &from_gpu);

        // The GPU's parameters after 3 steps, and its state, on the CPU.
        let now: Vec<Vec<f64>> = gpu_params.iter().map(|p| ctx.read(p).unwrap()).collect();
        let mut cpu_params = host(&now, dtype);
        let mut cpu = setup.cpu(&cpu_params);
        cpu.load_from_bytes(&from_gpu).unwrap_or_else(|e| panic!("{setup:?}: {e}"));
        assert_eq!(cpu.step_count(), 3);
        assert_eq!(canonical(&cpu.save_to_bytes().unwrap()), canonical(&from_gpu), "{setup:?}: GPU -> CPU");

        // Both continue from the same state with the same gradients.
        let grads = values(&mut rng);
        cpu.step(&mut slices_mut(&mut cpu_params), &slices(&host(&grads, dtype))).unwrap();
        let gpu_grads: Vec<Tensor> = grads.iter().map(|g| ctx.upload("grad", g, dtype)).collect();
        gpu.step(&gpu_grads).unwrap();
        if dtype == DType::F32 && setup.state_dtype.is_none() {
            for (i, (cpu_param, gpu_param)) in cpu_params.iter().zip(&gpu_params).enumerate() {
                let what = format!("{setup:?}: param {i} after a step on each backend");
                assert_close(&what, &cpu_param.to_f64(), &ctx.read(gpu_param).unwrap(), Tolerance::F32);
            }
        }

        // And back: the CPU's checkpoint on a fresh GPU optimizer.
        let from_cpu = cpu.save_to_bytes().unwrap();
        let mut back = setup.gpu(&ctx, &gpu_params);
        back.load_from_bytes(&from_cpu).unwrap_or_else(|e| panic!("{setup:?}: {e}"));
        assert_eq!(back.step_count(), 4);
        assert_eq!(canonical(&back.save_to_bytes().unwrap()), canonical(&from_cpu), "{setup:?}: CPU -> GPU");
    }
}

/// Asserts that every tensor of a checkpoint but the step scalars (states, Kahan
/// compensations, masters) has its parameter's shape from [`SHAPES`].
#[track_caller]
fn assert_every_tensor_shaped(what: &str, bytes: &[u8]) {
    let file = safetensors::SafeTensors::deserialize(bytes).unwrap();
    let mut checked = 0;
    for (name, view) in file.tensors() {
        let parts: Vec<&str> = name.split('.').collect();
        let (i, kind) = match parts[..] {
            ["state", i, kind] => (i, kind),
            ["master", i] => (i, "master"),
            _ => panic!("{what}: unexpected tensor `{name}`"),
        };
        let i: usize = i.parse().unwrap();
        let want: &[usize] = if kind == "step" { &[] } else { SHAPES[i] };
        assert_eq!(view.shape(), want, "{what}: `{name}`");
        checked += usize::from(kind != "step");
    }
    assert!(checked >= SHAPES.len(), "{what}: no state tensors");
}

/// Loads `bytes` into `optimizer`, expects a refusal, and checks that nothing changed.
fn assert_refused(optimizer: &mut CpuOptimizer, bytes: &[u8], what: &str) -> Error {
    let before = canonical(&optimizer.save_to_bytes().unwrap());
    let err = optimizer.load_from_bytes(bytes).expect_err(what);
    assert!(
        canonical(&optimizer.save_to_bytes().unwrap()) == before,
        "{what}: a refused load changed the optimizer"
    );
    err
}

#[test]
fn mismatched_files_are_refused_by_the_cpu_backend_and_change_nothing() {
    let ctx = ctx();
    let adam: Algorithm = Adam::default().into();
    let lens = lens();
    // GPU optimizers over parameters of `lens`, stepped once, with the CPU target's shapes.
    let gpu = |groups: Vec<ParamGroup>, options: OptimizerBuilder, dtype: DType| {
        let grads: Vec<Tensor> = lens.iter().map(|&n| ctx.upload("g", &vec![0.1; n], dtype)).collect();
        let mut optimizer = options.build_groups(&ctx, groups).unwrap();
        optimizer.step(&grads).unwrap();
        optimizer.save_to_bytes().unwrap()
    };
    let params = |dtype: DType| -> Vec<Tensor> {
        lens.iter().map(|&n| ctx.upload("p", &vec![0.5; n], dtype)).collect()
    };
    let shaped =
        |shapes: &[&[usize]]| Optimizer::builder().param_shapes(shapes.iter().map(|s| s.to_vec()).collect());
    let one = |algorithm: Algorithm, dtype: DType, options: OptimizerBuilder| {
        gpu(vec![ParamGroup::new(algorithm, &params(dtype))], options, dtype)
    };
    let p = params(DType::F32);
    let cases = [
        (
            "another algorithm",
            one(Sgd { momentum: 0.9, ..Sgd::default() }.into(), DType::F32, shaped(&SHAPES)),
        ),
        ("AMSGrad state", one(Adam { amsgrad: true, ..Adam::default() }.into(), DType::F32, shaped(&SHAPES))),
        ("another dtype", one(adam, DType::F16, shaped(&SHAPES))),
        ("another shape", one(adam, DType::F32, shaped(&[&[5, 8], &[5], &[3, 4, 2]]))),
        ("another rounding", one(adam, DType::BF16, shaped(&SHAPES).rounding(Rounding::Kahan))),
        (
            "two groups",
            gpu(
                vec![ParamGroup::new(adam, &p[..1]), ParamGroup::new(adam, &p[1..])],
                shaped(&SHAPES),
                DType::F32,
            ),
        ),
        (
            "master weights",
            gpu(
                vec![ParamGroup::new(adam, &p)],
                shaped(&SHAPES)
                    .model_copies(lens.iter().map(|&n| ctx.zeros("copy", n as u64, DType::BF16)).collect()),
                DType::F32,
            ),
        ),
    ];
    let mut rng = Rng::new(13);
    let mut target_params = host(&values(&mut rng), DType::F32);
    let mut target = Setup::f32(adam).cpu(&target_params);
    cpu_steps(&mut target, &mut target_params, &mut rng, DType::F32, 2);
    for (what, bytes) in &cases {
        let err = assert_refused(&mut target, bytes, what);
        assert!(matches!(err, Error::BadFile { .. }), "{what}: {err}");
    }
    assert_every_tensor_shaped("master weights", &cases[6].1);
    let err = assert_refused(&mut target, &cases[6].1, "master weights");
    assert!(err.to_string().contains("`master.0` is none of the optimizer's"), "{err}");
    // The wrong shape is named with both shapes.
    let err = assert_refused(&mut target, &cases[3].1, "another shape");
    assert!(err.to_string().contains("[5, 8]") && err.to_string().contains("[8, 5]"), "{err}");

    // Truncated and corrupt files.
    let good = target.save_to_bytes().unwrap();
    for cut in (0..good.len()).step_by(11).chain([good.len() - 1]) {
        let err = assert_refused(&mut target, &good[..cut], &format!("cut at {cut}"));
        assert!(matches!(err, Error::BadFile { .. }), "{err}");
    }
    let header = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize + 8;
    for k in 0..200 {
        let mut bad = good.clone();
        // Flips in the header and metadata: tensor data with a flipped bit is a valid file.
        let at = (rng.next_u64() % header as u64) as usize;
        bad[at] ^= 1 << (k % 8);
        let before = canonical(&good);
        match target.load_from_bytes(&bad) {
            Err(err) => {
                assert!(matches!(err, Error::BadFile { .. }), "{err}");
                assert!(
                    canonical(&target.save_to_bytes().unwrap()) == before,
                    "flip at {at} changed the optimizer"
                );
            }
            Ok(()) => target.load_from_bytes(&good).unwrap(),
        }
    }
}

/// Saves `optimizer` three times and asserts the bytes are the same each time.
#[track_caller]
fn saved_once(what: &str, save: impl Fn() -> Vec<u8>) -> Vec<u8> {
    let first = save();
    for _ in 0..2 {
        assert!(save() == first, "{what}: two saves of one optimizer gave different bytes");
    }
    first
}

#[test]
fn the_same_state_saves_to_the_same_bytes_on_either_backend() {
    let ctx = ctx();
    for setup in setups() {
        let mut rng = Rng::new(14);
        let initial = values(&mut rng);
        let dtype = setup.param_dtype;
        let gpu_params: Vec<Tensor> = initial.iter().map(|v| ctx.upload("param", v, dtype)).collect();
        let mut gpu = setup.gpu(&ctx, &gpu_params);
        for _ in 0..2 {
            let grads: Vec<Tensor> = values(&mut rng).iter().map(|g| ctx.upload("grad", g, dtype)).collect();
            gpu.step(&grads).unwrap();
        }
        let from_gpu = saved_once(&format!("{setup:?} on the GPU"), || gpu.save_to_bytes().unwrap());

        let mut cpu = setup.cpu(&host(&initial, dtype));
        cpu.load_from_bytes(&from_gpu).unwrap();
        let from_cpu = saved_once(&format!("{setup:?} on the CPU"), || cpu.save_to_bytes().unwrap());
        assert!(from_cpu == from_gpu, "{setup:?}: the CPU saves the GPU's state in other bytes");

        // Save, load, save on the GPU: a fresh optimizer given the file saves it back.
        let mut back = setup.gpu(&ctx, &gpu_params);
        back.load_from_bytes(&from_cpu).unwrap();
        assert!(back.save_to_bytes().unwrap() == from_gpu, "{setup:?}: save, load, save changed the bytes");

        // And a CPU optimizer's own steps.
        let mut params = host(&initial, dtype);
        let mut stepped = setup.cpu(&params);
        cpu_steps(&mut stepped, &mut params, &mut rng, dtype, 2);
        let own = saved_once(&format!("{setup:?} stepped on the CPU"), || stepped.save_to_bytes().unwrap());
        let mut reloaded = setup.cpu(&params);
        reloaded.load_from_bytes(&own).unwrap();
        assert!(
            reloaded.save_to_bytes().unwrap() == own,
            "{setup:?}: CPU save, load, save changed the bytes"
        );
    }
}

#[test]
fn a_flipped_bit_in_a_state_tensor_is_refused_by_both_backends_and_changes_nothing() {
    let ctx = ctx();
    let setup = Setup::f32(Adam { lr: 1e-2, amsgrad: true, ..Adam::default() });
    let mut rng = Rng::new(15);
    let initial = values(&mut rng);
    let mut params = host(&initial, DType::F32);
    let mut cpu = setup.cpu(&params);
    cpu_steps(&mut cpu, &mut params, &mut rng, DType::F32, 2);
    let good = cpu.save_to_bytes().unwrap();
    cpu_steps(&mut cpu, &mut params, &mut rng, DType::F32, 1);
    let gpu_params: Vec<Tensor> = initial.iter().map(|v| ctx.upload("param", v, DType::F32)).collect();
    let mut gpu = setup.gpu(&ctx, &gpu_params);
    gpu.step(&gpu_params).unwrap();

    let (n, metadata) = safetensors::SafeTensors::read_metadata(&good).unwrap();
    for name in ["state.1.exp_avg_sq", "state.2.max_exp_avg_sq"] {
        let (start, end) = metadata.info(name).unwrap().data_offsets;
        let mut bad = good.clone();
        // The low bit of a mantissa: a value off by one ulp, which nothing else would notice.
        bad[8 + n + (start + end) / 2 / 4 * 4] ^= 1;
        let err = assert_refused(&mut cpu, &bad, name);
        assert!(err.to_string().contains(&format!("the data of `{name}` is corrupt")), "{err}");
        let before = canonical(&gpu.save_to_bytes().unwrap());
        let err = gpu.load_from_bytes(&bad).unwrap_err();
        assert!(matches!(err, Error::BadFile { .. }) && err.to_string().contains(name), "{err}");
        assert!(
            canonical(&gpu.save_to_bytes().unwrap()) == before,
            "{name}: a refused load changed the GPU optimizer"
        );
    }
    // The same file loads on both.
    cpu.load_from_bytes(&good).unwrap();
    gpu.load_from_bytes(&good).unwrap();
    assert!(cpu.save_to_bytes().unwrap() == good && gpu.save_to_bytes().unwrap() == good);
}
