//! Muon (`torch.optim.Muon`): the elementwise end of its step and Newton-Schulz's
//! normalization: its configuration (`config`), its step contract with the kernels
//! (`contract`), its WGSL and, with the `cpu` feature, its CPU loops (`cpu`) and its
//! momentum and Newton-Schulz passes there (`cpu_passes`).

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
mod normalize;

/// The update's body (`update`), which the generated prelude precedes.
pub(crate) const UPDATE_WGSL: &str = include_str!("muon.wgsl");
/// Newton-Schulz's first normalization (the Frobenius norm's pass, `normalize`).
const NORMALIZE_WGSL: &str = include_str!("muon_normalize.wgsl");
/// Capturable mode's step values on the device: none. Refused in capturable mode
/// (`optimizer::muon`): the orthogonalization runs on the host-mode uniforms.
pub(crate) const CAPTURABLE_WGSL: &str = "";
/// The family's name in labels and pipeline keys.
pub(crate) const NAME: &str = "muon";
