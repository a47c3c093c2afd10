//! Property tests: random algorithms, hyperparameters, dtypes, lengths (0 and 1 included),
//! element offsets inside shared buffers and step counts; the GPU equals the oracle after
//! every step. Set PROPTEST_CASES for longer runs (default 24 cases).

use crate::common;

use common::{assert_close, ctx, download, Rng, Tolerance};
use proptest::prelude::*;
use wgpu_optim::{Adagrad, Adam, Algorithm, DType, Optimizer, Sgd, StateStorage, Tensor};
use wgpu_optim_testkit::oracle::{Storage, ToOracle, TorchState};

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(24)
}

fn dtype() -> impl Strategy<Value = DType> {
    prop_oneof![Just(DType::F32), Just(DType::F16), Just(DType::BF16)]
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    let beta = 0.0..0.999f64;
    prop_oneof![
        (
            1e-4..0.1f64,
            beta.clone(),
            beta,
            1e-10..1e-3f64,
            0.0..0.1f64,
            any::<bool>(),
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(
                |(lr, beta1, beta2, eps, weight_decay, decoupled_weight_decay, amsgrad, maximize)| {
                    Adam { lr, beta1, beta2, eps, weight_decay, decoupled_weight_decay, amsgrad, maximize }
                        .into()
                }
            ),
        (1e-4..0.1f64, 0.0..0.99f64, 0.0..0.5f64, 0.0..0.1f64, any::<bool>(), any::<bool>()).prop_map(
            |(lr, momentum, dampening, weight_decay, nesterov, maximize)| {
                let nesterov = nesterov && momentum > 0.0;
                let dampening = if nesterov { 0.0 } else { dampening };
                Sgd { lr, momentum, dampening, weight_decay, nesterov, maximize }.into()
            }
        ),
        (1e-4..0.1f64, 0.0..0.1f64, 0.0..0.1f64, 0.0..0.5f64, 1e-10..1e-3f64, any::<bool>()).prop_map(
            |(lr, lr_decay, weight_decay, initial_accumulator_value, eps, maximize)| {
                Adagrad { lr, lr_decay, weight_decay, initial_accumulator_value, eps, maximize }.into()
            }
        ),
    ]
}

/// One random optimizer: its algorithm, dtypes, tensors (length and element offset in a
/// shared buffer), steps and data seed.
#[derive(Debug, Clone)]
struct Setup {
    algorithm: Algorithm,
    param: DType,
    grad: DType,
    state: DType,
    tensors: Vec<(usize, u64)>,
    steps: u64,
    packed_f16: bool,
    seed: u64,
}

fn setup() -> impl Strategy<Value = Setup> {
    let tensor = (prop_oneof![Just(0usize), Just(1), 2..40usize, 250..300usize], 0..5u64);
    (
        algorithm(),
        dtype(),
        dtype(),
        dtype(),
        proptest::collection::vec(tensor, 1..4),
        1..4u64,
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(|(algorithm, param, grad, state, tensors, steps, packed_f16, seed)| Setup {
            algorithm,
            param,
            grad,
            state,
            tensors,
            steps,
            packed_f16,
            seed,
        })
}

/// Tensors of `lengths` at the given element offsets, one after another in one buffer.
fn packed(ctx: &wgpu_optim::GpuContext, specs: &[(usize, u64)], dtype: DType, rng: &mut Rng) -> Vec<Tensor> {
    let total: u64 = specs.iter().map(|(n, gap)| *n as u64 + gap).sum::<u64>() + 2;
    let buffer = ctx.upload("packed", &rng.vec(total as usize, 1.0), dtype);
    let mut at = 0;
    specs
        .iter()
        .map(|(n, gap)| {
            at += gap;
            let t =
                Tensor { buffer: buffer.buffer.clone(), offset: at * dtype.size(), len: *n as u64, dtype };
            at += *n as u64;
            t
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn the_gpu_equals_the_oracle_after_every_step(setup in setup()) {
        let ctx = ctx().with_packed_f16(setup.packed_f16);
        let mut rng = Rng::new(setup.seed);
        let params = packed(&ctx, &setup.tensors, setup.param, &mut rng);
        let grads = packed(&ctx, &setup.tensors, setup.grad, &mut rng);
        let options = Optimizer::builder().state_storage(StateStorage::Dtype(setup.state));
        let mut optimizer = options.build(&ctx, setup.algorithm, &params).unwrap();
        let kinds = setup.algorithm.state_kinds();
        for t in 1..=setup.steps {
            for g in &grads {
                ctx.write(g, &rng.vec(g.len as usize, 1.0)).unwrap();
            }
            // Per parameter: its values, its state tensors and its gradient, before the step.
            type Before = (Vec<f64>, Vec<Vec<f64>>, Vec<f64>);
            let before: Vec<Before> = (0..params.len())
                .map(|i| {
                    let state = kinds.iter().map(|k| download(&ctx, optimizer.state(i, *k).unwrap().and_then(|s| s.dense()).unwrap())).collect();
                    (download(&ctx, &params[i]), state, download(&ctx, &grads[i]))
                })
                .collect();
            optimizer.step(&grads).unwrap();
            for (i, (mut p, state, g)) in before.into_iter().enumerate() {
                let mut oracle = TorchState::resume(setup.algorithm.to_oracle(), t - 1, &state).storing(setup.param.to_oracle(), setup.state.to_oracle());
                oracle.step(&mut p, &g);
                let got = download(&ctx, &params[i]);
                assert_close(&format!("step {t} param[{i}]"), &got, &p, Tolerance::stored(setup.param));
                for (k, want) in oracle.tensors().iter().enumerate() {
                    let got = download(&ctx, optimizer.state(i, kinds[k]).unwrap().and_then(|s| s.dense()).unwrap());
                    let what = format!("step {t} {:?}[{i}]", kinds[k]);
                    assert_close(&what, &got, want, Tolerance::stored(setup.state));
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn stateless_updates_with_outputs_in_place_or_not_equal_the_oracle(
        algorithm in algorithm(),
        len in prop_oneof![Just(0usize), Just(1), 2..300usize],
        dtype in dtype(),
        in_place in proptest::collection::vec(any::<bool>(), 4),
        t in 1..5u64,
        seed in any::<u64>(),
    ) {
        let ctx = ctx();
        let mut rng = Rng::new(seed);
        let kinds = algorithm.state_kinds();
        let p = dtype.to_oracle().decode(&dtype.to_oracle().encode(&rng.vec(len, 1.0)));
        let g = dtype.to_oracle().decode(&dtype.to_oracle().encode(&rng.vec(len, 1.0)));
        let state: Vec<Vec<f64>> = kinds.iter().map(|_| dtype.to_oracle().decode(&dtype.to_oracle().encode(&rng.positive(len, 0.1)))).collect();
        let param = ctx.upload("p", &p, dtype);
        let grad = ctx.upload("g", &g, dtype);
        let state_tensors: Vec<Tensor> = state.iter().map(|s| ctx.upload("s", s, dtype)).collect();
        let out = |k: usize, input: &Tensor| (!in_place[k]).then(|| ctx.zeros("out", input.len, dtype));
        let update = wgpu_optim::ops::Update {
            param: param.clone(),
            grad,
            state: state_tensors.clone(),
            param_out: out(0, &param),
            state_out: state_tensors.iter().enumerate().map(|(k, s)| out(k + 1, s)).collect(),
            param_copy: None,
        };
        ctx.submit("update", |e| wgpu_optim::ops::update(&ctx, e, &algorithm, t, std::slice::from_ref(&update))).unwrap();
        let mut want = p.clone();
        let mut oracle = TorchState::resume(algorithm.to_oracle(), t - 1, &state).storing(dtype.to_oracle(), dtype.to_oracle());
        oracle.step(&mut want, &g);
        let got = download(&ctx, update.param_out.as_ref().unwrap_or(&param));
        assert_close("param", &got, &want, Tolerance::stored(dtype));
        for (k, want) in oracle.tensors().iter().enumerate() {
            let written = update.state_out[k].as_ref().unwrap_or(&state_tensors[k]);
            let got = download(&ctx, written);
            assert_close(&format!("{:?}", kinds[k]), &got, want, Tolerance::stored(dtype));
        }
    }
}
