//! Muon (`torch.optim.Muon`): its public vectors on every backend, the refusals, 16-bit
//! parameters and groups against the oracle, and the WGSL matrix product against an f64 one.

use crate::common;

use std::path::PathBuf;

use wgpu_optim_testkit::conformance::{run_case, Backend, Case, Outcome};

fn vector(name: &str) -> Case {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors").join(name);
    Case::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

const VECTORS: [&str; 2] = ["muon_bf16_rms.safetensors", "muon_f32_tall.safetensors"];

fn passes(case: &Case, backend: Backend) {
    let gpu = matches!(backend, Backend::GpuInPlace | Backend::GpuOutOfPlace);
    let _turn = gpu.then(common::gpu_turn);
    let ctx = gpu.then(common::ctx);
    let report = run_case(case, backend, ctx.as_ref()).unwrap_or_else(|e| panic!("{}: {e}", case.name));
    match report.outcome {
        Outcome::Pass => {}
        other => panic!("{} on {}: {other:?}", case.name, backend.name()),
    }
}

#[test]
fn the_public_vectors_pass_on_the_oracle() {
    for name in VECTORS {
        passes(&vector(name), Backend::Oracle);
    }
}

#[test]
fn the_public_vectors_pass_on_the_cpu_backend() {
    for name in VECTORS {
        passes(&vector(name), Backend::Cpu);
    }
}

#[test]
fn the_public_vectors_pass_on_the_gpu_in_place_and_out_of_place() {
    for name in VECTORS {
        passes(&vector(name), Backend::GpuInPlace);
        passes(&vector(name), Backend::GpuOutOfPlace);
    }
}

/// `a` (`n` x `k`) times `b` (`k` x `m`), row-major, in f64.
fn product_f64(a: &[f64], b: &[f64], n: usize, k: usize, m: usize) -> Vec<f64> {
    let mut out = vec![0.0; n * m];
    for i in 0..n {
        for p in 0..k {
            for j in 0..m {
                out[i * m + j] += a[i * k + p] * b[p * m + j];
            }
        }
    }
    out
}

#[test]
fn the_wgsl_matmul_matches_an_f64_product_at_odd_sizes_with_a_transposed_operand() {
    use wgpu_optim::matmul::{Matmul, MatrixView, Product};
    let _turn = common::gpu_turn();
    let ctx = common::ctx();
    let mut rng = common::Rng::new(31);
    // Sizes off the 64 x 64 x 16 tiles; a batch of 2; B given as its transpose (k x n
    // stored n x k), read through its strides; C = 0.5 A B + 2 D.
    let (m, n, k, batch) = (67usize, 45usize, 33usize, 2usize);
    let a = rng.vec(batch * m * k, 1.0);
    let bt = rng.vec(batch * n * k, 1.0);
    let d = rng.vec(batch * m * n, 1.0);
    let round = |v: &[f64]| -> Vec<f64> { v.iter().map(|x| f64::from(*x as f32)).collect() };
    let (a, bt, d) = (round(&a), round(&bt), round(&d));
    let mut data = [a.clone(), bt.clone(), d.clone(), vec![0.0; batch * m * n]].concat();
    data.push(0.0);
    let tensor = ctx.upload("data", &data, wgpu_optim::DType::F32);
    let (a_at, b_at, d_at, c_at) =
        (0, batch * m * k, batch * (m * k + n * k), batch * (m * k + n * k + m * n));
    let product = Product {
        batch: batch as u32,
        add: Some((2.0, MatrixView::row_major(d_at as u32, m as u32, n as u32))),
        alpha: 0.5,
        ..Product::plain(
            m as u32,
            n as u32,
            k as u32,
            MatrixView::row_major(a_at as u32, m as u32, k as u32),
            MatrixView::row_major(b_at as u32, n as u32, k as u32).transposed(),
            MatrixView::row_major(c_at as u32, m as u32, n as u32),
        )
    };
    let matmul = Matmul::new(&ctx, &tensor, &[product]).unwrap();
    ctx.submit("matmul", |encoder| {
        matmul.record(encoder);
        Ok(())
    })
    .unwrap();
    let got = ctx.read(&tensor).unwrap();
    for z in 0..batch {
        let az = &a[z * m * k..(z + 1) * m * k];
        let btz = &bt[z * n * k..(z + 1) * n * k];
        let mut b = vec![0.0; k * n];
        for j in 0..n {
            for p in 0..k {
                b[p * n + j] = btz[j * k + p];
            }
        }
        let ab = product_f64(az, &b, m, k, n);
        for e in 0..m * n {
            let want = 0.5 * ab[e] + 2.0 * d[z * m * n + e];
            let got = got[c_at + z * m * n + e];
            assert!(
                (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "matrix {z} element {e}: {got} != {want}"
            );
        }
    }
    // Nothing past the output was written.
    assert_eq!(got[data.len() - 1], 0.0);
    assert_eq!(&got[..c_at], &data[..c_at]);
}

/// Operands stored as bfloat16 or f16 give the products of the same values stored as f32,
/// bit for bit (the kernel widens them exactly and accumulates in f32 alike), a 16-bit
/// output rounded to nearest even: at sizes off the tiles, with a transposed operand, an
/// added D and a batch of two.
#[test]
fn sixteen_bit_operands_give_the_products_of_f32_operands_bit_for_bit() {
    use half::{bf16, f16};
    use wgpu_optim::matmul::{Matmul, MatrixView, Product};
    use wgpu_optim::DType;
    let _turn = common::gpu_turn();
    let ctx = common::ctx();
    let (m, n, k, batch) = (67u32, 46u32, 33u32, 2u32);
    let sizes = [batch * m * k, batch * n * k, batch * m * n, batch * m * n];
    for (dtype, round_bf16) in [(DType::BF16, true), (DType::BF16, false), (DType::F16, false)] {
        let mut rng = common::Rng::new(47);
        // Values the 16-bit type holds exactly, so that both storages hold the same ones.
        let exact = |x: f64| match dtype {
            DType::BF16 => bf16::from_f64(x).to_f32(),
            _ => f16::from_f64(x).to_f32(),
        };
        let [a, bt, d, _] =
            sizes.map(|len| rng.vec(len as usize, 1.0).into_iter().map(exact).collect::<Vec<_>>());
        // A, Bᵀ, D, C back to back, in f32 or in `dtype`.
        let offsets = [0, sizes[0], sizes[0] + sizes[1], sizes[0] + sizes[1] + sizes[2]];
        let product = |storage: DType| Product {
            batch,
            add: Some((2.0, MatrixView::row_major(offsets[2], m, n).stored_as(storage))),
            alpha: 0.5,
            round_bf16,
            ..Product::plain(
                m,
                n,
                k,
                MatrixView::row_major(offsets[0], m, k).stored_as(storage),
                MatrixView::row_major(offsets[1], n, k).transposed().stored_as(storage),
                MatrixView::row_major(offsets[3], m, n).stored_as(storage),
            )
        };
        let c_len = sizes[3] as usize;
        let run = |storage: DType, bytes: Vec<u8>| -> Vec<u8> {
            let data = ctx.upload_bytes("data", &bytes, DType::F32);
            let matmul = Matmul::new(&ctx, &data, &[product(storage)]).unwrap();
            ctx.submit("matmul", |encoder| {
                matmul.record(encoder);
                Ok(())
            })
            .unwrap();
            let got = ctx.read_bytes(&data).unwrap();
            let at = offsets[3] as usize * storage.size() as usize;
            got[at..at + c_len * storage.size() as usize].to_vec()
        };
        let values = [a.clone(), bt.clone(), d.clone(), vec![0.0; c_len]].concat();
        let f32_bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let half_bytes: Vec<u8> = values
            .iter()
            .flat_map(|&v| match dtype {
                DType::BF16 => bf16::from_f32(v).to_le_bytes(),
                _ => f16::from_f32(v).to_le_bytes(),
            })
            .collect();
        let wide: Vec<f32> = run(DType::F32, f32_bytes)
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let narrow = run(dtype, half_bytes);
        for (e, (got, want)) in narrow.chunks_exact(2).zip(&wide).enumerate() {
            let want = match dtype {
                DType::BF16 => bf16::from_f32(*want).to_bits(),
                _ => f16::from_f32(*want).to_bits(),
            };
            assert_eq!(u16::from_le_bytes([got[0], got[1]]), want, "{dtype:?} element {e} ({round_bf16})");
        }
        // The f32 run itself against f64 (the products are the earlier test's, in f32).
        let first = (0..k as usize).map(|p| f64::from(a[p]) * f64::from(bt[p])).sum::<f64>();
        let first = 0.5 * first + 2.0 * f64::from(d[0]);
        let tolerance = if round_bf16 { 1e-2 } else { 1e-5 };
        assert!(
            (f64::from(wide[0]) - first).abs() <= tolerance * (1.0 + first.abs()),
            "{} != {first}",
            wide[0]
        );
    }
}

use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostTensor};
use wgpu_optim::{Adam, DType, Error, Muon, NsPrecision, Optimizer, ParamGroup, StateKind, StateStorage};
use wgpu_optim_testkit::oracle::{muon_step, torch_adam_step, Storage, ToOracle, TorchAdamState};

/// A GPU build with `shapes` refused as `check` expects, the parameter unchanged.
fn gpu_refuses(algorithm: Muon, len: usize, shapes: Vec<Vec<usize>>, check: impl Fn(&Error)) {
    let _turn = common::gpu_turn();
    let ctx = common::ctx();
    let values = common::Rng::new(7).vec(len, 1.0);
    let param = ctx.upload("p", &values, DType::F32);
    let err = Optimizer::builder()
        .param_shapes(shapes)
        .build(&ctx, algorithm, std::slice::from_ref(&param))
        .unwrap_err();
    check(&err);
    assert_eq!(ctx.read(&param).unwrap(), values, "a refused build changed the parameter");
}

/// The same on the CPU backend.
fn cpu_refuses(algorithm: Muon, len: usize, shapes: Vec<Vec<usize>>, check: impl Fn(&Error)) {
    let values: Vec<f32> = common::to_f32(&common::Rng::new(7).vec(len, 1.0));
    let err = CpuOptimizer::builder()
        .param_shapes(shapes)
        .build(algorithm, &[HostSlice::from(&values[..])])
        .unwrap_err();
    check(&err);
}

fn bad_shape(expected_shape: Vec<usize>) -> impl Fn(&Error) {
    move |err| match err {
        Error::BadShape { param: 0, shape, algorithm: "Muon", .. } => assert_eq!(*shape, expected_shape),
        other => panic!("expected BadShape, got {other:?}"),
    }
}

#[test]
fn muon_refuses_1d_and_3d_parameters_by_shape_on_both_backends() {
    gpu_refuses(Muon::default(), 24, vec![vec![24]], bad_shape(vec![24]));
    gpu_refuses(Muon::default(), 24, vec![vec![2, 3, 4]], bad_shape(vec![2, 3, 4]));
    cpu_refuses(Muon::default(), 24, vec![vec![24]], bad_shape(vec![24]));
    cpu_refuses(Muon::default(), 24, vec![vec![2, 3, 4]], bad_shape(vec![2, 3, 4]));
}

#[test]
fn muon_without_shapes_needs_the_param_shapes_option() {
    let needs = |err: &Error| match err {
        Error::NeedsOption { option: "param_shapes", what } => assert_eq!(what, "Muon"),
        other => panic!("expected NeedsOption, got {other:?}"),
    };
    gpu_refuses(Muon::default(), 24, Vec::new(), needs);
    cpu_refuses(Muon::default(), 24, Vec::new(), needs);
}

#[test]
fn muon_refuses_zero_newton_schulz_steps() {
    let config = Muon { ns_steps: 0, ..Muon::default() };
    let refused = |err: &Error| match err {
        Error::BadHyperparameter { name: "ns_steps", .. } => {}
        other => panic!("expected BadHyperparameter ns_steps, got {other:?}"),
    };
    gpu_refuses(config, 24, vec![vec![4, 6]], refused);
    cpu_refuses(config, 24, vec![vec![4, 6]], refused);
    assert!(wgpu_optim::Algorithm::from(config).validate().is_err());
}

#[test]
fn muon_refuses_clipping_capturable_and_8bit_state() {
    let _turn = common::gpu_turn();
    let ctx = common::ctx();
    let param = ctx.upload("p", &[0.5; 24], DType::F32);
    let shapes = vec![vec![4, 6]];
    let params = std::slice::from_ref(&param);
    let clip = wgpu_optim::GradClip::l2(1.0);
    for builder in [
        Optimizer::builder().param_shapes(shapes.clone()).grad_clip(clip),
        Optimizer::builder().param_shapes(shapes.clone()).capturable(true),
        Optimizer::builder()
            .param_shapes(shapes.clone())
            .state_storage(StateStorage::Q8(wgpu_optim::q8::Q8States::default())),
    ] {
        match builder.build(&ctx, Muon::default(), params) {
            Err(Error::ConflictingOptions { .. }) => {}
            other => panic!("expected ConflictingOptions, got {other:?}"),
        }
    }
}

/// The oracle's Muon trajectory of one matrix, each step's parameter and buffer rounded to
/// `dtype` as the optimizer stores them.
fn oracle_trajectory(
    config: &Muon,
    p0: &[f64],
    grads: &[Vec<f64>],
    shape: (usize, usize),
    dtype: DType,
) -> Vec<f64> {
    let round = |v: &mut [f64]| v.iter_mut().for_each(|x| *x = dtype.to_oracle().round(*x));
    let mut p = p0.to_vec();
    let mut buf = vec![0.0; p.len()];
    for g in grads {
        muon_step(&config.to_oracle(), &mut p, g, &mut buf, shape.0, shape.1);
        round(&mut p);
        round(&mut buf);
    }
    p
}

fn close(got: &[f64], want: &[f64], rtol: f64, atol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (e, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= atol + rtol * w.abs(), "{what}: element {e}: got {g}, want {w}");
    }
}

