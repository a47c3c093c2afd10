//! Rounding of 16-bit stores (`OptimizerBuilder::rounding`): stochastic rounding is unbiased
//! and stores the same bits on the GPU and the CPU backend for a seed, whatever the dispatch
//! shape; Kahan compensation keeps tiny updates that nearest rounding loses; bad options are
//! typed errors that change nothing; a checkpoint carries the seed and the compensations.

use crate::common;

use common::{ctx, Rng};
use wgpu_optim::cpu::{CpuOptimizer, CpuOptimizerBuilder, HostSlice, HostSliceMut, HostTensor};
use wgpu_optim::{DType, Error, GpuContext, Optimizer, OptimizerBuilder, Rounding, Sgd, StateKind, Tensor};
use wgpu_optim_testkit::oracle::{Storage, ToOracle};

fn options(rounding: Rounding) -> OptimizerBuilder {
    Optimizer::builder().rounding(rounding)
}

fn cpu_options(rounding: Rounding) -> CpuOptimizerBuilder {
    CpuOptimizer::builder().rounding(rounding)
}

fn host(values: &[f64], dtype: DType) -> HostTensor {
    HostTensor::from_f64(dtype, values).unwrap_or_else(|e| panic!("{e}"))
}

/// Panics naming the first few indices where `got` and `want` differ in their bits.
#[track_caller]
fn assert_bits_eq(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let bad: Vec<String> = (0..got.len())
        .filter(|&i| got[i].to_bits() != want[i].to_bits())
        .take(5)
        .map(|i| format!("[{i}] got {:e} want {:e}", got[i], want[i]))
        .collect();
    let count = (0..got.len()).filter(|&i| got[i].to_bits() != want[i].to_bits()).count();
    assert!(bad.is_empty(), "{what}: {count} of {} differ, first {bad:?}", got.len());
}

/// Mean and standard error of the mean of the values.
fn mean_and_error(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let variance = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / (n - 1.0);
    (mean, (variance / n).sqrt())
}

/// The cases of the unbiasedness test: (dtype, start, gradient) with `p = start - gradient`
/// (SGD, lr 1, exact in f32) between two 16-bit neighbours, well away from both, so that
/// nearest rounding is off by many standard errors: bf16 above 1, f16 above 1, and an f16
/// subnormal.
const UNBIASED_CASES: [(DType, f64, f64); 3] =
    [(DType::BF16, 1.0, -0.001), (DType::F16, 1.0, -0.0003), (DType::F16, 0.0, -3.3e-6)];

/// Many elements of the same exact value, each rounded with its own bits: their mean is the
/// exact value within a few standard errors, and far from what nearest rounding stores.
#[track_caller]
fn check_unbiased(what: &str, stored: &[f64], exact: f64, nearest: f64) {
    let (mean, error) = mean_and_error(stored);
    assert!(error > 0.0, "{what}: every element rounded the same way ({mean:e})");
    assert!(
        (mean - exact).abs() < 4.0 * error,
        "{what}: mean {mean:e}, exact {exact:e}, standard error {error:e}"
    );
    assert!((nearest - exact).abs() > 10.0 * error, "{what}: the case does not tell the modes apart");
}

#[test]
fn stochastic_rounding_is_unbiased_on_the_gpu_and_the_cpu() {
    let ctx = ctx();
    let n = 20_001;
    let sgd = Sgd { lr: 1.0, ..Sgd::default() };
    for (dtype, start, gradient) in UNBIASED_CASES {
        let exact = f64::from((start - gradient) as f32);
        let nearest = dtype.to_oracle().round(exact);
        let rounding = Rounding::Stochastic { seed: 42, state: false };

        let param = ctx.upload("p", &vec![start; n], dtype);
        let grad = ctx.upload("g", &vec![gradient; n], DType::F32);
        let mut gpu = options(rounding).build(&ctx, sgd, std::slice::from_ref(&param)).unwrap();
        gpu.step(&[grad]).unwrap();
        check_unbiased(&format!("GPU {dtype:?} {exact:e}"), &ctx.read(&param).unwrap(), exact, nearest);

        let mut p = host(&vec![start; n], dtype);
        let g = host(&vec![gradient; n], DType::F32);
        let mut cpu = cpu_options(rounding).build(sgd, &[p.as_slice()]).unwrap();
        cpu.step(&mut [p.as_mut_slice()], &[g.as_slice()]).unwrap();
        check_unbiased(&format!("CPU {dtype:?} {exact:e}"), &p.to_f64(), exact, nearest);
    }
}

