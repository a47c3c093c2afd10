//! The 4-bit kernels against the oracle.