/// 16-bit parameters with either Newton-Schulz precision: a matrix of even sides (whose X, M
/// and N the GPU keeps in bfloat16 in bfloat16 mode) and one of odd sides (kept in f32).
#[test]
fn muon_on_f16_and_bf16_parameters_follows_the_oracle_on_both_backends() {
    let _turn = common::gpu_turn();
    let ctx = common::ctx();
    let mut rng = common::Rng::new(11);
    for (dtype, shape) in [(DType::F16, (24, 10)), (DType::BF16, (24, 10)), (DType::BF16, (9, 17))] {
        let len = shape.0 * shape.1;
        for precision in [NsPrecision::BF16, NsPrecision::F32] {
            let config = Muon { lr: 0.02, ns_precision: precision, ..Muon::default() };
            let p0: Vec<f64> = rng.vec(len, 1.0).into_iter().map(|v| dtype.to_oracle().round(v)).collect();
            let grads: Vec<Vec<f64>> = (0..3)
                .map(|_| rng.vec(len, 0.1).into_iter().map(|v| dtype.to_oracle().round(v)).collect())
                .collect();
            let want = oracle_trajectory(&config, &p0, &grads, shape, dtype);
            // One storage ulp of the parameter (a value near a rounding tie may land on
            // either side) plus bfloat16 Newton-Schulz's tolerance of the vectors.
            let (rtol, atol) = (8e-3, 2e-3);
            let param = ctx.upload("p", &p0, dtype);
            let grad = ctx.zeros("g", len as u64, dtype);
            let mut opt = Optimizer::builder()
                .param_shapes(vec![vec![shape.0, shape.1]])
                .build(&ctx, config, std::slice::from_ref(&param))
                .unwrap();
            for g in &grads {
                ctx.write(&grad, g).unwrap();
                opt.step(std::slice::from_ref(&grad)).unwrap();
            }
            close(&ctx.read(&param).unwrap(), &want, rtol, atol, &format!("GPU {dtype:?} {precision:?}"));
            let mut host = HostTensor::from_f64(dtype, &p0).unwrap();
            let mut cpu = CpuOptimizer::builder()
                .param_shapes(vec![vec![shape.0, shape.1]])
                .build(config, &[host.as_slice()])
                .unwrap();
            for g in &grads {
                let g = HostTensor::from_f64(dtype, g).unwrap();
                cpu.step(&mut [host.as_mut_slice()], &[g.as_slice()]).unwrap();
            }
            close(&host.to_f64(), &want, rtol, atol, &format!("CPU {dtype:?} {precision:?}"));
            assert!(cpu.state(0, StateKind::MomentumBuffer).is_some());
        }
    }
}

