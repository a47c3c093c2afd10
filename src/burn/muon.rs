//! Muon behind Burn's front ends: which algorithm steps each parameter.
//!
//! Muon orthogonalizes matrices, so it takes 2-D parameters only; a trainer puts the others
//! (biases, norms, embeddings if it likes) in a group of another algorithm, AdamW typically,
//! as torch users do. Both front ends take that algorithm as their *fallback*: a 2-D
//! parameter gets Muon, any other the fallback, and without one a parameter that is not 2-D
//! is refused by name and shape ([`Error::BadShape`]).

use crate::{Algorithm, Error, Result};

/// What [`Error::BadShape`] says Muon expects, for `front_end`'s setter.
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

/// Refuses a fallback that cannot be one: only Muon leaves parameters to another algorithm,
/// and the fallback takes the parameters Muon does not, so it is not Muon itself.
pub(super) fn check_fallback(algorithm: &Algorithm, fallback: Option<&Algorithm>) -> Result<()> {
    let Some(fallback) = fallback else { return Ok(()) };
    if !matches!(algorithm, Algorithm::Muon(_)) {
        return Err(Error::ConflictingOptions {
            first: "fallback",
            second: "algorithm",
            reason: "only Muon leaves parameters (those that are not 2-D) to a fallback algorithm; \
                     every other algorithm steps every parameter",
        });
    }
    if matches!(fallback, Algorithm::Muon(_)) {
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
    !(matches!(algorithm, Algorithm::Muon(_)) && fallback.is_some() && shape.len() != 2)
}

/// The algorithm that steps a parameter of `shape`, the `param`-th of its step: Muon's
/// 2-D ones Muon, the others the fallback. Refused ([`Error::BadShape`]) for a parameter
/// Muon cannot take where there is no fallback.
pub(super) fn algorithm_for(
    algorithm: &Algorithm,
    fallback: Option<&Algorithm>,
    shape: &[usize],
    param: usize,
    front_end: FrontEnd,
) -> Result<Algorithm> {
    match (algorithm, fallback) {
        (Algorithm::Muon(_), _) if shape.len() == 2 => Ok(*algorithm),
        (Algorithm::Muon(_), Some(fallback)) => Ok(*fallback),
        (Algorithm::Muon(_), None) => Err(Error::BadShape {
            param,
            shape: shape.to_vec(),
            algorithm: "Muon",
            expected: match front_end {
                FrontEnd::DropIn => EXPECTED_DROP_IN,
                FrontEnd::ModuleStep => EXPECTED_MODULE_STEP,
            },
        }),
        _ => Ok(*algorithm),
    }
}

/// Whether `algorithm` needs each parameter's shape (and so an optimizer of its own, not the
/// elementwise update): Muon's matrices and Adafactor's factored states.
pub(super) fn needs_shapes(algorithm: &Algorithm) -> bool {
    matches!(algorithm, Algorithm::Muon(_) | Algorithm::Adafactor(_))
}
