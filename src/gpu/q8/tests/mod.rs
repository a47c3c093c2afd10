//! The 8-bit path against the oracle, on the default adapter and on devices of chosen limits.

mod kernels;

use crate::gpu::q8::shader::Requantize;
use crate::oracle::{bnb_8bit_step, bnb_adam8bit_step, bnb_sgd8bit_step, BnbAdam, BnbSgd};
use crate::q8::{Q8States, StoredState};
use crate::{
    Adam, Algorithm, DType, GpuContext, Optimizer, ParamGroup, QuantizedState, Sgd, StateKind, StateStorage,
    Tensor,
};

/// Asserts that `got` (read back) follows the oracle's 8-bit state `want` as FORMAT.md
/// compares them: codes within 1 and at most 1 % differing, absmax within 1e-4 relative;
/// f32 state within 1e-6.
fn assert_state_follows(what: &str, got: Option<StoredState>, want: &StoredState) {
    match (got, want) {
        (Some(StoredState::Q8 { codes, absmax }), StoredState::Q8 { codes: w_codes, absmax: w_absmax }) => {
            let differing = codes.iter().zip(w_codes).filter(|(a, b)| a != b).count();
            let furthest = codes.iter().zip(w_codes).map(|(a, b)| a.abs_diff(*b)).max().unwrap_or(0);
            assert!(
                codes.len() == w_codes.len() && furthest <= 1 && differing * 100 <= codes.len(),
                "{what}: {differing} codes differ, by up to {furthest}"
            );
            assert_eq!(absmax.len(), w_absmax.len(), "{what}: absmax count");
            for (a, b) in absmax.iter().zip(w_absmax) {
                assert!((a - b).abs() <= 1e-4 * b.abs(), "{what}: absmax {a} against {b}");
            }
        }
        (Some(StoredState::F32(values)), StoredState::F32(w_values)) => {
            assert_eq!(values.len(), w_values.len(), "{what}: length");
            for (a, b) in values.iter().zip(w_values) {
                assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "{what}: {a} against {b}");
            }
        }
        (got, _) => panic!("{what}: stored as {got:?}, not as the oracle's"),
    }
}

/// A device of its own whose storage bindings hold 64 KiB (WebGPU's defaults otherwise),
/// whatever the adapter's limit: small enough that a few thousand elements outgrow one.
fn ctx_with_64k_bindings() -> GpuContext {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = pollster::block_on(wgpu::util::initialize_adapter_from_env_or_default(&instance, None))
        .unwrap_or_else(|e| panic!("{e}"));
    let limits = wgpu::Limits { max_storage_buffer_binding_size: 64 << 10, ..wgpu::Limits::default() };
    let descriptor = wgpu::DeviceDescriptor { required_limits: limits, ..Default::default() };
    let (device, queue) =
        pollster::block_on(adapter.request_device(&descriptor)).unwrap_or_else(|e| panic!("{e}"));
    GpuContext::from_device(device, queue)
}