/// The stores of one SGD step (lr 1) from `start` with `gradients`, stochastically rounded
/// with `seed`, on the GPU and on the CPU backend.
fn one_stochastic_step(dtype: DType, start: f64, gradients: &[f64], seed: u64) -> (Vec<f64>, Vec<f64>) {
    let ctx = ctx();
    let n = gradients.len();
    let sgd = Sgd { lr: 1.0, ..Sgd::default() };
    let rounding = Rounding::Stochastic { seed, state: false };
    let param = ctx.upload("p", &vec![start; n], dtype);
    let grad = ctx.upload("g", gradients, DType::F32);
    let mut gpu = options(rounding).build(&ctx, sgd, std::slice::from_ref(&param)).unwrap();
    gpu.step(&[grad]).unwrap();
    let mut p = host(&vec![start; n], dtype);
    let g = host(gradients, DType::F32);
    let mut cpu = cpu_options(rounding).build(sgd, &[p.as_slice()]).unwrap();
    cpu.step(&mut [p.as_mut_slice()], &[g.as_slice()]).unwrap();
    (ctx.read(&param).unwrap(), p.to_f64())
}

/// Stores worked out by hand from the documented hash and rounding rule, independently of
/// both backends' code (which share it, so their agreement alone would not catch a wrong
/// hash).
///
/// `Rounding::Stochastic` (src/step/rounding.rs): `mix` is `lowbias32` (`x ^= x >> 16;
/// x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16`, wrapping); the key of
/// (seed, step, parameter ordinal) is `mix` folded over the seed's low and high words, the
/// step and the ordinal from 0; an element's 32 random bits `r` continue it over the stream
/// (0 for a parameter) and the element index's low and high words. Seed 9, step 1,
/// parameter 0:
///
/// ```text
/// mix(9) = 0x429fd5ab; mix(0x429fd5ab ^ 0) = 0xc5f64a98; mix(0xc5f64a98 ^ 1) = 0xc76678f3;
/// key = mix(0xc76678f3 ^ 0) = 0xe205b715
/// r[e] = mix(mix(mix(key ^ 0) ^ e) ^ 0):
///   e = 0: 0xabce966c  1: 0xd7f3d3f2  2: 0x0f7bea87  3: 0x95dbfa1e
///   e = 4: 0x7778c5ec  5: 0x4fc26a8f  6: 0xb38f9b23  7: 0x3300729f
/// ```
///
/// Each element's exact result is `1 + low * 2^-23` (start 1, gradient `-low * 2^-23`, lr 1:
/// the f32 bits `0x3f80_0000 | low`). bf16 keeps the top 16 bits after adding `r >> 16`
/// below them, so it rounds up to 0x3f81 (1 + 2^-7) exactly when `low + (r >> 16) >=
/// 0x1_0000`; f16 (normal) adds `r >> 19` below its 13 dropped bits, so 1 rounds up to 0x3c01
/// (1 + 2^-10) exactly when `low + (r >> 19) >= 0x2000`:
///
/// ```text
///  e  r >> 16  bf16 low  sum      store   r >> 19  f16 low  sum     store
///  0  0xabce   0x8000    0x12bce  up      0x1579   0x1000   0x2579  up
///  1  0xd7f3   0x4000    0x117f3  up      0x1afe   0x0800   0x22fe  up
///  2  0x0f7b   0xc000    0x0cf7b  down    0x01ef   0x1800   0x19ef  down
///  3  0x95db   0x2000    0x0b5db  down    0x12bb   0x0400   0x16bb  down
///  4  0x7778   0xe000    0x15778  up      0x0eef   0x1c00   0x2aef  up
///  5  0x4fc2   0x8000    0x0cfc2  down    0x09f8   0x1000   0x19f8  down
///  6  0xb38f   0x6000    0x1138f  up      0x1671   0x0c00   0x2271  up
///  7  0x3300   0xa000    0x0d300  down    0x0660   0x1400   0x1a60  down
/// ```
#[test]
fn stochastic_stores_match_values_worked_out_by_hand_from_the_documented_hash() {
    const UP: [bool; 8] = [true, true, false, false, true, false, true, false];
    let cases = [
        (DType::BF16, [0x8000u32, 0x4000, 0xc000, 0x2000, 0xe000, 0x8000, 0x6000, 0xa000], 2f64.powi(-7)),
        (DType::F16, [0x1000, 0x0800, 0x1800, 0x0400, 0x1c00, 0x1000, 0x0c00, 0x1400], 2f64.powi(-10)),
    ];
    for (dtype, lows, spacing) in cases {
        let gradients: Vec<f64> = lows.iter().map(|&low| -f64::from(low) * 2f64.powi(-23)).collect();
        let want: Vec<f64> = UP.iter().map(|&up| if up { 1.0 + spacing } else { 1.0 }).collect();
        let (gpu, cpu) = one_stochastic_step(dtype, 1.0, &gradients, 9);
        assert_bits_eq(&format!("GPU {dtype:?}"), &gpu, &want);
        assert_bits_eq(&format!("CPU {dtype:?}"), &cpu, &want);
    }
}