#[test]
fn a_muon_group_beside_an_adamw_group_follows_the_oracle() {
    let _turn = common::gpu_turn();
    let ctx = common::ctx();
    let mut rng = common::Rng::new(5);
    // Two matrices of one shape (one batch), one of another (tall), and a bias for AdamW.
    let shapes = vec![vec![12, 20], vec![12, 20], vec![30, 8], vec![20]];
    let lens: Vec<usize> = shapes.iter().map(|s| s.iter().product()).collect();
    let p0: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grads: Vec<Vec<Vec<f64>>> = (0..3).map(|_| lens.iter().map(|&n| rng.vec(n, 0.1)).collect()).collect();
    let muon = Muon { lr: 0.02, nesterov: false, ns_precision: NsPrecision::F32, ..Muon::default() };
    let adamw = Adam { lr: 0.01, ..Adam::adamw() };
    let params: Vec<_> = p0.iter().map(|v| ctx.upload("p", v, DType::F32)).collect();
    let grad_tensors: Vec<_> = lens.iter().map(|&n| ctx.zeros("g", n as u64, DType::F32)).collect();
    let mut opt = Optimizer::builder()
        .param_shapes(shapes.clone())
        .build_groups(&ctx, vec![ParamGroup::new(muon, &params[..3]), ParamGroup::new(adamw, &params[3..])])
        .unwrap();
    let mut want = p0.clone();
    let mut buffers: Vec<Vec<f64>> = lens.iter().map(|&n| vec![0.0; n]).collect();
    let mut adam_state =
        TorchAdamState { exp_avg: vec![0.0; lens[3]], exp_avg_sq: vec![0.0; lens[3]], ..Default::default() };
    for step in &grads {
        for (t, g) in grad_tensors.iter().zip(step) {
            ctx.write(t, g).unwrap();
        }
        opt.step(&grad_tensors).unwrap();
        for i in 0..3 {
            muon_step(&muon.to_oracle(), &mut want[i], &step[i], &mut buffers[i], shapes[i][0], shapes[i][1]);
        }
        torch_adam_step(&adamw.to_oracle(), &mut want[3], &step[3], &mut adam_state);
    }
    for (i, p) in params.iter().enumerate() {
        close(&ctx.read(p).unwrap(), &want[i], 1e-4, 1e-5, &format!("param {i}"));
        let buffer = ctx
            .read(opt.state(i, StateKind::MomentumBuffer).unwrap().and_then(|s| s.dense()).unwrap_or(p))
            .unwrap();
        if i < 3 {
            close(&buffer, &buffers[i], 1e-5, 1e-6, &format!("momentum_buffer {i}"));
        }
    }
    // A group moves between Muon and another algorithm only in a new optimizer.
    assert!(matches!(
        opt.set_group_algorithm(0, wgpu_optim::Sgd { momentum: 0.9, ..Default::default() }),
        Err(Error::ConflictingOptions { .. })
    ));
}

