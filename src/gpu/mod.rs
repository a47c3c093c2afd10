//! The GPU layer: it knows buffers, bindings and shaders, and nothing of any convention.

pub(crate) mod adafactor;
pub(crate) mod blockwise;
pub(crate) mod compile;
mod context;
pub(crate) mod dispatch;
pub(crate) mod kernel;
pub(crate) mod lamb;
pub mod matmul;
pub(crate) mod packing;
pub(crate) mod pipeline;
pub(crate) mod plan;
pub(crate) mod q4;
pub(crate) mod q8;
pub(crate) mod table;
pub(crate) mod transfer;

#[cfg(feature = "burn")]
pub(crate) use context::choose_adapter;
pub use context::{ContextReport, GpuContext};
pub use transfer::TENSOR_USAGES;
