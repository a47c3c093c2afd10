//! The testkit's oracle (`wgpu_optim_testkit::oracle`), compiled inside the crate for the
//! unit tests that check internals against it (the CPU kernels under the ONNX and DirectML
//! conventions in `cpu/tests.rs`, the GPU's 8-bit kernels in `gpu/q8`).
//!
//! Those tests cannot depend on the testkit: it links wgpu-optim as a crate of its own, whose
//! types are not this crate's, so its oracle could not take a `crate::OnnxAdam` or hand back
//! a `crate::q8::StoredState`. Nor can they become integration tests, since they drive
//! crate-private kernels. So the oracle's files are included here by path, one source for
//! both builds, and `api` names this crate where the testkit's names `wgpu_optim`. The files
//! name only public items (the testkit build would not compile otherwise), so the oracle
//! stays independent of the internals these tests check.

/// The crate under test, as the oracle's files name it.
use crate as api;

// The unit tests use part of each file.
#[path = "../testkit/src/oracle/onnx.rs"]
#[allow(dead_code)]
mod onnx;

#[path = "../testkit/src/oracle/ademamix.rs"]
#[allow(dead_code)]
mod ademamix;

#[path = "../testkit/src/oracle/ao4.rs"]
#[allow(dead_code)]
pub(crate) mod ao4;

#[path = "../testkit/src/oracle/lion.rs"]
#[allow(dead_code)]
mod lion;

#[path = "../testkit/src/oracle/bnb.rs"]
#[allow(dead_code)]
pub(crate) mod bnb;

pub(crate) use bnb::{bnb_8bit_step, bnb_adam8bit_step, bnb_sgd8bit_step, BnbAdam, BnbSgd};
pub(crate) use onnx::{dml_adam, onnx_adagrad, onnx_adam, onnx_momentum};
