//! 4-bit state (torchao's `AdamW4bit` format) through the `burn` feature's `ModuleStep`:
//! against the oracle (`wgpu_optim_testkit::oracle::ao4`, transcribed from torchao's source),
//! with parameters that skip a step (their state moves to another optimizer), and its records
//! under torchao's names, resumed bit for bit; records that do not fit refused.

use burn::module::{Module, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor, TensorData};
use burn_pack::Reader;
use wgpu_optim::q4::{map_for, Q4State, Q4States};
use wgpu_optim::{Adam, BurnFailure, Error, StateKind, StateStorage};
use wgpu_optim_burn::{ModuleStep, SharedDevice};
use wgpu_optim_testkit::oracle::{ao4, State4bit, ToLibrary, ToOracle};

fn shared() -> SharedDevice {
    SharedDevice::headless_blocking().unwrap_or_else(|e| panic!("Burn tests need an adapter: {e}"))
}

fn tensor(values: &[f32], device: &Device) -> Tensor<1> {
    Tensor::from_data(TensorData::new(values.to_vec(), [values.len()]), device)
}

/// Deterministic values in `-scale..scale` (an LCG), `seed` apart.
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// A module of 1-D parameters, so that tests choose every value.
#[derive(Module, Debug)]
struct Params {
    params: Vec<Param<Tensor<1>>>,
}

impl Params {
    fn new(values: &[Vec<f32>], device: &Device) -> Self {
        Params { params: values.iter().map(|v| Param::from_tensor(tensor(v, device))).collect() }
    }

    /// Gradients for the parameters `with` names.
    fn grads(&self, grads: &[Vec<f32>], with: &[usize], device: &Device) -> GradientsParams {
        let mut out = GradientsParams::new();
        for &i in with {
            out.register(self.params[i].id, tensor(&grads[i], device));
        }
        out
    }

    fn values(&self) -> Vec<Vec<f32>> {
        self.params
            .iter()
            .map(|p| p.val().into_data().try_to_vec::<f32>().unwrap_or_else(|e| panic!("{e:?}")))
            .collect()
    }
}

/// A 4-bit tensor (whole blocks of 128, at least 4096 elements) and an f32-state one.
const LENS: [usize; 2] = [8192, 300];

fn adamw() -> Adam {
    Adam { lr: 1e-2, ..Adam::adamw() }
}

fn initial() -> Vec<Vec<f32>> {
    LENS.iter().enumerate().map(|(i, &n)| values(n, 1 + i as u64, 1.0)).collect()
}

fn grads(steps: usize) -> Vec<Vec<Vec<f32>>> {
    (0..steps)
        .map(|t| {
            LENS.iter().enumerate().map(|(i, &n)| values(n, 100 * (t as u64 + 1) + i as u64, 0.1)).collect()
        })
        .collect()
}

