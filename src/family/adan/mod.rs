//! Adan (Xie et al. 2022, the official sail-sg/Adan `adan.Adan`): its configuration
//! (`config`), its step contract with the kernels (`contract`), its WGSL, its `param_groups`
//! JSON (`checkpoint`), its low-bit rules (`low_bit`) and, with the `cpu` feature, its CPU
//! loops (`cpu`).

#[cfg(feature = "checkpoint")]
mod checkpoint;
pub(crate) mod config;
pub(crate) mod contract;
#[cfg(feature = "cpu")]
pub(crate) mod cpu;
mod low_bit;

/// The update's body (`update`), which the generated prelude precedes.
pub(crate) const UPDATE_WGSL: &str = include_str!("adan.wgsl");
/// Capturable mode's derivation of the step's values on the device.
pub(crate) const CAPTURABLE_WGSL: &str = include_str!("adan_capturable.wgsl");
/// The family's name in labels and pipeline keys.
pub(crate) const NAME: &str = "adan";
