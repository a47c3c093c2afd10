//! Storage types of tensors. All arithmetic is f32 (f64 for the ONNX double ops).

/// How the elements of a tensor are stored in its buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary64 (ONNX `tensor(double)`; needs `SHADER_F64`).
    F64,
}

impl DType {
    /// Bytes per element.
    pub const fn size(self) -> u64 {
        match self {
            DType::F32 => 4,
            DType::F64 => 8,
        }
    }

    /// The WGSL scalar type a storage array of this dtype is declared with.
    pub(crate) const fn wgsl_storage(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }
}