/// The two 16-bit neighbours of `x > 0` (not itself representable): `x` rounded down and up
/// to a multiple of the spacing of its binade (the subnormal spacing below the normal range).
fn neighbours(dtype: DType, x: f64) -> (f64, f64) {
    let (precision, min_exponent) = match dtype {
        DType::BF16 => (8, -126),
        DType::F16 => (11, -14),
        other => panic!("{other:?} stores do not round stochastically"),
    };
    let spacing = 2f64.powi(x.log2().floor().max(f64::from(min_exponent)) as i32 - (precision - 1));
    let below = (x / spacing).floor() * spacing;
    (below, below + spacing)
}

/// Over many seeds and elements, the mean of the stored values is the exact value within a
/// bound fixed in advance from the binomial distribution rather than from the sample.
///
/// A value `x` between the neighbours `lo < x < hi` is stored as `hi` with probability
/// `q = (x - lo) / (hi - lo)`, as `lo` otherwise; so the mean of `N` independent stores is
/// `lo + (hi - lo) K / N` with `K ~ Binomial(N, q)`: expectation `x`, standard deviation
/// `sigma = (hi - lo) sqrt(q (1 - q) / N)`. The test asserts every store is `lo` or `hi` and
/// `|mean - x| <= 5 sigma` (a two-sided normal tail of 6e-7 for an unbiased rounding), over
/// N = 16 seeds x 4096 elements, on the GPU and on the CPU backend. Nearest rounding would
/// be off by `min(x - lo, hi - x)`, more than 50 sigma in every case.
#[test]
fn the_mean_of_stochastic_stores_is_the_exact_value_within_five_binomial_sigmas() {
    let (seeds, n) = (16u64, 4096);
    for (dtype, start, gradient) in UNBIASED_CASES {
        let exact = f64::from((start - gradient) as f32);
        let (lo, hi) = neighbours(dtype, exact);
        assert!(lo < exact && exact < hi, "{dtype:?}: {lo:e} < {exact:e} < {hi:e}");
        let q = (exact - lo) / (hi - lo);
        let samples = (seeds * n as u64) as f64;
        let sigma = (hi - lo) * (q * (1.0 - q) / samples).sqrt();
        assert!(
            (exact - lo).min(hi - exact) > 50.0 * sigma,
            "{dtype:?}: the case does not tell the modes apart"
        );
        let (mut gpu_sum, mut cpu_sum) = (0.0, 0.0);
        for seed in 0..seeds {
            let (gpu, cpu) = one_stochastic_step(dtype, start, &vec![gradient; n], 1000 + seed);
            for (what, stored, sum) in [("GPU", &gpu, &mut gpu_sum), ("CPU", &cpu, &mut cpu_sum)] {
                let other = stored.iter().find(|&&v| v != lo && v != hi);
                assert!(
                    other.is_none(),
                    "{what} {dtype:?} seed {seed}: stored {other:?}, not {lo:e} or {hi:e}"
                );
                *sum += stored.iter().sum::<f64>();
            }
        }
        for (what, sum) in [("GPU", gpu_sum), ("CPU", cpu_sum)] {
            let mean = sum / samples;
            assert!(
                (mean - exact).abs() <= 5.0 * sigma,
                "{what} {dtype:?}: mean {mean:e}, exact {exact:e}, 5 sigma {:e}",
                5.0 * sigma
            );
        }
    }
}

