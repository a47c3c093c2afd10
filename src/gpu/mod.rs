//! The GPU layer: it knows buffers, bindings and shaders, and nothing of any convention.
//! The passes of the algorithms that are not elementwise live in their family folders
//! (`crate::family::<name>::gpu_passes`). [`matmul`] stays here: a batched matrix product
//! any caller may run ([`matmul::Matmul`]), whose layout a family's passes compile their own
//! kernels over (`MatrixKernels::compile_kernel`) so that one bind group serves the products
//! and those kernels.

pub(crate) mod blockwise;
pub(crate) mod compile;
mod context;
pub(crate) mod dispatch;
pub(crate) mod kernel;
pub mod matmul;
pub(crate) mod packing;
pub(crate) mod pipeline;
pub(crate) mod plan;
pub(crate) mod q4;
pub(crate) mod q8;
pub(crate) mod table;
pub(crate) mod transfer;

pub use context::{ContextReport, GpuContext};
pub use transfer::TENSOR_USAGES;
