//! Checkpoints: PyTorch's state names and dtypes kept, a save-load-continue run identical
//! bit for bit to an uninterrupted one, atomic writes, and every mismatched, truncated or
//! corrupt file refused with a typed error that leaves the optimizer as it was.

use crate::common;

use common::{ctx, Rng};
use wgpu_optim::{
    Adagrad, Adam, Algorithm, DType, Error, GpuContext, Optimizer, OptimizerBuilder, ParamGroup, Sgd,
    StateStorage, Tensor,
};
use wgpu_optim_testkit::checkpoint::canonical;
use wgpu_optim_testkit::oracle::{Storage, ToOracle};

const SIZES: [usize; 3] = [33, 1, 258];

/// One way to build an optimizer, so a run can be rebuilt from scratch and resumed.
#[derive(Clone)]
struct Setup {
    groups: Vec<(Algorithm, std::ops::Range<usize>)>,
    param_dtype: DType,
    state_dtype: Option<DType>,
    capturable: bool,
    master_weights: bool,
}

impl Setup {
    fn single(algorithm: impl Into<Algorithm>) -> Self {
        Setup {
            groups: vec![(algorithm.into(), 0..SIZES.len())],
            param_dtype: DType::F32,
            state_dtype: None,
            capturable: false,
            master_weights: false,
        }
    }

    /// The parameters (the model's, in master-weight mode) and the optimizer over them.
    fn build(&self, ctx: &GpuContext, initial: &[Vec<f64>]) -> (Vec<Tensor>, Optimizer) {
        let params: Vec<Tensor> = initial.iter().map(|p| ctx.upload("param", p, self.param_dtype)).collect();
        if self.master_weights {
            let optimizer =
                Optimizer::builder().master_weights(true).build(ctx, self.groups[0].0, &params).unwrap();
            return (params, optimizer);
        }
        let groups =
            self.groups.iter().map(|(a, range)| ParamGroup::new(*a, &params[range.clone()])).collect();
        let options = Optimizer::builder()
            .state_storage(self.state_dtype.map_or(StateStorage::ParamDtype, StateStorage::Dtype))
            .capturable(self.capturable);
        (params.clone(), options.build_groups(ctx, groups).unwrap())
    }
}

/// Every byte of the parameters and the optimizer's state.
fn snapshot(ctx: &GpuContext, params: &[Tensor], optimizer: &Optimizer) -> Vec<(String, Vec<u8>)> {
    let mut entries = canonical(&optimizer.save_to_bytes().unwrap());
    for (i, p) in params.iter().enumerate() {
        entries.push((format!("model {i}"), ctx.read_bytes(p).unwrap()));
    }
    entries
}

fn run(ctx: &GpuContext, optimizer: &mut Optimizer, grads: &[Tensor], seed: u64, steps: usize) {
    let mut rng = Rng::new(seed);
    for _ in 0..steps {
        for g in grads {
            ctx.write(g, &rng.vec(g.len as usize, 1.0)).unwrap();
        }
        optimizer.step(grads).unwrap();
    }
}

