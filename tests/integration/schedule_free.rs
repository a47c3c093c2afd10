//! Schedule-Free AdamW on the GPU and the CPU backend against the oracle (the package's
//! `step()`, `eval()` and `train()` in f64), and the refusals that keep it well defined.

use crate::common;

use common::{assert_close, ctx, download, Rng, Tolerance};
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut, HostTensor};
use wgpu_optim::q8::Q8States;
use wgpu_optim::{
    Adam, Algorithm, DType, Error, GpuContext, GradClip, Optimizer, ParamGroup, ScheduleFreeAdamW,
    ScheduleFreeMode, ScheduleFreeScalars, StateKind, StateStorage, Tensor,
};
use wgpu_optim_testkit::oracle::{clip_grad_norm, ScheduleFreeOracle, Storage, ToOracle};

const KINDS: [StateKind; 2] = [StateKind::Z, StateKind::ExpAvgSq];

/// Lengths that cover a lone element, a packed pair's odd tail and a few workgroups.
const LENGTHS: [usize; 3] = [1, 255, 1029];

fn warmup_decay() -> ScheduleFreeAdamW {
    ScheduleFreeAdamW {
        lr: 1e-2,
        weight_decay: 0.05,
        warmup_steps: 3,
        r: 0.5,
        ..ScheduleFreeAdamW::default()
    }
}

/// What a test drives: the GPU optimizer or the CPU backend, through one interface.
trait Backend {
    fn params(&self) -> Vec<Vec<f64>>;
    fn state(&self, i: usize, kind: StateKind) -> Vec<f64>;
    fn scalars(&self, g: usize) -> ScheduleFreeScalars;
    fn step(&mut self, grads: &[Vec<f64>]) -> wgpu_optim::Result<()>;
    fn eval(&mut self) -> wgpu_optim::Result<()>;
    fn train(&mut self) -> wgpu_optim::Result<()>;
    fn mode(&self) -> ScheduleFreeMode;
}

struct Gpu {
    ctx: GpuContext,
    optimizer: Optimizer,
    /// The tensors the oracle's parameters are compared with (the masters in master-weight
    /// mode).
    params: Vec<Tensor>,
    grads: Vec<Tensor>,
}

impl Gpu {
    fn new(
        ctx: &GpuContext,
        groups: &[(ScheduleFreeAdamW, Vec<Vec<f64>>)],
        dtype: DType,
        state: DType,
    ) -> Self {
        Self::with(ctx, groups, dtype, Optimizer::builder().state_storage(StateStorage::Dtype(state)))
    }

    fn with(
        ctx: &GpuContext,
        groups: &[(ScheduleFreeAdamW, Vec<Vec<f64>>)],
        dtype: DType,
        options: wgpu_optim::OptimizerBuilder,
    ) -> Self {
        let tensors: Vec<Vec<Tensor>> = groups
            .iter()
            .map(|(_, values)| values.iter().map(|v| ctx.upload("param", v, dtype)).collect())
            .collect();
        let param_groups: Vec<ParamGroup> =
            groups.iter().zip(&tensors).map(|((c, _), t)| ParamGroup::new(*c, t)).collect();
        let optimizer = options.build_groups(ctx, param_groups).unwrap();
        let params = optimizer.params().to_vec();
        let grads = params.iter().map(|p| ctx.zeros("grad", p.len, DType::F32)).collect();
        Gpu { ctx: ctx.clone(), optimizer, params, grads }
    }
}

impl Backend for Gpu {
    fn params(&self) -> Vec<Vec<f64>> {
        self.params.iter().map(|p| download(&self.ctx, p)).collect()
    }
    fn state(&self, i: usize, kind: StateKind) -> Vec<f64> {
        download(&self.ctx, self.optimizer.state(i, kind).unwrap().and_then(|s| s.dense()).unwrap())
    }
    fn scalars(&self, g: usize) -> ScheduleFreeScalars {
        self.optimizer.schedule_free_scalars(g).unwrap()
    }
    fn step(&mut self, grads: &[Vec<f64>]) -> wgpu_optim::Result<()> {
        for (t, g) in self.grads.iter().zip(grads) {
            self.ctx.write(t, g).unwrap();
        }
        self.optimizer.step(&self.grads)
    }
    fn eval(&mut self) -> wgpu_optim::Result<()> {
        self.optimizer.eval()
    }
    fn train(&mut self) -> wgpu_optim::Result<()> {
        self.optimizer.train()
    }
    fn mode(&self) -> ScheduleFreeMode {
        self.optimizer.mode()
    }
}

struct Cpu {
    optimizer: CpuOptimizer,
    params: Vec<HostTensor>,
}

impl Cpu {
    fn new(config: ScheduleFreeAdamW, values: &[Vec<f64>], dtype: DType, state: DType) -> Self {
        Self::with(config, values, dtype, CpuOptimizer::builder().state_storage(StateStorage::Dtype(state)))
    }