/// A device whose storage bindings hold 64 KiB: a tensor larger than a binding is
/// updated in chunks, the states fill several arenas, and bindings that would outgrow a
/// binding start new dispatches; every tensor still follows the oracle.
#[test]
fn tensors_past_a_small_binding_limit_split_into_chunks_arenas_and_dispatches() {
    let ctx = ctx_with_64k_bindings();
    // 25000 elements: two chunks of whole blocks, and 51 KB of 8-bit state, so the next
    // tensor's state starts a new arena.
    let sizes = [25_000usize, 4096, 4096, 300, 4096];
    let adam = Adam { lr: 1e-2, weight_decay: 0.1, decoupled_weight_decay: true, ..Adam::default() };
    let config =
        BnbAdam { lr: adam.lr, beta1: adam.beta1, beta2: adam.beta2, eps: adam.eps, weight_decay: 0.1 };
    let total: usize = sizes.iter().sum::<usize>() + 1;
    let initial: Vec<f64> = (0..total).map(|i| ((i * 7919) % 1000) as f64 * 1e-3 - 0.5).collect();
    let grads: Vec<Vec<f64>> = (0..2)
        .map(|k| (0..total).map(|i| ((i * 104_729 + k * 31) % 997) as f64 * 1e-4 - 0.05).collect())
        .collect();
    // Tensor t covers elements at[t].. of the flat buffers, one element in.
    let at: Vec<usize> = sizes.iter().scan(1, |next, &n| Some(std::mem::replace(next, *next + n))).collect();
    let mut want: Vec<Vec<f64>> = at.iter().zip(&sizes).map(|(&a, &n)| initial[a..a + n].to_vec()).collect();
    let mut states: Vec<[StoredState; 2]> =
        sizes.iter().map(|&n| [StoredState::zeros(n, n >= 4096), StoredState::zeros(n, n >= 4096)]).collect();
    for (k, g) in grads.iter().enumerate() {
        for (t, [m, v]) in states.iter_mut().enumerate() {
            let g: Vec<f64> = g[at[t]..at[t] + sizes[t]].iter().map(|&x| f64::from(x as f32)).collect();
            bnb_adam8bit_step(&config, k as u64 + 1, &mut want[t], &g, m, v)
                .unwrap_or_else(|e| panic!("{e}"));
            want[t] = want[t].iter().map(|&x| f64::from(x as f32)).collect();
        }
    }
    for serial in [false, true] {
        let flat = ctx.upload("params", &initial, DType::F32);
        let flat_grads = ctx.zeros("grads", total as u64, DType::F32);
        let view =
            |b: &Tensor, t: usize| Tensor::new(&b.buffer, 4 * at[t] as u64, sizes[t] as u64, DType::F32);
        let params: Vec<Tensor> = (0..sizes.len()).map(|t| view(&flat, t)).collect();
        let grad_tensors: Vec<Tensor> = (0..sizes.len()).map(|t| view(&flat_grads, t)).collect();
        let options = Optimizer::builder().state_storage(StateStorage::Q8(Q8States::default()));
        let mut opt = options.build(&ctx, adam, &params).unwrap_or_else(|e| panic!("{e}"));
        if let Some(engine) = opt.q8_engine_mut() {
            engine.set_serial(serial);
        }
        for g in &grads {
            ctx.write(&flat_grads, g).unwrap_or_else(|e| panic!("{e}"));
            opt.step(&grad_tensors).unwrap_or_else(|e| panic!("{e}"));
        }
        let dispatches = opt.q8_engine_mut().map_or(0, |e| e.dispatch_count());
        assert!(dispatches >= 3, "serial {serial}: {dispatches} dispatches, expected a split");
        for (t, param) in params.iter().enumerate() {
            let got = ctx.read(param).unwrap_or_else(|e| panic!("{e}"));
            let worst = got.iter().zip(&want[t]).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(worst < 1e-4, "serial {serial}: params[{t}] {worst} from the oracle's");
            for (kind, want) in [StateKind::ExpAvg, StateKind::ExpAvgSq].iter().zip(&states[t]) {
                let got =
                    opt.state(t, *kind).map(|s| s.and_then(|v| v.q8())).unwrap_or_else(|e| panic!("{e}"));
                assert_state_follows(&format!("serial {serial}: params[{t}] {kind:?}"), got, want);
            }
        }
    }
}