/// Over many steps of one element, each step draws new bits: the stored value random-walks
/// around the exact sum of the updates instead of staying where nearest rounding keeps it.
#[test]
fn stochastic_rounding_accumulates_updates_below_half_an_ulp() {
    let (lr, gradient, steps) = (1.0 / 1024.0, -0.5, 2000);
    let sgd = Sgd { lr, ..Sgd::default() };
    let n = 64;
    let mut p = host(&vec![1.0; n], DType::BF16);
    let g = host(&vec![gradient; n], DType::F32);
    let rounding = Rounding::Stochastic { seed: 3, state: false };
    let mut cpu = cpu_options(rounding).build(sgd, &[p.as_slice()]).unwrap();
    for _ in 0..steps {
        cpu.step(&mut [p.as_mut_slice()], &[g.as_slice()]).unwrap();
    }
    // The exact sum is 1 + 2000 * 2^-11 = 1.9766; each update is 1/16 of bf16's spacing there.
    let exact = 1.0 - lr * gradient * f64::from(steps);
    let (mean, _) = mean_and_error(&p.to_f64());
    assert!((mean - exact).abs() < 0.02, "mean {mean} after {steps} steps, exact {exact}");
}

/// `count` tensors of odd lengths at odd element offsets in one flat 16-bit buffer (so the
/// scalar head and tail, the vec4 middle and, packed, the pair path all run), their
/// gradients at the same offsets in one f32 buffer (aligned alike, so vec4 runs) except the
/// last, which sits in a buffer of its own one element off (scalar or pairs only).
struct Layout {
    lens: Vec<usize>,
    offsets: Vec<usize>,
}

impl Layout {
    fn new() -> Self {
        let lens = vec![1, 3, 7, 64, 1029, 4101, 517];
        let mut offsets = Vec::new();
        let mut at = 1;
        for len in &lens {
            offsets.push(at);
            at += len + 3;
        }
        Layout { lens, offsets }
    }

    fn end(&self) -> usize {
        self.offsets.last().unwrap() + self.lens.last().unwrap() + 4
    }
}

/// SGD with momentum 0.5 and lr 2^-6: every product is exact, so a fused multiply-add on
/// the GPU rounds as the CPU's multiply then add, and the f32 values before the stores are
/// identical; the stores then decide alone.
fn exact_momentum() -> Sgd {
    Sgd { lr: 1.0 / 64.0, momentum: 0.5, ..Sgd::default() }
}

/// The GPU run of `data`; `capturable` takes the step (and so the hash's step) from the
/// device's counter.
fn gpu_run(
    ctx: &GpuContext,
    dtype: DType,
    (rounding, capturable): (Rounding, bool),
    data: &Data,
    steps: usize,
) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
    let layout = &data.layout;
    let flat = ctx.zeros("params", layout.end() as u64, dtype);
    let params: Vec<Tensor> = layout
        .offsets
        .iter()
        .zip(&layout.lens)
        .map(|(o, n)| Tensor {
            buffer: flat.buffer.clone(),
            offset: (o * dtype.size() as usize) as u64,
            len: *n as u64,
            dtype,
        })
        .collect();
    for (p, v) in params.iter().zip(&data.params) {
        ctx.write(p, v).unwrap();
    }
    let count = layout.lens.len();
    let grads: Vec<Vec<Tensor>> = data
        .grads
        .iter()
        .map(|step| {
            // A buffer per step, so that each step has its own values in flight.
            let flat = ctx.upload("grads", &vec![0.0; layout.end()], DType::F32);
            let last = ctx.upload("last", &vec![0.0; layout.lens[count - 1] + 2], DType::F32);
            step.iter()
                .enumerate()
                .map(|(i, g)| {
                    let t = if i + 1 == count {
                        Tensor {
                            buffer: last.buffer.clone(),
                            offset: 4,
                            len: g.len() as u64,
                            dtype: DType::F32,
                        }
                    } else {
                        Tensor {
                            buffer: flat.buffer.clone(),
                            offset: (layout.offsets[i] * 4) as u64,
                            len: g.len() as u64,
                            dtype: DType::F32,
                        }
                    };
                    ctx.write(&t, g).unwrap();
                    t
                })
                .collect()
        })
        .collect();
    let options = Optimizer::builder().rounding(rounding).capturable(capturable);
    let mut opt = options.build(ctx, exact_momentum(), &params).unwrap();
    for g in grads.iter().take(steps) {
        opt.step(g).unwrap();
    }
    let read = |t: &Tensor| ctx.read(t).unwrap();
    let state = (0..count)
        .map(|i| read(opt.state(i, StateKind::MomentumBuffer).unwrap().and_then(|s| s.dense()).unwrap()))
        .collect();
    (params.iter().map(read).collect(), state)
}