    fn with(
        config: ScheduleFreeAdamW,
        values: &[Vec<f64>],
        dtype: DType,
        options: wgpu_optim::cpu::CpuOptimizerBuilder,
    ) -> Self {
        let params: Vec<HostTensor> =
            values.iter().map(|v| HostTensor::from_f64(dtype, v).unwrap()).collect();
        let slices: Vec<HostSlice<'_>> = params.iter().map(HostTensor::as_slice).collect();
        let optimizer = options.build(config, &slices).unwrap();
        Cpu { optimizer, params }
    }

    fn slices(&mut self) -> Vec<HostSliceMut<'_>> {
        self.params.iter_mut().map(HostTensor::as_mut_slice).collect()
    }
}

impl Backend for Cpu {
    fn params(&self) -> Vec<Vec<f64>> {
        self.params.iter().map(HostTensor::to_f64).collect()
    }
    fn state(&self, i: usize, kind: StateKind) -> Vec<f64> {
        self.optimizer.state(i, kind).and_then(|s| s.dense()).unwrap().to_f64()
    }
    fn scalars(&self, g: usize) -> ScheduleFreeScalars {
        self.optimizer.schedule_free_scalars(g).unwrap()
    }
    fn step(&mut self, grads: &[Vec<f64>]) -> wgpu_optim::Result<()> {
        let grads: Vec<HostTensor> =
            grads.iter().map(|g| HostTensor::from_f64(DType::F32, g).unwrap()).collect();
        let grads: Vec<HostSlice<'_>> = grads.iter().map(HostTensor::as_slice).collect();
        let mut optimizer = self.optimizer.clone();
        let result = optimizer.step(&mut self.slices(), &grads);
        self.optimizer = optimizer;
        result
    }
    fn eval(&mut self) -> wgpu_optim::Result<()> {
        let mut optimizer = self.optimizer.clone();
        let result = optimizer.eval(&mut self.slices());
        self.optimizer = optimizer;
        result
    }
    fn train(&mut self) -> wgpu_optim::Result<()> {
        let mut optimizer = self.optimizer.clone();
        let result = optimizer.train(&mut self.slices());
        self.optimizer = optimizer;
        result
    }
    fn mode(&self) -> ScheduleFreeMode {
        self.optimizer.mode()
    }
}

/// The oracle of group `g` resumed from what `backend` holds now.
fn resume(
    backend: &dyn Backend,
    config: ScheduleFreeAdamW,
    first: usize,
    count: usize,
    g: usize,
) -> ScheduleFreeOracle {
    let scalars = backend.scalars(g);
    let mut oracle = ScheduleFreeOracle::new(config.to_oracle(), count);
    oracle.k = scalars.k;
    oracle.weight_sum = scalars.weight_sum;
    oracle.lr_max = scalars.lr_max;
    oracle.train_mode = backend.mode() == ScheduleFreeMode::Train;
    if scalars.k > 0 {
        oracle.z = (first..first + count).map(|i| backend.state(i, StateKind::Z)).collect();
        oracle.exp_avg_sq = (first..first + count).map(|i| backend.state(i, StateKind::ExpAvgSq)).collect();
    }
    oracle
}

#[track_caller]
fn assert_scalars(what: &str, got: ScheduleFreeScalars, want: &ScheduleFreeOracle) {
    assert_eq!(got.k, want.k, "{what}: k");
    assert_close(&format!("{what}: weight_sum"), &[got.weight_sum], &[want.weight_sum], Tolerance::F64);
    assert_close(&format!("{what}: lr_max"), &[got.lr_max], &[want.lr_max], Tolerance::F64);
}

/// A run of [`check_step_by_step`]: each group's config and tensor count, the tensors'
/// lengths, the parameter and state dtypes, the clipping, the steps and the data's seed.
#[derive(Clone, Copy)]
struct Plan<'a> {
    configs: &'a [(ScheduleFreeAdamW, usize)],
    lengths: &'a [usize],
    dtypes: (DType, DType),
    clip: Option<GradClip>,
    steps: usize,
    seed: u64,
}