/// Many tensors in shared buffers (odd offsets, a tensor below `min_8bit_size`, three
/// groups of two algorithms, gradients in a buffer of their own or beside the
/// parameters): one dispatch per variant and group, each tensor as the oracle steps it,
/// for both owners of a block.
#[test]
fn tensors_in_shared_buffers_step_in_one_dispatch_per_variant_and_follow_the_oracle() {
    let ctx = GpuContext::headless_blocking().unwrap_or_else(|e| panic!("{e}"));
    // Group 0 (AdamW): two 8-bit tensors and one below min_8bit_size; group 1 (Adam, no
    // decay): two 8-bit tensors, one ending in a partial block; group 2 (SGD momentum).
    let sizes = [5003usize, 4096, 300, 8209, 4096, 6000];
    let group_of = [0usize, 0, 0, 1, 1, 2];
    let adamw = Adam { lr: 1e-2, weight_decay: 0.1, decoupled_weight_decay: true, ..Adam::default() };
    let adam = Adam { lr: 3e-3, weight_decay: 0.0, decoupled_weight_decay: true, ..Adam::default() };
    let sgd = Sgd { lr: 1e-2, momentum: 0.9, ..Sgd::default() };
    let bnb = |a: &Adam| BnbAdam {
        lr: a.lr,
        beta1: a.beta1,
        beta2: a.beta2,
        eps: a.eps,
        weight_decay: a.weight_decay,
    };
    let initial: Vec<Vec<f64>> = sizes
        .iter()
        .enumerate()
        .map(|(t, &n)| (0..n).map(|i| ((i * 7919 + t * 13) % 1000) as f64 * 1e-3 - 0.5).collect())
        .collect();
    let grads: Vec<Vec<Vec<f64>>> = (0..3)
        .map(|k| {
            sizes
                .iter()
                .enumerate()
                .map(|(t, &n)| {
                    (0..n).map(|i| ((i * 104_729 + k * 31 + t) % 997) as f64 * 1e-4 - 0.05).collect()
                })
                .collect()
        })
        .collect();
    // The oracle, tensor by tensor.
    let mut want = initial.clone();
    let mut states: Vec<Vec<StoredState>> = sizes
        .iter()
        .zip(group_of)
        .map(|(&n, g)| {
            let kinds = if g == 2 { 1 } else { 2 };
            (0..kinds).map(|_| StoredState::zeros(n, n >= 4096)).collect()
        })
        .collect();
    for (k, step_grads) in grads.iter().enumerate() {
        for t in 0..sizes.len() {
            let g: Vec<f64> = step_grads[t].iter().map(|&x| f64::from(x as f32)).collect();
            let step = k as u64 + 1;
            let result = match (group_of[t], states[t].as_mut_slice()) {
                (2, [buffer]) => {
                    let config = BnbSgd { lr: sgd.lr, momentum: sgd.momentum, weight_decay: 0.0 };
                    bnb_sgd8bit_step(&config, step, &mut want[t], &g, buffer)
                }
                (group, [m, v]) => {
                    let config = bnb(if group == 0 { &adamw } else { &adam });
                    bnb_adam8bit_step(&config, step, &mut want[t], &g, m, v)
                }
                _ => unreachable!(),
            };
            result.unwrap_or_else(|e| panic!("{e}"));
            want[t] = want[t].iter().map(|&x| f64::from(x as f32)).collect();
        }
    }
    // Elements of padding before each tensor, so none starts at an aligned offset.
    let place = |first_pad: usize, between: usize| {
        let mut at = Vec::new();
        let mut next = first_pad;
        for &n in &sizes {
            at.push(next);
            next += n + between;
        }
        (at, next)
    };
    for grads_beside_params in [false, true] {
        for serial in [false, true] {
            let what = format!("grads beside params {grads_beside_params}, serial {serial}");
            // Beside: each gradient right after its parameter, in the parameters' buffer.
            let (at, total) =
                place(3, if grads_beside_params { sizes.iter().max().copied().unwrap_or(0) + 5 } else { 7 });
            let mut flat = vec![0.0; total];
            for (t, p) in initial.iter().enumerate() {
                flat[at[t]..at[t] + p.len()].copy_from_slice(p);
            }
            let param_buffer = ctx.upload("params", &flat, DType::F32);
            let grad_buffer = ctx.zeros("grads", total as u64, DType::F32);
            let params: Vec<Tensor> = at
                .iter()
                .zip(&sizes)
                .map(|(&a, &n)| Tensor::new(&param_buffer.buffer, 4 * a as u64, n as u64, DType::F32))
                .collect();
            let grad_at = |t: usize| if grads_beside_params { at[t] + sizes[t] + 2 } else { at[t] };
            let grad_home = if grads_beside_params { &param_buffer } else { &grad_buffer };
            let grad_tensors: Vec<Tensor> = (0..sizes.len())
                .map(|t| Tensor::new(&grad_home.buffer, 4 * grad_at(t) as u64, sizes[t] as u64, DType::F32))
                .collect();
            let groups = vec![
                ParamGroup::new(adamw, &params[..3]),
                ParamGroup::new(adam, &params[3..5]),
                ParamGroup::new(sgd, &params[5..]),
            ];
            let options = Optimizer::builder().state_storage(StateStorage::Q8(Q8States::default()));
            let mut opt = options.build_groups(&ctx, groups).unwrap_or_else(|e| panic!("{e}"));
            if let Some(engine) = opt.q8_engine_mut() {
                engine.set_serial(serial);
            }
            for step_grads in &grads {
                for (t, g) in grad_tensors.iter().enumerate() {
                    ctx.write(g, &step_grads[t]).unwrap_or_else(|e| panic!("{e}"));
                }
                opt.step(&grad_tensors).unwrap_or_else(|e| panic!("{e}"));
            }
            // Group 0: its 8-bit tensors, and its f32-state tensor; groups 1 and 2: one each.
            let dispatches = opt.q8_engine_mut().map_or(0, |e| e.dispatch_count());
            assert_eq!(dispatches, 4, "{what}: dispatches");
            for (t, param) in params.iter().enumerate() {
                let got = ctx.read(param).unwrap_or_else(|e| panic!("{e}"));
                let worst = got.iter().zip(&want[t]).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
                assert!(worst < 1e-4, "{what}: params[{t}] {worst} from the oracle's");
                let kinds: &[StateKind] = if group_of[t] == 2 {
                    &[StateKind::MomentumBuffer]
                } else {
                    &[StateKind::ExpAvg, StateKind::ExpAvgSq]
                };
                for (kind, want) in kinds.iter().zip(&states[t]) {
                    let got =
                        opt.state(t, *kind).map(|s| s.and_then(|v| v.q8())).unwrap_or_else(|e| panic!("{e}"));
                    assert_state_follows(&format!("{what}: params[{t}] {kind:?}"), got, want);
                }
            }
            // Gradients beside parameters are read, never written.
            for (t, g) in grad_tensors.iter().enumerate() {
                let got = ctx.read(g).unwrap_or_else(|e| panic!("{e}"));
                let last = grads.last().map(|s| &s[t]).unwrap_or_else(|| unreachable!());
                let worst = got.iter().zip(last).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
                assert!(worst < 1e-6, "{what}: grads[{t}] changed by {worst}");
            }
        }
    }
}