fn cpu_run(dtype: DType, rounding: Rounding, data: &Data, steps: usize) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
    let mut params: Vec<HostTensor> = data.params.iter().map(|p| host(p, dtype)).collect();
    let slices: Vec<HostSlice<'_>> = params.iter().map(HostTensor::as_slice).collect();
    let mut opt = cpu_options(rounding).build(exact_momentum(), &slices).unwrap();
    for step in data.grads.iter().take(steps) {
        let grads: Vec<HostTensor> = step.iter().map(|g| host(g, DType::F32)).collect();
        let grads: Vec<HostSlice<'_>> = grads.iter().map(HostTensor::as_slice).collect();
        let mut slices: Vec<HostSliceMut<'_>> = params.iter_mut().map(HostTensor::as_mut_slice).collect();
        opt.step(&mut slices, &grads).unwrap();
    }
    let state = (0..params.len())
        .map(|i| opt.state(i, StateKind::MomentumBuffer).and_then(|s| s.dense()).unwrap().to_f64())
        .collect();
    (params.iter().map(HostTensor::to_f64).collect(), state)
}

/// Parameters and a few steps of gradients.
struct Data {
    layout: Layout,
    params: Vec<Vec<f64>>,
    grads: Vec<Vec<Vec<f64>>>,
}

fn data(dtype: DType, steps: usize) -> Data {
    let layout = Layout::new();
    let mut rng = Rng::new(11);
    let params = layout
        .lens
        .iter()
        .map(|n| rng.vec(*n, 1.0).iter().map(|v| dtype.to_oracle().round(*v)).collect())
        .collect();
    let grads = (0..steps).map(|_| layout.lens.iter().map(|n| rng.vec(*n, 1.0)).collect()).collect();
    Data { layout, params, grads }
}

#[test]
fn the_gpu_and_the_cpu_store_the_same_bits_for_a_seed() {
    let steps = 3;
    for (dtype, packed) in [(DType::BF16, false), (DType::F16, false), (DType::F16, true)] {
        let ctx = ctx().with_packed_f16(packed);
        let data = data(dtype, steps);
        for rounding in [
            Rounding::Stochastic { seed: 0x5eed_0000_0001, state: true },
            Rounding::Stochastic { seed: 9, state: false },
            Rounding::Kahan,
        ] {
            let what = format!("{dtype:?} (packed {packed}) {rounding:?}");
            let (cpu_params, cpu_state) = cpu_run(dtype, rounding, &data, steps);
            for capturable in [false, true] {
                let (gpu_params, gpu_state) = gpu_run(&ctx, dtype, (rounding, capturable), &data, steps);
                let what = format!("{what}, capturable {capturable}");
                for i in 0..gpu_params.len() {
                    assert_bits_eq(&format!("{what}: params[{i}]"), &gpu_params[i], &cpu_params[i]);
                    assert_bits_eq(&format!("{what}: momentum_buffer[{i}]"), &gpu_state[i], &cpu_state[i]);
                }
            }
            // Not nearest rounding in disguise: the same run with nearest stores differs.
            let (nearest, _) = cpu_run(dtype, Rounding::NearestEven, &data, steps);
            let differing =
                nearest.iter().flatten().zip(cpu_params.iter().flatten()).filter(|(a, b)| a != b).count();
            assert!(differing > 100, "{what}: only {differing} elements differ from nearest rounding");
        }
    }
}

/// A different seed draws different bits; the same seed the same ones.
#[test]
fn the_seed_selects_the_draws() {
    let data = data(DType::BF16, 2);
    let run = |seed| cpu_run(DType::BF16, Rounding::Stochastic { seed, state: false }, &data, 2).0;
    let (a, b, c) = (run(1), run(1), run(2));
    assert_eq!(a, b);
    let differing = a.iter().flatten().zip(c.iter().flatten()).filter(|(x, y)| x != y).count();
    assert!(differing > 100, "seeds 1 and 2 differ in {differing} elements");
}

