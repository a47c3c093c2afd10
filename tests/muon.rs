//! Muon (`torch.optim.Muon`): its public vectors on every backend, the refusals, 16-bit
//! parameters and groups against the oracle, and the WGSL matrix product against an f64 one.

mod common;

use std::path::PathBuf;

use wgpu_optim_testkit::conformance::{run_case, Backend, Case, Outcome};

fn vector(name: &str) -> Case {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors").join(name);
    Case::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

const VECTORS: [&str; 2] = ["muon_bf16_rms.safetensors", "muon_f32_tall.safetensors"];

fn passes(case: &Case, backend: Backend) {
    let ctx = matches!(backend, Backend::GpuInPlace | Backend::GpuOutOfPlace).then(common::ctx);
    let report = run_case(case, backend, ctx.as_ref()).unwrap_or_else(|e| panic!("{}: {e}", case.name));
    match report.outcome {
        Outcome::Pass => {}
        other => panic!("{} on {}: {other:?}", case.name, backend.name()),
    }
}

#[test]
fn the_public_vectors_pass_on_the_oracle() {
    for name in VECTORS {
        passes(&vector(name), Backend::Oracle);
    }
}

#[test]
fn the_public_vectors_pass_on_the_cpu_backend() {
    for name in VECTORS {
        passes(&vector(name), Backend::Cpu);
    }
}