/// `algorithm` with 8-bit state over one tensor of `initial` values, stepped by `grads`
/// with blocks owned by one invocation each (`serial`) or by a workgroup, codes found as
/// `requantize` says; its parameters must land within 1e-4 of the oracle's `want`. Returns
/// the optimizer, for its state.
fn run_adam_8bit(
    ctx: &GpuContext,
    algorithm: Algorithm,
    initial: &[f64],
    grads: &[Vec<f64>],
    (serial, requantize): (bool, Requantize),
    want: &[f64],
) -> Optimizer {
    let p = ctx.upload("param", initial, DType::F32);
    let g = ctx.zeros("grad", initial.len() as u64, DType::F32);
    let options = Optimizer::builder().state_storage(StateStorage::Q8(Q8States::default()));
    let mut opt = options
        .build(ctx, algorithm, std::slice::from_ref(&p))
        .unwrap_or_else(|e| panic!("serial {serial}: {e}"));
    if let Some(engine) = opt.q8_engine_mut() {
        engine.set_serial(serial);
        engine.set_requantize(requantize);
    }
    for grad in grads {
        ctx.write(&g, grad).unwrap_or_else(|e| panic!("{e}"));
        opt.step(std::slice::from_ref(&g)).unwrap_or_else(|e| panic!("{e}"));
    }
    let got = ctx.read(&p).unwrap_or_else(|e| panic!("{e}"));
    let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    assert!(worst < 1e-4, "serial {serial}: parameters {worst} from the oracle's");
    opt
}

