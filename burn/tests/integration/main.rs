//! The Burn integration's tests as one binary, one module per area (as the library's
//! `tests/integration`): Burn's tensors stepped by the library's kernels on a shared device,
//! checked against the f64 oracle, Burn's own optimizers and the library's records. Run one
//! area with `cargo test -p wgpu-optim-burn --test integration <area>::`.

mod common;

mod burn;
mod burn_muon_adafactor;
mod burn_q4;
mod families;
mod lamb_burn;
