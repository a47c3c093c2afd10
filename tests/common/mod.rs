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
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut bad = Vec::new();
    let mut count = 0;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g = f64::from(g);
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() {
            g == w
        } else {
            (g - w).abs() <= atol + rtol * w.abs()
        };
        if !ok {
            count += 1;
            if bad.len() < 3 {
                bad.push(format!("[{i}] got {g:e} want {w:e}"));
            }
        }
    }
    assert!(count == 0, "{what}: {count} of {} values outside tolerance: {}", got.len(), bad.join(", "));
}

/// Reads an f32 tensor and compares it with the oracle.
pub fn assert_tensor(ctx: &GpuContext, what: &str, tensor: &wgpu_optim::Tensor, want: &[f64]) {
    let got = ctx.read_f32(tensor).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_close(what, &got, want, RTOL, ATOL);
}
