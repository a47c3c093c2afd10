//! LAMB (torch-optimizer): its configuration (`config`), its step contract with the kernels
//! (`contract`), its WGSL and, with the `cpu` feature, its CPU loops (`cpu`).

pub(crate) mod config;
pub(crate) mod contract;
#[cfg(feature = "cpu")]
pub(crate) mod cpu;

/// The update's body (`update`), which the generated prelude precedes.
pub(crate) const WGSL: &str = include_str!("lamb.wgsl");
/// The pass that combines each tensor's partial norms into its trust ratio.
pub(crate) const COMBINE_WGSL: &str = include_str!("lamb_combine.wgsl");
/// The entry points of LAMB's passes.
pub(crate) const ENTRY_WGSL: &str = include_str!("lamb_entry.wgsl");