/// Matrices larger than the CPU backend's matrix products' blocks, wide and tall: the
/// bfloat16 Newton-Schulz follows the oracle within the vectors' tolerance, and gives the
/// same bits on 1, 2 and 3 threads (the products' order of sums does not depend on them).
#[test]
fn cpu_muon_on_matrices_of_several_blocks_follows_the_oracle_on_any_thread_count() {
    let shapes = [(200, 300), (520, 136)];
    let mut rng = common::Rng::new(17);
    let p0: Vec<Vec<f64>> = shapes.iter().map(|&(a, b)| rng.vec(a * b, 1.0)).collect();
    let grads: Vec<Vec<Vec<f64>>> =
        (0..2).map(|_| shapes.iter().map(|&(a, b)| rng.vec(a * b, 0.1)).collect()).collect();
    let config = Muon { lr: 0.02, ..Muon::default() };
    assert_eq!(config.ns_precision, NsPrecision::BF16);
    let run = |threads: usize| -> Vec<Vec<f64>> {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            let mut hosts: Vec<HostTensor> =
                p0.iter().map(|p| HostTensor::from_f64(DType::F32, p).unwrap()).collect();
            let views: Vec<HostSlice<'_>> = hosts.iter().map(HostTensor::as_slice).collect();
            let mut cpu = CpuOptimizer::builder()
                .param_shapes(shapes.iter().map(|&(a, b)| vec![a, b]).collect())
                .build(config, &views)
                .unwrap();
            for step in &grads {
                let g: Vec<HostTensor> =
                    step.iter().map(|g| HostTensor::from_f64(DType::F32, g).unwrap()).collect();
                let g: Vec<HostSlice<'_>> = g.iter().map(HostTensor::as_slice).collect();
                let mut p: Vec<_> = hosts.iter_mut().map(HostTensor::as_mut_slice).collect();
                cpu.step(&mut p, &g).unwrap();
            }
            hosts.iter().map(HostTensor::to_f64).collect()
        })
    };
    let one = run(1);
    for (i, &shape) in shapes.iter().enumerate() {
        let steps: Vec<Vec<f64>> = grads.iter().map(|step| step[i].clone()).collect();
        let want = oracle_trajectory(&config, &p0[i], &steps, shape, DType::F32);
        close(&one[i], &want, 4e-3, 1e-3, &format!("CPU {shape:?}"));
    }
    for threads in [2, 3] {
        assert!(run(threads) == one, "{threads} threads differ from one");
    }
}

