//! The crate's GPU tests that make sense in a browser, on the page's WebGPU adapter (in
//! headless Chromium: SwiftShader behind Dawn and Tint, which validate WGSL and limits
//! independently of wgpu and naga). Every readback is awaited: nothing blocks the page.
//!
//! Run with `tools/web-test.sh`. A page without a WebGPU adapter fails every test.

#![cfg(target_arch = "wasm32")]

use std::cell::RefCell;

use wasm_bindgen_test::{wasm_bindgen_test, wasm_bindgen_test_configure};
use wgpu_optim::ops::{self, Update};
use wgpu_optim::q8::{Q8States, StoredState};
use wgpu_optim::{
    Adagrad, Adam, Algorithm, DType, Error, GpuContext, GradClip, NormType, Optimizer, ParamGroup,
    QuantizedState, Rounding, Sgd, StateKind, StateStorage, Tensor,
};
use wgpu_optim_testkit::compare::{assert_close, Tolerance};
use wgpu_optim_testkit::oracle::{self, clip_grad_norm, Storage, ToLibrary, ToOracle, TorchState};

wasm_bindgen_test_configure!(run_in_browser);

thread_local! {
    static CTX: RefCell<Option<GpuContext>> = const { RefCell::new(None) };
}

/// The page's WebGPU context, opened once. No adapter is a test failure.
async fn ctx() -> GpuContext {
    if let Some(ctx) = CTX.with(|c| c.borrow().clone()) {
        return ctx;
    }
    let ctx = GpuContext::headless().await.unwrap_or_else(|e| panic!("the browser tests need WebGPU: {e}"));
    ctx.device().on_uncaptured_error(std::sync::Arc::new(|error| {
        wasm_bindgen_test::console_log!("uncaptured wgpu error: {error}");
    }));
    CTX.with(|c| *c.borrow_mut() = Some(ctx.clone()));
    ctx
}

async fn download(ctx: &GpuContext, t: &Tensor) -> Vec<f64> {
    ctx.read_async(t).await.unwrap_or_else(|e| panic!("{e}"))
}

async fn bytes(ctx: &GpuContext, t: &Tensor) -> Vec<u8> {
    ctx.read_bytes_async(t).await.unwrap_or_else(|e| panic!("{e}"))
}

/// SplitMix64: deterministic test data.
struct Rng(u64);

impl Rng {
    fn uniform(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }

    /// `len` values in [-scale, scale), exact in f32.
    fn vec(&mut self, len: usize, scale: f64) -> Vec<f64> {
        (0..len).map(|_| f64::from((self.uniform() * scale) as f32)).collect()
    }
}

fn algorithms() -> Vec<Algorithm> {
    vec![
        Adam { lr: 1e-2, ..Adam::default() }.into(),
        Adam { lr: 1e-2, weight_decay: 0.1, ..Adam::adamw() }.into(),
        Adam { lr: 1e-2, amsgrad: true, ..Adam::default() }.into(),
        Sgd { lr: 1e-2, momentum: 0.9, ..Sgd::default() }.into(),
        Sgd { lr: 1e-2, momentum: 0.9, nesterov: true, ..Sgd::default() }.into(),
        Adagrad { lr: 1e-2, ..Adagrad::default() }.into(),
    ]
}

/// Parameter, gradient and state dtypes.
const MIXES: [(DType, DType, DType); 5] = [
    (DType::F32, DType::F32, DType::F32),
    (DType::F16, DType::F16, DType::F16),
    (DType::F16, DType::F16, DType::F32),
    (DType::BF16, DType::BF16, DType::BF16),
    (DType::F32, DType::BF16, DType::F16),
];

/// Odd lengths; the last parameter starts at element 1 of its buffer.
const LENGTHS: [usize; 3] = [3, 257, 1001];

