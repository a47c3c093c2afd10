//! The library's integration tests as one binary, one module per area (as wgpu's own
//! `tests/tests/wgpu-gpu/main.rs`): the wgpu stack is linked once instead of once per
//! area, and the areas share one process, so one headless context (`common::ctx`) and its
//! pipelines. Run one area with `cargo test --test integration <area>::`.
//!
//! Areas that need a cargo feature are compiled only with it (`cargo test
//! --no-default-features` builds the rest). Tests that count GPU objects open a device of
//! their own (`common::fresh_ctx`): wgpu's counters are per device, so the other areas'
//! tests running beside them in this process do not move the counts.

#[allow(dead_code)]
mod common;
#[allow(dead_code)]
mod family;

// The `train_mlp` example's modules, shared by the `train_mlp` and `lamb_mlp` areas. They
// sit at the crate root because they name each other as `crate::model` and
// `crate::spirals`, as in the example; its `checkpoint` module is `mlp_checkpoint` here, as
// the `checkpoint` area has that name.
#[cfg(feature = "checkpoint")]
#[allow(dead_code)]
#[path = "../../examples/train_mlp/gpu.rs"]
mod gpu;
#[cfg(feature = "checkpoint")]
#[allow(dead_code)]
#[path = "../../examples/train_mlp/checkpoint.rs"]
mod mlp_checkpoint;
#[cfg(feature = "checkpoint")]
#[allow(dead_code)]
#[path = "../../examples/train_mlp/model.rs"]
mod model;
#[cfg(feature = "checkpoint")]
#[allow(dead_code)]
#[path = "../../examples/train_mlp/spirals.rs"]
mod spirals;

mod adafactor;
mod adam_onnx;
mod adan;
mod ademamix;
mod adopt;
mod aliasing;
mod amsgrad;
mod capturable;
mod careless;
#[cfg(feature = "checkpoint")]
mod checkpoint;
mod clip;
#[cfg(feature = "checkpoint")]
mod conformance;
#[cfg(feature = "cpu")]
mod cpu;
#[cfg(all(feature = "cpu", feature = "checkpoint"))]
mod cpu_checkpoint;
mod directml;
mod failed_steps;
mod front_end;
#[cfg(feature = "checkpoint")]
mod fuzz_loaders;
#[cfg(all(feature = "cpu", feature = "checkpoint"))]
mod lamb;
#[cfg(feature = "checkpoint")]
mod lamb_mlp;
mod limits;
mod lion;
mod muon;
#[cfg(all(feature = "cpu", feature = "checkpoint"))]
mod muon_checkpoint;
mod nonfinite;
mod onnx_momentum_adagrad;
mod precision;
mod properties;
mod q4;
mod q4_checkpoint;
mod q8;
#[cfg(all(feature = "cpu", feature = "checkpoint"))]
mod q8_checkpoint;
mod q8_kernels;
#[cfg(all(feature = "cpu", feature = "checkpoint"))]
mod refusals;
mod rmsprop;
#[cfg(feature = "cpu")]
mod rounding;
mod scale;
mod schedule_free;
mod shard;
#[cfg(all(feature = "cpu", feature = "checkpoint"))]
mod torch_checkpoint;
mod torch_trajectories;
#[cfg(feature = "checkpoint")]
mod train_mlp;
