//! Shared helpers of the GPU tests: the headless context, deterministic random data, and
//! a comparison that names the first few mismatching indices.
#![allow(dead_code)]

use std::sync::OnceLock;

use wgpu_optim::GpuContext;

/// The headless context. No adapter is a test failure whose message says how to get one.
pub fn ctx() -> GpuContext {
    static CTX: OnceLock<GpuContext> = OnceLock::new();
    CTX.get_or_init(|| match GpuContext::headless_blocking() {
        Ok(ctx) => ctx,
        Err(e) => panic!("GPU tests need an adapter: {e}"),
    })
    .clone()
}

/// A context of its own (its own pipeline cache), for tests that count compiled pipelines
/// while other tests compile theirs on the shared one.
pub fn fresh_ctx() -> GpuContext {
    GpuContext::headless_blocking().unwrap_or_else(|e| panic!("GPU tests need an adapter: {e}"))
}

/// SplitMix64: deterministic, dependency-free test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }

    /// `len` values in [-scale, scale), exactly representable in f32.
    pub fn vec(&mut self, len: usize, scale: f64) -> Vec<f64> {
        (0..len).map(|_| f64::from((self.uniform() * scale) as f32)).collect()
    }

    /// `len` values in [0, scale), exactly representable in f32 (second moments).
    pub fn positive(&mut self, len: usize, scale: f64) -> Vec<f64> {
        (0..len).map(|_| f64::from((self.uniform().abs() * scale) as f32)).collect()
    }
}

pub fn to_f32(values: &[f64]) -> Vec<f32> {
    values.iter().map(|v| *v as f32).collect()
}

/// The tolerance of the conformance vectors: `|got - want| <= atol + rtol * |want|`.
pub const RTOL: f64 = 1e-5;
pub const ATOL: f64 = 1e-6;

/// Asserts `got` matches `want` within the tolerance, NaN-aware, naming the first three
/// mismatches instead of printing the arrays.
pub fn assert_close(what: &str, got: &[f32], want: &[f64], rtol: f64, atol: f64) {
    let got: Vec<f64> = got.iter().map(|g| f64::from(*g)).collect();
    assert_close_f64(what, &got, want, rtol, atol);
}

/// Reads an f32 tensor and compares it with the oracle.
pub fn assert_tensor(ctx: &GpuContext, what: &str, tensor: &wgpu_optim::Tensor, want: &[f64]) {
    let got = ctx.read_f32(tensor).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_close(what, &got, want, RTOL, ATOL);
}

/// Uploads `values` (rounded to `dtype`) as a new tensor.
pub fn upload(ctx: &GpuContext, values: &[f64], dtype: wgpu_optim::DType) -> wgpu_optim::Tensor {
    ctx.upload("input", values, dtype)
}

/// Reads a tensor of any dtype, widened to f64.
pub fn download(ctx: &GpuContext, tensor: &wgpu_optim::Tensor) -> Vec<f64> {
    ctx.read(tensor).unwrap_or_else(|e| panic!("reading a tensor back: {e}"))
}

/// One variadic ONNX training-operator call, checked against the oracle.
pub struct OnnxCall<'a> {
    /// The input groups after R and T, e.g. `["X", "G", "V", "H"]`; every group but `G`
    /// has an output.
    pub groups: &'a [&'a str],
    /// The lengths of the n tensors.
    pub lengths: &'a [usize],
    pub dtype: wgpu_optim::DType,
    /// Whether output k (in operator order) is written in place.
    pub in_place: &'a dyn Fn(usize) -> bool,
    pub seed: u64,
    pub rtol: f64,
    pub atol: f64,
}

