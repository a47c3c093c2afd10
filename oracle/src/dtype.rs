//! Values stored in a tensor's dtype, as the oracle rounds them: to nearest, ties to even,
//! once, from the exact f64 value. Written from IEEE 754's definition (the nearest value of
//! the format, the one with an even last bit on a tie, infinity past the largest finite value
//! plus half a spacing), not with wgpu-optim's conversions, so that the tests compare the
//! crate's stores with an independent rounding. The dtypes are the oracle's own ([`DType`],
//! PyTorch's names), not the crate's.

/// A tensor's storage dtype, as PyTorch names them (`torch.float64`, `torch.float32`,
/// `torch.float16`, `torch.bfloat16`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// `torch.float64`: IEEE binary64 (no rounding in the oracle).
    F64,
    /// `torch.float32`: IEEE binary32.
    F32,
    /// `torch.float16`: IEEE binary16.
    F16,
    /// `torch.bfloat16`: 8 significant bits, f32's exponents.
    BF16,
}

impl DType {
    /// `dtype.itemsize`: bytes per element.
    pub const fn itemsize(self) -> usize {
        match self {
            DType::F64 => 8,
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }
}

/// `value` rounded to the nearest value of `dtype` (ties to even), widened back to f64.
/// NaN stays NaN, infinities and zeros (with their sign) stay themselves.
pub fn round(dtype: DType, value: f64) -> f64 {
    match dtype {
        DType::F64 => value,
        // Rust's `as` rounds to nearest, ties to even.
        DType::F32 => f64::from(value as f32),
        // binary16: 11 significant bits, normal exponents -14 ..= 15.
        DType::F16 => round_to_format(value, 11, -14, 15),
        // bfloat16: 8 significant bits, f32's exponents -126 ..= 127.
        DType::BF16 => round_to_format(value, 8, -126, 127),
    }
}

/// Round to nearest even into a binary format of `precision` significant bits whose normal
/// numbers have exponents `min_exponent ..= max_exponent` (subnormals below, with the spacing
/// of the smallest normal binade).
fn round_to_format(value: f64, precision: i32, min_exponent: i32, max_exponent: i32) -> f64 {
    if !value.is_finite() || value == 0.0 {
        return value;
    }
    // floor(log2 |value|) from the exponent bits; an f64 subnormal (far below any of these
    // formats) reads as -1023 and is clamped like any other value below the normal range.
    let exponent = ((value.to_bits() >> 52) & 0x7ff) as i32 - 1023;
    let spacing = 2f64.powi(exponent.max(min_exponent) - (precision - 1));
    // Dividing and multiplying by a power of two is exact here, so the only rounding is
    // `round_ties_even`'s, to an integer count of spacings.
    let rounded = (value / spacing).round_ties_even() * spacing;
    let largest = (2.0 - 2f64.powi(1 - precision)) * 2f64.powi(max_exponent);
    if rounded.abs() > largest {
        f64::INFINITY.copysign(value)
    } else {
        rounded
    }
}

/// The little-endian bytes of `values` stored in `dtype`, each rounded once by [`round`].
pub fn encode(dtype: DType, values: &[f64]) -> Vec<u8> {
    let rounded = values.iter().map(|&v| round(dtype, v));
    // Every rounded value is exactly representable, so these conversions do not round.
    match dtype {
        DType::F64 => rounded.flat_map(f64::to_le_bytes).collect(),
        DType::F32 => rounded.flat_map(|v| (v as f32).to_le_bytes()).collect(),
        DType::F16 => rounded.flat_map(|v| half::f16::from_f64(v).to_le_bytes()).collect(),
        DType::BF16 => rounded.flat_map(|v| half::bf16::from_f32(v as f32).to_le_bytes()).collect(),
    }
}

/// The values stored in `bytes` (little-endian, `dtype`), widened exactly to f64.
pub fn decode(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    fn each<const N: usize>(bytes: &[u8], f: impl Fn([u8; N]) -> f64) -> Vec<f64> {
        bytes.chunks_exact(N).map(|c| f(c.try_into().unwrap_or([0; N]))).collect()
    }
    match dtype {
        DType::F64 => each(bytes, f64::from_le_bytes),
        DType::F32 => each(bytes, |b| f64::from(f32::from_le_bytes(b))),
        DType::F16 => each(bytes, |b| half::f16::from_le_bytes(b).to_f64()),
        DType::BF16 => each(bytes, |b| half::bf16::from_le_bytes(b).to_f64()),
    }
}

/// [`round`], [`encode`] and [`decode`] as methods of a [`DType`], so that a test reads
/// `dtype.round(x)`.
pub trait Storage {
    /// [`round`]: `value` rounded to this dtype, to nearest even.
    fn round(self, value: f64) -> f64;
    /// [`encode`]: the little-endian bytes of `values` in this dtype.
    fn encode(self, values: &[f64]) -> Vec<u8>;
    /// [`decode`]: the values in `bytes`, widened to f64.
    fn decode(self, bytes: &[u8]) -> Vec<f64>;
}

impl Storage for DType {
    fn round(self, value: f64) -> f64 {
        round(self, value)
    }

