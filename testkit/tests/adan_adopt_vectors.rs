//! The Adan and ADOPT oracles against their public vectors (`adan_plain`, `adan_wd_prox`,
//! `adopt_plain`, `adopt_decouple_wd` in `tests/vectors/`, from pytorch-optimizer run with the
//! official semantics): each file's trajectory reproduced from its inputs within the file's
//! tolerance, every other backend refused until the crate implements the op, and a
//! hyperparameter changed on the same inputs caught, so that a pass means the oracle followed
//! the file.

use std::path::PathBuf;

use wgpu_optim_testkit::conformance::{run_case, Backend, Case, Outcome};

const FILES: [&str; 4] = ["adan_plain", "adan_wd_prox", "adopt_plain", "adopt_decouple_wd"];

fn case(name: &str) -> Case {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/vectors")
        .join(format!("{name}.safetensors"));
    Case::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

/// The oracle's outcome on `case`, and its worst value as a fraction of the tolerance.
fn on_the_oracle(case: &Case) -> (Outcome, f64) {
    let report = run_case(case, Backend::Oracle, None).unwrap_or_else(|e| panic!("{}: {e}", case.name));
    (report.outcome, report.worst)
}

#[test]
fn the_oracle_reproduces_each_public_file_within_its_tolerance() {
    for name in FILES {
        let case = case(name);
        assert_eq!(Backend::all_for(&case), [Backend::Oracle], "{name}");
        let (outcome, worst) = on_the_oracle(&case);
        assert_eq!(outcome, Outcome::Pass, "{name}");
        // Compared at all: a trajectory this long moves every parameter by more than atol.
        assert!(worst > 0.0 && worst <= 1.0, "{name}: worst {worst}");
        println!("{name}: worst {worst:.3} of tolerance");
    }
}

#[test]
fn every_other_backend_is_refused_as_oracle_checked_only() {
    for name in FILES {
        let case = case(name);
        assert!(case.oracle_only(), "{name}");
        // Refused before any GPU is asked for: no context is needed to say so.
        for backend in [Backend::GpuInPlace, Backend::GpuOutOfPlace, Backend::Cpu] {
            let report = run_case(&case, backend, None).unwrap_or_else(|e| panic!("{name}: {e}"));
            let Outcome::Refused(reason) = report.outcome else {
                panic!("{name} on {}: {:?}", backend.name(), report.outcome)
            };
            assert!(reason.contains("oracle-checked only") && reason.contains(&case.op), "{reason}");
        }
    }
}

/// `case` with attribute `name` set to `value`.
fn with_attribute(case: &Case, name: &str, value: serde_json::Value) -> Case {
    let mut changed = case.clone();
    changed.attributes.insert(name.to_string(), value);
    changed
}

fn fails(case: &Case) -> bool {
    matches!(on_the_oracle(case).0, Outcome::Fail(_))
}

#[test]
fn a_changed_convention_on_the_same_inputs_fails() {
    let plain = case("adan_plain");
    // The paper's betas (1 - the official ones) and the other decay rule.
    assert!(fails(&with_attribute(&plain, "betas", serde_json::json!([0.02, 0.08, 0.01]))));
    let prox = case("adan_wd_prox");
    assert!(fails(&with_attribute(&prox, "no_prox", serde_json::json!(true))));
    // Clipping at the norm's order of magnitude changes the trajectory.
    assert!(fails(&with_attribute(&plain, "max_grad_norm", serde_json::json!(0.01))));

    let adopt = case("adopt_plain");
    assert!(fails(&with_attribute(&adopt, "clip_lambda", serde_json::json!(0.5))));
    assert!(fails(&with_attribute(&adopt, "maximize", serde_json::json!(true))));
    let decoupled = case("adopt_decouple_wd");
    assert!(fails(&with_attribute(&decoupled, "decouple", serde_json::json!(false))));
}
