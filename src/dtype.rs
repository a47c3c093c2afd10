//! Storage types of tensors. All arithmetic is f32 (f64 for the ONNX double ops); a
//! store rounds to the storage type once, to nearest even.

/// How the elements of a tensor are stored in its buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary64 (ONNX `tensor(double)`; needs `SHADER_F64`). The math then runs in f64.
    F64,
    /// IEEE binary16: native `f16` where the adapter has `SHADER_F16`, packed pairs in
    /// `u32` otherwise.
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

    /// Rounds `value` to the nearest value of this dtype (ties to even), widened back.
    pub fn round(self, value: f64) -> f64 {
        match self {
            DType::F64 => value,
            DType::F32 => f64::from(value as f32),
            DType::F16 => half::f16::from_f64(value).to_f64(),
            DType::BF16 => half::bf16::from_f64(value).to_f64(),
        }
    }

    /// The little-endian bytes of `values` in this dtype, each rounded once.
    pub fn encode(self, values: &[f64]) -> Vec<u8> {
        match self {
            DType::F64 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            DType::F32 => values.iter().flat_map(|v| (*v as f32).to_le_bytes()).collect(),
            DType::F16 => values.iter().flat_map(|v| half::f16::from_f64(*v).to_le_bytes()).collect(),
            DType::BF16 => values.iter().flat_map(|v| half::bf16::from_f64(*v).to_le_bytes()).collect(),
        }
    }

    /// The values stored in `bytes` (little-endian, this dtype), widened exactly to f64.
    pub fn decode(self, bytes: &[u8]) -> Vec<f64> {
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
