//! Schedule-Free AdamW (the `schedulefree` package): its configuration (`config`), its step
//! contract with the kernels (`contract`), its WGSL, its part of the GPU optimizer
//! (`gpu_passes`: the running values, the mode, the swap pass), its running values in
//! checkpoints (`checkpoint_layout`) and, with the `cpu` feature, its CPU loops (`cpu`) and
//! its passes there (`cpu_passes`).

#[cfg(feature = "checkpoint")]
mod checkpoint;
#[cfg(feature = "checkpoint")]
pub(crate) mod checkpoint_layout;
pub(crate) mod config;
pub(crate) mod contract;
#[cfg(feature = "cpu")]
pub(crate) mod cpu;
#[cfg(feature = "cpu")]
pub(crate) mod cpu_passes;
pub(crate) mod gpu_passes;
mod low_bit;
pub(crate) mod scalars;

/// The update's body (`update`), which the generated prelude precedes.
pub(crate) const UPDATE_WGSL: &str = include_str!("schedule_free.wgsl");
/// Capturable mode's step values on the device: none. Refused in capturable mode
/// (`FamilyConfig::check_options` in `config`): its weights need the host's running
/// `lr_max` and `weight_sum`.
pub(crate) const CAPTURABLE_WGSL: &str = "";
/// The family's name in labels and pipeline keys.
pub(crate) const NAME: &str = "schedule_free";