/// 2000 steps of updates a tenth of bf16's spacing (and less): nearest rounding loses every
/// one of them, Kahan compensation keeps the sum to within about one spacing of f32's.
#[test]
fn kahan_compensation_tracks_the_f32_run_where_nearest_rounding_stalls() {
    let n = 256;
    let steps = 2000;
    let sgd = Sgd { lr: 1.0 / 1024.0, ..Sgd::default() };
    let mut rng = Rng::new(5);
    let start: Vec<f64> = (0..n).map(|_| DType::BF16.to_oracle().round(1.0 + rng.uniform().abs())).collect();
    let gradient: Vec<f64> = rng.vec(n, 0.5);
    let g = host(&gradient, DType::F32);
    let run = |dtype: DType, rounding: Rounding| {
        let mut p = host(&start, dtype);
        let mut opt = cpu_options(rounding).build(sgd, &[p.as_slice()]).unwrap();
        for _ in 0..steps {
            opt.step(&mut [p.as_mut_slice()], &[g.as_slice()]).unwrap();
        }
        p.to_f64()
    };
    let reference = run(DType::F32, Rounding::NearestEven);
    let error = |p: &[f64]| p.iter().zip(&reference).map(|(a, b)| (a - b).abs()).sum::<f64>() / n as f64;
    let nearest = error(&run(DType::BF16, Rounding::NearestEven));
    let kahan_values = run(DType::BF16, Rounding::Kahan);
    let kahan = error(&kahan_values);
    let stochastic = error(&run(DType::BF16, Rounding::Stochastic { seed: 1, state: false }));
    println!("mean |p - p_f32| after {steps} steps: nearest {nearest:.5}, stochastic {stochastic:.5}, Kahan {kahan:.5}");
    // The updates sum to 2000 / 1024 * |g| ~ 0.49 on average; nearest keeps none of it.
    assert!(nearest > 0.4, "nearest rounding's mean error {nearest}");
    // bf16's spacing in [1, 4) is at most 2^-6 = 0.0156; Kahan is within half of it.
    assert!(kahan < 0.008, "Kahan's mean error {kahan}");
    assert!(nearest > 50.0 * kahan, "nearest {nearest} against Kahan {kahan}");
    assert!(stochastic < 0.1 && stochastic > kahan, "stochastic rounding's mean error {stochastic}");

    // The GPU stores the same bits (lr 2^-10: the products are exact, so fusion cannot differ).
    let ctx = ctx();
    let param = ctx.upload("p", &start, DType::BF16);
    let grad = ctx.upload("g", &gradient, DType::F32);
    let mut gpu = options(Rounding::Kahan).build(&ctx, sgd, std::slice::from_ref(&param)).unwrap();
    for _ in 0..steps {
        gpu.step(std::slice::from_ref(&grad)).unwrap();
    }
    assert_bits_eq("GPU Kahan parameters", &ctx.read(&param).unwrap(), &kahan_values);
}

/// Infinities and NaN store as with nearest rounding, and a non-finite residual leaves no
/// compensation behind (so an infinite parameter stays infinite rather than turning NaN).
#[test]
fn nan_and_infinity_store_as_with_nearest_rounding() {
    let ctx = ctx();
    let start = [f64::INFINITY, f64::NEG_INFINITY, 1.0, 2.0, 3.0e38, 1.0];
    let gradient = [1.0, 1.0, f64::NAN, f64::INFINITY, -3.0e38, 0.25];
    for rounding in [Rounding::Kahan, Rounding::Stochastic { seed: 4, state: true }] {
        for dtype in [DType::BF16, DType::F16] {
            let sgd = Sgd { lr: 1.0, ..Sgd::default() };
            let run_nearest = {
                let mut p = host(&start, dtype);
                let g = host(&gradient, DType::F32);
                let mut opt = CpuOptimizer::builder().build(sgd, &[p.as_slice()]).unwrap();
                for _ in 0..2 {
                    opt.step(&mut [p.as_mut_slice()], &[g.as_slice()]).unwrap();
                }
                p.to_f64()
            };
            let param = ctx.upload("p", &start, dtype);
            let grad = ctx.upload("g", &gradient, DType::F32);
            let mut opt = options(rounding).build(&ctx, sgd, std::slice::from_ref(&param)).unwrap();
            opt.step(std::slice::from_ref(&grad)).unwrap();
            opt.step(&[grad]).unwrap();
            let got = ctx.read(&param).unwrap();
            for k in 0..5 {
                let (a, b) = (got[k], run_nearest[k]);
                let same = (a.is_nan() && b.is_nan())
                    || (a.is_infinite() && a == b)
                    || (a.is_finite() && b.is_finite());
                assert!(same, "{rounding:?} {dtype:?} [{k}]: got {a}, nearest rounding {b}");
            }
            if let Some(c) = opt.state(0, StateKind::KahanCompensation).unwrap().and_then(|s| s.dense()) {
                let c = ctx.read(c).unwrap();
                assert!(c[..4].iter().all(|v| *v == 0.0), "{dtype:?}: compensation {c:?}");
            }
        }
    }
}