/// Steps the stateful optimizer (in place) and checks every step against the oracle resumed
/// from what the GPU stored before it.
async fn check_in_place(
    ctx: &GpuContext,
    algorithm: Algorithm,
    (pd, gd, sd): (DType, DType, DType),
    seed: u64,
) {
    let mut rng = Rng(seed);
    let params: Vec<Tensor> = LENGTHS
        .iter()
        .enumerate()
        .map(|(k, &n)| {
            let shift = usize::from(k + 1 == LENGTHS.len());
            let t = ctx.upload("param", &rng.vec(n + shift, 1.0), pd);
            Tensor { buffer: t.buffer.clone(), offset: shift as u64 * pd.size(), len: n as u64, dtype: pd }
        })
        .collect();
    let grads: Vec<Tensor> = LENGTHS.iter().map(|&n| ctx.zeros("grad", n as u64, gd)).collect();
    let options = Optimizer::builder().state_storage(StateStorage::Dtype(sd));
    let mut optimizer = options.build(ctx, algorithm, &params).unwrap();
    let kinds = algorithm.state_kinds();
    for t in 1..=3u64 {
        for (i, g) in grads.iter().enumerate() {
            ctx.write_async(g, &rng.vec(LENGTHS[i], 1.0)).await.unwrap();
        }
        let mut before = Vec::new();
        for i in 0..LENGTHS.len() {
            let mut state = Vec::new();
            for k in kinds {
                state.push(
                    download(ctx, optimizer.state(i, *k).unwrap().and_then(|s| s.dense()).unwrap()).await,
                );
            }
            before.push((download(ctx, &params[i]).await, state, download(ctx, &grads[i]).await));
        }
        optimizer.step(&grads).unwrap();
        for (i, (mut p, state, g)) in before.into_iter().enumerate() {
            let mut oracle = TorchState::resume(algorithm.to_oracle(), t - 1, &state)
                .storing(pd.to_oracle(), sd.to_oracle());
            oracle.step(&mut p, &g);
            let what = format!("{algorithm:?} {pd:?}/{gd:?}/{sd:?} step {t} param[{i}]");
            assert_close(&what, &download(ctx, &params[i]).await, &p, Tolerance::stored(pd));
            for (k, want) in oracle.tensors().iter().enumerate() {
                let got =
                    download(ctx, optimizer.state(i, kinds[k]).unwrap().and_then(|s| s.dense()).unwrap())
                        .await;
                assert_close(&format!("{what} {:?}", kinds[k]), &got, want, Tolerance::stored(sd));
            }
        }
    }
}

#[wasm_bindgen_test]
async fn the_adapter_is_the_browsers_webgpu_without_f64() {
    let ctx = ctx().await;
    let report = ctx.report();
    web_sys_log(&format!("adapter: {report}"));
    assert_eq!(report.backend, wgpu::Backend::BrowserWebGpu, "{report}");
    assert!(!ctx.has_feature(wgpu::Features::SHADER_F64), "{report}");
}