/// A Muon group with empty matrices (`[0, 16]`, `[16, 0]`) first, in the middle, last, or
/// only: the GPU runs it as the CPU backend does (within the tolerance of the other
/// two-backend tests), each against the oracle, the empty ones untouched, and no error
/// reaches the device's handler.
#[test]
fn gpu_muon_skips_empty_matrices_in_any_position_as_the_cpu_backend_does() {
    let _turn = common::gpu_turn();
    let (ctx, seen) = common::watched_ctx();
    let layouts: [&[(usize, usize)]; 6] = [
        &[(0, 16), (32, 48), (64, 16)],
        &[(32, 48), (0, 16), (64, 16)],
        &[(32, 48), (64, 16), (0, 16)],
        &[(32, 48), (16, 0), (64, 16), (0, 16)],
        &[(0, 16), (16, 0)],
        &[(0, 16), (0, 16), (32, 48)],
    ];
    for (l, layout) in layouts.iter().enumerate() {
        for precision in [NsPrecision::F32, NsPrecision::BF16] {
            let what = format!("layout {l} {layout:?} {precision:?}");
            let config = Muon { lr: 0.02, ns_precision: precision, ..Muon::default() };
            let shapes: Vec<Vec<usize>> = layout.iter().map(|&(a, b)| vec![a, b]).collect();
            let lens: Vec<usize> = layout.iter().map(|&(a, b)| a * b).collect();
            let mut rng = common::Rng::new(23 + l as u64);
            let p0: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
            let grads: Vec<Vec<Vec<f64>>> =
                (0..3).map(|_| lens.iter().map(|&n| rng.vec(n, 0.1)).collect()).collect();
            let params: Vec<_> = p0.iter().map(|v| ctx.upload("p", v, DType::F32)).collect();
            let grad_tensors: Vec<_> = lens.iter().map(|&n| ctx.zeros("g", n as u64, DType::F32)).collect();
            let mut opt = Optimizer::builder()
                .param_shapes(shapes.clone())
                .build(&ctx, config, &params)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let mut hosts: Vec<HostTensor> =
                p0.iter().map(|p| HostTensor::from_f64(DType::F32, p).unwrap()).collect();
            let views: Vec<HostSlice<'_>> = hosts.iter().map(HostTensor::as_slice).collect();
            let mut cpu = CpuOptimizer::builder().param_shapes(shapes).build(config, &views).unwrap();
            for step in &grads {
                for (t, g) in grad_tensors.iter().zip(step) {
                    ctx.write(t, g).unwrap();
                }
                opt.step(&grad_tensors).unwrap_or_else(|e| panic!("{what}: {e}"));
                let g: Vec<HostTensor> =
                    step.iter().map(|g| HostTensor::from_f64(DType::F32, g).unwrap()).collect();
                let g: Vec<HostSlice<'_>> = g.iter().map(HostTensor::as_slice).collect();
                let mut p: Vec<_> = hosts.iter_mut().map(HostTensor::as_mut_slice).collect();
                cpu.step(&mut p, &g).unwrap();
            }
            assert_eq!(opt.step_count(), 3, "{what}");
            let (rtol, atol) = match precision {
                NsPrecision::F32 => (1e-4, 1e-5),
                _ => (8e-3, 2e-3),
            };
            for (i, &shape) in layout.iter().enumerate() {
                let gpu = ctx.read(&params[i]).unwrap();
                let host = hosts[i].to_f64();
                close(&gpu, &host, rtol, atol, &format!("{what}: param {i} against the CPU backend"));
                let steps: Vec<Vec<f64>> = grads.iter().map(|s| s[i].clone()).collect();
                let want = oracle_trajectory(&config, &p0[i], &steps, shape, DType::F32);
                close(&gpu, &want, rtol, atol, &format!("{what}: param {i} against the oracle"));
                let buffer = ctx
                    .read(opt.state(i, StateKind::MomentumBuffer).unwrap().and_then(|s| s.dense()).unwrap())
                    .unwrap();
                let cpu_buffer =
                    match cpu.state(i, StateKind::MomentumBuffer).and_then(|s| s.dense()).unwrap() {
                        HostSlice::F32(v) => v.iter().map(|x| f64::from(*x)).collect::<Vec<_>>(),
                        other => panic!("{what}: an f32 buffer expected, got {other:?}"),
                    };
                close(&buffer, &cpu_buffer, 1e-5, 1e-6, &format!("{what}: momentum_buffer {i}"));
            }
        }
    }
    common::assert_no_uncaptured(&seen);
}

