//! Which algorithm steps each parameter behind Burn's front ends, where the algorithm takes
//! matrices only (Muon: `FamilyConfig::needs_matrix`).
//!
//! Muon orthogonalizes matrices, so it takes 2-D parameters only; a trainer puts the others
//! (biases, norms, embeddings if it likes) in a group of another algorithm, AdamW typically,
//! as torch users do. Both front ends take that algorithm as their *fallback*: a 2-D
//! parameter gets the main algorithm, any other the fallback, and without one a parameter
//! that is not 2-D is refused by name and shape ([`Error::BadShape`]).

use wgpu_optim::{Algorithm, Error, Result};

/// What [`Error::BadShape`] says a matrix-only algorithm expects, for `front_end`'s setter.
const EXPECTED_MODULE_STEP: &str =
    "a 2-D parameter (ModuleStepBuilder::fallback names the algorithm of the others, AdamW typically)";
const EXPECTED_DROP_IN: &str =
    "a 2-D parameter (FusedOptimizer::fallback names the algorithm of the others, AdamW typically)";

/// Which front end asks: the setter an error points to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FrontEnd {
    DropIn,
    ModuleStep,
}

/// Refuses a fallback that cannot be one: only a matrix-only algorithm (Muon) leaves
/// parameters to another algorithm, and the fallback takes the parameters it does not, so
/// it is not matrix-only itself.
pub(super) fn check_fallback(algorithm: &Algorithm, fallback: Option<&Algorithm>) -> Result<()> {
    let Some(fallback) = fallback else { return Ok(()) };
    if !algorithm.needs_matrix() {
        return Err(Error::ConflictingOptions {
            first: "fallback",
            second: "algorithm",
            reason: "only Muon leaves parameters (those that are not 2-D) to a fallback algorithm; \
                     every other algorithm steps every parameter",
        });
    }
    if fallback.needs_matrix() {
        return Err(Error::ConflictingOptions {
            first: "fallback",
            second: "algorithm",
            reason: "the fallback steps the parameters Muon does not take (those that are not 2-D), \
                     so it cannot be Muon",
        });
    }
    fallback.validate()
}

/// Whether a parameter of `shape` is stepped by the main algorithm (`true`) or the fallback.
pub(super) fn in_main_group(algorithm: &Algorithm, fallback: Option<&Algorithm>, shape: &[usize]) -> bool {
    !(algorithm.needs_matrix() && fallback.is_some() && shape.len() != 2)
}

/// The algorithm that steps a parameter of `shape`, the `param`-th of its step: a
/// matrix-only algorithm's 2-D ones the algorithm, the others the fallback. Refused
/// ([`Error::BadShape`]) for a parameter it cannot take where there is no fallback.
pub(super) fn algorithm_for(
    algorithm: &Algorithm,
    fallback: Option<&Algorithm>,
    shape: &[usize],
    param: usize,
    front_end: FrontEnd,
) -> Result<Algorithm> {
    if !algorithm.needs_matrix() || shape.len() == 2 {
        return Ok(*algorithm);
    }
    fallback.copied().ok_or_else(|| Error::BadShape {
        param,
        shape: shape.to_vec(),
        algorithm: algorithm.name(),
        expected: match front_end {
            FrontEnd::DropIn => EXPECTED_DROP_IN,
            FrontEnd::ModuleStep => EXPECTED_MODULE_STEP,
        },
    })
}
