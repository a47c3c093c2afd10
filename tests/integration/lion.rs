//! Lion (lion-pytorch's `Lion`) on the GPU and the CPU backend against the f64 oracle:
//! f32 trajectories, 16-bit storage and state dtypes other than the parameter's, master
//! weights, two groups, capturable mode with a device learning rate, global clipping,
//! stochastic and Kahan rounding, checkpoints, and refusals. The public vectors
//! (`lion_plain`, `lion_wd`) run in `tests/conformance.rs`.

use crate::common;
use crate::family;

use common::{ctx, Tolerance};
use wgpu_optim::{Adam, Algorithm, DType, Lion, Sgd, StateStorage};
use wgpu_optim_testkit::oracle::{Storage, ToOracle};

/// The data keep every direction `c = beta1 m + (1 - beta1) g` at least 1e-3 (relative to
/// its terms) away from 0, as the public vectors do: f32 and f64 may round a smaller one to
/// either sign. Each element of `g` where `c` (from any backend's `exp_avg` before the step,
/// `states[b][0]`) is that close gets another value.
fn untie(config: Lion) -> impl Fn(&[&[Vec<f64>]], &mut [f64], DType) {
    move |states, g, dtype| {
        for (j, g) in g.iter_mut().enumerate() {
            let tied = |g: f64| {
                states.iter().any(|s| {
                    let (a, b) = (config.beta1 * s[0][j], (1.0 - config.beta1) * g);
                    (a + b).abs() <= 1e-3 * (a.abs() + b.abs())
                })
            };
            *g = dtype.to_oracle().round(*g);
            while tied(*g) {
                *g = dtype.to_oracle().round(*g * 0.75 + 0.125);
            }
        }
    }
}

fn plain() -> Algorithm {
    Lion { lr: 1e-2, ..Lion::default() }.into()
}

fn decayed_config() -> Lion {
    Lion { lr: 3e-3, beta1: 0.8, beta2: 0.95, weight_decay: 0.5 }
}

fn decayed() -> Algorithm {
    decayed_config().into()
}

#[test]
fn lion_defaults_are_lion_pytorchs() {
    assert_eq!(Lion::default(), Lion { lr: 1e-4, beta1: 0.9, beta2: 0.99, weight_decay: 0.0 });
    let lion: Algorithm = Lion::default().into();
    assert_eq!(lion.name(), "Lion");
    assert_eq!(lion.state_kinds(), &[wgpu_optim::StateKind::ExpAvg]);
    assert_eq!(wgpu_optim::StateKind::ExpAvg.torch_name(), "exp_avg");
}

#[test]
fn f32_trajectories_follow_the_oracle_on_the_gpu_and_the_cpu() {
    family::f32_trajectories_follow_the_oracle(plain(), 20, 1);
    family::f32_trajectories_follow_the_oracle(decayed(), 20, 2);
}

#[test]
fn sixteen_bit_storage_and_other_state_dtypes_match_the_oracle_natively() {
    let ctx = ctx().with_packed_f16(false);
    // Only GL may lack SHADER_F16; its run leaves the native path to the Vulkan run.
    if !common::has_feature_unless_gl(&ctx, wgpu::Features::SHADER_F16, "SHADER_F16") {
        return;
    }
    family::mixes_match_the_oracle_step_by_step(&ctx, decayed(), &untie(decayed_config()), 3, 10);
}

#[test]
fn sixteen_bit_storage_and_other_state_dtypes_match_the_oracle_packed() {
    let ctx = ctx().with_packed_f16(true);
    family::mixes_match_the_oracle_step_by_step(&ctx, decayed(), &untie(decayed_config()), 3, 20);
}

#[test]
fn master_weights_follow_the_oracle_and_round_the_model_copy_once() {
    family::master_weights_follow_the_oracle(decayed(), 30);
}

#[test]
fn two_groups_keep_their_own_hyperparameters() {
    family::two_groups_follow_their_own_oracles(plain(), decayed(), 40);
}

#[test]
fn capturable_mode_takes_the_rate_and_the_decay_from_the_device() {
    let schedule = |t: u64| 1e-2 / (1.0 + t as f64);
    family::capturable_follows_the_oracle(decayed(), 0, 8, schedule, Tolerance::F32, 50);
}

#[test]
fn global_clipping_scales_the_gradients_before_the_update() {
    family::clipped_steps_follow_the_oracle(decayed(), 60);
}