fn bytemuck_f64(values: &[f64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn web_sys_log(line: &str) {
    wasm_bindgen_test::console_log!("{line}");
}

#[wasm_bindgen_test]
async fn every_algorithm_and_dtype_mix_matches_the_oracle_in_place_packed_f16() {
    let ctx = ctx().await.with_packed_f16(true);
    assert!(!ctx.native_f16());
    for (a, algorithm) in algorithms().into_iter().enumerate() {
        for (m, mix) in MIXES.into_iter().enumerate() {
            check_in_place(&ctx, algorithm, mix, (a * 10 + m) as u64).await;
        }
    }
}

#[wasm_bindgen_test]
async fn every_algorithm_on_f16_matches_the_oracle_with_native_f16_where_granted() {
    let ctx = ctx().await.with_packed_f16(false);
    // Without `shader-f16` f16 stays packed whatever is asked, and the check still runs.
    assert_eq!(ctx.native_f16(), ctx.has_feature(wgpu::Features::SHADER_F16));
    web_sys_log(&format!("shader-f16 granted: {}", ctx.native_f16()));
    for (a, algorithm) in algorithms().into_iter().enumerate() {
        check_in_place(&ctx, algorithm, MIXES[1], 100 + a as u64).await;
        check_in_place(&ctx, algorithm, MIXES[2], 200 + a as u64).await;
    }
}

/// The stateless `ops::update`, every output in a tensor of its own, for every algorithm
/// and storage type; the inputs are checked unchanged.
#[wasm_bindgen_test]
async fn every_algorithm_and_dtype_matches_the_oracle_out_of_place() {
    let base = ctx().await;
    for packed in [true, false] {
        let ctx = base.with_packed_f16(packed);
        for (a, algorithm) in algorithms().into_iter().enumerate() {
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                let mut rng = Rng(1000 + a as u64);
                let n = 517;
                let p = rng.vec(n, 1.0);
                let g = rng.vec(n, 1.0);
                let kinds = algorithm.state_kinds();
                let init = match algorithm {
                    Algorithm::Adagrad(c) => c.initial_accumulator_value,
                    _ => 0.0,
                };
                let param = ctx.upload("p", &p, dtype);
                let grad = ctx.upload("g", &g, dtype);
                let state: Vec<Tensor> =
                    kinds.iter().map(|_| ctx.upload("s", &vec![init; n], dtype)).collect();
                let param_out = ctx.zeros("p_out", n as u64, dtype);
                let state_out: Vec<Tensor> =
                    kinds.iter().map(|_| ctx.zeros("s_out", n as u64, dtype)).collect();
                let before = bytes(&ctx, &param).await;
                let update = Update {
                    param: param.clone(),
                    grad: grad.clone(),
                    state: state.clone(),
                    param_out: Some(param_out.clone()),
                    state_out: state_out.iter().cloned().map(Some).collect(),
                    param_copy: None,
                };
                ctx.submit("update", |e| ops::update(&ctx, e, &algorithm, 1, &[update])).unwrap();
                let mut want = dtype.to_oracle().decode(&dtype.to_oracle().encode(&p));
                let states: Vec<Vec<f64>> = kinds.iter().map(|_| vec![init; n]).collect();
                let mut oracle = TorchState::resume(algorithm.to_oracle(), 0, &states)
                    .storing(dtype.to_oracle(), dtype.to_oracle());
                oracle.step(&mut want, &dtype.to_oracle().decode(&dtype.to_oracle().encode(&g)));
                let what = format!("{algorithm:?} {dtype:?} packed {packed} out of place");
                assert_close(&what, &download(&ctx, &param_out).await, &want, Tolerance::stored(dtype));
                for (k, want) in oracle.tensors().iter().enumerate() {
                    let got = download(&ctx, &state_out[k]).await;
                    assert_close(&format!("{what} {:?}", kinds[k]), &got, want, Tolerance::stored(dtype));
                }
                assert_eq!(bytes(&ctx, &param).await, before, "{what}: the input changed");
            }
        }
    }
}

/// Outputs may alias their inputs exactly; a partial overlap, two outputs on one range
/// and two parameters sharing memory are typed errors that record nothing.
#[wasm_bindgen_test]
async fn aliasing_exact_is_allowed_partial_is_refused_and_changes_nothing() {
    let ctx = ctx().await;
    let buffer = ctx.upload_f32("shared", &[0.5; 128]);
    let t = |k: u64| Tensor { buffer: buffer.buffer.clone(), offset: 128 * k, len: 16, dtype: DType::F32 };
    let (param, grad, m, v) = (t(0), t(1), t(2), t(3));
    let adam: Algorithm = Adam::default().into();
    let refused = [
        {
            let mut io = Update::in_place(&param, &grad, &[m.clone(), v.clone()]);
            io.param_out =
                Some(Tensor { buffer: buffer.buffer.clone(), offset: 128 + 16, len: 16, dtype: DType::F32 });
            io
        },
        {
            let mut io = Update::in_place(&param, &grad, &[m.clone(), v.clone()]);
            io.state_out[0] = Some(v.clone());
            io
        },
    ];
    for io in refused {
        let before = bytes(&ctx, &buffer).await;
        let mut encoder = ctx.device().create_command_encoder(&Default::default());
        let err = ops::update(&ctx, &mut encoder, &adam, 1, &[io]).unwrap_err();
        assert!(matches!(err, Error::PartialOverlap { .. } | Error::OutputsAlias { .. }), "{err}");
        ctx.queue().submit([encoder.finish()]);
        assert_eq!(bytes(&ctx, &buffer).await, before, "a refused call changed memory ({err})");
    }
    // Two parameters sharing bytes.
    let err = Optimizer::builder()
        .build(
            &ctx,
            adam,
            &[t(0), Tensor { buffer: buffer.buffer.clone(), offset: 32, len: 16, dtype: DType::F32 }],
        )
        .unwrap_err();
    assert!(matches!(err, Error::OverlappingParams { .. }), "{err}");

    // In place, exactly aliased: the stateless update on the same tensors matches the oracle.
    let mut rng = Rng(7);
    let n = 33;
    let p = rng.vec(n, 1.0);
    let g = rng.vec(n, 1.0);
    let param = ctx.upload("p", &p, DType::F32);
    let grad = ctx.upload("g", &g, DType::F32);
    let state: Vec<Tensor> = (0..2).map(|_| ctx.zeros("s", n as u64, DType::F32)).collect();
    let io = Update::in_place(&param, &grad, &state);
    ctx.submit("in place", |e| ops::update(&ctx, e, &adam, 1, &[io])).unwrap();
    let mut want = p.clone();
    let mut oracle =
        TorchState::new(adam.to_oracle(), n).storing(DType::F32.to_oracle(), DType::F32.to_oracle());
    oracle.step(&mut want, &g);
    assert_close("in place", &download(&ctx, &param).await, &want, Tolerance::F32);
}

/// Two groups with their own algorithms and learning rates, stepped together.
#[wasm_bindgen_test]
async fn groups_step_with_their_own_algorithms() {
    let ctx = ctx().await;
    let mut rng = Rng(11);
    let a: Algorithm = Adam { lr: 3e-3, ..Adam::adamw() }.into();
    let b: Algorithm = Sgd { lr: 0.1, momentum: 0.5, ..Sgd::default() }.into();
    let lens = [100usize, 37];
    let values: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let params: Vec<Tensor> = values.iter().map(|v| ctx.upload("p", v, DType::F32)).collect();
    let grads: Vec<Tensor> = lens.iter().map(|&n| ctx.zeros("g", n as u64, DType::F32)).collect();
    let groups = vec![ParamGroup::new(a, &params[..1]), ParamGroup::new(b, &params[1..])];
    let mut optimizer = Optimizer::builder().build_groups(&ctx, groups).unwrap();
    let mut oracles = [TorchState::new(a.to_oracle(), lens[0]), TorchState::new(b.to_oracle(), lens[1])];
    let mut want = values.clone();
    for _ in 0..4 {
        for i in 0..2 {
            let g = rng.vec(lens[i], 1.0);
            ctx.write_async(&grads[i], &g).await.unwrap();
            oracles[i].step(&mut want[i], &g);
        }
        optimizer.step(&grads).unwrap();
    }
    for i in 0..2 {
        assert_close(&format!("group {i}"), &download(&ctx, &params[i]).await, &want[i], Tolerance::F32);
    }
}

/// Capturable mode: the step counter on the device; AMP skips a step whose unscaled
/// gradients hold an infinity, changing nothing, and unscales the next one.
#[wasm_bindgen_test]
async fn capturable_amp_skips_a_non_finite_step_and_changes_nothing() {
    let ctx = ctx().await;
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let mut rng = Rng(5);
        let n = 257;
        let param = ctx.upload("param", &rng.vec(n, 1.0), dtype);
        let algorithm: Algorithm = Adam { lr: 1e-2, amsgrad: true, ..Adam::default() }.into();
        let options = Optimizer::builder().capturable(true);
        let mut optimizer = options.build(&ctx, algorithm, std::slice::from_ref(&param)).unwrap();
        let inv_scale = ctx.upload("inv_scale", &[0.5], DType::F32);
        let step = |optimizer: &mut Optimizer, g: &[f64]| {
            let grad = ctx.upload("grad", g, dtype);
            ctx.submit("amp step", |encoder| {
                optimizer.record_unscale(encoder, std::slice::from_ref(&grad), &inv_scale)?;
                optimizer.record_step(encoder, std::slice::from_ref(&grad))
            })
            .unwrap();
        };
        step(&mut optimizer, &rng.vec(n, 1.0));
        assert!(!optimizer.read_found_inf_async().await.unwrap());
        let snapshot = |optimizer: &Optimizer| {
            let (param, ctx) = (param.clone(), ctx.clone());
            let states: Vec<Tensor> = algorithm
                .state_kinds()
                .iter()
                .map(|k| optimizer.state(0, *k).unwrap().and_then(|s| s.dense()).unwrap().clone())
                .collect();
            async move {
                let mut all = bytes(&ctx, &param).await;
                for s in &states {
                    all.extend(bytes(&ctx, s).await);
                }
                all
            }
        };
        let before = (snapshot(&optimizer).await, optimizer.read_device_step_async().await.unwrap());
        let mut g = rng.vec(n, 1.0);
        g[100] = f64::INFINITY;
        step(&mut optimizer, &g);
        assert!(optimizer.read_found_inf_async().await.unwrap(), "{dtype:?}: found_inf is set");
        let after = (snapshot(&optimizer).await, optimizer.read_device_step_async().await.unwrap());
        assert_eq!(after, before, "{dtype:?}: a skipped step changed parameters, state or step");

        let mut p = download(&ctx, &param).await;
        let mut state = Vec::new();
        for k in algorithm.state_kinds() {
            state
                .push(download(&ctx, optimizer.state(0, *k).unwrap().and_then(|s| s.dense()).unwrap()).await);
        }
        let mut oracle = TorchState::resume(algorithm.to_oracle(), 1, &state)
            .storing(dtype.to_oracle(), dtype.to_oracle());
        let g = dtype.to_oracle().decode(&dtype.to_oracle().encode(&rng.vec(n, 1.0)));
        step(&mut optimizer, &g);
        oracle.step(&mut p, &g.iter().map(|x| dtype.to_oracle().round(x * 0.5)).collect::<Vec<_>>());
        assert!(!optimizer.read_found_inf_async().await.unwrap());
        assert_eq!(optimizer.read_device_step_async().await.unwrap(), 2, "{dtype:?}");
        assert_close(
            &format!("{dtype:?} after the skip"),
            &download(&ctx, &param).await,
            &p,
            Tolerance::stored(dtype),
        );
    }
}

