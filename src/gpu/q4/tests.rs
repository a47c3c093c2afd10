//! The 4-bit kernels against the oracle: both entry points (a workgroup per group of blocks,
//! an invocation per block) on whatever adapter runs the tests, several block sizes, several
//! tensors in one dispatch, and a binding small enough that tensors are cut into chunks.

use crate::oracle::ao4;
use crate::q4::{Q4State, Q4States};
use crate::{Adam, DType, GpuContext, Optimizer, StateKind, StateStorage, Tensor};

fn values(n: usize, seed: u64, scale: f64) -> Vec<f64> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(1);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 40) as f64 / (1u64 << 24) as f64 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// Runs `steps` steps on `ctx` with the chosen kernel and checks every tensor against the
/// oracle: parameters within 1e-5, codes equal but for at most 0.5 % one code apart (near
/// ties), scales within 1e-5, f32 states within 1e-5.
fn check(ctx: &GpuContext, serial: bool, block_size: usize, sizes: &[usize]) {
    let config = Q4States { block_size, min_size: 1024 };
    let adamw = Adam { lr: 1e-2, weight_decay: 0.1, ..Adam::adamw() };
    let params: Vec<Vec<f64>> = sizes.iter().enumerate().map(|(i, &n)| values(n, i as u64, 1.0)).collect();
    let tensors: Vec<Tensor> = params.iter().map(|p| ctx.upload("p", p, DType::F32)).collect();
    let grads: Vec<Tensor> = sizes.iter().map(|&n| ctx.zeros("g", n as u64, DType::F32)).collect();
    let mut opt = Optimizer::builder()
        .state_storage(StateStorage::Q4(config))
        .build(ctx, adamw, &tensors)
        .unwrap_or_else(|e| panic!("{e}"));
    opt.q4_engine_mut().unwrap_or_else(|| panic!("no engine")).set_serial(serial);
    let mut want: Vec<(Vec<f64>, Q4State, Q4State)> = params
        .iter()
        .map(|p| {
            let zeros = || ao4::zeros(p.len(), block_size, 1024);
            (p.iter().map(|&v| f64::from(v as f32)).collect(), zeros(), zeros())
        })
        .collect();
    for t in 1..=3u64 {
        for (i, g) in grads.iter().enumerate() {
            let values = values(sizes[i], 100 * t + i as u64, 0.1);
            ctx.write(g, &values).unwrap_or_else(|e| panic!("{e}"));
            let values: Vec<f64> = values.iter().map(|&v| f64::from(v as f32)).collect();
            let (p, m, v) = &mut want[i];
            ao4::ao4_adam_step(&adamw, t, block_size, p, &values, m, v).unwrap_or_else(|e| panic!("{e}"));
        }
        opt.step(&grads).unwrap_or_else(|e| panic!("{e}"));
    }
    let what = format!("serial {serial}, block {block_size}");
    for (i, (p, m, v)) in want.iter().enumerate() {
        let got = ctx.read(&tensors[i]).unwrap_or_else(|e| panic!("{e}"));
        for (j, (a, b)) in got.iter().zip(p).enumerate() {
            assert!((a - b).abs() <= 1e-6 + 1e-5 * b.abs(), "{what} tensor {i} param[{j}]: {a} against {b}");
        }
        for (kind, want) in [(StateKind::ExpAvg, m), (StateKind::ExpAvgSq, v)] {
            let state = opt.state(i, kind).map(|s| s.and_then(|v| v.q4())).unwrap_or_else(|e| panic!("{e}"));
            match (state, want) {
                (Some(Q4State::Q4 { codes, scale }), Q4State::Q4 { codes: w_codes, scale: w_scale }) => {
                    let (codes, w_codes) = (ao4::unpack(&codes), ao4::unpack(w_codes));
                    let differing = codes.iter().zip(&w_codes).filter(|(a, b)| a != b).count();
                    let furthest = codes.iter().zip(&w_codes).map(|(a, b)| a.abs_diff(*b)).max().unwrap_or(0);
                    assert!(
                        codes.len() == w_codes.len() && furthest <= 1 && differing * 200 <= codes.len(),
                        "{what} tensor {i} {kind:?}: {differing} codes differ, by up to {furthest}"
                    );
                    for (a, b) in scale.iter().zip(w_scale) {
                        assert!(
                            (a - b).abs() <= 1e-5 * b.abs(),
                            "{what} tensor {i} {kind:?}: scale {a} against {b}"
                        );
                    }
                }
                (Some(Q4State::F32(values)), Q4State::F32(w_values)) => {
                    for (a, b) in values.iter().zip(w_values) {
                        assert!(
                            (a - b).abs() <= 1e-6 + 1e-5 * b.abs(),
                            "{what} tensor {i} {kind:?}: {a} against {b}"
                        );
                    }
                }
                (got, _) => panic!("{what} tensor {i} {kind:?}: stored as {got:?}, not as the oracle's"),
            }
        }
    }
}

#[test]
fn both_kernels_follow_the_oracle_at_every_block_size() {
    let ctx = GpuContext::headless_blocking().unwrap_or_else(|e| panic!("{e}"));
    for serial in [false, true] {
        // 8: one word a block, eight blocks a workgroup; 128: torchao's; 256: the largest.
        for (block, sizes) in
            [(8, &[1024usize, 1032, 500][..]), (128, &[2048, 1024 + 128, 7]), (256, &[4096, 100])]
        {
            check(&ctx, serial, block, sizes);
        }
    }
}

/// A device whose storage bindings hold 16 KiB: a tensor's states fill several arenas and
/// its parameters several bindings; every chunk still follows the oracle.
#[test]
fn tensors_past_a_small_binding_limit_are_cut_into_chunks() {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = pollster::block_on(wgpu::util::initialize_adapter_from_env_or_default(&instance, None))
        .unwrap_or_else(|e| panic!("{e}"));
    let limits = wgpu::Limits { max_storage_buffer_binding_size: 16 << 10, ..wgpu::Limits::default() };
    let descriptor = wgpu::DeviceDescriptor { required_limits: limits, ..Default::default() };
    let (device, queue) =
        pollster::block_on(adapter.request_device(&descriptor)).unwrap_or_else(|e| panic!("{e}"));
    let ctx = GpuContext::from_device(device, queue);
    for serial in [false, true] {
        check(&ctx, serial, 128, &[20_480, 1024, 300]);
    }
}