/// Steps `backend` (one group per config) `steps` times, each step checked against the
/// oracle resumed from the values the backend stored before it, then `eval()` and `train()`
/// checked the same way. `param`/`state` are the storage dtypes the oracle rounds to.
fn check_step_by_step(what: &str, backend: &mut dyn Backend, plan: &Plan<'_>) {
    let Plan { configs, lengths, dtypes: (param, state), clip, steps, seed } = *plan;
    let mut rng = Rng::new(seed);
    let check =
        |what: &str, backend: &dyn Backend, oracles: &[ScheduleFreeOracle], want_params: &[Vec<f64>]| {
            let got = backend.params();
            let mut i = 0;
            for (g, oracle) in oracles.iter().enumerate() {
                assert_scalars(&format!("{what} group {g}"), backend.scalars(g), oracle);
                for k in 0..oracle.z.len() {
                    let at = format!("{what} group {g} tensor {i}");
                    assert_close(&format!("{at} param"), &got[i], &want_params[i], Tolerance::stored(param));
                    assert_close(
                        &format!("{at} z"),
                        &backend.state(i, StateKind::Z),
                        &oracle.z[k],
                        Tolerance::stored(state),
                    );
                    let v = backend.state(i, StateKind::ExpAvgSq);
                    assert_close(
                        &format!("{at} exp_avg_sq"),
                        &v,
                        &oracle.exp_avg_sq[k],
                        Tolerance::stored(state),
                    );
                    i += 1;
                }
            }
        };
    let resume_all = |backend: &dyn Backend| -> Vec<ScheduleFreeOracle> {
        let mut first = 0;
        configs
            .iter()
            .enumerate()
            .map(|(g, (c, count))| {
                let o = resume(backend, *c, first, *count, g).storing(param.to_oracle(), state.to_oracle());
                first += count;
                o
            })
            .collect()
    };
    for t in 1..=steps {
        let grads: Vec<Vec<f64>> = lengths.iter().map(|&n| rng.vec(n, 1.0)).collect();
        let mut oracles = resume_all(backend);
        let mut params = backend.params();
        let mut clipped = grads.clone();
        if let Some(clip) = &clip {
            clip_grad_norm(&mut clipped, &clip.to_oracle());
        }
        backend.step(&grads).unwrap();
        let mut first = 0;
        for oracle in &mut oracles {
            let count = oracle.z.len();
            oracle.step(&mut params[first..first + count], &clipped[first..first + count]);
            first += count;
        }
        check(&format!("{what} step {t}"), backend, &oracles, &params);
    }
    for (name, to_eval) in [("eval", true), ("train", false)] {
        let mut oracles = resume_all(backend);
        let mut params = backend.params();
        let mut first = 0;
        for oracle in &mut oracles {
            let count = oracle.z.len();
            if to_eval {
                oracle.eval(&mut params[first..first + count]);
            } else {
                oracle.train(&mut params[first..first + count]);
            }
            first += count;
        }
        if to_eval {
            backend.eval().unwrap();
            assert_eq!(backend.mode(), ScheduleFreeMode::Eval);
        } else {
            backend.train().unwrap();
            assert_eq!(backend.mode(), ScheduleFreeMode::Train);
        }
        check(&format!("{what} {name}"), backend, &oracles, &params);
    }
}

fn initial(rng: &mut Rng, lengths: &[usize]) -> Vec<Vec<f64>> {
    lengths.iter().map(|&n| rng.vec(n, 1.0)).collect()
}

#[test]
fn f32_trajectory_eval_and_train_match_the_oracle_on_gpu_and_cpu() {
    let config = warmup_decay();
    let mut rng = Rng::new(1);
    let start = initial(&mut rng, &LENGTHS);
    let grads: Vec<Vec<Vec<f64>>> = (0..8).map(|_| initial(&mut rng, &LENGTHS)).collect();
    // The oracle from the start, never resumed: the whole trajectory within f32's tolerance.
    let mut oracle = ScheduleFreeOracle::new(config.to_oracle(), LENGTHS.len());
    let mut y = start.clone();
    for g in &grads {
        oracle.step(&mut y, g);
    }
    let mut x = y.clone();
    oracle.eval(&mut x);
    let mut back = x.clone();
    oracle.train(&mut back);
    let gpu = Gpu::new(&ctx(), &[(config, start.clone())], DType::F32, DType::F32);
    let cpu = Cpu::new(config, &start, DType::F32, DType::F32);
    let backends: [(&str, Box<dyn Backend>); 2] = [("gpu", Box::new(gpu)), ("cpu", Box::new(cpu))];
    for (name, mut backend) in backends {
        for g in &grads {
            backend.step(g).unwrap();
        }
        assert_scalars(name, backend.scalars(0), &oracle);
        for (i, y) in y.iter().enumerate() {
            assert_close(&format!("{name} y[{i}]"), &backend.params()[i], y, Tolerance::F32);
            assert_close(
                &format!("{name} z[{i}]"),
                &backend.state(i, StateKind::Z),
                &oracle.z[i],
                Tolerance::F32,
            );
            let v = backend.state(i, StateKind::ExpAvgSq);
            assert_close(&format!("{name} exp_avg_sq[{i}]"), &v, &oracle.exp_avg_sq[i], Tolerance::F32);
        }
        backend.eval().unwrap();
        for (i, x) in x.iter().enumerate() {
            assert_close(&format!("{name} x[{i}]"), &backend.params()[i], x, Tolerance::F32);
        }
        // eval() twice is a no-op, as the package's.
        backend.eval().unwrap();
        for (i, x) in x.iter().enumerate() {
            assert_close(
                &format!("{name} x[{i}] after a second eval"),
                &backend.params()[i],
                x,
                Tolerance::F32,
            );
        }
        backend.train().unwrap();
        for i in 0..LENGTHS.len() {
            assert_close(
                &format!("{name} y[{i}] after train"),
                &backend.params()[i],
                &back[i],
                Tolerance::F32,
            );
            assert_close(&format!("{name} y[{i}] round trip"), &backend.params()[i], &y[i], Tolerance::F32);
        }
    }
}