impl OnnxCall<'_> {
    /// Generates inputs (the `H` group non-negative), records the call with `record`, and
    /// compares every output with `oracle(inputs of tensor i)`, which returns the outputs of
    /// tensor i in operator order.
    pub fn check(
        &self,
        record: impl FnOnce(
            &GpuContext,
            &mut wgpu::CommandEncoder,
            &[wgpu_optim::Tensor],
            &[Option<wgpu_optim::Tensor>],
        ) -> wgpu_optim::Result<()>,
        oracle: impl Fn(&[Vec<f64>]) -> Vec<Vec<f64>>,
    ) {
        let ctx = ctx();
        let mut rng = Rng::new(self.seed);
        let n = self.lengths.len();
        let values: Vec<Vec<Vec<f64>>> = self
            .groups
            .iter()
            .map(|g| {
                self.lengths
                    .iter()
                    .map(|&l| match *g {
                        "H" => rng.positive(l, 0.01),
                        "V" => rng.vec(l, 0.1),
                        _ => rng.vec(l, 1.0),
                    })
                    .collect()
            })
            .collect();
        let inputs: Vec<wgpu_optim::Tensor> =
            values.iter().flat_map(|group| group.iter().map(|v| upload(&ctx, v, self.dtype))).collect();
        let updated: Vec<usize> = (0..self.groups.len()).filter(|&k| self.groups[k] != "G").collect();
        let outputs: Vec<Option<wgpu_optim::Tensor>> = (0..updated.len() * n)
            .map(|k| {
                (!(self.in_place)(k)).then(|| ctx.zeros("output", self.lengths[k % n] as u64, self.dtype))
            })
            .collect();
        ctx.submit("onnx", |encoder| record(&ctx, encoder, &inputs, &outputs)).unwrap();
        for i in 0..n {
            let tensor_inputs: Vec<Vec<f64>> = values.iter().map(|group| group[i].clone()).collect();
            let want = oracle(&tensor_inputs);
            for (k, group) in updated.iter().enumerate() {
                let slot = k * n + i;
                let written = outputs[slot].as_ref().unwrap_or(&inputs[group * n + i]);
                let got = download(&ctx, written);
                let what = format!(
                    "{}_new_{} (n = {}, {:?})",
                    self.groups[*group],
                    i + 1,
                    self.lengths[i],
                    self.dtype
                );
                assert_close_f64(&what, &got, &want[k], self.rtol, self.atol);
            }
        }
    }
}

/// As [`assert_close`], for values already widened to f64.
pub fn assert_close_f64(what: &str, got: &[f64], want: &[f64], rtol: f64, atol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let bad: Vec<String> = got
        .iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (g, w))| {
            let ok = if w.is_nan() {
                g.is_nan()
            } else if w.is_infinite() {
                g == w
            } else {
                (*g - *w).abs() <= atol + rtol * w.abs()
            };
            !ok
        })
        .map(|(i, (g, w))| format!("[{i}] got {g:e} want {w:e}"))
        .collect();
    assert!(
        bad.is_empty(),
        "{what}: {} values outside tolerance: {}",
        bad.len(),
        bad[..bad.len().min(3)].join(", ")
    );
}

/// Distance in units in the last place of `dtype` between two values representable in it.
pub fn ulps(a: f64, b: f64, dtype: wgpu_optim::DType) -> u64 {
    use wgpu_optim::DType;
    if a.is_nan() || b.is_nan() {
        return if a.is_nan() && b.is_nan() { 0 } else { u64::MAX };
    }
    // Sign-magnitude bits mapped to a line on which neighbours differ by one.
    let ordered = |bits: i64, sign_bit: i64| if bits & sign_bit != 0 { sign_bit - bits } else { bits };
    let bits16 = |x: f64| i64::from(u16::from_le_bytes(dtype.encode(&[x])[..2].try_into().unwrap()));
    let (x, y) = match dtype {
        DType::F16 | DType::BF16 => (ordered(bits16(a), 0x8000), ordered(bits16(b), 0x8000)),
        DType::F32 => (
            ordered(i64::from((a as f32).to_bits()), 0x8000_0000),
            ordered(i64::from((b as f32).to_bits()), 0x8000_0000),
        ),
        DType::F64 => return if a == b { 0 } else { u64::MAX },
    };
    x.abs_diff(y)
}