    fn encode(self, values: &[f64]) -> Vec<u8> {
        encode(self, values)
    }

    fn decode(self, bytes: &[u8]) -> Vec<f64> {
        decode(self, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_uses_every_bit_of_the_f64() {
        // Just above the halfway point between 8.0 and 8.0625: rounds up.
        let tie = f64::from(f32::from_bits(0x4100_8000));
        assert_eq!(round(DType::BF16, tie + 1e-12), 8.0625);
        // Exactly halfway: ties to even (8.0 has an even last bit).
        assert_eq!(round(DType::BF16, tie), 8.0);
        // Just below: down, although rounding to f32 first would land on the tie.
        assert_eq!(round(DType::BF16, tie - 1e-12), 8.0);
        assert!(round(DType::BF16, f64::NAN).is_nan());
        assert_eq!(round(DType::BF16, 1e39), f64::INFINITY);
        // bf16's largest finite value, 0x7f7f, and the overflow threshold half a spacing on.
        let largest = f64::from(f32::from_bits(0x7f7f_0000));
        assert_eq!(round(DType::BF16, largest), largest);
        assert_eq!(round(DType::BF16, largest + 2f64.powi(119)), f64::INFINITY);
        assert_eq!(round(DType::BF16, -(largest + 2f64.powi(119) - 2f64.powi(100))), -largest);
    }

    #[test]
    fn f16_rounding_overflows_subnormals_and_ties_as_ieee() {
        assert_eq!(round(DType::F16, 65520.0), f64::INFINITY);
        assert_eq!(round(DType::F16, 65519.0), 65504.0);
        // The smallest subnormal, 2^-24, and half of it (a tie, to the even 0).
        assert_eq!(round(DType::F16, 2f64.powi(-24) * 0.75), 2f64.powi(-24));
        assert_eq!(round(DType::F16, 2f64.powi(-25)), 0.0);
        assert!(round(DType::F16, -(2f64.powi(-26))).is_sign_negative());
        // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: to the even 1.
        assert_eq!(round(DType::F16, 1.0 + 2f64.powi(-11)), 1.0);
        assert_eq!(round(DType::F16, 1.0 + 3.0 * 2f64.powi(-11)), 1.0 + 2.0 * 2f64.powi(-10));
    }

    /// Every f16 value, every midpoint between neighbours and points a quarter spacing either
    /// side round as the `half` crate's f16 conversion does, for a second opinion. (Not points
    /// within 2^-20 or so of a midpoint: `half::f16::from_f64` (2.7) rounds from the f64's
    /// top 32 bits only, so just above a midpoint it can round down.)
    #[test]
    fn f16_rounding_agrees_with_the_half_crate_on_every_value_and_midpoint() {
        for bits in 0..0x7bffu16 {
            let v = half::f16::from_bits(bits).to_f64();
            let next = half::f16::from_bits(bits + 1).to_f64();
            let (mid, quarter) = ((v + next) / 2.0, (next - v) / 4.0);
            for x in [v, mid, mid - quarter, mid + quarter, -mid, -(mid + quarter)] {
                let want = half::f16::from_f64(x).to_f64();
                assert_eq!(round(DType::F16, x).to_bits(), want.to_bits(), "{x:e}");
            }
        }
        // Just above the midpoint between 0 and the smallest subnormal: up, to 2^-24.
        assert_eq!(round(DType::F16, 2f64.powi(-25) * (1.0 + 1e-9)), 2f64.powi(-24));
    }

    #[test]
    fn encode_and_decode_round_trip_the_rounded_values() {
        let values = [1.0, -2.5, 1.0 / 3.0, 1e-7, 70000.0];
        for dtype in [DType::F64, DType::F32, DType::F16, DType::BF16] {
            let want: Vec<f64> = values.iter().map(|&v| round(dtype, v)).collect();
            let bytes = encode(dtype, &values);
            assert_eq!(bytes.len(), values.len() * dtype.itemsize(), "{dtype:?}");
            assert_eq!(decode(dtype, &bytes), want, "{dtype:?}");
        }
        assert_eq!(encode(DType::BF16, &[1.0]), [0x80, 0x3f]);
        assert_eq!(encode(DType::F16, &[1.0]), [0x00, 0x3c]);
    }
}
