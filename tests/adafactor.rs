//! Adafactor (`torch.optim.Adafactor`) on the GPU and the CPU backend against the f64
//! oracle (`wgpu_optim_testkit::oracle::AdafactorOracle`) and the public vectors: each
//! backend on its own, 16-bit parameters, groups beside AdamW, maximize, shapes whose last
//! dimensions are 1 or odd, and refusals (nothing created or changed).

mod common;

use std::path::PathBuf;

use wgpu_optim_testkit::conformance::{run_case, Backend, Case, Outcome};

fn adafactor_vectors() -> Vec<Case> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("adafactor_")))
        .collect();
    files.sort();
    assert!(files.len() >= 2, "the public adafactor_* vectors");
    files.iter().map(|f| Case::load(f).unwrap_or_else(|e| panic!("{e}"))).collect()
}

fn vectors_pass_on(backends: &[Backend]) {
    let ctx = backends.iter().any(|b| !matches!(b, Backend::Oracle | Backend::Cpu)).then(common::ctx);
    for case in adafactor_vectors() {
        for &backend in backends {
            let report =
                run_case(&case, backend, ctx.as_ref()).unwrap_or_else(|e| panic!("{}: {e}", case.name));
            assert_eq!(
                report.outcome,
                Outcome::Pass,
                "{} on {} (worst {})",
                case.name,
                backend.name(),
                report.worst
            );
        }
    }
}

#[test]
fn public_vectors_pass_on_the_oracle() {
    vectors_pass_on(&[Backend::Oracle]);
}

#[test]
fn public_vectors_pass_on_the_cpu_backend() {
    vectors_pass_on(&[Backend::Cpu]);
}

#[test]
fn public_vectors_pass_on_the_gpu_in_place_and_out_of_place() {
    vectors_pass_on(&[Backend::GpuInPlace, Backend::GpuOutOfPlace]);
}