/// Global-norm clipping over several tensors: the norm read back and the clipped step
/// match the oracle, for the L2 and the infinity norm.
#[wasm_bindgen_test]
async fn clipping_matches_the_oracle_and_reports_the_norm() {
    let ctx = ctx().await;
    for norm_type in [NormType::L2, NormType::Inf] {
        let clip = GradClip { max_norm: 0.5, norm_type };
        let mut rng = Rng(21);
        let lens = [300usize, 7, 1024];
        let algorithm: Algorithm = Adam { lr: 1e-2, ..Adam::default() }.into();
        let mut values: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
        let params: Vec<Tensor> = values.iter().map(|v| ctx.upload("p", v, DType::F32)).collect();
        let grads: Vec<Tensor> = lens.iter().map(|&n| ctx.zeros("g", n as u64, DType::F32)).collect();
        let options = Optimizer::builder().grad_clip(clip);
        let mut optimizer = options.build(&ctx, algorithm, &params).unwrap();
        let mut oracles: Vec<TorchState> =
            lens.iter().map(|&n| TorchState::new(algorithm.to_oracle(), n)).collect();
        for _ in 0..3 {
            let mut g: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
            for (t, g) in grads.iter().zip(&g) {
                ctx.write_async(t, g).await.unwrap();
            }
            optimizer.step(&grads).unwrap();
            let want_norm = clip_grad_norm(&mut g, &clip.to_oracle());
            let norm = optimizer.grad_norm_async().await.unwrap();
            assert!(
                (norm - want_norm).abs() <= 1e-5 * want_norm,
                "{norm_type:?}: norm {norm}, oracle {want_norm}"
            );
            for ((p, o), g) in values.iter_mut().zip(&mut oracles).zip(&g) {
                o.step(p, g);
            }
        }
        for (i, p) in params.iter().enumerate() {
            assert_close(
                &format!("{norm_type:?} clipped param {i}"),
                &download(&ctx, p).await,
                &values[i],
                Tolerance::Close { rtol: 1e-5, atol: 1e-6 },
            );
        }
    }
}