/// The oracle's parameters and states after steps in which parameter i has a gradient
/// where `with[t]` names it, each counting its own steps.
fn oracle(initial: &[Vec<f32>], grads: &[Vec<Vec<f32>>], with: &[&[usize]]) -> Vec<(Vec<f64>, [Q4State; 2])> {
    let config = Q4States::default();
    let mut runs: Vec<(Vec<f64>, [State4bit; 2], u64)> = initial
        .iter()
        .map(|p| {
            let zeros = || ao4::zeros(p.len(), config.block_size, config.min_size as usize);
            (p.iter().map(|&v| f64::from(v)).collect(), [zeros(), zeros()], 0)
        })
        .collect();
    for (step, with) in grads.iter().zip(with) {
        for &i in *with {
            let (param, [m, v], t) = &mut runs[i];
            *t += 1;
            let g: Vec<f64> = step[i].iter().map(|&v| f64::from(v)).collect();
            ao4::ao4_adam_step(&adamw().to_oracle(), *t, config.block_size, param, &g, m, v)
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }
    runs.into_iter().map(|(p, [m, v], _)| (p, [m.to_library(), v.to_library()])).collect()
}

/// `got` within 1e-5 relative (+1e-6) of `want`.
fn assert_near(what: &str, got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (j, (a, b)) in got.iter().zip(want).enumerate() {
        assert!((f64::from(*a) - b).abs() <= 1e-6 + 1e-5 * b.abs(), "{what}[{j}]: {a} against {b}");
    }
}

/// A stored state follows the oracle's: 4-bit codes equal but for at most 0.5 % within one
/// code (values that land near a tie between two entries may round either way), scales and
/// f32 values within 1e-5 relative.
fn assert_state(what: &str, got: &Q4State, want: &Q4State) {
    match (got, want) {
        (Q4State::Q4 { codes, scale }, Q4State::Q4 { codes: w_codes, scale: w_scale }) => {
            let (codes, w_codes) = (ao4::unpack(codes), ao4::unpack(w_codes));
            assert_eq!(codes.len(), w_codes.len(), "{what}: code count");
            let differing = codes.iter().zip(&w_codes).filter(|(a, b)| a != b).count();
            let furthest = codes.iter().zip(&w_codes).map(|(a, b)| a.abs_diff(*b)).max().unwrap_or(0);
            assert!(furthest <= 1 && differing * 200 <= codes.len(), "{what}: {differing} codes differ");
            let w_scale: Vec<f64> = w_scale.iter().map(|&v| f64::from(v)).collect();
            assert_near(&format!("{what} scale"), scale, &w_scale);
        }
        (Q4State::F32(values), Q4State::F32(w_values)) => {
            let w_values: Vec<f64> = w_values.iter().map(|&v| f64::from(v)).collect();
            assert_near(what, values, &w_values);
        }
        (got, _) => panic!("{what}: stored as {got:?}, not as the oracle's"),
    }
}

fn step_all(
    step: &mut ModuleStep,
    mut model: Params,
    grads: &[Vec<Vec<f32>>],
    with: &[&[usize]],
    device: &Device,
) -> Params {
    for (g, with) in grads.iter().zip(with) {
        let g = model.grads(g, with, device);
        model = step.step(adamw().lr, model, g).unwrap_or_else(|e| panic!("{e}"));
    }
    model
}

#[test]
fn the_module_step_with_4bit_state_follows_torchaos_oracle_when_a_parameter_skips_a_step() {
    let shared = shared();
    let device = shared.device().clone().autodiff();
    let (initial, grads) = (initial(), grads(4));
    // Parameter 1 has no gradient in step 2: from step 3 on the two count differently, so
    // each is stepped by an optimizer of its own, its 4-bit state moved into it.
    let with: [&[usize]; 4] = [&[0, 1], &[0], &[0, 1], &[0, 1]];
    let mut step = ModuleStep::builder()
        .state_storage(StateStorage::Q4(Q4States::default()))
        .build(&shared, adamw())
        .unwrap();
    let model = step_all(&mut step, Params::new(&initial, &device), &grads, &with, &device);
    let want = oracle(&initial, &grads, &with);
    assert_eq!(
        model.params.iter().map(|p| step.param_step_count(p.id)).collect::<Vec<_>>(),
        [Some(4), Some(3)]
    );
    for (i, (got, (want, _))) in model.values().iter().zip(&want).enumerate() {
        assert_near(&format!("parameter {i}"), got, want);
    }
    // The optimizer of the lowest count holds parameter 1's state.
    let optimizer = step.optimizer().unwrap_or_else(|| panic!("no optimizer"));
    for (k, kind) in [StateKind::ExpAvg, StateKind::ExpAvgSq].into_iter().enumerate() {
        let got = optimizer
            .state(0, kind)
            .map(|s| s.and_then(|v| v.q4()))
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("none"));
        assert_state(&format!("parameter 1 state {k}"), &got, &want[1].1[k]);
    }
}

/// A record's tensors by name, and their bytes.
fn record_tensors(bytes: burn::tensor::Bytes) -> Vec<(String, Vec<usize>, Vec<u8>)> {
    let tensors = Reader::from_bytes(bytes).unwrap_or_else(|e| panic!("{e}")).into_tensors();
    let tensors = tensors.unwrap_or_else(|e| panic!("{e}"));
    tensors
        .into_iter()
        .map(|t| {
            let (name, _, shape, _, bytes) = t.into_parts().unwrap_or_else(|e| panic!("{e}"));
            (name, shape.to_vec(), bytes.to_vec())
        })
        .collect()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect()
}