#[test]
fn stochastic_and_kahan_rounding_store_the_same_bits_on_the_gpu_and_the_cpu() {
    // Powers of two and gradients on a 1/64 grid: every f32 operation is exact, and a step
    // of 2^-13 falls between neighbouring f16 and bf16 values of most parameters.
    let lion: Algorithm = Lion { lr: 1.0 / 8192.0, beta1: 0.5, beta2: 0.75, weight_decay: 0.0 }.into();
    // Each element's gradient keeps its sign, so its updates add up past half a 16-bit
    // spacing within the run (where Kahan's stores part from nearest ones). The state is
    // stored in 16 bits every step, so its f32 products stay exact too.
    let mut rng = common::Rng::new(70);
    let sizes = [300usize, 7];
    let signs: Vec<Vec<f64>> =
        sizes.iter().map(|&n| rng.vec(n, 1.0).iter().map(|x| x.signum()).collect()).collect();
    let start: Vec<Vec<f64>> = sizes.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grads: Vec<Vec<Vec<f64>>> = (0..24)
        .map(|_| {
            signs
                .iter()
                .map(|s| s.iter().map(|s| s * (1.0 + (rng.uniform().abs() * 63.0).round()) / 64.0).collect())
                .collect()
        })
        .collect();
    family::rounding_stores_the_same_bits_on_the_gpu_and_the_cpu(lion, &start, &grads);
}

#[test]
fn a_gpu_checkpoint_continues_on_the_cpu_backend() {
    family::a_gpu_checkpoint_continues_on_the_cpu(decayed(), 80);
}

#[test]
fn a_checkpoint_of_lion_does_not_load_into_adam_and_adam_not_into_lion() {
    family::a_checkpoint_of_another_algorithm_is_refused(decayed(), Adam::adamw().into());
    family::a_checkpoint_of_another_algorithm_is_refused(Adam::default().into(), plain());
    family::a_checkpoint_of_another_algorithm_is_refused(
        plain(),
        Sgd { momentum: 0.9, ..Sgd::default() }.into(),
    );
}

#[test]
fn the_checkpoint_json_keeps_lion_pytorchs_names() {
    family::json_round_trips(decayed());
    let json = decayed().to_json();
    for key in ["lr", "betas", "weight_decay"] {
        assert!(json.contains_key(key), "{key} in {json:?}");
    }
    assert_eq!(json["betas"], serde_json::json!([0.8, 0.95]));
}

/// lion-pytorch's and bitsandbytes' sign is `torch.sign`'s (`(0 < c) - (c < 0)`), whose sign
/// of NaN is 0: a NaN gradient element only decays its parameter, step after step (its
/// `exp_avg` stays NaN; with 8-bit state it restarts as the code of 0). On both backends with
/// f32, bf16 and f16 parameters and state and with 8-bit state; the GPU and the CPU store the
/// same bits, and every other element stays finite.
#[test]
fn a_nan_gradient_element_only_decays_its_parameter() {
    use family::{host, slices, slices_mut};
    use wgpu_optim::cpu::CpuOptimizer;
    use wgpu_optim::q8::{Q8States, StoredState};
    use wgpu_optim::{Optimizer, StateKind};
    let ctx = ctx();
    let config = Lion { lr: 1e-2, weight_decay: 0.5, ..Lion::default() };
    let (n, bad) = (300usize, [7usize, 260]);
    let mut rng = common::Rng::new(77);
    let start = rng.vec(n, 1.0);
    // A clean step, then two with NaN at `bad`.
    let grads: Vec<Vec<f64>> = (0..3)
        .map(|k| {
            let mut g = rng.vec(n, 1.0);
            if k > 0 {
                bad.iter().for_each(|&b| g[b] = f64::NAN);
            }
            g
        })
        .collect();
    let q8 = Q8States { min_8bit_size: 256 };
    for (dtype, q8) in [(DType::F32, None), (DType::BF16, None), (DType::F16, None), (DType::F32, Some(q8))] {
        let what = format!("{dtype:?}, 8-bit {}", q8.is_some());
        let params = [ctx.upload("param", &start, dtype)];
        let mut gpu = Optimizer::builder()
            .state_storage(q8.map_or(StateStorage::ParamDtype, StateStorage::Q8))
            .build(&ctx, config, &params)
            .unwrap();
        let mut cpu_params = [host(&start, dtype)];
        let mut cpu = CpuOptimizer::builder()
            .state_storage(q8.map_or(StateStorage::ParamDtype, StateStorage::Q8))
            .build(config, &slices(&cpu_params))
            .unwrap();
        // The parameter after the clean step, then decayed in f32 and stored in `dtype`.
        let mut want = Vec::new();
        for (k, g) in grads.iter().enumerate() {
            let grad = [ctx.upload("grad", g, dtype)];
            gpu.step(&grad).unwrap();
            cpu.step(&mut slices_mut(&mut cpu_params), &slices(&[host(g, dtype)])).unwrap();
            let (got, cpu_got) = (common::download(&ctx, &params[0]), cpu_params[0].to_f64());
            family::assert_bits_eq(&format!("{what}: step {}", k + 1), &got, &cpu_got);
            if k == 0 {
                want = bad.iter().map(|&b| got[b]).collect();
                continue;
            }
            let decay = (1.0 - config.lr * config.weight_decay) as f32;
            for (w, &b) in want.iter_mut().zip(&bad) {
                *w = dtype.to_oracle().round(f64::from(*w as f32 * decay));
                assert_eq!(got[b], *w, "{what}: step {}: parameter {b} only decays", k + 1);
            }
            assert!(got.iter().all(|p| p.is_finite()), "{what}: step {}", k + 1);
        }
        match cpu.state(0, StateKind::ExpAvg).and_then(|s| s.q8()) {
            Some(StoredState::Q8 { codes, .. }) => assert!(bad.iter().all(|&b| codes[b] == 127), "{what}"),
            Some(StoredState::F32(_)) => panic!("{what}: 300 elements keep 8-bit state"),
            None => {
                let state = cpu.state(0, StateKind::ExpAvg).and_then(|s| s.dense()).map(|s| s.to_f64());
                let state = state.unwrap_or_else(|| panic!("{what}: no exp_avg"));
                assert!(bad.iter().all(|&b| state[b].is_nan()), "{what}: exp_avg stays NaN");
            }
        }
    }
}