fn check_resume_is_bit_identical(setup: Setup, name: &str) {
    let ctx = ctx();
    let mut rng = Rng::new(1);
    let initial: Vec<Vec<f64>> = SIZES.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grad_dtype = if setup.master_weights { DType::F32 } else { setup.param_dtype };
    let grads: Vec<Tensor> = SIZES.iter().map(|&n| ctx.zeros("grad", n as u64, grad_dtype)).collect();
    let dir = std::env::temp_dir().join(format!("wgpu-optim-checkpoint-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("optimizer.safetensors");

    // Uninterrupted: 10 steps, the checkpoint taken after 5 along with the model.
    let (params, mut optimizer) = setup.build(&ctx, &initial);
    run(&ctx, &mut optimizer, &grads, 10, 5);
    optimizer.save(&path).unwrap();
    let model: Vec<Vec<u8>> = params.iter().map(|p| ctx.read_bytes(p).unwrap()).collect();
    run(&ctx, &mut optimizer, &grads, 20, 5);
    let uninterrupted = snapshot(&ctx, &params, &optimizer);

    // Interrupted: a fresh optimizer, the model and the checkpoint loaded, 5 more steps.
    let (params, mut resumed) = setup.build(&ctx, &initial);
    for (p, bytes) in params.iter().zip(&model) {
        ctx.write_bytes(p, bytes).unwrap();
    }
    resumed.load(&path).unwrap();
    assert_eq!(resumed.step_count(), 5);
    run(&ctx, &mut resumed, &grads, 20, 5);
    assert!(
        snapshot(&ctx, &params, &resumed) == uninterrupted,
        "{name}: resumed run differs from the uninterrupted one"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn save_load_continue_is_bit_identical_to_an_uninterrupted_run() {
    check_resume_is_bit_identical(Setup::single(Adam { amsgrad: true, ..Adam::adamw() }), "amsgrad");
    check_resume_is_bit_identical(
        Setup::single(Sgd { lr: 0.01, momentum: 0.9, nesterov: true, ..Sgd::default() }),
        "nesterov",
    );
    check_resume_is_bit_identical(Setup::single(Adagrad { lr_decay: 0.01, ..Adagrad::default() }), "adagrad");
    let groups = Setup {
        groups: vec![
            (Adam::adamw().into(), 0..1),
            (Adam { weight_decay: 0.0, ..Adam::adamw() }.into(), 1..3),
        ],
        ..Setup::single(Adam::default())
    };
    check_resume_is_bit_identical(groups, "groups");
    let half =
        Setup { param_dtype: DType::F16, state_dtype: Some(DType::BF16), ..Setup::single(Adam::default()) };
    check_resume_is_bit_identical(half, "f16-bf16");
    let capturable = Setup { capturable: true, ..Setup::single(Adam::default()) };
    check_resume_is_bit_identical(capturable, "capturable");
    let master = Setup { param_dtype: DType::BF16, master_weights: true, ..Setup::single(Adam::adamw()) };
    check_resume_is_bit_identical(master, "master");
}

#[test]
fn tensor_names_and_dtypes_follow_pytorchs_state_dict() {
    let ctx = ctx();
    let params = vec![ctx.upload("p", &[0.5; 10], DType::F16)];
    let options = Optimizer::builder().state_storage(StateStorage::Dtype(DType::F32));
    let mut optimizer = options.build(&ctx, Adam { amsgrad: true, ..Adam::default() }, &params).unwrap();
    optimizer.step(&[ctx.upload("g", &[0.1; 10], DType::F16)]).unwrap();
    let bytes = optimizer.save_to_bytes().unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names = file.names();
    names.sort();
    assert_eq!(names, ["state.0.exp_avg", "state.0.exp_avg_sq", "state.0.max_exp_avg_sq", "state.0.step"]);
    assert_eq!(file.tensor("state.0.exp_avg").unwrap().dtype(), safetensors::Dtype::F32);
    assert_eq!(file.tensor("state.0.step").unwrap().data(), 1.0f32.to_le_bytes());
    let (_, metadata) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let groups = &metadata.metadata().as_ref().unwrap()["param_groups"];
    let groups: serde_json::Value = serde_json::from_str(groups).unwrap();
    assert_eq!(groups[0]["optimizer"], "Adam");
    assert_eq!(groups[0]["betas"], serde_json::json!([0.9, 0.999]));
    assert_eq!(groups[0]["params"], serde_json::json!([0]));
    assert_eq!(groups[0]["amsgrad"], true);
}

/// Asserts that loading `bytes` fails with a typed error and changes nothing.
fn assert_refused(ctx: &GpuContext, optimizer: &mut Optimizer, bytes: &[u8], what: &str) -> Error {
    let before = canonical(&optimizer.save_to_bytes().unwrap());
    let step = optimizer.step_count();
    let err = optimizer.load_from_bytes(bytes).expect_err(what);
    ctx.queue().submit([]);
    assert!(
        canonical(&optimizer.save_to_bytes().unwrap()) == before,
        "{what}: a refused load changed the optimizer"
    );
    assert_eq!(optimizer.step_count(), step, "{what}");
    err
}

#[test]
fn mismatched_files_are_refused_and_change_nothing() {
    let ctx = ctx();
    let make = |algorithm: Algorithm, len: usize, dtype: DType| {
        let params = vec![ctx.upload("p", &vec![0.5; len], dtype)];
        let mut optimizer = Optimizer::builder().build(&ctx, algorithm, &params).unwrap();
        optimizer.step(&[ctx.upload("g", &vec![0.1; len], dtype)]).unwrap();
        optimizer
    };
    let adam: Algorithm = Adam::default().into();
    let mut target = make(adam, 16, DType::F32);
    let cases = [
        ("another algorithm", make(Sgd { momentum: 0.9, ..Sgd::default() }.into(), 16, DType::F32)),
        ("AMSGrad state", make(Adam { amsgrad: true, ..Adam::default() }.into(), 16, DType::F32)),
        ("another length", make(adam, 17, DType::F32)),
        ("another dtype", make(adam, 16, DType::F16)),
    ];
    for (what, other) in cases {
        let err = assert_refused(&ctx, &mut target, &other.save_to_bytes().unwrap(), what);
        assert!(matches!(err, Error::BadFile { .. }), "{what}: {err}");
    }
}

#[test]
fn truncated_and_corrupt_files_are_refused_and_change_nothing() {
    let ctx = ctx();
    let params = vec![ctx.upload("p", &[0.5; 40], DType::F32)];
    let mut optimizer = Optimizer::builder().build(&ctx, Adam::default(), &params).unwrap();
    optimizer.step(&[ctx.upload("g", &[0.1; 40], DType::F32)]).unwrap();
    let good = optimizer.save_to_bytes().unwrap();
    let mut refused = 0;
    for cut in (0..good.len()).step_by(7).chain([good.len() - 1]) {
        assert_refused(&ctx, &mut optimizer, &good[..cut], &format!("cut at {cut}"));
        refused += 1;
    }
    let mut rng = Rng::new(3);
    for k in 0..200 {
        let mut bad = good.clone();
        let at = (rng.next_u64() % good.len() as u64) as usize;
        bad[at] ^= 1 << (k % 8);
        // A flipped bit in the tensor data is still a valid file; everything else must fail
        // or load exactly what it says.
        match optimizer.load_from_bytes(&bad) {
            Err(err) => assert!(matches!(err, Error::BadFile { .. }), "{err}"),
            Ok(()) => {
                optimizer.load_from_bytes(&good).unwrap();
            }
        }
        refused += 1;
    }
    assert!(refused > 200);
}

#[test]
fn saving_is_atomic() {
    let ctx = ctx();
    let params = vec![ctx.upload("p", &[0.5; 8], DType::F32)];
    let mut optimizer = Optimizer::builder().build(&ctx, Adam::default(), &params).unwrap();
    let dir = std::env::temp_dir().join(format!("wgpu-optim-atomic-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("opt.safetensors");
    optimizer.save(&path).unwrap();
    let first = std::fs::read(&path).unwrap();
    optimizer.step(&[ctx.upload("g", &[0.1; 8], DType::F32)]).unwrap();
    // Make the temporary file impossible to create: the save fails, the old file survives.
    let blocker = dir.join(format!("opt.safetensors.tmp-{}", std::process::id()));
    std::fs::create_dir(&blocker).unwrap();
    let err = optimizer.save(&path).unwrap_err();
    assert!(matches!(err, Error::BadFile { .. }), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), first, "a failed save touched the previous checkpoint");
    std::fs::remove_dir(&blocker).unwrap();
    optimizer.save(&path).unwrap();
    assert_ne!(std::fs::read(&path).unwrap(), first);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "no temporary file is left behind");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn loading_in_master_weight_mode_restores_the_models_copies() {
    let ctx = ctx();
    let model = vec![ctx.upload("model", &[0.3, -0.7, 1.1, 0.01, 5.0], DType::BF16)];
    let grads = vec![ctx.upload("g", &[0.1, -0.2, 0.3, 0.4, -0.5], DType::F32)];
    let mut optimizer = Optimizer::builder().master_weights(true).build(&ctx, Adam::adamw(), &model).unwrap();
    for _ in 0..3 {
        optimizer.step(&grads).unwrap();
    }
    let bytes = optimizer.save_to_bytes().unwrap();
    let saved_model = ctx.read_bytes(&model[0]).unwrap();
    // A fresh model (as a restarted trainer would have) and a fresh optimizer.
    let fresh = vec![ctx.upload("model", &[0.0; 5], DType::BF16)];
    let mut resumed = Optimizer::builder().master_weights(true).build(&ctx, Adam::adamw(), &fresh).unwrap();
    resumed.load_from_bytes(&bytes).unwrap();
    assert_eq!(
        ctx.read_bytes(&fresh[0]).unwrap(),
        saved_model,
        "the bf16 copy is the loaded masters rounded"
    );
}

/// A buffer with `usage` holding `values` as `dtype`.
fn buffer_with(ctx: &GpuContext, values: &[f64], dtype: DType, usage: wgpu::BufferUsages) -> Tensor {
    use wgpu::util::DeviceExt;
    let buffer = ctx.device().create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some("model"),
        contents: &dtype.to_oracle().encode(values),
        usage,
    });
    Tensor { buffer: buffer.clone(), offset: 0, len: values.len() as u64, dtype }
}

#[test]
fn a_load_that_cannot_write_every_target_is_refused_before_the_first_write() {
    let ctx = ctx();
    let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC;
    // Master-weight mode over a model whose buffers can be read but not written by copies:
    // the step writes them through a storage binding, but a load could not restore them.
    let model = [
        buffer_with(&ctx, &[0.3, -0.7, 1.1, 0.01], DType::BF16, wgpu_optim::TENSOR_USAGES),
        buffer_with(&ctx, &[0.5, 0.25, -2.0, 4.0], DType::BF16, usage),
    ];
    let grads = [ctx.upload("g", &[0.1, -0.2, 0.3, 0.4], DType::F32), ctx.upload("g", &[0.5; 4], DType::F32)];
    let mut optimizer = Optimizer::builder().master_weights(true).build(&ctx, Adam::adamw(), &model).unwrap();
    optimizer.step(&grads).unwrap();
    let bytes = optimizer.save_to_bytes().unwrap();
    optimizer.step(&grads).unwrap();
    let model_before: Vec<Vec<u8>> = model.iter().map(|m| ctx.read_bytes(m).unwrap()).collect();
    let err = assert_refused(&ctx, &mut optimizer, &bytes, "a model copy without COPY_DST");
    assert!(
        matches!(&err, Error::MissingUsage { argument, needed: "COPY_DST", .. } if argument == "model_copies[1]"),
        "{err}"
    );
    let model_after: Vec<Vec<u8>> = model.iter().map(|m| ctx.read_bytes(m).unwrap()).collect();
    assert_eq!(model_after, model_before, "a refused load changed the model");

    // Given copies whose halves share a word with a neighbour need COPY_SRC to be patched.
    let words =
        buffer_with(&ctx, &[0.0; 6], DType::F16, wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST);
    let masters = [ctx.upload("master", &[0.5, 1.5, -0.5], DType::F32)];
    let options = Optimizer::builder().model_copies(vec![words.slice(1, 3)]);
    let mut optimizer = options.build(&ctx, Adam::default(), &masters).unwrap();
    optimizer.step(&[ctx.upload("g", &[0.1; 3], DType::F32)]).unwrap();
    let bytes = optimizer.save_to_bytes().unwrap();
    optimizer.step(&[ctx.upload("g", &[0.2; 3], DType::F32)]).unwrap();
    let err = assert_refused(&ctx, &mut optimizer, &bytes, "a copy sharing words without COPY_SRC");
    assert!(
        matches!(&err, Error::MissingUsage { argument, needed: "COPY_SRC", .. } if argument == "model_copies[0]"),
        "{err}"
    );
}

#[test]
fn every_kind_of_mismatched_checkpoint_is_refused_and_changes_nothing() {
    let ctx = ctx();
    let params = |n: usize| {
        vec![ctx.upload("p", &vec![0.5; n], DType::F32), ctx.upload("q", &vec![0.5; n], DType::F32)]
    };
    let grads = vec![ctx.upload("g", &[0.1; 8], DType::F32), ctx.upload("h", &[0.2; 8], DType::F32)];
    let build = |groups: Vec<ParamGroup>, options: OptimizerBuilder| {
        let mut optimizer = options.build_groups(&ctx, groups).unwrap();
        optimizer.step(&grads).unwrap();
        optimizer
    };
    let one_group = |p: &[Tensor]| vec![ParamGroup::new(Adam::default(), p)];
    let mut target = build(one_group(&params(8)), Optimizer::builder());
    let p = params(8);
    let two_groups = build(
        vec![ParamGroup::new(Adam::default(), &p[..1]), ParamGroup::new(Adam::default(), &p[1..])],
        Optimizer::builder(),
    );
    let masters = build(
        one_group(&params(8)),
        Optimizer::builder()
            .model_copies(vec![ctx.zeros("c", 8, DType::BF16), ctx.zeros("d", 8, DType::BF16)]),
    );
    let cases = [
        ("two groups into one", two_groups.save_to_bytes().unwrap()),
        ("masters into an optimizer without", masters.save_to_bytes().unwrap()),
    ];
    for (what, bytes) in cases {
        let err = assert_refused(&ctx, &mut target, &bytes, what);
        assert!(matches!(err, Error::BadFile { .. }), "{what}: {err}");
    }
    // A file without masters into master-weight mode.
    let mut with_masters = masters;
    let err = assert_refused(&ctx, &mut with_masters, &target.save_to_bytes().unwrap(), "no masters");
    assert!(err.to_string().contains("master.0"), "{err}");
    // A step beyond the device's u32 counter into capturable mode.
    let mut capturable = build(one_group(&params(8)), Optimizer::builder().capturable(true));
    let mut far = build(one_group(&params(8)), Optimizer::builder());
    far.set_step_count(1 << 33).unwrap();
    let err = assert_refused(&ctx, &mut capturable, &far.save_to_bytes().unwrap(), "a step beyond u32");
    assert!(err.to_string().contains("u32"), "{err}");
}