/// Stochastic rounding: many equal elements round up and down so that their mean is the
/// exact value (nearest rounding is many standard errors away), and a seed repeats its bits.
#[wasm_bindgen_test]
async fn stochastic_rounding_is_unbiased_and_reproducible() {
    let ctx = ctx().await;
    let n = 20_001;
    let sgd = Sgd { lr: 1.0, ..Sgd::default() };
    for (dtype, start, gradient) in [(DType::BF16, 1.0, -0.001), (DType::F16, 1.0, -0.0003)] {
        let exact = f64::from((start - gradient) as f32);
        let nearest = dtype.to_oracle().round(exact);
        let run = |seed: u64| {
            let ctx = ctx.clone();
            async move {
                let rounding = Rounding::Stochastic { seed, state: false };
                let param = ctx.upload("p", &vec![start; n], dtype);
                let grad = ctx.upload("g", &vec![gradient; n], DType::F32);
                let options = Optimizer::builder().rounding(rounding);
                let mut opt = options.build(&ctx, sgd, std::slice::from_ref(&param)).unwrap();
                opt.step(&[grad]).unwrap();
                download(&ctx, &param).await
            }
        };
        let stored = run(42).await;
        let mean = stored.iter().sum::<f64>() / n as f64;
        let var = stored.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / (n as f64 - 1.0);
        let error = (var / n as f64).sqrt();
        assert!(error > 0.0, "{dtype:?}: every element rounded the same way");
        assert!(
            (mean - exact).abs() < 4.0 * error,
            "{dtype:?}: mean {mean:e}, exact {exact:e}, error {error:e}"
        );
        assert!((nearest - exact).abs() > 10.0 * error, "{dtype:?}: the case does not tell the modes apart");
        assert_eq!(run(42).await, stored, "{dtype:?}: a seed repeats its draws");
        assert_ne!(run(43).await, stored, "{dtype:?}: another seed draws other bits");
    }
}

/// Kahan-compensated bf16 updates track the exact sum where nearest rounding stalls.
#[wasm_bindgen_test]
async fn kahan_compensation_tracks_the_exact_run_where_nearest_stalls() {
    let ctx = ctx().await;
    let (n, steps) = (256, 2000);
    let sgd = Sgd { lr: 1.0 / 1024.0, ..Sgd::default() };
    let mut rng = Rng(5);
    let start: Vec<f64> = (0..n).map(|_| DType::BF16.to_oracle().round(1.0 + rng.uniform().abs())).collect();
    let gradient = rng.vec(n, 0.5);
    let mut exact = start.clone();
    let mut oracle = TorchState::new(sgd.to_oracle().into(), n);
    for _ in 0..steps {
        oracle.step(&mut exact, &gradient);
    }
    let grad = ctx.upload("g", &gradient, DType::F32);
    let mut errors = Vec::new();
    for rounding in [Rounding::NearestEven, Rounding::Kahan] {
        let param = ctx.upload("p", &start, DType::BF16);
        let options = Optimizer::builder().rounding(rounding);
        let mut opt = options.build(&ctx, sgd, std::slice::from_ref(&param)).unwrap();
        for _ in 0..steps {
            opt.step(std::slice::from_ref(&grad)).unwrap();
        }
        let got = download(&ctx, &param).await;
        errors.push(got.iter().zip(&exact).map(|(a, b)| (a - b).abs()).sum::<f64>() / n as f64);
    }
    let (nearest, kahan) = (errors[0], errors[1]);
    web_sys_log(&format!("mean |p - exact| after {steps} steps: nearest {nearest:.5}, Kahan {kahan:.5}"));
    assert!(nearest > 0.4, "nearest rounding's mean error {nearest}");
    assert!(kahan < 0.008, "Kahan's mean error {kahan}");
}

