//! The Adan and ADOPT oracles against their public vectors (`adan_plain`, `adan_wd_prox`,
//! `adopt_plain`, `adopt_decouple_wd` in `tests/vectors/`, from pytorch-optimizer run with the
//! official semantics): each file's trajectory reproduced from its inputs within the file's
//! tolerance (by the runner, which rounds what it stores to f32, and by the oracles alone in
//! f64), and a hyperparameter changed on the same inputs caught, so that a pass means the
//! oracle followed the file. (The crate's GPU and CPU backends run the same files in
//! `tests/conformance.rs` and the conformance example.)

use std::path::PathBuf;

use wgpu_optim_testkit::conformance::{run_case, Backend, Case, Outcome};
use wgpu_optim_testkit::oracle::{AdanHyperparameters, AdanOracle, AdoptHyperparameters, AdoptOracle};
use wgpu_optim_testkit::{compare, Tolerance};

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
        let mut backends = vec![Backend::Oracle, Backend::GpuInPlace, Backend::GpuOutOfPlace];
        // The CPU backend with the testkit's `cpu` feature (on in the workspace's test run,
        // through the library's dev-dependency).
        if cfg!(feature = "cpu") {
            backends.push(Backend::Cpu);
        }
        assert_eq!(Backend::all_for(&case), backends, "{name}: the crate runs it on every backend");
        let (outcome, worst) = on_the_oracle(&case);
        assert_eq!(outcome, Outcome::Pass, "{name}");
        // Compared at all: a trajectory this long moves every parameter by more than atol.
        assert!(worst > 0.0 && worst <= 1.0, "{name}: worst {worst}");
        println!("{name}: worst {worst:.3} of tolerance");
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

/// The tensors `name.{i}` of `case` against `got` (one per tensor), by the file's tolerance.
fn assert_matches(case: &Case, name: &str, got: &[Vec<f64>]) {
    let tolerance = Tolerance::Close { rtol: case.rtol, atol: case.atol };
    for (i, values) in got.iter().enumerate() {
        let want = case.tensor(&format!("{name}.{i}")).unwrap_or_else(|e| panic!("{e}"));
        let comparison = compare(values, &want.values, tolerance);
        assert!(comparison.passed(), "{} {name}.{i}: {comparison}", case.name);
    }
}

/// `case`'s initial parameters and each step's gradients.
fn inputs(case: &Case) -> (Vec<Vec<f64>>, Vec<Vec<Vec<f64>>>) {
    let tensor = |name: String| case.tensor(&name).unwrap_or_else(|e| panic!("{e}")).values.clone();
    let params: Vec<Vec<f64>> = (0..case.count).map(|i| tensor(format!("param.{i}"))).collect();
    let grads = (0..case.steps)
        .map(|k| {
            (0..case.count)
                .map(|i| {
                    let len = params[i].len();
                    tensor(format!("grad.{i}"))[k * len..(k + 1) * len].to_vec()
                })
                .collect()
        })
        .collect();
    (params, grads)
}

#[test]
fn the_unrounded_f64_trajectories_meet_the_files_too() {
    // Each file's attributes, written out: the oracles' own API, nothing rounded to f32.
    let adan = [
        ("adan_plain", AdanHyperparameters::default()),
        ("adan_wd_prox", AdanHyperparameters { lr: 0.02, weight_decay: 0.1, ..Default::default() }),
    ];
    for (name, config) in adan {
        let case = case(name);
        assert_eq!(case.attributes["lr"], serde_json::json!(config.lr), "{name}");
        assert_eq!(case.attributes["weight_decay"], serde_json::json!(config.weight_decay), "{name}");
        let (mut params, grads) = inputs(&case);
        let mut oracle = AdanOracle::new(config, case.count);
        for step in &grads {
            oracle.step(&mut params, step);
        }
        assert_matches(&case, "param_out", &params);
        assert_matches(&case, "exp_avg", &oracle.exp_avg);
        assert_matches(&case, "exp_avg_diff", &oracle.exp_avg_diff);
        assert_matches(&case, "exp_avg_sq", &oracle.exp_avg_sq);
        assert_matches(&case, "neg_pre_grad", &oracle.neg_pre_grad);
    }
    let adopt = [
        ("adopt_plain", AdoptHyperparameters::default()),
        (
            "adopt_decouple_wd",
            AdoptHyperparameters { lr: 0.01, weight_decay: 0.1, decouple: true, ..Default::default() },
        ),
    ];
    for (name, config) in adopt {
        let case = case(name);
        assert_eq!(case.attributes["lr"], serde_json::json!(config.lr), "{name}");
        assert_eq!(case.attributes["decouple"], serde_json::json!(config.decouple), "{name}");
        let (mut params, grads) = inputs(&case);
        let mut oracle = AdoptOracle::new(config, case.count);
        for step in &grads {
            oracle.step(&mut params, step);
        }
        assert_eq!(oracle.step, case.steps as u64);
        assert_matches(&case, "param_out", &params);
        assert_matches(&case, "exp_avg", &oracle.exp_avg);
        assert_matches(&case, "exp_avg_sq", &oracle.exp_avg_sq);
    }
}
