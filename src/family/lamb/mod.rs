//! LAMB (torch-optimizer): its configuration (`config`), its step contract with the kernels
//! (`contract`), its WGSL, the shader pieces of its passes on the device (`shader`) and the
//! passes themselves (`gpu_passes`) and, with the `cpu` feature, its CPU loops (`cpu`) and
//! passes (`cpu_passes`).

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
pub(crate) mod shader;

/// The update's body (`update`), which the generated prelude precedes.
pub(crate) const UPDATE_WGSL: &str = include_str!("lamb.wgsl");
/// The pass that combines each tensor's partial norms into its trust ratio.
pub(crate) const COMBINE_WGSL: &str = include_str!("lamb_combine.wgsl");
/// The entry points of LAMB's passes.
pub(crate) const ENTRY_WGSL: &str = include_str!("lamb_entry.wgsl");
/// Capturable mode's step values on the device: none. Refused in capturable mode
/// (`FamilyConfig::check_options` in `config`): its passes take their scalars from the host.
pub(crate) const CAPTURABLE_WGSL: &str = "";
/// The family's name in labels and pipeline keys.
pub(crate) const NAME: &str = "lamb";