/// Both owners of a block (a workgroup, one invocation), each finding codes by a table and
/// by arithmetic, against the oracle, over a tensor that ends in a partial block and a
/// word of fewer than four codes. Both ways find `nearest_code`'s codes (the probe test
/// below checks each against it), so their states must agree bit for bit: a word with a
/// value near a switch (a few per state here) that the arithmetic got wrong would show.
#[test]
fn a_workgroup_and_a_single_invocation_per_block_both_follow_the_oracle() {
    let ctx = GpuContext::headless_blocking().unwrap_or_else(|e| panic!("{e}"));
    let n = 5000 + 3;
    let param: Vec<f64> = (0..n).map(|i| ((i * 7919) % 1000) as f64 * 1e-3 - 0.5).collect();
    let grads: Vec<Vec<f64>> = (0..3)
        .map(|k| (0..n).map(|i| ((i * 104_729 + k * 31) % 997) as f64 * 1e-4 - 0.05).collect())
        .collect();
    let adam = Adam { weight_decay: 0.1, decoupled_weight_decay: true, ..Adam::default() };
    let config =
        BnbAdam { lr: adam.lr, beta1: adam.beta1, beta2: adam.beta2, eps: adam.eps, weight_decay: 0.1 };
    let (mut want, mut m, mut v) = (param.clone(), StoredState::zeros(n, true), StoredState::zeros(n, true));
    for (k, g) in grads.iter().enumerate() {
        let narrowed: Vec<f64> = g.iter().map(|&x| f64::from(x as f32)).collect();
        bnb_adam8bit_step(&config, k as u64 + 1, &mut want, &narrowed, &mut m, &mut v)
            .unwrap_or_else(|e| panic!("{e}"));
        want = want.iter().map(|&x| f64::from(x as f32)).collect();
    }
    let ways = [Requantize::Table, Requantize::Arithmetic];
    let mut by_table = Vec::new();
    for (serial, requantize) in [false, true].into_iter().flat_map(|s| ways.map(|r| (s, r))) {
        let what = format!("serial {serial} {requantize:?}");
        let opt = run_adam_8bit(&ctx, adam.into(), &param, &grads, (serial, requantize), &want);
        for (kind, want) in [(StateKind::ExpAvg, &m), (StateKind::ExpAvgSq, &v)] {
            let got = opt.state(0, kind).map(|s| s.and_then(|v| v.q8())).unwrap_or_else(|e| panic!("{e}"));
            match requantize {
                Requantize::Table => by_table.push(got.clone()),
                Requantize::Arithmetic => {
                    assert!(by_table.remove(0) == got, "{what} {kind:?}: not the table's state")
                }
            }
            let (
                Some(StoredState::Q8 { codes, absmax }),
                StoredState::Q8 { codes: w_codes, absmax: w_absmax },
            ) = (got, want)
            else {
                panic!("{what}: {kind:?} is not 8-bit");
            };
            let differing = codes.iter().zip(w_codes).filter(|(a, b)| a != b).count();
            let furthest = codes.iter().zip(w_codes).map(|(a, b)| a.abs_diff(*b)).max().unwrap_or(0);
            assert!(furthest <= 1 && differing * 100 <= n, "{what} {kind:?}: {differing} codes differ");
            for (a, b) in absmax.iter().zip(w_absmax) {
                assert!((a - b).abs() <= 1e-4 * b.abs(), "{what} {kind:?}: absmax {a} against {b}");
            }
        }
    }
}

