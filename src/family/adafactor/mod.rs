//! Adafactor (PyTorch): its configuration (`config`), its step contract with the kernels
//! (`contract`), its passes on the device (`gpu_passes`, with their WGSL) and, with the
//! `cpu` feature, on the CPU (`cpu_passes`), its elementwise CPU update, which does
//! nothing (`cpu`), and its step over ZeRO-1's pieces of its tensors (`shard`).

#[cfg(feature = "checkpoint")]
mod checkpoint;
pub(crate) mod config;
pub(crate) mod contract;
#[cfg(feature = "cpu")]
pub(crate) mod cpu;
#[cfg(feature = "cpu")]
pub(crate) mod cpu_passes;
pub(crate) mod gpu_passes;
mod low_bit;
#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod shard;

/// Its passes (the factors' sums and the update), `gpu_passes`'s.
pub(crate) const PASSES_WGSL: &str = include_str!("adafactor.wgsl");
/// No elementwise update: its own passes run it (`gpu_passes`).
pub(crate) const UPDATE_WGSL: &str = "";
/// Capturable mode's step values on the device: none. Adafactor has no elementwise update.
pub(crate) const CAPTURABLE_WGSL: &str = "";
/// The family's name in labels and pipeline keys.
pub(crate) const NAME: &str = "adafactor";