#[test]
fn sixteen_bit_params_and_state_match_the_oracle_step_by_step() {
    let mut rng = Rng::new(2);
    let config = warmup_decay();
    let mixes = [
        (DType::F16, DType::F16),
        (DType::BF16, DType::BF16),
        (DType::BF16, DType::F32),
        (DType::F32, DType::BF16),
        (DType::F16, DType::F32),
    ];
    for (param, state) in mixes {
        let start = initial(&mut rng, &LENGTHS);
        for packed in [false, true] {
            let ctx = ctx().with_packed_f16(packed);
            let what = format!("gpu {param:?}/{state:?} packed {packed}");
            let mut gpu = Gpu::new(&ctx, &[(config, start.clone())], param, state);
            check_step_by_step(
                &what,
                &mut gpu,
                &Plan {
                    configs: &[(config, 3)],
                    lengths: &LENGTHS,
                    dtypes: (param, state),
                    clip: None,
                    steps: 4,
                    seed: 3,
                },
            );
        }
        let mut cpu = Cpu::new(config, &start, param, state);
        let what = format!("cpu {param:?}/{state:?}");
        check_step_by_step(
            &what,
            &mut cpu,
            &Plan {
                configs: &[(config, 3)],
                lengths: &LENGTHS,
                dtypes: (param, state),
                clip: None,
                steps: 4,
                seed: 3,
            },
        );
    }
}

#[test]
fn two_groups_keep_their_own_rates_and_running_values() {
    let mut rng = Rng::new(4);
    let first = ScheduleFreeAdamW { lr: 2e-2, warmup_steps: 2, ..ScheduleFreeAdamW::default() };
    let second = ScheduleFreeAdamW {
        lr: 5e-3,
        beta1: 0.8,
        beta2: 0.99,
        weight_decay: 0.1,
        weight_lr_power: 1.0,
        ..ScheduleFreeAdamW::default()
    };
    let start = initial(&mut rng, &LENGTHS);
    let groups = [(first, start[..1].to_vec()), (second, start[1..].to_vec())];
    let mut gpu = Gpu::new(&ctx(), &groups, DType::F32, DType::F32);
    check_step_by_step(
        "two groups",
        &mut gpu,
        &Plan {
            configs: &[(first, 1), (second, 2)],
            lengths: &LENGTHS,
            dtypes: (DType::F32, DType::F32),
            clip: None,
            steps: 4,
            seed: 5,
        },
    );
    assert_ne!(gpu.scalars(0).weight_sum, gpu.scalars(1).weight_sum);
}

#[test]
fn clipping_scales_the_gradients_before_the_step_on_gpu_and_cpu() {
    let mut rng = Rng::new(6);
    let config = warmup_decay();
    let start = initial(&mut rng, &LENGTHS);
    let clip = GradClip::l2(0.5);
    let options = Optimizer::builder().grad_clip(clip);
    let mut gpu = Gpu::with(&ctx(), &[(config, start.clone())], DType::F32, options);
    let mixed = (DType::F32, DType::F32);
    check_step_by_step(
        "gpu clipped",
        &mut gpu,
        &Plan {
            configs: &[(config, 3)],
            lengths: &LENGTHS,
            dtypes: mixed,
            clip: Some(clip),
            steps: 3,
            seed: 7,
        },
    );
    let mut cpu = Cpu::with(config, &start, DType::F32, CpuOptimizer::builder().grad_clip(clip));
    check_step_by_step(
        "cpu clipped",
        &mut cpu,
        &Plan {
            configs: &[(config, 3)],
            lengths: &LENGTHS,
            dtypes: mixed,
            clip: Some(clip),
            steps: 3,
            seed: 7,
        },
    );
}