/// A family of four states (Adan, the most any keeps: every lane of a segment's words) on
/// both owners of a block, each finding codes by a table and by arithmetic, over a tensor
/// that ends in a partial block and a word of fewer than four codes: every way stores the
/// CPU backend's codes and absmax bit for bit (`tests/integration/adan.rs` holds the CPU and the
/// default way against the oracle), and its parameters.
#[cfg(feature = "cpu")]
#[test]
fn a_four_state_family_stores_the_cpus_state_in_every_way() {
    use crate::cpu::{CpuOptimizer, HostTensor};
    let ctx = GpuContext::headless_blocking().unwrap_or_else(|e| panic!("{e}"));
    let n = 5000 + 3;
    let param: Vec<f64> = (0..n).map(|i| ((i * 7919) % 1000) as f64 * 1e-3 - 0.5).collect();
    let grads: Vec<Vec<f64>> = (0..3)
        .map(|k| (0..n).map(|i| ((i * 104_729 + k * 31) % 997) as f64 * 1e-4 - 0.05).collect())
        .collect();
    let adan: Algorithm = crate::Adan { lr: 1e-2, weight_decay: 0.1, ..crate::Adan::default() }.into();
    let host = |values: &[f64]| HostTensor::from_f64(DType::F32, values).unwrap_or_else(|e| panic!("{e}"));
    let mut cpu_param = host(&param);
    let storage = StateStorage::Q8(Q8States::default());
    let mut cpu = CpuOptimizer::builder()
        .state_storage(storage)
        .build(adan, &[cpu_param.as_slice()])
        .unwrap_or_else(|e| panic!("{e}"));
    for g in &grads {
        let g = host(g);
        cpu.step(&mut [cpu_param.as_mut_slice()], &[g.as_slice()]).unwrap_or_else(|e| panic!("{e}"));
    }
    let want = cpu_param.to_f64();
    let ways = [Requantize::Table, Requantize::Arithmetic];
    for (serial, requantize) in [false, true].into_iter().flat_map(|s| ways.map(|r| (s, r))) {
        let what = format!("serial {serial} {requantize:?}");
        let opt = run_adam_8bit(&ctx, adan, &param, &grads, (serial, requantize), &want);
        for kind in adan.state_kinds() {
            let got = opt.state(0, *kind).map(|s| s.and_then(|v| v.q8())).unwrap_or_else(|e| panic!("{e}"));
            let want = cpu.state(0, *kind).and_then(|s| s.q8());
            assert!(matches!(got, Some(StoredState::Q8 { .. })), "{what}: {kind:?} is not 8-bit");
            assert!(got.as_ref() == want, "{what} {kind:?}: not the CPU's state");
        }
    }
}

/// The code of 0 in the map of `kind` (the signed map's is not its first code).
fn zero_code(kind: StateKind) -> u8 {
    let map = crate::q8::map_for(kind);
    map.iter().position(|&c| c == 0.0).unwrap_or_else(|| panic!("no 0 in the map")) as u8
}

