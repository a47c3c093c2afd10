//! One folder per algorithm family: its configuration and defaults, its step contract with
//! the kernels (uniform, switches), its WGSL beside them, and its CPU loops.

pub(crate) mod adafactor;
pub(crate) mod adagrad;
pub(crate) mod adam;
pub(crate) mod adan;
pub(crate) mod ademamix;
pub(crate) mod adopt;
pub(crate) mod lamb;
pub(crate) mod lion;
pub(crate) mod momentum;
pub(crate) mod muon;
pub(crate) mod rmsprop;
pub(crate) mod schedule_free;