/// 8-bit Adam state against the transcription of bitsandbytes' reference, read back
/// without blocking: parameters within f32 tolerance, codes within one of the expected.
#[wasm_bindgen_test]
async fn q8_adam_matches_the_bitsandbytes_oracle() {
    let ctx = ctx().await;
    let config = Q8States { min_8bit_size: 4096 };
    let adam = Adam { lr: 1e-3, weight_decay: 0.01, ..Adam::adamw() };
    let mut rng = Rng(31);
    let lens = [8192usize, 100];
    let mut values: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let params: Vec<Tensor> = values.iter().map(|v| ctx.upload("p", v, DType::F32)).collect();
    let grads: Vec<Tensor> = lens.iter().map(|&n| ctx.zeros("g", n as u64, DType::F32)).collect();
    let options = Optimizer::builder().state_storage(StateStorage::Q8(config));
    let mut optimizer = options.build(&ctx, adam, &params).unwrap();
    let mut states: Vec<[oracle::State8bit; 2]> = lens
        .iter()
        .map(|&n| {
            let q = config.quantizes(n as u64);
            [oracle::State8bit::zeros(n, q), oracle::State8bit::zeros(n, q)]
        })
        .collect();
    let bnb = oracle::BnbAdam {
        lr: adam.lr,
        beta1: adam.beta1,
        beta2: adam.beta2,
        eps: adam.eps,
        weight_decay: adam.weight_decay,
    };
    for t in 1..=3u64 {
        for i in 0..lens.len() {
            let g: Vec<f64> = rng.vec(lens[i], 1.0);
            ctx.write_async(&grads[i], &g).await.unwrap();
            let [m, v] = &mut states[i];
            oracle::bnb_adam8bit_step(&bnb, t, &mut values[i], &g, m, v).unwrap();
        }
        optimizer.step(&grads).unwrap();
    }
    for i in 0..lens.len() {
        assert_close(
            &format!("q8 param {i}"),
            &download(&ctx, &params[i]).await,
            &values[i],
            Tolerance::Close { rtol: 1e-5, atol: 1e-6 },
        );
        for (k, kind) in [StateKind::ExpAvg, StateKind::ExpAvgSq].into_iter().enumerate() {
            let got = optimizer
                .state_async(i, kind)
                .await
                .map(|s| s.and_then(|v| v.q8()))
                .unwrap()
                .expect("a state");
            match (&got, &states[i][k].to_library()) {
                (StoredState::Q8 { codes, absmax }, StoredState::Q8 { codes: want, absmax: want_absmax }) => {
                    let far = codes.iter().zip(want).filter(|(a, b)| a.abs_diff(**b) > 1).count();
                    let off = codes.iter().zip(want).filter(|(a, b)| a != b).count();
                    assert!(
                        far == 0 && off * 100 <= codes.len(),
                        "param {i} {kind:?}: {far} codes off by more than 1, {off} differ"
                    );
                    let absmax: Vec<f64> = absmax.iter().map(|&a| f64::from(a)).collect();
                    let want_absmax: Vec<f64> = want_absmax.iter().map(|&a| f64::from(a)).collect();
                    assert_close(
                        &format!("param {i} {kind:?} absmax"),
                        &absmax,
                        &want_absmax,
                        Tolerance::Close { rtol: 1e-4, atol: 0.0 },
                    );
                }
                (StoredState::F32(got), StoredState::F32(want)) => {
                    let got: Vec<f64> = got.iter().map(|&a| f64::from(a)).collect();
                    let want: Vec<f64> = want.iter().map(|&a| f64::from(a)).collect();
                    assert_close(
                        &format!("param {i} {kind:?}"),
                        &got,
                        &want,
                        Tolerance::Close { rtol: 1e-5, atol: 1e-7 },
                    );
                }
                (got, want) => panic!("param {i} {kind:?}: stored as {got:?}, expected as {want:?}"),
            }
        }
    }
}

