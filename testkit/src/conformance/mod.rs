//! Conformance vectors (`optim-vectors/1`, see `tests/vectors/FORMAT.md`): reading a case,
//! refusing what this reader does not implement, running it on the GPU or the oracle, and
//! comparing with the expected values that an independent implementation produced.

mod case;
mod files;
mod inputs;
mod run;
mod tally;

/// The runners of a module of their own, one line each: the module provides `OP` (its op,
/// kind and attributes: [`case::Op`]) and `trajectory(case, backend, ctx)`; every backend,
/// the CPU's included, runs it. A family's conformance runner is added here, and nowhere else.
macro_rules! own_runners {
    ($($module:ident,)*) => {
        $(mod $module;)*

        /// The ops whose runners are modules of their own.
        const OWN_OPS: &[&case::Op] = &[$(&$module::OP,)*];

        /// `case` through its own module's runner; `None` for an op without one.
        async fn run_own(
            case: &Case,
            backend: Backend,
            ctx: Option<&wgpu_optim::GpuContext>,
        ) -> Option<wgpu_optim::Result<Vec<(String, Vec<f64>)>>> {
            $(
                if case.op == $module::OP.name && case.kind == $module::OP.kind {
                    return Some($module::trajectory(case, backend, ctx).await);
                }
            )*
            None
        }
    };
}

own_runners! {
    adafactor,
    adan,
    adopt,
    ao4,
    lamb,
    muon,
    schedule_free,
}

pub use case::{Case, CaseTensor, Kind, ValueType};
pub use files::{vector_files, VectorDirError};
pub use run::{run_case, run_case_async, Backend, CaseReport, Outcome};
pub use tally::{Tally, Verdict};