/// A Muon step whose submission wgpu refuses (a gradient buffer destroyed after the step
/// that bound it) is an error, with the step count, the parameters and the momentum buffers
/// as they were and nothing at the device's handler; the next step runs as the CPU
/// backend's second.
#[test]
fn a_refused_gpu_muon_step_changes_nothing_and_is_not_counted() {
    let _turn = common::gpu_turn();
    let (ctx, seen) = common::watched_ctx();
    let layout = [(32usize, 48usize), (0, 16), (64, 16)];
    let shapes: Vec<Vec<usize>> = layout.iter().map(|&(a, b)| vec![a, b]).collect();
    let lens: Vec<usize> = layout.iter().map(|&(a, b)| a * b).collect();
    let config = Muon { lr: 0.02, ns_precision: NsPrecision::F32, ..Muon::default() };
    let mut rng = common::Rng::new(41);
    let p0: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grads: Vec<Vec<Vec<f64>>> = (0..2).map(|_| lens.iter().map(|&n| rng.vec(n, 0.1)).collect()).collect();
    let params: Vec<_> = p0.iter().map(|v| ctx.upload("p", v, DType::F32)).collect();
    let upload =
        |step: &[Vec<f64>]| -> Vec<_> { step.iter().map(|g| ctx.upload("g", g, DType::F32)).collect() };
    let (first, second) = (upload(&grads[0]), upload(&grads[1]));
    let mut opt = Optimizer::builder().param_shapes(shapes.clone()).build(&ctx, config, &params).unwrap();
    opt.step(&first).unwrap();
    let read_all = |opt: &Optimizer| -> Vec<Vec<f64>> {
        (0..params.len())
            .flat_map(|i| {
                [
                    &params[i],
                    opt.state(i, StateKind::MomentumBuffer).unwrap().and_then(|s| s.dense()).unwrap(),
                ]
            })
            .map(|t| ctx.read(t).unwrap())
            .collect()
    };
    let before = read_all(&opt);
    first[0].buffer.destroy();
    for _ in 0..2 {
        match opt.step(&first) {
            Err(Error::Gpu { .. }) => {}
            other => panic!("expected a GPU error from a destroyed gradient, got {other:?}"),
        }
        assert_eq!(opt.step_count(), 1, "a refused step was counted");
        assert!(read_all(&opt) == before, "a refused step changed a parameter or a buffer");
    }
    opt.step(&second).unwrap();
    assert_eq!(opt.step_count(), 2);
    let mut hosts: Vec<HostTensor> =
        p0.iter().map(|p| HostTensor::from_f64(DType::F32, p).unwrap()).collect();
    let views: Vec<HostSlice<'_>> = hosts.iter().map(HostTensor::as_slice).collect();
    let mut cpu = CpuOptimizer::builder().param_shapes(shapes).build(config, &views).unwrap();
    for step in &grads {
        let g: Vec<HostTensor> = step.iter().map(|g| HostTensor::from_f64(DType::F32, g).unwrap()).collect();
        let g: Vec<HostSlice<'_>> = g.iter().map(HostTensor::as_slice).collect();
        let mut p: Vec<_> = hosts.iter_mut().map(HostTensor::as_mut_slice).collect();
        cpu.step(&mut p, &g).unwrap();
    }
    for (i, host) in hosts.iter().enumerate() {
        close(&ctx.read(&params[i]).unwrap(), &host.to_f64(), 1e-4, 1e-5, &format!("param {i}"));
    }
    common::assert_no_uncaptured(&seen);
}