#[test]
fn master_weights_step_and_swap_the_f32_masters_and_write_the_model_copies() {
    let mut rng = Rng::new(8);
    let config = warmup_decay();
    for dtype in [DType::F16, DType::BF16] {
        let ctx = ctx();
        let start: Vec<Vec<f64>> = initial(&mut rng, &LENGTHS)
            .into_iter()
            .map(|v| v.into_iter().map(|x| dtype.to_oracle().round(x)).collect())
            .collect();
        let options = Optimizer::builder().master_weights(true);
        let mut gpu = Gpu::with(&ctx, &[(config, start.clone())], dtype, options);
        let models = gpu.optimizer.model_copies().to_vec();
        let rounded = |values: &[Vec<f64>]| -> Vec<Vec<f64>> {
            values.iter().map(|v| v.iter().map(|x| dtype.to_oracle().round(*x)).collect()).collect()
        };
        let mut oracle = ScheduleFreeOracle::new(config.to_oracle(), LENGTHS.len());
        let mut y = start.clone();
        for _ in 0..4 {
            let g = initial(&mut rng, &LENGTHS);
            oracle.step(&mut y, &g);
            gpu.step(&g).unwrap();
        }
        let mut x = y.clone();
        oracle.eval(&mut x);
        for (phase, want) in [("step", &y), ("eval", &x), ("train", &y)] {
            match phase {
                "eval" => gpu.eval().unwrap(),
                "train" => gpu.train().unwrap(),
                _ => {}
            }
            let masters = gpu.params();
            for i in 0..LENGTHS.len() {
                let what = format!("{dtype:?} {phase} tensor {i}");
                assert_close(&format!("{what} master"), &masters[i], &want[i], Tolerance::F32);
                let copy = download(&ctx, &models[i]);
                assert_close(
                    &format!("{what} model copy"),
                    &copy,
                    &rounded(&masters)[i],
                    Tolerance::exact(dtype),
                );
            }
        }
    }
}

#[test]
fn a_step_in_eval_mode_is_refused_and_changes_nothing() {
    let mut rng = Rng::new(9);
    let config = warmup_decay();
    let start = initial(&mut rng, &LENGTHS);
    let gpu = Gpu::new(&ctx(), &[(config, start.clone())], DType::F32, DType::F32);
    let cpu = Cpu::new(config, &start, DType::F32, DType::F32);
    let backends: [(&str, Box<dyn Backend>); 2] = [("gpu", Box::new(gpu)), ("cpu", Box::new(cpu))];
    for (name, mut backend) in backends {
        let g = initial(&mut rng, &LENGTHS);
        backend.step(&g).unwrap();
        backend.eval().unwrap();
        let before =
            (backend.params(), backend.state(1, StateKind::Z), backend.state(1, StateKind::ExpAvgSq));
        let scalars = backend.scalars(0);
        let refused = backend.step(&g).unwrap_err();
        assert!(matches!(refused, Error::EvalMode { call: "step" }), "{name}: {refused:?}");
        assert!(refused.to_string().contains("train()"), "{name}: {refused}");
        let after = (backend.params(), backend.state(1, StateKind::Z), backend.state(1, StateKind::ExpAvgSq));
        assert_eq!(before, after, "{name}: a refused step changed a tensor");
        assert_eq!(backend.scalars(0), scalars, "{name}: a refused step changed the group's values");
        assert_eq!(backend.mode(), ScheduleFreeMode::Eval);
        backend.train().unwrap();
        backend.step(&g).unwrap();
        assert_eq!(backend.scalars(0).k, 2, "{name}");
    }
}

#[test]
fn eval_before_the_first_step_and_on_other_algorithms_changes_nothing() {
    let ctx = ctx();
    let values = vec![0.25, -0.5, 1.0];
    // Before the first step z is y (the package has no state yet): eval leaves y.
    let mut gpu = Gpu::new(&ctx, &[(warmup_decay(), vec![values.clone()])], DType::F32, DType::F32);
    gpu.eval().unwrap();
    assert_eq!(gpu.mode(), ScheduleFreeMode::Eval);
    assert_eq!(gpu.params()[0], values);
    let mut cpu = Cpu::new(warmup_decay(), std::slice::from_ref(&values), DType::F32, DType::F32);
    cpu.eval().unwrap();
    assert_eq!(cpu.params()[0], values);
    // Another algorithm: no-ops, and the optimizer stays in train mode.
    let param = ctx.upload("param", &values, DType::F32);
    let mut adam = Optimizer::builder().build(&ctx, Adam::default(), std::slice::from_ref(&param)).unwrap();
    adam.eval().unwrap();
    assert_eq!(adam.mode(), ScheduleFreeMode::Train);
    assert_eq!(download(&ctx, &param), values);
    assert_eq!(adam.schedule_free_scalars(0), None);
}

