//! The tools of wgpu-optim's tests, examples and benchmarks, kept out of the library a
//! trainer embeds:
//!
//! - [`cases`]: deterministic test data ([`cases::Rng`]) and the algorithm variants the
//!   tests sweep.
//! - [`oracle`]: the f64 reference every result is checked against (PyTorch, ONNX, DirectML
//!   and bitsandbytes conventions): the `wgpu-optim-oracle` crate, which depends on nothing of
//!   the library, and the conversions of the library's values into its types.
//! - [`conformance`]: reading `optim-vectors/1` cases (`tests/vectors/FORMAT.md`) and
//!   running them on the oracle and the GPU.
//! - [`compare`](mod@compare): the one comparator every test uses, and the tolerance of 16-bit stores.
//! - [`checkpoint::canonical`]: a checkpoint's content, to compare files by what they hold.
//! - [`GpuTimer`] and [`CopyRoofline`]: timing GPU work and the adapter's streaming
//!   bandwidth, for the benchmark.
//!
//! Everything here goes through wgpu-optim's public API only.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cases;
pub mod checkpoint;
pub mod compare;
pub mod conformance;
pub mod oracle;
mod roofline;
mod timer;

pub use compare::{assert_close, compare, compare_codes, Comparison, Tolerance};
pub use roofline::CopyRoofline;
pub use timer::{GpuTimer, Timing};