/// Asserts every value is within `max_ulps` of `dtype`, or within `abs` absolutely.
pub fn assert_ulps_or_abs(
    what: &str,
    got: &[f64],
    want: &[f64],
    dtype: wgpu_optim::DType,
    max_ulps: u64,
    abs: f64,
) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let bad: Vec<String> = got
        .iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (g, w))| {
            let close_enough = (*g - *w).abs() <= abs;
            ulps(**g, **w, dtype) > max_ulps && !close_enough
        })
        .map(|(i, (g, w))| format!("[{i}] got {g:e} want {w:e} ({} ulps)", ulps(*g, *w, dtype)))
        .collect();
    assert!(
        bad.is_empty(),
        "{what}: {} values beyond {max_ulps} ulp of {dtype:?}: {}",
        bad.len(),
        bad[..bad.len().min(3)].join(", ")
    );
}

/// Cancellation slack of a 16-bit store: where a result cancels to nearly zero it carries
/// the f32 arithmetic's absolute error, many ulps of a type that keeps f32's exponent (SGD's
/// `0.9 * v - g + 0.1 * p` on unit-scale bfloat16 data is exactly 0 in f64 and 2^-25 in f32).
pub const CANCELLATION: f64 = 1e-7;

/// Checks one stored tensor against the oracle resumed from the previous stored state: a
/// 16-bit store within 1 ulp (f32 against f64 intermediates can move a result across one
/// 16-bit rounding boundary) or [`CANCELLATION`]; an f32 store within the f32 tolerance
/// (cancellation in `b1 * m + (1 - b1) * g` makes its error many f32 ulps).
pub fn assert_stored(what: &str, got: &[f64], want: &[f64], dtype: wgpu_optim::DType) {
    if dtype.size() == 2 {
        assert_ulps_or_abs(what, got, want, dtype, 1, CANCELLATION);
    } else {
        assert_close_f64(what, got, want, RTOL, ATOL);
    }
}

/// Every combination of amsgrad, maximize and weight-decay mode (none, L2, decoupled,
/// decoupled with a zero coefficient).
///
/// Weight decays in these lists are powers of two: then `g + wd * p` is exact in f32 before
/// its one rounding, so where it cancels (|g + wd p| ~ 1e-8 happens among millions of random
/// elements) f32 and the f64 oracle still agree. With wd = 0.05 the product's own rounding
/// would dominate such a cancelled sum and the two would differ by design, not by a bug.
pub fn adam_switch_combinations() -> Vec<wgpu_optim::Algorithm> {
    use wgpu_optim::Adam;
    let mut configs = Vec::new();
    for amsgrad in [false, true] {
        for maximize in [false, true] {
            for (weight_decay, decoupled_weight_decay) in
                [(0.0, false), (0.0625, false), (0.0, true), (0.0625, true)]
            {
                let adam = Adam {
                    lr: 1e-2,
                    amsgrad,
                    maximize,
                    weight_decay,
                    decoupled_weight_decay,
                    ..Adam::default()
                };
                configs.push(adam.into());
            }
        }
    }
    configs
}

/// SGD: plain, momentum, dampening, Nesterov, and maximize with weight decay.
pub fn sgd_variants() -> Vec<wgpu_optim::Algorithm> {
    use wgpu_optim::Sgd;
    let base = Sgd { lr: 0.01, ..Sgd::default() };
    vec![
        base.into(),
        Sgd { momentum: 0.9, ..base }.into(),
        Sgd { momentum: 0.9, dampening: 0.5, ..base }.into(),
        Sgd { momentum: 0.9, nesterov: true, ..base }.into(),
        Sgd { momentum: 0.8, nesterov: true, weight_decay: 0.015625, maximize: true, ..base }.into(),
        Sgd { momentum: 0.9, weight_decay: 0.125, maximize: true, ..base }.into(),
        Sgd { weight_decay: 0.125, maximize: true, ..base }.into(),
    ]
}

/// Adagrad: defaults, lr_decay with weight decay, and an initial accumulator with maximize.
pub fn adagrad_variants() -> Vec<wgpu_optim::Algorithm> {
    use wgpu_optim::Adagrad;
    vec![
        Adagrad::default().into(),
        Adagrad { lr_decay: 0.1, weight_decay: 0.015625, ..Adagrad::default() }.into(),
        Adagrad { initial_accumulator_value: 0.1, eps: 1e-6, maximize: true, ..Adagrad::default() }.into(),
    ]
}
