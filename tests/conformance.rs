//! Every public conformance vector in `tests/vectors/` on the oracle and on the GPU (in
//! place and out of place). Expected values come from ONNX's reference implementation,
//! PyTorch and the DirectML formula, never from this crate.

mod common;

use std::path::PathBuf;

use wgpu_optim::conformance::{run_case, Backend, Case, Outcome};

/// Ops the crate implements; a case of one of these may be skipped only for its dtype.
const IMPLEMENTED: [&str; 8] = [
    "onnx.Adam",
    "onnx.Momentum",
    "onnx.Adagrad",
    "dml.Adam",
    "torch.Adam",
    "torch.AdamW",
    "torch.SGD",
    "torch.Adagrad",
];

fn vector_files() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    assert!(files.len() >= 19, "expected the 19 public vectors in {}", dir.display());
    files
}

#[test]
fn every_supported_public_vector_passes_on_the_oracle_and_the_gpu() {
    let ctx = common::ctx();
    let mut failures = Vec::new();
    let mut passed = 0;
    for file in vector_files() {
        let case = Case::load(&file).unwrap();
        for backend in Backend::all_for(&case) {
            let report =
                run_case(&case, backend, Some(&ctx)).unwrap_or_else(|e| panic!("{}: {e}", case.name));
            match report.outcome {
                Outcome::Pass => passed += 1,
                Outcome::Fail(detail) => {
                    failures.push(format!("{} on {}: {detail}", case.name, backend.name()))
                }
                Outcome::Skipped(reason) => {
                    let low_precision = reason.contains("F16") || reason.contains("BF16");
                    assert!(
                        !IMPLEMENTED.contains(&case.op.as_str()) || low_precision,
                        "{} ({}) was skipped: {reason}",
                        case.name,
                        case.op
                    );
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} failed:\n{}", failures.len(), failures.join("\n"));
    assert!(passed >= 51, "only {passed} case runs passed");
}

#[test]
fn a_truncated_vector_file_is_a_typed_error() {
    let file = &vector_files()[0];
    let bytes = std::fs::read(file).unwrap();
    for cut in [0, 7, 8, 100, bytes.len() / 2, bytes.len() - 1] {
        let err = Case::parse("truncated", &bytes[..cut]).unwrap_err();
        assert!(!err.is_empty(), "cut at {cut}");
    }
    assert!(Case::parse("whole", &bytes).is_ok());
}
