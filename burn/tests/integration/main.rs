//! The Burn integration's tests as one binary, one module per area (as the library's
//! `tests/integration`): Burn's tensors stepped by the library's kernels on a shared device,
//! checked against the f64 oracle, Burn's own optimizers and the library's records. Run one
//! area with `cargo test -p wgpu-optim-burn --test integration <area>::`.

/// What the areas share with the library's integration tests: the testkit's deterministic
/// data, swept variants and comparator.
mod common {
    pub use wgpu_optim_testkit::cases::{
        adagrad_variants, adam_switch_combinations, rmsprop_variants, sgd_variants, Rng,
    };
    pub use wgpu_optim_testkit::compare::{assert_close, Tolerance};
}

mod burn;
mod burn_muon_adafactor;
mod burn_q4;
mod families;
mod lamb_burn;