#[test]
fn bad_hyperparameters_are_refused_by_name() {
    let base = ScheduleFreeAdamW::default();
    let cases: [(ScheduleFreeAdamW, &str); 8] = [
        (ScheduleFreeAdamW { lr: -1.0, ..base }, "lr"),
        (ScheduleFreeAdamW { lr: f64::NAN, ..base }, "lr"),
        (ScheduleFreeAdamW { beta1: 1.0, ..base }, "beta1"),
        (ScheduleFreeAdamW { beta2: -0.1, ..base }, "beta2"),
        (ScheduleFreeAdamW { eps: -1e-8, ..base }, "eps"),
        (ScheduleFreeAdamW { weight_decay: -0.1, ..base }, "weight_decay"),
        (ScheduleFreeAdamW { r: -1.0, ..base }, "r"),
        (ScheduleFreeAdamW { weight_lr_power: f64::INFINITY, ..base }, "weight_lr_power"),
    ];
    let ctx = ctx();
    let param = ctx.upload("param", &[0.5; 4], DType::F32);
    for (config, name) in cases {
        match Algorithm::from(config).validate() {
            Err(Error::BadHyperparameter { name: got, .. }) => assert_eq!(got, name),
            other => panic!("{config:?}: {other:?}"),
        }
        let built = Optimizer::builder().build(&ctx, config, std::slice::from_ref(&param));
        assert!(matches!(built, Err(Error::BadHyperparameter { .. })), "{name}");
        let values = [0.5f32; 4];
        let built = CpuOptimizer::builder().build(config, &[HostSlice::from(&values[..])]);
        assert!(matches!(built, Err(Error::BadHyperparameter { .. })), "{name}");
    }
    assert_eq!(download(&ctx, &param), vec![0.5; 4]);
    // beta1 = 0 steps (y is z then) but has no average to evaluate: eval() is refused.
    let no_average = ScheduleFreeAdamW { beta1: 0.0, ..base };
    let mut gpu = Gpu::new(&ctx, &[(no_average, vec![vec![0.5; 4]])], DType::F32, DType::F32);
    let mut cpu = Cpu::new(no_average, &[vec![0.5; 4]], DType::F32, DType::F32);
    let backends: [&mut dyn Backend; 2] = [&mut gpu, &mut cpu];
    for backend in backends {
        backend.step(&[vec![0.1; 4]]).unwrap();
        let y = backend.params();
        assert!(matches!(backend.eval(), Err(Error::BadHyperparameter { name: "beta1", .. })));
        assert_eq!((backend.params(), backend.mode()), (y, ScheduleFreeMode::Train));
    }
    assert!(Algorithm::from(base).validate().is_ok());
    assert_eq!(Algorithm::from(base).name(), "AdamWScheduleFree");
    assert_eq!(Algorithm::from(base).state_kinds(), &KINDS);
}

