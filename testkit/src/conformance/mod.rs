//! Conformance vectors (`optim-vectors/1`, see `tests/vectors/FORMAT.md`): reading a case,
//! refusing what this reader does not implement, running it on the GPU or the oracle, and
//! comparing with the expected values that an independent implementation produced.

mod adafactor;
mod adan;
mod adopt;
mod ao4;
mod case;
mod files;
mod inputs;
mod lamb;
mod muon;
mod run;
mod schedule_free;
mod tally;

pub use case::{Case, CaseTensor, Kind, ValueType};
pub use files::{vector_files, VectorDirError};
pub use run::{run_case, run_case_async, Backend, CaseReport, Outcome};
pub use tally::{Tally, Verdict};
