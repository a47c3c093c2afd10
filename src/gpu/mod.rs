//! The GPU layer: it knows buffers, bindings and shaders, and nothing of any convention.

mod context;
pub(crate) mod dispatch;
pub(crate) mod kernel;
pub(crate) mod pipeline;
pub(crate) mod plan;
pub(crate) mod step;
mod transfer;

pub use context::{ContextReport, GpuContext};
pub use transfer::TENSOR_USAGES;

/// `len` copies of `value` in `dtype`'s bytes, for filling a tensor from the host.
pub(crate) fn fill_bytes(value: f64, len: u64, dtype: crate::DType) -> Vec<u8> {
    match dtype {
        crate::DType::F32 => (value as f32).to_le_bytes().repeat(len as usize),
        crate::DType::F64 => value.to_le_bytes().repeat(len as usize),
    }
}