/// One NaN or infinite gradient element with 8-bit state changes its own element only: Adam
/// and AdEMAMix (bitsandbytes' 2-state kernel) leave its parameter as it was and restart
/// its states from 0; SGD with momentum, Lion and RMSprop step it (its parameter goes
/// non-finite as with f32 state, but Lion's, whose sign of NaN is 0) and store its
/// non-finite states as the code of 0, which its block's absmax leaves out. So the block's
/// 255 other elements and the next step follow the oracle; for every 8-bit algorithm, NaN,
/// +inf and -inf, and both owners of a block.
#[test]
fn a_non_finite_gradient_element_changes_only_its_own_element() {
    use wgpu_optim_testkit::compare::{assert_close, compare_codes, Tolerance};
    let ctx = GpuContext::headless_blocking().unwrap_or_else(|e| panic!("{e}"));
    // Four blocks, the last partial; the bad element in the second.
    let (n, bad) = (1000usize, 300usize);
    let config = Q8States { min_8bit_size: 256 };
    let algorithms: [Algorithm; 6] = [
        Adam { lr: 1e-2, ..Adam::default() }.into(),
        Adam { lr: 1e-2, weight_decay: 0.1, decoupled_weight_decay: true, ..Adam::default() }.into(),
        Sgd { lr: 1e-2, momentum: 0.9, ..Sgd::default() }.into(),
        crate::Lion { lr: 1e-3, weight_decay: 0.1, ..crate::Lion::default() }.into(),
        crate::RmsProp { lr: 1e-3, ..crate::RmsProp::default() }.into(),
        crate::AdEMAMix { weight_decay: 0.1, ..crate::AdEMAMix::default() }.into(),
    ];
    let initial: Vec<f64> = (0..n).map(|i| ((i * 7919) % 1000) as f64 * 1e-3 - 0.5).collect();
    for algorithm in algorithms {
        let kinds = algorithm.state_kinds();
        for bad_value in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            // A good step, the bad one, and a good one after it.
            let grads: Vec<Vec<f64>> = (0..3)
                .map(|k| {
                    let mut g: Vec<f64> = (0..n)
                        .map(|i| f64::from((((i * 104_729 + k * 31) % 997) as f64 * 1e-4 - 0.05) as f32))
                        .collect();
                    if k == 1 {
                        g[bad] = bad_value;
                    }
                    g
                })
                .collect();
            let mut want = initial.clone();
            let mut states: Vec<StoredState> = kinds.iter().map(|_| StoredState::zeros(n, true)).collect();
            let mut after: Vec<(Vec<f64>, Vec<StoredState>)> = Vec::new();
            for (k, g) in grads.iter().enumerate() {
                bnb_8bit_step(&algorithm, k as u64 + 1, &mut want, g, &mut states)
                    .unwrap_or_else(|e| panic!("{e}"));
                after.push((want.clone(), states.clone()));
            }
            for serial in [false, true] {
                let what = format!("{algorithm:?}, gradient {bad_value}, serial {serial}");
                let p = ctx.upload("param", &initial, DType::F32);
                let g = ctx.zeros("grad", n as u64, DType::F32);
                let options = Optimizer::builder().state_storage(StateStorage::Q8(config));
                let mut opt = options
                    .build(&ctx, algorithm, std::slice::from_ref(&p))
                    .unwrap_or_else(|e| panic!("{e}"));
                if let Some(engine) = opt.q8_engine_mut() {
                    engine.set_serial(serial);
                }
                for (k, (grad, (want, want_states))) in grads.iter().zip(&after).enumerate() {
                    let what = format!("{what}, after step {}", k + 1);
                    ctx.write(&g, grad).unwrap_or_else(|e| panic!("{e}"));
                    opt.step(std::slice::from_ref(&g)).unwrap_or_else(|e| panic!("{e}"));
                    let got = ctx.read(&p).unwrap_or_else(|e| panic!("{e}"));
                    let non_finite: Vec<usize> = (0..n).filter(|&i| !got[i].is_finite()).collect();
                    let expected: Vec<usize> = (0..n).filter(|&i| !want[i].is_finite()).collect();
                    assert_eq!(non_finite, expected, "{what}: non-finite parameters");
                    assert!(expected.iter().all(|&i| i == bad), "{what}: the oracle's {expected:?}");
                    if k == 1
                        && crate::q8::restarts_non_finite(&crate::q8::kernel_step(&algorithm, 1).switches())
                    {
                        assert_eq!(got[bad], after[0].0[bad] as f32 as f64, "{what}: the parameter kept");
                    }
                    let tolerance = Tolerance::Close { rtol: 0.0, atol: 1e-4 };
                    assert_close(&format!("{what}: parameters"), &got, want, tolerance);
                    for (kind, want) in kinds.iter().zip(want_states) {
                        let what = format!("{what}: {kind:?}");
                        let Some(StoredState::Q8 { codes, absmax }) = opt
                            .state(0, *kind)
                            .map(|s| s.and_then(|v| v.q8()))
                            .unwrap_or_else(|e| panic!("{e}"))
                        else {
                            panic!("{what} is not 8-bit");
                        };
                        assert!(absmax.iter().all(|a| a.is_finite()), "{what}: absmax {absmax:?}");
                        if k == 1 {
                            assert_eq!(codes[bad], zero_code(*kind), "{what}: the bad element's code");
                        }
                        let StoredState::Q8 { codes: want_codes, absmax: want_absmax } = want else {
                            panic!("{what}: the oracle's state is not 8-bit");
                        };
                        let widen = |c: &[u8]| c.iter().map(|&c| f64::from(c)).collect::<Vec<_>>();
                        let codes_match = compare_codes(&widen(&codes), &widen(want_codes));
                        assert!(codes_match.passed(), "{what}: codes {codes_match}");
                        let widen = |a: &[f32]| a.iter().map(|&a| f64::from(a)).collect::<Vec<_>>();
                        let absmax_tolerance = Tolerance::Close { rtol: 1e-4, atol: 0.0 };
                        assert_close(&what, &widen(&absmax), &widen(want_absmax), absmax_tolerance);
                    }
                }
            }
        }
    }
}