#[test]
fn bad_hyperparameters_are_refused_by_name_and_change_nothing() {
    let good = decayed();
    let cases: [(Lion, &str); 6] = [
        (Lion { beta1: 1.0, ..Lion::default() }, "beta1"),
        (Lion { beta1: -0.1, ..Lion::default() }, "beta1"),
        (Lion { beta2: 1.5, ..Lion::default() }, "beta2"),
        (Lion { lr: -1e-3, ..Lion::default() }, "lr"),
        (Lion { lr: f64::NAN, ..Lion::default() }, "lr"),
        (Lion { weight_decay: -0.1, ..Lion::default() }, "weight_decay"),
    ];
    for (bad, name) in cases {
        family::a_bad_hyperparameter_is_refused_by_name(good, bad.into(), name);
    }
}

/// bitsandbytes' `Lion8bit`: `exp_avg` in blockwise 8-bit codes under its names in
/// checkpoints (`state1`, `absmax1`, `qmap1`), on the GPU and on the CPU backend, which load
/// each other's files. (The `lion8bit_n700` vector checks the values on both.)
#[test]
fn lion8bit_checkpoints_keep_bitsandbytes_names_and_load_on_the_cpu() {
    use wgpu_optim::cpu::CpuOptimizer;
    use wgpu_optim::q8::Q8States;
    use wgpu_optim::{Optimizer, StateKind};
    use wgpu_optim_testkit::oracle::bnb::signed_map;

    let ctx = ctx();
    let config = Q8States { min_8bit_size: 512 };
    let lion = Lion { lr: 1e-3, weight_decay: 0.1, ..Lion::default() };
    let mut rng = common::Rng::new(95);
    let lens = [700usize, 5];
    let start: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let params: Vec<wgpu_optim::Tensor> = start.iter().map(|p| ctx.upload("param", p, DType::F32)).collect();
    let mut gpu =
        Optimizer::builder().state_storage(StateStorage::Q8(config)).build(&ctx, lion, &params).unwrap();
    for _ in 0..3 {
        let g: Vec<wgpu_optim::Tensor> =
            lens.iter().map(|&n| ctx.upload("grad", &rng.vec(n, 1.0), DType::F32)).collect();
        gpu.step(&g).unwrap();
    }
    let bytes = gpu.save_to_bytes().unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let shape = |name: &str| {
        let t = file.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        (t.dtype(), t.shape().to_vec())
    };
    assert_eq!(shape("state.0.state1"), (safetensors::Dtype::U8, vec![700]));
    assert_eq!(shape("state.0.absmax1"), (safetensors::Dtype::F32, vec![3]));
    assert_eq!(shape("state.1.state1"), (safetensors::Dtype::F32, vec![5]));
    assert_eq!(shape("qmap1"), (safetensors::Dtype::F32, vec![256]));
    let qmap: Vec<f32> = file
        .tensor("qmap1")
        .unwrap()
        .data()
        .chunks(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(qmap, signed_map().to_vec(), "qmap1 is bitsandbytes' signed map");
    assert!(file.tensor("state.0.exp_avg").is_err() && file.tensor("qmap2").is_err());

    let host: Vec<wgpu_optim::cpu::HostTensor> =
        start.iter().map(|p| wgpu_optim::cpu::HostTensor::from_f64(DType::F32, p).unwrap()).collect();
    let views: Vec<wgpu_optim::cpu::HostSlice<'_>> = host.iter().map(|t| t.as_slice()).collect();
    let mut cpu =
        CpuOptimizer::builder().state_storage(StateStorage::Q8(config)).build(lion, &views).unwrap();
    cpu.load_from_bytes(&bytes).unwrap();
    for i in 0..lens.len() {
        let gpu_state =
            gpu.state(i, StateKind::ExpAvg).map(|s| s.and_then(|v| v.q8())).unwrap().expect("an 8-bit state");
        assert_eq!(
            cpu.state(i, StateKind::ExpAvg).and_then(|s| s.q8()),
            Some(&gpu_state),
            "exp_avg of param {i}"
        );
    }
    assert_eq!(cpu.save_to_bytes().unwrap(), bytes, "the CPU saves the GPU's file back");
}