/// Checkpoints to and from bytes without blocking: a resumed run is bit-identical to the
/// uninterrupted one (f16 states at odd offsets included); a bad file and the blocking
/// forms are typed errors that change nothing.
#[wasm_bindgen_test]
async fn checkpoints_round_trip_through_bytes_and_bad_ones_change_nothing() {
    let ctx = ctx().await;
    let algorithm: Algorithm = Adam { lr: 1e-2, amsgrad: true, ..Adam::adamw() }.into();
    let lens = [5usize, 300];
    let mut rng = Rng(41);
    let start: Vec<Vec<f64>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let grads_at: Vec<Vec<Vec<f64>>> =
        (0..6).map(|_| lens.iter().map(|&n| rng.vec(n, 1.0)).collect()).collect();
    let options = || Optimizer::builder().capturable(true);
    let make = |ctx: &GpuContext| {
        let params: Vec<Tensor> = start.iter().map(|v| ctx.upload("p", v, DType::F16)).collect();
        let grads: Vec<Tensor> = lens.iter().map(|&n| ctx.zeros("g", n as u64, DType::F16)).collect();
        let opt = options().build(ctx, algorithm, &params).unwrap();
        (params, grads, opt)
    };
    // Uninterrupted: six steps.
    let (params, grads, mut full) = make(&ctx);
    for g in &grads_at {
        for (t, g) in grads.iter().zip(g) {
            ctx.write_async(t, g).await.unwrap();
        }
        full.step(&grads).unwrap();
    }
    // Three steps, saved, loaded into a fresh optimizer, three more.
    let (params2, grads2, mut first) = make(&ctx);
    for g in &grads_at[..3] {
        for (t, g) in grads2.iter().zip(g) {
            ctx.write_async(t, g).await.unwrap();
        }
        first.step(&grads2).unwrap();
    }
    let saved = first.save_to_bytes_async().await.unwrap();
    assert!(matches!(first.save_to_bytes(), Err(Error::Readback { .. })), "the blocking save must refuse");
    let (params3, grads3, mut resumed) = make(&ctx);
    for (dst, src) in params3.iter().zip(&params2) {
        ctx.write_bytes_async(dst, &bytes(&ctx, src).await).await.unwrap();
    }
    // A truncated file and a blocking load that would need a readback: refused, nothing changed.
    let before = resumed.save_to_bytes_async().await.unwrap();
    let err = resumed.load_from_bytes_async(&saved[..saved.len() / 2]).await.unwrap_err();
    assert!(matches!(err, Error::BadFile { .. }), "{err}");
    let err = resumed.load_from_bytes(&saved).unwrap_err();
    assert!(matches!(err, Error::Readback { .. }), "{err}");
    assert_eq!(resumed.save_to_bytes_async().await.unwrap(), before, "a refused load changed the optimizer");
    resumed.load_from_bytes_async(&saved).await.unwrap();
    assert_eq!(resumed.read_device_step_async().await.unwrap(), 3);
    for g in &grads_at[3..] {
        for (t, g) in grads3.iter().zip(g) {
            ctx.write_async(t, g).await.unwrap();
        }
        resumed.step(&grads3).unwrap();
    }
    for (i, (a, b)) in params.iter().zip(&params3).enumerate() {
        assert_eq!(bytes(&ctx, a).await, bytes(&ctx, b).await, "param {i}: the resumed run differs");
    }
    assert_eq!(
        full.save_to_bytes_async().await.unwrap(),
        resumed.save_to_bytes_async().await.unwrap(),
        "the resumed optimizer's checkpoint differs"
    );
}

/// What WebGPU cannot do, and bad input, are typed errors that change nothing: f64 (no
/// `SHADER_F64`), blocking readbacks, mismatched gradients, bad hyperparameters.
#[wasm_bindgen_test]
async fn refusals_are_typed_and_change_nothing() {
    let ctx = ctx().await;
    // f64 parameters: WebGPU has no f64.
    let p64 = ctx.upload("p64", &[1.0; 8], wgpu_optim::DType::F64);
    let g64 = ctx.upload("g64", &[1.0; 8], wgpu_optim::DType::F64);
    // Refused when the optimizer is made or, at the latest, at its first step.
    let err = match Optimizer::builder().build(&ctx, Adam::default(), std::slice::from_ref(&p64)) {
        Err(e) => e,
        Ok(mut optimizer) => optimizer.step(std::slice::from_ref(&g64)).unwrap_err(),
    };
    assert!(matches!(err, Error::MissingFeature { feature: "SHADER_F64", .. }), "{err}");
    assert_eq!(bytes(&ctx, &p64).await, bytemuck_f64(&[1.0; 8]), "a refused f64 step changed the parameters");
    let mut encoder = ctx.device().create_command_encoder(&Default::default());
    let err = ops::update(
        &ctx,
        &mut encoder,
        &Adam::default().into(),
        1,
        &[Update::in_place(
            &p64,
            &g64,
            &[
                ctx.upload("m", &[0.0; 8], wgpu_optim::DType::F64),
                ctx.upload("v", &[0.0; 8], wgpu_optim::DType::F64),
            ],
        )],
    )
    .unwrap_err();
    assert!(matches!(err, Error::MissingFeature { .. }), "{err}");
    // Blocking readbacks cannot wait in a browser.
    let p = ctx.upload_f32("p", &[0.25; 17]);
    assert!(matches!(ctx.read_bytes(&p), Err(Error::Readback { .. })));
    let odd = ctx.zeros("odd", 3, DType::F16);
    assert!(matches!(ctx.write(&odd, &[1.0, 2.0, 3.0]), Err(Error::Readback { .. })));
    ctx.write_async(&odd, &[1.0, 2.0, 3.0]).await.unwrap();
    assert_eq!(download(&ctx, &odd).await, [1.0, 2.0, 3.0]);
    // Gradients that do not match, a bad learning rate: refused, parameters unchanged.
    let mut optimizer = Optimizer::builder().build(&ctx, Adam::default(), std::slice::from_ref(&p)).unwrap();
    let before = bytes(&ctx, &p).await;
    let short = ctx.upload_f32("g", &[1.0; 16]);
    let err = optimizer.step(std::slice::from_ref(&short)).unwrap_err();
    assert!(matches!(err, Error::LengthMismatch { .. }), "{err}");
    let err = optimizer.step(&[]).unwrap_err();
    assert!(matches!(err, Error::CountMismatch { .. }), "{err}");
    assert!(optimizer.set_lr(f64::NAN).is_err());
    assert_eq!(bytes(&ctx, &p).await, before, "a refused step changed the parameters");
    assert_eq!(optimizer.step_count(), 0);
    // Options that need another option.
    assert!(matches!(optimizer.grad_norm_async().await, Err(Error::NeedsOption { .. })));
    assert!(matches!(optimizer.read_device_step_async().await, Err(Error::NeedsOption { .. })));
    let eight_bit = QuantizedState::Q8(StoredState::zeros(16, false));
    assert!(matches!(optimizer.set_state(0, StateKind::ExpAvg, &eight_bit), Err(Error::NeedsOption { .. })));
}