#[test]
fn bad_rounding_options_are_typed_errors_that_change_nothing() {
    let ctx = ctx();
    let values = [0.5, -0.25, 0.125];
    let bf16 = ctx.upload("bf16", &values, DType::BF16);
    let f32s = ctx.upload("f32", &values, DType::F32);
    let sgd = Sgd::default();
    let stochastic = Rounding::Stochastic { seed: 1, state: true };
    for rounding in [stochastic, Rounding::Kahan] {
        // f32 parameters: their stores are exact, the option would do nothing.
        let err = options(rounding).build(&ctx, sgd, std::slice::from_ref(&f32s)).unwrap_err();
        assert!(
            matches!(&err, Error::DTypeMismatch { argument, got: DType::F32, .. } if argument == "params[0]"),
            "{err}"
        );
        let err = options(rounding).build(&ctx, sgd, &[bf16.clone(), f32s.clone()]).unwrap_err();
        assert!(matches!(&err, Error::DTypeMismatch { argument, .. } if argument == "params[1]"), "{err}");
        // Master weights and model copies: the f32 masters already keep the updates.
        let masters = Optimizer::builder().master_weights(true).rounding(rounding);
        let err = masters.build(&ctx, sgd, std::slice::from_ref(&bf16)).unwrap_err();
        assert!(
            matches!(err, Error::ConflictingOptions { first: "rounding", second: "master_weights", .. }),
            "{err}"
        );
        let copy = ctx.upload("copy", &values, DType::BF16);
        let copies = Optimizer::builder().model_copies(vec![copy]).rounding(rounding);
        let err = copies.build(&ctx, sgd, std::slice::from_ref(&f32s)).unwrap_err();
        assert!(
            matches!(err, Error::ConflictingOptions { first: "rounding", second: "model_copies", .. }),
            "{err}"
        );

        let p = host(&values, DType::F32);
        let err = cpu_options(rounding).build(sgd, &[p.as_slice()]).unwrap_err();
        assert!(matches!(&err, Error::DTypeMismatch { argument, .. } if argument == "params[0]"), "{err}");
        // The CPU builder has no master weights to conflict with (a compile_fail doctest of
        // `CpuOptimizerBuilder` shows the setter is absent).
    }
    // Nothing was written.
    assert_eq!(ctx.read(&bf16).unwrap(), values);
    assert_eq!(ctx.read(&f32s).unwrap(), values);
    // Nearest rounding takes any dtype, and keeps no compensation.
    let opt = options(Rounding::NearestEven).build(&ctx, sgd, &[f32s]).unwrap();
    assert!(opt.state(0, StateKind::KahanCompensation).unwrap().and_then(|s| s.dense()).is_none());
}