/// An 8-bit Adam state larger than a storage binding (64 KiB here; 40000 elements keep
/// 81 KB of codes and absmax) is cut into chunks of whole blocks, each in an arena of its
/// own: the tensor steps as the oracle does, and `state` and `set_state` see
/// the whole tensor's state across the chunks.
#[test]
fn an_8bit_state_larger_than_a_binding_is_cut_into_chunks() {
    let ctx = ctx_with_64k_bindings();
    let n = 40_000usize;
    let adam: Algorithm =
        Adam { lr: 1e-2, weight_decay: 0.1, decoupled_weight_decay: true, ..Adam::default() }.into();
    let initial: Vec<f64> = (0..n).map(|i| ((i * 7919) % 1000) as f64 * 1e-3 - 0.5).collect();
    let grads: Vec<Vec<f64>> = (0..2)
        .map(|k| {
            (0..n).map(|i| f64::from((((i * 104_729 + k * 31) % 997) as f64 * 1e-4 - 0.05) as f32)).collect()
        })
        .collect();
    let mut want = initial.clone();
    let mut states = [StoredState::zeros(n, true), StoredState::zeros(n, true)];
    for (k, g) in grads.iter().enumerate() {
        bnb_8bit_step(&adam, k as u64 + 1, &mut want, g, &mut states).unwrap_or_else(|e| panic!("{e}"));
    }
    for (serial, requantize) in [(false, Requantize::Table), (true, Requantize::Arithmetic)] {
        let opt = run_adam_8bit(&ctx, adam, &initial, &grads, (serial, requantize), &want);
        for (kind, want) in [StateKind::ExpAvg, StateKind::ExpAvgSq].iter().zip(&states) {
            let got = opt.state(0, *kind).map(|s| s.and_then(|v| v.q8())).unwrap_or_else(|e| panic!("{e}"));
            assert_state_follows(&format!("serial {serial}: {kind:?}"), got, want);
        }
        // A state of distinct codes and absmax, written and read back whole.
        let written = StoredState::Q8 {
            codes: (0..n).map(|i| (i * 7 % 256) as u8).collect(),
            absmax: (0..crate::q8::blocks(n)).map(|b| b as f32 + 0.5).collect(),
        };
        opt.set_state(0, StateKind::ExpAvgSq, &QuantizedState::Q8(written.clone()))
            .unwrap_or_else(|e| panic!("{e}"));
        let back = opt
            .state(0, StateKind::ExpAvgSq)
            .map(|s| s.and_then(|v| v.q8()))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back.as_ref(), Some(&written), "serial {serial}: the state written, read back");
        let other =
            opt.state(0, StateKind::ExpAvg).map(|s| s.and_then(|v| v.q8())).unwrap_or_else(|e| panic!("{e}"));
        assert_state_follows(&format!("serial {serial}: ExpAvg after the write"), other, &states[0]);
    }
}