/// Master weights over an f16 model, made without blocking: f32 masters step as the oracle
/// in f32, and the model holds them rounded once; the blocking constructor is refused.
#[wasm_bindgen_test]
async fn master_weights_over_an_f16_model_match_the_oracle() {
    let ctx = ctx().await;
    let algorithm: Algorithm = Adam { lr: 1e-2, ..Adam::adamw() }.into();
    let mut rng = Rng(51);
    let lens = [7usize, 300];
    let model: Vec<Tensor> =
        lens.iter().map(|&n| ctx.upload("model", &rng.vec(n, 1.0), DType::F16)).collect();
    let err = Optimizer::builder().master_weights(true).build(&ctx, algorithm, &model).unwrap_err();
    assert!(matches!(err, Error::Readback { .. }), "{err}");
    let mut want = Vec::new();
    for m in &model {
        want.push(download(&ctx, m).await);
    }
    let mut optimizer =
        Optimizer::builder().master_weights(true).build_async(&ctx, algorithm, &model).await.unwrap();
    let grads: Vec<Tensor> = lens.iter().map(|&n| ctx.zeros("g", n as u64, DType::F32)).collect();
    let mut oracles: Vec<TorchState> =
        lens.iter().map(|&n| TorchState::new(algorithm.to_oracle(), n)).collect();
    for _ in 0..3 {
        for i in 0..lens.len() {
            let g = rng.vec(lens[i], 1.0);
            ctx.write_async(&grads[i], &g).await.unwrap();
            oracles[i].step(&mut want[i], &g);
        }
        optimizer.step(&grads).unwrap();
    }
    for i in 0..lens.len() {
        let master = download(&ctx, &optimizer.params()[i]).await;
        assert_close(&format!("master {i}"), &master, &want[i], Tolerance::F32);
        // Within an ulp of the master rounded once (Tint's f32-to-f16 conversion may round
        // a value next to a halfway point the other way, as the native tests allow).
        let rounded: Vec<f64> = master.iter().map(|v| DType::F16.to_oracle().round(*v)).collect();
        let copy = download(&ctx, &model[i]).await;
        assert_close(&format!("model copy {i}"), &copy, &rounded, Tolerance::stored(DType::F16));
    }
}

/// A lost device is a typed error, not a hang: the readback in flight fails, and every
/// later call of the crate on the context returns `DeviceLost`.
#[wasm_bindgen_test]
async fn a_lost_device_is_a_typed_error_not_a_hang() {
    let ctx = GpuContext::headless().await.unwrap_or_else(|e| panic!("the browser tests need WebGPU: {e}"));
    let param = ctx.upload_f32("p", &[0.5; 64]);
    let grad = ctx.upload_f32("g", &[0.25; 64]);
    let mut optimizer =
        Optimizer::builder().build(&ctx, Adam::default(), std::slice::from_ref(&param)).unwrap();
    optimizer.step(std::slice::from_ref(&grad)).unwrap();
    ctx.device().destroy();
    let read = ctx.read_bytes_async(&param).await;
    assert!(matches!(read, Err(Error::Readback { .. } | Error::DeviceLost { .. })), "{read:?}");
    // The device's `lost` promise settles on the event loop: give it a turn or a few.
    for _ in 0..100 {
        if ctx.check_alive().is_err() {
            break;
        }
        let tick = js_sys::Promise::new(&mut |resolve, _| {
            let window = web_sys::window().expect("a window");
            window.set_timeout_with_callback_and_timeout_and_arguments_0(&resolve, 10).expect("a timer");
        });
        wasm_bindgen_futures::JsFuture::from(tick).await.expect("a timer");
    }
    assert!(matches!(ctx.check_alive(), Err(Error::DeviceLost { .. })), "the loss was not recorded");
    let err = optimizer.step(std::slice::from_ref(&grad)).unwrap_err();
    assert!(matches!(err, Error::DeviceLost { .. }), "{err}");
    assert!(matches!(ctx.read_bytes_async(&param).await, Err(Error::DeviceLost { .. })));
}
