//! Every public conformance vector in `tests/vectors/` on the oracle, on the GPU (in place
//! and out of place) and, for PyTorch and bitsandbytes trajectories, on the CPU backend.
//! Expected values come from ONNX's reference implementation, PyTorch, bitsandbytes and the
//! DirectML formula, never from this crate.
//!
//! Cases whose op or attributes the reader does not implement are made here from public
//! vectors with one name changed (same length, so the file stays well-formed), and must be
//! refused by name, never run.

use crate::common;

use std::path::PathBuf;

use wgpu_optim::Error;
use wgpu_optim_testkit::conformance::{self, run_case, Backend, Case, Outcome};

fn vectors() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors")
}

/// The public vector files, sorted.
fn vector_files() -> Vec<PathBuf> {
    conformance::vector_files(&vectors()).unwrap_or_else(|e| panic!("{e}"))
}

fn problem(err: &Error) -> &str {
    match err {
        Error::BadFile { problem, .. } => problem,
        other => panic!("expected Error::BadFile, got {other:?}"),
    }
}

#[test]
fn every_public_vector_passes_on_the_oracle_the_gpu_and_the_cpu_backend() {
    let files = vector_files();
    assert!(files.len() >= 44, "expected the 44 public vectors in {}", vectors().display());
    let ctx = common::ctx();
    let mut failures = Vec::new();
    for file in &files {
        let case = Case::load(file).unwrap_or_else(|e| panic!("{e}"));
        for backend in Backend::all_for(&case) {
            let report =
                run_case(&case, backend, Some(&ctx)).unwrap_or_else(|e| panic!("{}: {e}", case.name));
            match report.outcome {
                Outcome::Pass => {}
                Outcome::Fail(detail) | Outcome::Refused(detail) => {
                    failures.push(format!("{} on {}: {detail}", case.name, backend.name()))
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} failed:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn a_truncated_vector_file_is_a_bad_file_error() {
    let file = &vector_files()[0];
    let bytes = std::fs::read(file).unwrap();
    for cut in [0, 7, 8, 100, bytes.len() / 2, bytes.len() - 1] {
        match Case::parse("truncated", &bytes[..cut]) {
            Err(Error::BadFile { path, .. }) => assert_eq!(path, "truncated", "cut at {cut}"),
            other => panic!("cut at {cut}: expected Error::BadFile, got {other:?}"),
        }
    }
    assert!(Case::parse("whole", &bytes).is_ok());
}

/// The bytes of public vector `file` with the first `from` replaced by `to` (same length).
fn renamed(file: &str, from: &str, to: &str) -> Vec<u8> {
    assert_eq!(from.len(), to.len(), "a rename keeps the header's length");
    let mut bytes = std::fs::read(vectors().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    let at = bytes
        .windows(from.len())
        .position(|w| w == from.as_bytes())
        .unwrap_or_else(|| panic!("{file} has no {from}"));
    bytes[at..at + to.len()].copy_from_slice(to.as_bytes());
    bytes
}

/// bitsandbytes' 8-bit LAMB, which this crate does not implement: its Adam vector renamed.
fn unimplemented_op() -> Vec<u8> {
    renamed("bnb_adam8bit_n8192.safetensors", "bnb.Adam8bit", "bnb.Lamb8bit")
}

#[test]
fn an_op_the_reader_does_not_implement_is_refused_by_name() {
    let err = Case::parse("lamb", &unimplemented_op()).unwrap_err();
    assert!(problem(&err).contains("op `bnb.Lamb8bit` is not implemented"), "{err}");
}

#[test]
fn a_block_size_other_than_256_is_refused_by_name_on_every_backend() {
    // The attributes are JSON inside the header's JSON: their quotes are escaped.
    let bytes = renamed("bnb_adam8bit_n8192.safetensors", "block_size\\\": 256", "block_size\\\": 128");
    let case = Case::parse("blocks of 128", &bytes).unwrap_or_else(|e| panic!("{e}"));
    let ctx = common::ctx();
    for backend in Backend::all_for(&case) {
        let err = run_case(&case, backend, Some(&ctx)).unwrap_err();
        assert!(
            problem(&err).contains("block_size 128: only 256"),
            "{} on {}: {err}",
            case.name,
            backend.name()
        );
    }
}

#[test]
fn an_unknown_attribute_is_refused_by_name_even_where_it_would_change_nothing() {
    // The clipped case with `norm_type` renamed (same length, so the file stays
    // well-formed): an attribute nobody reads would change nothing here, and the refusal
    // is for not knowing it, not for a result.
    let bytes = std::fs::read(vectors().join("clip_adam_unclipped.safetensors")).unwrap();
    let (from, to) = (b"norm_type".as_slice(), b"norm_typo".as_slice());
    let at = bytes.windows(from.len()).position(|w| w == from).expect("the case has a norm_type");
    let mut renamed = bytes.clone();
    renamed[at..at + to.len()].copy_from_slice(to);
    let err = Case::parse("renamed", &renamed).unwrap_err();
    let problem = problem(&err);
    assert!(problem.contains("`norm_typo`") && problem.contains("`torch.Adam`"), "{err}");
    assert!(Case::parse("original", &bytes).is_ok());
}

#[test]
fn the_runner_reports_a_refused_case_as_refused_on_every_backend() {
    let path = std::env::temp_dir().join(format!("wgpu-optim-refused-{}.safetensors", std::process::id()));
    std::fs::write(&path, unimplemented_op()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    // Well-formed: a refusal, not a malformed file.
    let case = Case::read(&path);
    let _ = std::fs::remove_file(&path);
    let case = case.unwrap_or_else(|e| panic!("{e}"));
    let refusal = case.check_supported().unwrap_err().to_string();
    let ctx = common::ctx();
    for backend in Backend::all_for(&case) {
        let report = run_case(&case, backend, Some(&ctx)).unwrap();
        assert_eq!(report.outcome, Outcome::Refused(refusal.clone()), "{} on {}", case.name, backend.name());
    }
}