#[test]
fn capturable_mode_and_8_bit_state_are_refused_by_name() {
    let ctx = ctx();
    let param = ctx.upload("param", &[0.5; 4096], DType::F32);
    let config = ScheduleFreeAdamW::default();
    let capturable = Optimizer::builder().capturable(true).build(&ctx, config, std::slice::from_ref(&param));
    match capturable {
        Err(Error::ConflictingOptions { first: "capturable", second: "algorithm", reason }) => {
            assert!(reason.contains("Schedule-Free"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    let q8 = Optimizer::builder().state_storage(StateStorage::Q8(Q8States::default())).build(
        &ctx,
        config,
        std::slice::from_ref(&param),
    );
    match q8 {
        Err(Error::ConflictingOptions { first: "state_storage", second: "algorithm", reason }) => {
            assert!(reason.contains("Schedule-Free"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    let values = vec![0.5f32; 4096];
    let cpu = CpuOptimizer::builder()
        .state_storage(StateStorage::Q8(Q8States::default()))
        .build(config, &[HostSlice::from(&values[..])]);
    assert!(matches!(cpu, Err(Error::ConflictingOptions { first: "state_storage", .. })), "{cpu:?}");
}

#[test]
fn checkpoints_carry_the_state_group_values_and_mode_from_gpu_to_cpu() {
    let mut rng = Rng::new(11);
    let config = warmup_decay();
    let ctx = ctx();
    let start = initial(&mut rng, &LENGTHS);
    let mut gpu = Gpu::new(&ctx, &[(config, start.clone())], DType::F32, DType::F32);
    for _ in 0..3 {
        gpu.step(&initial(&mut rng, &LENGTHS)).unwrap();
    }
    for mode in [ScheduleFreeMode::Train, ScheduleFreeMode::Eval] {
        if mode == ScheduleFreeMode::Eval {
            gpu.eval().unwrap();
        }
        let bytes = gpu.optimizer.save_to_bytes().unwrap();
        let checkpoint = wgpu_optim::Checkpoint::parse(&bytes).unwrap();
        assert_eq!(checkpoint.groups[0].0, Algorithm::from(config), "the hyperparameters in param_groups");
        assert_eq!(checkpoint.schedule_free(), vec![Some(gpu.scalars(0))]);
        assert_eq!(checkpoint.mode, mode);
        // The CPU backend over the parameters the GPU holds (y, or x in eval mode).
        let mut cpu = Cpu::new(config, &gpu.params(), DType::F32, DType::F32);
        cpu.optimizer.load_from_bytes(&bytes).unwrap();
        assert_eq!(cpu.mode(), mode);
        assert_eq!(cpu.scalars(0), gpu.scalars(0));
        for i in 0..LENGTHS.len() {
            for kind in KINDS {
                assert_eq!(cpu.state(i, kind), gpu.state(i, kind), "{mode:?} {kind:?}[{i}]");
            }
        }
        if mode == ScheduleFreeMode::Eval {
            assert!(matches!(cpu.step(&initial(&mut rng, &LENGTHS)), Err(Error::EvalMode { .. })));
            cpu.train().unwrap();
            gpu.train().unwrap();
            for i in 0..LENGTHS.len() {
                assert_close(
                    &format!("y[{i}] after train"),
                    &cpu.params()[i],
                    &gpu.params()[i],
                    Tolerance::F32,
                );
            }
        }
        // One more step on each continues the same trajectory.
        let g = initial(&mut rng, &LENGTHS);
        gpu.step(&g).unwrap();
        cpu.step(&g).unwrap();
        assert_eq!(cpu.scalars(0), gpu.scalars(0));
        for i in 0..LENGTHS.len() {
            assert_close(
                &format!("{mode:?} y[{i}] after a step"),
                &cpu.params()[i],
                &gpu.params()[i],
                Tolerance::F32,
            );
            let z = cpu.state(i, StateKind::Z);
            assert_close(
                &format!("{mode:?} z[{i}] after a step"),
                &z,
                &gpu.state(i, StateKind::Z),
                Tolerance::F32,
            );
        }
        // Back the other way: the CPU's checkpoint loads into the GPU optimizer.
        let bytes = cpu.optimizer.save_to_bytes().unwrap();
        gpu.optimizer.load_from_bytes(&bytes).unwrap();
        assert_eq!(gpu.scalars(0), cpu.scalars(0));
        assert_eq!(gpu.mode(), ScheduleFreeMode::Train);
    }
}

#[test]
fn a_checkpoint_of_another_algorithm_is_refused_and_changes_nothing() {
    let mut rng = Rng::new(12);
    let ctx = ctx();
    let start = initial(&mut rng, &LENGTHS);
    let mut gpu = Gpu::new(&ctx, &[(warmup_decay(), start.clone())], DType::F32, DType::F32);
    gpu.step(&initial(&mut rng, &LENGTHS)).unwrap();
    let adam_params: Vec<Tensor> = start.iter().map(|v| ctx.upload("adam", v, DType::F32)).collect();
    let adam = Optimizer::builder().build(&ctx, Adam::adamw(), &adam_params).unwrap();
    let bytes = adam.save_to_bytes().unwrap();
    let before = (gpu.scalars(0), gpu.state(1, StateKind::Z), gpu.state(1, StateKind::ExpAvgSq));
    let refused = gpu.optimizer.load_from_bytes(&bytes).unwrap_err();
    assert!(matches!(&refused, Error::BadFile { problem, .. } if problem.contains("AdamW")), "{refused}");
    assert_eq!(before, (gpu.scalars(0), gpu.state(1, StateKind::Z), gpu.state(1, StateKind::ExpAvgSq)));
    let mut cpu = Cpu::new(warmup_decay(), &start, DType::F32, DType::F32);
    let refused = cpu.optimizer.load_from_bytes(&bytes).unwrap_err();
    assert!(matches!(refused, Error::BadFile { .. }), "{refused}");
    assert_eq!(cpu.scalars(0), ScheduleFreeScalars::default());
    // And the other way: a schedule-free checkpoint does not load into Adam.
    let sf = gpu.optimizer.save_to_bytes().unwrap();
    let mut adam = adam;
    assert!(matches!(adam.load_from_bytes(&sf), Err(Error::BadFile { .. })));
}

#[test]
fn kahan_and_stochastic_rounding_keep_bf16_parameters_near_the_f32_trajectory() {
    use wgpu_optim::Rounding;
    let config = warmup_decay();
    for (rounding, ulps) in [(Rounding::Kahan, 1), (Rounding::Stochastic { seed: 7, state: false }, 4)] {
        let mut rng = Rng::new(13);
        let start: Vec<Vec<f64>> = initial(&mut rng, &LENGTHS)
            .into_iter()
            .map(|v| v.into_iter().map(|x| DType::BF16.to_oracle().round(x)).collect())
            .collect();
        let grads: Vec<Vec<Vec<f64>>> = (0..4).map(|_| initial(&mut rng, &LENGTHS)).collect();
        let mut oracle = ScheduleFreeOracle::new(config.to_oracle(), LENGTHS.len())
            .storing(DType::F32.to_oracle(), DType::F32.to_oracle());
        let mut y = start.clone();
        for g in &grads {
            oracle.step(&mut y, g);
        }
        let mut x = y.clone();
        oracle.eval(&mut x);
        let gpu_options =
            Optimizer::builder().state_storage(StateStorage::Dtype(DType::F32)).rounding(rounding);
        let gpu = Gpu::with(&ctx(), &[(config, start.clone())], DType::BF16, gpu_options);
        let cpu_options =
            CpuOptimizer::builder().state_storage(StateStorage::Dtype(DType::F32)).rounding(rounding);
        let cpu = Cpu::with(config, &start, DType::BF16, cpu_options);
        // Values near 0 come from O(1) values that cancel: their error is an O(1) value's
        // rounding (half a bf16 ulp at 1), not their own ulps.
        let tolerance = Tolerance::Ulps { dtype: DType::BF16, ulps, abs: 1.0 / 512.0 };
        let backends: [(&str, Box<dyn Backend>); 2] = [("gpu", Box::new(gpu)), ("cpu", Box::new(cpu))];
        for (name, mut backend) in backends {
            for g in &grads {
                backend.step(g).unwrap();
            }
            let rounded =
                |v: &[f64]| -> Vec<f64> { v.iter().map(|e| DType::BF16.to_oracle().round(*e)).collect() };
            for (phase, want) in [("step", &y), ("eval", &x), ("train", &y)] {
                match phase {
                    "eval" => backend.eval().unwrap(),
                    "train" => backend.train().unwrap(),
                    _ => {}
                }
                for (i, want) in want.iter().enumerate() {
                    let what = format!("{name} {} {phase} param[{i}]", rounding.name());
                    assert_close(&what, &backend.params()[i], &rounded(want), tolerance);
                }
            }
        }
    }
}

/// `bytes` with its `param_groups` metadata rewritten by `edit` (the tensors, and so their
/// checksums, unchanged).
fn with_param_groups(bytes: &[u8], edit: impl Fn(&mut [serde_json::Value])) -> Vec<u8> {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let meta = header["__metadata__"].as_object_mut().unwrap();
    let mut groups: Vec<serde_json::Value> =
        serde_json::from_str(meta["param_groups"].as_str().unwrap()).unwrap();
    edit(&mut groups);
    meta.insert("param_groups".into(), serde_json::to_string(&groups).unwrap().into());
    let mut header = serde_json::to_vec(&header).unwrap();
    header.resize(header.len().next_multiple_of(8), b' ');
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend(header);
    out.extend(&bytes[8 + n..]);
    out
}

#[test]
fn a_checkpoints_group_values_and_modes_are_checked_by_name() {
    let mut rng = Rng::new(13);
    let ctx = ctx();
    let groups: Vec<(ScheduleFreeAdamW, Vec<Vec<f64>>)> =
        (0..2).map(|_| (warmup_decay(), initial(&mut rng, &LENGTHS[..2]))).collect();
    let mut gpu = Gpu::new(&ctx, &groups, DType::F32, DType::F32);
    gpu.step(&initial(&mut rng, &[1, 255, 1, 255])).unwrap();
    gpu.eval().unwrap();
    let bytes = gpu.optimizer.save_to_bytes().unwrap();
    // The schedulefree package's keys, per group.
    let checkpoint = wgpu_optim::Checkpoint::parse(&bytes).unwrap();
    assert_eq!(checkpoint.mode, ScheduleFreeMode::Eval);
    assert_eq!(checkpoint.schedule_free(), vec![Some(gpu.scalars(0)), Some(gpu.scalars(1))]);
    let same = with_param_groups(&bytes, |g| {
        assert_eq!(g[1]["k"], 1);
        assert_eq!(g[1]["train_mode"], false);
        assert_eq!(g[1]["lr_max"].as_f64(), Some(gpu.scalars(1).lr_max));
        assert_eq!(g[1]["weight_sum"].as_f64(), Some(gpu.scalars(1).weight_sum));
    });
    assert_eq!(same, bytes, "the metadata rewritten unchanged");
    type Edit = fn(&mut [serde_json::Value]);
    let cases: [(Edit, &str); 5] = [
        (|g| drop(g[1].as_object_mut().unwrap().remove("k")), "param_groups[1] has no `k`"),
        (|g| g[0]["k"] = (-1).into(), "param_groups[0].k is not a whole number >= 0"),
        (|g| g[0]["weight_sum"] = "x".into(), "param_groups[0].weight_sum is not a number"),
        (|g| g[0]["train_mode"] = 1.into(), "param_groups[0].train_mode is not true or false"),
        (|g| g[1]["train_mode"] = true.into(), "param_groups[1].train_mode differs from an earlier group's"),
    ];
    let before = (gpu.scalars(1), gpu.state(1, StateKind::Z));
    for (edit, want) in cases {
        let edited = with_param_groups(&bytes, edit);
        for refused in
            [wgpu_optim::Checkpoint::parse(&edited).err(), gpu.optimizer.load_from_bytes(&edited).err()]
        {
            match refused {
                Some(Error::BadFile { problem, .. }) => assert_eq!(problem, want),
                other => panic!("expected `{want}`, got {other:?}"),
            }
        }
        assert_eq!(before, (gpu.scalars(1), gpu.state(1, StateKind::Z)), "a refused load changed the group");
    }
}
