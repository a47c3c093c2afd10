//! Storage types of tensors. All arithmetic is f32 (f64 for the ONNX double ops); a
//! store rounds to the storage type once, to nearest even.

/// How the elements of a tensor are stored in its buffer.
///
/// `#[non_exhaustive]`: storage types follow the hardware (8-bit floats next).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary64 (ONNX `tensor(double)`; needs `SHADER_F64`). The math then runs in f64.
    F64,
    /// IEEE binary16: native `array<f16>` where the device has `SHADER_F16` and is not a
    /// CPU adapter, packed pairs in `u32` otherwise ([`GpuContext::native_f16`] says which).
    ///
    /// [`GpuContext::native_f16`]: crate::GpuContext::native_f16
    F16,
    /// bfloat16, packed pairs in `u32` (WGSL has no bf16 type).
    BF16,
}

impl DType {
    /// Bytes per element.
    pub const fn size(self) -> u64 {
        match self {
            DType::F32 => 4,
            DType::F64 => 8,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// The WGSL scalar type of values of this dtype in registers.
    pub(crate) const fn wgsl_math(self) -> &'static str {
        match self {
            DType::F32 | DType::BF16 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
        }
    }

    /// Rounds `value` to the nearest value of this dtype (ties to even), widened back: the
    /// CPU backend's host tensors (`HostTensor::from_f64`) are its one user.
    #[cfg_attr(not(feature = "cpu"), allow(dead_code))]
    pub(crate) fn round(self, value: f64) -> f64 {
        match self {
            DType::F64 => value,
            DType::F32 => f64::from(value as f32),
            DType::F16 => f16_from_f64(value).to_f64(),
            DType::BF16 => bf16_from_f64(value).to_f64(),
        }
    }

    /// The little-endian bytes of `values` in this dtype, each rounded once.
    pub(crate) fn encode(self, values: &[f64]) -> Vec<u8> {
        match self {
            DType::F64 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            DType::F32 => values.iter().flat_map(|v| (*v as f32).to_le_bytes()).collect(),
            DType::F16 => values.iter().flat_map(|v| f16_from_f64(*v).to_le_bytes()).collect(),
            DType::BF16 => values.iter().flat_map(|v| bf16_from_f64(*v).to_le_bytes()).collect(),
        }
    }

    /// The values stored in `bytes` (little-endian, this dtype), widened exactly to f64.
    pub(crate) fn decode(self, bytes: &[u8]) -> Vec<f64> {
        fn each<const N: usize>(bytes: &[u8], f: impl Fn([u8; N]) -> f64) -> Vec<f64> {
            bytes.chunks_exact(N).map(|c| f(c.try_into().unwrap_or([0; N]))).collect()
        }
        match self {
            DType::F64 => each(bytes, f64::from_le_bytes),
            DType::F32 => each(bytes, |b| f64::from(f32::from_le_bytes(b))),
            DType::F16 => each(bytes, |b| half::f16::from_le_bytes(b).to_f64()),
            DType::BF16 => each(bytes, |b| half::bf16::from_le_bytes(b).to_f64()),
        }
    }
}

/// `value` rounded to the nearest bfloat16, ties to even.
///
/// `half::bf16::from_f64` (2.7) drops the low 32 bits of the f64 mantissa before rounding,
/// so a value just above a halfway point can round down. Rounding to f32 first is exact
/// except where it lands on a bfloat16 halfway point that `value` itself is not on; there
/// the direction comes from `value`.
fn bf16_from_f64(value: f64) -> half::bf16 {
    let single = value as f32;
    let bits = single.to_bits();
    if !single.is_nan() && bits & 0xffff == 0x8000 && f64::from(single) != value {
        let truncated = bits & 0xffff_0000;
        let away_from_zero = value.abs() > f64::from(single).abs();
        let rounded = if away_from_zero { truncated + 0x1_0000 } else { truncated };
        return half::bf16::from_bits((rounded >> 16) as u16);
    }
    half::bf16::from_f32(single)
}

/// `value` rounded to the nearest IEEE binary16, ties to even, overflowing to infinity from
/// 65520 up.
///
/// `half::f16::from_f64` (2.7) has `bf16_from_f64`'s flaw: it rounds from the top 32 bits of
/// the f64. Every binary16 value and every midpoint between neighbours (the subnormals', and
/// the overflow threshold 65520, included) is an f32, so rounding to f32 first keeps the
/// direction except where the f32 lands on such a midpoint that `value` is not on; there the
/// f32 is moved one step toward `value`, which no longer ties.
fn f16_from_f64(value: f64) -> half::f16 {
    let single = value as f32;
    if single.is_nan() || f64::from(single) == value || !is_f16_midpoint(single) {
        return half::f16::from_f32(single);
    }
    let bits = single.to_bits();
    let nudged = if value.abs() > f64::from(single).abs() { bits + 1 } else { bits - 1 };
    half::f16::from_f32(f32::from_bits(nudged))
}

/// Whether `x` lies exactly halfway between two neighbouring binary16 values (the largest
/// finite one and 65536, past which everything overflows, count as neighbours).
fn is_f16_midpoint(x: f32) -> bool {
    let magnitude = f64::from(x.abs());
    if !magnitude.is_finite() || magnitude == 0.0 || magnitude >= 65536.0 {
        return false;
    }
    // The spacing of binary16 values at this magnitude: 2^-24 among the subnormals, below 2^-14.
    let exponent = if magnitude < 2f64.powi(-14) { -14 } else { magnitude.log2().floor() as i32 };
    let spacing = 2f64.powi(exponent - 10);
    (magnitude / spacing).fract() == 0.5
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_uses_every_bit_of_the_f64() {
        // Just above the halfway point between 8.0 and 8.0625: rounds up.
        let above_tie = f64::from(f32::from_bits(0x4100_8000)) + 1e-12;
        assert_eq!(DType::BF16.round(above_tie), 8.0625);
        // Exactly halfway: ties to even (8.0 has an even mantissa).
        assert_eq!(DType::BF16.round(f64::from(f32::from_bits(0x4100_8000))), 8.0);
        // f32 rounding lands on the halfway point from below: still rounds down.
        let below_tie = f64::from(f32::from_bits(0x4100_8000)) - 1e-12;
        assert_eq!(DType::BF16.round(below_tie), 8.0);
        assert!(DType::BF16.round(f64::NAN).is_nan());
        assert_eq!(DType::BF16.round(1e39), f64::INFINITY);
        assert_eq!(DType::F16.round(65520.0), f64::INFINITY);
        assert_eq!(DType::F16.round(65519.0), 65504.0);
    }

    #[test]
    fn f16_rounding_uses_every_bit_of_the_f64() {
        // Halfway between 1.0 and 1 + 2^-10 sits at 1 + 2^-11; a hair above rounds up.
        let tie = 1.0 + 2f64.powi(-11);
        assert_eq!(DType::F16.round(tie + 1e-12), 1.0 + 2f64.powi(-10));
        assert_eq!(DType::F16.round(tie), 1.0);
        assert_eq!(DType::F16.round(tie - 1e-12), 1.0);
        // Odd neighbour below: the tie goes up to the even one, a hair below stays down.
        let odd_tie = 1.0 + 3.0 * 2f64.powi(-11);
        assert_eq!(DType::F16.round(odd_tie), 1.0 + 2f64.powi(-9));
        assert_eq!(DType::F16.round(odd_tie - 1e-12), 1.0 + 2f64.powi(-10));
        // Subnormals: halfway between 0 and the smallest, 2^-25, ties to 0; above, up.
        assert_eq!(DType::F16.round(2f64.powi(-25)), 0.0);
        assert_eq!(DType::F16.round(2f64.powi(-25) * (1.0 + 1e-9)), 2f64.powi(-24));
        assert_eq!(DType::F16.round(-(2f64.powi(-25) * (1.0 + 1e-9))), -(2f64.powi(-24)));
        // The overflow threshold, 65520: at or a hair above overflows, a hair below does not.
        assert_eq!(DType::F16.round(65520.0), f64::INFINITY);
        assert_eq!(DType::F16.round(65520.0 + 1e-9), f64::INFINITY);
        assert_eq!(DType::F16.round(65520.0 - 1e-9), 65504.0);
        assert_eq!(DType::F16.round(-65520.0 + 1e-9), -65504.0);
        let bytes = DType::F16.encode(&[tie + 1e-12]);
        assert_eq!(DType::F16.decode(&bytes), vec![1.0 + 2f64.powi(-10)]);
    }

    /// Every binary16 value, every midpoint and points just off each midpoint round as the
    /// testkit oracle's exact rounding does.
    #[test]
    fn f16_rounding_matches_the_exact_rule_around_every_midpoint() {
        for bits in 0u16..0x7bff {
            let v = half::f16::from_bits(bits).to_f64();
            let next = half::f16::from_bits(bits + 1).to_f64();
            let mid = (v + next) / 2.0;
            let even = if bits % 2 == 0 { v } else { next };
            assert_eq!(DType::F16.round(v), v);
            assert_eq!(DType::F16.round(mid), even, "tie at {mid:e}");
            let nudge = (next - v) * 1e-7;
            assert_eq!(DType::F16.round(mid + nudge), next, "above {mid:e}");
            assert_eq!(DType::F16.round(mid - nudge), v, "below {mid:e}");
            assert_eq!(DType::F16.round(-(mid + nudge)), -next, "below -{mid:e}");
        }
    }
}
