//! The oracle's refusals: what the reference code would reject (a tensor of another length,
//! a configuration the reference has no form of), so that a test learns why a step did not
//! run instead of reading a half-updated state.

use std::fmt;

/// Why a step of the oracle refused to run; nothing changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// A tensor (`argument`) has another length than the parameter's.
    LengthMismatch {
        /// The tensor refused (`grad`, a state's name).
        argument: String,
        /// Its element count.
        got: usize,
        /// The parameter's element count.
        expected: usize,
    },
    /// Another count of items than the reference keeps (states of an algorithm, absmax
    /// entries of 8-bit codes).
    CountMismatch {
        /// The items refused.
        argument: String,
        /// How many were given.
        got: usize,
        /// How many the reference keeps.
        expected: usize,
    },
    /// A configuration the transcribed reference has no form of (AMSGrad with 8-bit state,
    /// an algorithm bitsandbytes does not quantize, ...).
    Unsupported(&'static str),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::LengthMismatch { argument, got, expected } => {
                write!(f, "{argument} has {got} elements, the parameter {expected}")
            }
            Error::CountMismatch { argument, got, expected } => {
                write!(f, "{got} {argument} given, {expected} expected")
            }
            Error::Unsupported(reason) => write!(f, "unsupported by the reference: {reason}"),
        }
    }
}

impl std::error::Error for Error {}

/// The oracle's result.
pub type Result<T> = std::result::Result<T, Error>;