#[test]
fn a_4bit_record_holds_torchaos_names_and_resumes_bit_for_bit() {
    let shared = shared();
    let device = shared.device().clone().autodiff();
    let (initial, grads) = (initial(), grads(4));
    let both: [&[usize]; 4] = [&[0, 1]; 4];
    let q4 = || ModuleStep::builder().state_storage(StateStorage::Q4(Q4States::default()));
    let mut straight = q4().build(&shared, adamw()).unwrap();
    let straight = step_all(&mut straight, Params::new(&initial, &device), &grads, &both, &device);

    let mut first = q4().build(&shared, adamw()).unwrap();
    let model = step_all(&mut first, Params::new(&initial, &device), &grads[..2], &both[..2], &device);
    let bytes = first.to_bytes().unwrap_or_else(|e| panic!("{e}"));

    // torchao's names: the 4-bit tensor's states flattened into codes, scale and map, the
    // small one's in f32, each against the oracle after two steps.
    let want = oracle(&initial, &grads[..2], &both[..2]);
    let tensors = record_tensors(bytes.clone());
    let find = |name: String| {
        let found = tensors.iter().find(|(n, ..)| *n == name);
        found.unwrap_or_else(|| {
            panic!("the record has no {name}: {:?}", tensors.iter().map(|t| &t.0).collect::<Vec<_>>())
        })
    };
    let (big, small) = (model.params[0].id.val(), model.params[1].id.val());
    for (k, kind) in [StateKind::ExpAvg, StateKind::ExpAvgSq].into_iter().enumerate() {
        let name = kind.torch_name();
        let (_, shape, codes) = find(format!("{big}.{name}.codes"));
        assert_eq!(*shape, [LENS[0] / 2]);
        let (_, _, scale) = find(format!("{big}.{name}.scale"));
        let state = Q4State::Q4 { codes: codes.clone(), scale: f32s(scale) };
        assert_state(&format!("recorded {name}"), &state, &want[0].1[k]);
        let (_, _, qmap) = find(format!("{big}.{name}.qmap"));
        assert_eq!(f32s(qmap), map_for(kind));
        let (_, shape, values) = find(format!("{small}.{name}"));
        assert_eq!(*shape, [LENS[1]]);
        assert_state(&format!("recorded {name} (f32)"), &Q4State::F32(f32s(values)), &want[1].1[k]);
    }
    assert_eq!(tensors.len(), 8, "{:?}", tensors.iter().map(|t| &t.0).collect::<Vec<_>>());

    // Loaded into a new module step, the remaining steps are the uninterrupted run's.
    let mut second = q4().build(&shared, adamw()).unwrap();
    second.load_bytes(bytes.clone()).unwrap_or_else(|e| panic!("{e}"));
    let resumed = step_all(&mut second, model.clone(), &grads[2..], &both[2..], &device);
    assert_eq!(resumed.values(), straight.values());

    // Without 4-bit state, the record is another optimizer's.
    let err = ModuleStep::builder().build(&shared, adamw()).unwrap().load_bytes(bytes).unwrap_err();
    assert!(
        matches!(&err, Error::Burn { cause: BurnFailure::Record, detail: m } if m.contains("exp_avg.codes")),
        "{err}"
    );

    // An f32-state record loads by name, but the 4-bit tensor's f32 state is refused at its
    // step, the module handed back unchanged.
    let mut plain = ModuleStep::builder().build(&shared, adamw()).unwrap();
    let plain_model = step_all(&mut plain, Params::new(&initial, &device), &grads[..1], &both[..1], &device);
    let mut third = q4().build(&shared, adamw()).unwrap();
    third.load_bytes(plain.to_bytes().unwrap_or_else(|e| panic!("{e}"))).unwrap_or_else(|e| panic!("{e}"));
    let before = plain_model.values();
    let g = plain_model.grads(&grads[1], &[0, 1], &device);
    let refused = third.step(adamw().lr, plain_model, g).unwrap_err();
    assert!(matches!(refused.error, Error::BadRange { .. }), "{}", refused.error);
    assert_eq!(refused.module.values(), before);
}

#[test]
fn a_bad_block_size_is_refused_when_the_module_step_is_built() {
    let shared = shared();
    let config = Q4States { block_size: 100, ..Q4States::default() };
    let err = ModuleStep::builder().state_storage(StateStorage::Q4(config)).build(&shared, adamw()).err();
    assert!(matches!(err, Some(Error::BadRange { .. } | Error::BadValue { .. })), "{err:?}");
}