/// Save after 3 steps, load into a fresh optimizer (for stochastic rounding one built with
/// another seed: the file's seed replaces it), take 3 more: the same bits as 6 steps straight.
#[cfg(feature = "checkpoint")]
#[test]
fn a_resumed_run_is_bit_identical_to_an_uninterrupted_one() {
    use wgpu_optim::Adam;
    let ctx = ctx();
    let adam = Adam { lr: 1e-3, weight_decay: 0.01, decoupled_weight_decay: true, ..Adam::default() };
    let lens = [5usize, 1030];
    let mut rng = Rng::new(8);
    let start: Vec<Vec<f64>> = lens.iter().map(|n| rng.vec(*n, 1.0)).collect();
    let grads: Vec<Vec<Tensor>> = (0..6)
        .map(|_| lens.iter().map(|n| ctx.upload("g", &rng.vec(*n, 1.0), DType::BF16)).collect())
        .collect();
    let kinds = [StateKind::ExpAvg, StateKind::ExpAvgSq, StateKind::KahanCompensation];
    let snapshot = |opt: &Optimizer, params: &[Tensor]| -> Vec<Vec<f64>> {
        let mut all: Vec<Vec<f64>> = params.iter().map(|p| ctx.read(p).unwrap()).collect();
        for i in 0..params.len() {
            all.extend(
                kinds
                    .iter()
                    .filter_map(|k| opt.state(i, *k).unwrap().and_then(|s| s.dense()))
                    .map(|t| ctx.read(t).unwrap()),
            );
        }
        all
    };
    for (rounding, other) in [
        (Rounding::Stochastic { seed: 77, state: true }, Rounding::Stochastic { seed: 1, state: true }),
        (Rounding::Kahan, Rounding::Kahan),
    ] {
        let upload = |values: &[Vec<f64>]| -> Vec<Tensor> {
            values.iter().map(|v| ctx.upload("p", v, DType::BF16)).collect()
        };
        let straight = upload(&start);
        let mut opt = options(rounding).build(&ctx, adam, &straight).unwrap();
        for g in &grads {
            opt.step(g).unwrap();
        }
        let want = snapshot(&opt, &straight);

        let first = upload(&start);
        let mut opt = options(rounding).build(&ctx, adam, &first).unwrap();
        for g in &grads[..3] {
            opt.step(g).unwrap();
        }
        let bytes = opt.save_to_bytes().unwrap();
        let resumed = upload(&first.iter().map(|p| ctx.read(p).unwrap()).collect::<Vec<_>>());
        let mut opt = options(other).build(&ctx, adam, &resumed).unwrap();
        opt.load_from_bytes(&bytes).unwrap();
        assert_eq!(opt.rounding(), rounding);
        for g in &grads[3..] {
            opt.step(g).unwrap();
        }
        let got = snapshot(&opt, &resumed);
        assert_eq!(got.len(), want.len());
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_bits_eq(&format!("{rounding:?}: tensor {k}"), g, w);
        }
        // The same steps with the other seed differ: the seed was restored, not ignored.
        if rounding != other {
            let again = upload(&start);
            let mut opt = options(other).build(&ctx, adam, &again).unwrap();
            for g in &grads {
                opt.step(g).unwrap();
            }
            assert_ne!(snapshot(&opt, &again)[1], want[1]);
        }
    }
}

/// A checkpoint of one rounding mode is refused by an optimizer of another, which keeps its
/// state and step count.
#[cfg(feature = "checkpoint")]
#[test]
fn a_checkpoint_of_another_rounding_mode_is_refused() {
    let ctx = ctx();
    let sgd = Sgd { lr: 0.1, momentum: 0.9, ..Sgd::default() };
    let p = ctx.upload("p", &[1.0, 2.0, 3.0], DType::BF16);
    let g = ctx.upload("g", &[0.5, 0.25, 0.125], DType::BF16);
    let mut kahan = options(Rounding::Kahan).build(&ctx, sgd, std::slice::from_ref(&p)).unwrap();
    kahan.step(std::slice::from_ref(&g)).unwrap();
    let bytes = kahan.save_to_bytes().unwrap();
    let q = ctx.upload("q", &[1.0, 2.0, 3.0], DType::BF16);
    for rounding in [Rounding::NearestEven, Rounding::Stochastic { seed: 2, state: false }] {
        let mut opt = options(rounding).build(&ctx, sgd, std::slice::from_ref(&q)).unwrap();
        opt.step(std::slice::from_ref(&g)).unwrap();
        let before = ctx
            .read(opt.state(0, StateKind::MomentumBuffer).unwrap().and_then(|s| s.dense()).unwrap())
            .unwrap();
        let err = opt.load_from_bytes(&bytes).unwrap_err();
        assert!(matches!(&err, Error::BadFile { problem, .. } if problem.contains("rounding")), "{err}");
        assert_eq!(opt.step_count(), 1);
        assert_eq!(opt.rounding(), rounding);
        assert_eq!(
            ctx.read(opt.state(0, StateKind::MomentumBuffer).unwrap().and_then(|s| s.dense()).unwrap())
                .unwrap(),
            before
        );
    }
}