/// After the first steps, a recorded Muon step (momentum, normalize, Newton-Schulz products,
/// apply) creates no GPU object: every pipeline, scratch buffer and bind group is made when
/// the optimizer is built or a gradient set is first bound. The parameters still follow the
/// oracle.
#[test]
fn a_recorded_muon_step_creates_no_gpu_objects() {
    let _turn = common::gpu_turn();
    // A device of its own: the live counts are per device, and other tests run in parallel.
    let ctx = common::fresh_ctx();
    let shapes = vec![vec![12, 20], vec![30, 8], vec![20]];
    let lens: Vec<usize> = shapes.iter().map(|s| s.iter().product()).collect();
    let mut rng = common::Rng::new(43);
    let p0: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let g: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 0.1)).collect();
    let muon = Muon { lr: 0.02, ns_precision: NsPrecision::F32, ..Muon::default() };
    let adamw = Adam { lr: 0.01, ..Adam::adamw() };
    let params: Vec<_> = p0.iter().map(|v| ctx.upload("p", v, DType::F32)).collect();
    let grads: Vec<_> = g.iter().map(|v| ctx.upload("g", v, DType::F32)).collect();
    let mut opt = Optimizer::builder()
        .param_shapes(shapes.clone())
        .build_groups(&ctx, vec![ParamGroup::new(muon, &params[..2]), ParamGroup::new(adamw, &params[2..])])
        .unwrap();
    let mut record = |steps: usize| {
        let mut encoder = ctx.device().create_command_encoder(&Default::default());
        for _ in 0..steps {
            opt.record_step(&mut encoder, &grads).unwrap();
        }
        encoder
    };
    ctx.queue().submit([record(2).finish()]);
    ctx.device().poll(wgpu::PollType::wait_indefinitely()).unwrap();
    let live = || {
        let c = ctx.device().get_internal_counters().hal;
        [c.buffers.read(), c.bind_groups.read(), c.compute_pipelines.read(), c.shader_modules.read()]
    };
    let before = live();
    // An encoder keeps alive whatever its passes use, so anything a step created would show.
    let encoder = record(2);
    assert_eq!(live(), before, "[buffers, bind groups, pipelines, shader modules] changed");
    ctx.queue().submit([encoder.finish()]);
    let mut want = p0.clone();
    let mut buffers: Vec<Vec<f64>> = lens.iter().map(|&n| vec![0.0; n]).collect();
    let mut adam_state =
        TorchAdamState { exp_avg: vec![0.0; lens[2]], exp_avg_sq: vec![0.0; lens[2]], ..Default::default() };
    for _ in 0..4 {
        for i in 0..2 {
            muon_step(&muon.to_oracle(), &mut want[i], &g[i], &mut buffers[i], shapes[i][0], shapes[i][1]);
        }
        torch_adam_step(&adamw.to_oracle(), &mut want[2], &g[2], &mut adam_state);
    }
    for (i, p) in params.iter().enumerate() {
        close(&ctx.read(p).unwrap(), &want[i], 1e-4, 1e-5, &format!("param {i}"));
    }
}
