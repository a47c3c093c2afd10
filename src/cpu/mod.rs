//! The CPU backend: the same algorithms, semantics and storage types as the GPU kernels,
//! on all cores.
