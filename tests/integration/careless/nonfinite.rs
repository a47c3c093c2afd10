//! NaN, +inf and -inf in one gradient element (tensor 0, row 3, column 5) at step 2, between
//! two clean steps, for every family and storage on both backends and the f64 oracle.
//!
//! Checked at steps 2 and 3: every element's class (finite, NaN, +inf, -inf) is the
//! oracle's on both backends; the elementwise families store the same bits on the GPU and the
//! CPU; the other tensors are bit for bit those of the run without the bad element (on each
//! backend), and so are the poisoned tensor's other elements where the family is elementwise
//! with f32 state. What the poisoned element's parameter and states become is written as one
//! cell of the table in `docs/non-finite.md`, which must hold exactly that row.

use super::cases::{
    assert_clean, assert_same, cases, lens, shapes, values, Array, Case, Cpu, Gpu, Held, Storage,
};
use super::oracle::OracleRun;
use wgpu_optim::Algorithm;

/// The poisoned tensor and element: tensor 0 is 8 x 12.
const TENSOR: usize = 0;
const ROW: usize = 3;
const COL: usize = 5;
const COLS: usize = 12;
const ELEMENT: usize = ROW * COLS + COL;

const BAD: [f32; 3] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY];

/// Whether each element's update depends on that element alone (everything but LAMB's
/// trust ratio, Adafactor's factored second moment and Muon's orthogonalization).
fn elementwise(case: &Case) -> bool {
    !matches!(case.algorithm, Algorithm::Lamb(_) | Algorithm::Adafactor(_) | Algorithm::Muon(_))
}

fn class(x: f32) -> &'static str {
    if x.is_nan() {
        "NaN"
    } else if x == f32::INFINITY {
        "+inf"
    } else if x == f32::NEG_INFINITY {
        "-inf"
    } else {
        "finite"
    }
}

fn classes(held: &Held) -> Vec<Vec<Vec<&'static str>>> {
    held.tensors
        .iter()
        .map(|t| t.iter().map(|a| a.values.iter().map(|&x| class(x)).collect()).collect())
        .collect()
}

/// The three gradient sets; `bad` (if any) at the poisoned element of the second.
fn gradients(case: &Case, bad: Option<f32>) -> Vec<Vec<Vec<f32>>> {
    let lens = lens(&shapes(case));
    (0..3u64)
        .map(|k| {
            let mut set: Vec<Vec<f32>> =
                lens.iter().enumerate().map(|(i, &n)| values(n, 100 + 10 * k + i as u64, 0.5)).collect();
            if let (1, Some(bad)) = (k, bad) {
                set[TENSOR][ELEMENT] = bad;
            }
            set
        })
        .collect()
}

fn start(case: &Case) -> Vec<Vec<f32>> {
    lens(&shapes(case)).iter().enumerate().map(|(i, &n)| values(n, 7 + i as u64, 1.0)).collect()
}

/// What each of the three holds after each step.
struct Runs {
    oracle: Vec<Held>,
    gpu: Vec<Held>,
    cpu: Vec<Held>,
}

fn run(case: &Case, bad: Option<f32>) -> Runs {
    let (shapes, start) = (shapes(case), start(case));
    let mut oracle = OracleRun::new(case, &shapes, &start);
    let mut gpu = Gpu::build(case, &shapes, &start, &[shapes.len()], 0);
    let mut cpu = Cpu::new(case, &shapes, &start);
    let mut runs = Runs { oracle: Vec::new(), gpu: Vec::new(), cpu: Vec::new() };
    for set in gradients(case, bad) {
        oracle.step(&set);
        gpu.step(&set);
        cpu.step(&set);
        runs.oracle.push(oracle.held());
        runs.gpu.push(gpu.held());
        runs.cpu.push(cpu.held());
    }
    runs
}

/// The element of array `k` of the poisoned tensor that the poisoned element feeds:
/// Adafactor's `row_var` and `col_var` hold one value per row and per column.
fn own(case: &Case, k: usize) -> usize {
    match (case.kinds(&shapes(case)[TENSOR]).len(), case.algorithm, k) {
        (2, Algorithm::Adafactor(_), 1) => ROW,
        (2, Algorithm::Adafactor(_), 2) => COL,
        _ => ELEMENT,
    }
}

/// How far the non-finite values of an array reach beyond its own element.
fn extent(k: usize, own: usize, array: &Array) -> String {
    let bad: Vec<usize> = (0..array.values.len()).filter(|&e| !array.values[e].is_finite()).collect();
    let cross: Vec<usize> = (0..array.values.len()).filter(|&e| e / COLS == ROW || e % COLS == COL).collect();
    if bad == [own] {
        String::new()
    } else if bad.len() == array.values.len() {
        " (whole tensor)".into()
    } else if k == 0 && bad == cross {
        " (its row and column)".into()
    } else {
        format!(" ({} elements)", bad.len())
    }
}

/// The poisoned tensor's arrays after a step, in words: each non-finite one with its class
/// at the element (and how far it reaches), a parameter that kept its value, a state at 0.
fn describe(case: &Case, before: &Held, after: &Held) -> String {
    let mut words = Vec::new();
    for (k, (array, prior)) in after.tensors[TENSOR].iter().zip(&before.tensors[TENSOR]).enumerate() {
        let e = own(case, k);
        let name = array.name.trim_end_matches("[0]");
        let value = array.values[e];
        if !value.is_finite() {
            words.push(format!("{name} {}{}", class(value), extent(k, e, array)));
        } else if k == 0 && value.to_bits() == prior.values[e].to_bits() {
            words.push("param kept".into());
        } else if k > 0 && value == 0.0 {
            words.push(format!("{name} 0"));
        }
    }
    if words.is_empty() {
        "finite".into()
    } else {
        words.join(", ")
    }
}

/// The table's cell for one bad value: step 2, then step 3 where it differs.
fn cell(case: &Case, held: &[Held]) -> String {
    let (bad, clean) = (describe(case, &held[0], &held[1]), describe(case, &held[1], &held[2]));
    if bad == clean {
        bad
    } else {
        format!("{bad}; then {clean}")
    }
}

fn storage(case: &Case) -> &'static str {
    match case.storage {
        Storage::F32 => "f32",
        Storage::Q8 => "8-bit",
        Storage::Q4 => "4-bit",
    }
}

/// Every check of one case; returns its row of the table.
fn check(case: &Case) -> String {
    let what = format!("{} ({})", case.name, storage(case));
    let clean = run(case, None);
    let mut cells = Vec::new();
    for bad in BAD {
        let runs = run(case, Some(bad));
        for t in 1..3 {
            let at = |backend: &str| format!("{what}, gradient {bad}, {backend} after step {}", t + 1);
            let want = classes(&runs.oracle[t]);
            assert_eq!(classes(&runs.gpu[t]), want, "{}: classes against the oracle's", at("GPU"));
            assert_eq!(classes(&runs.cpu[t]), want, "{}: classes against the oracle's", at("CPU"));
            if elementwise(case) {
                assert_same(
                    &runs.gpu[t],
                    &runs.cpu[t],
                    &format!("{}: the GPU's bits against the CPU's", at("GPU")),
                );
            }
            for (backend, held, reference) in [("GPU", &runs.gpu, &clean.gpu), ("CPU", &runs.cpu, &clean.cpu)]
            {
                for i in (0..held[t].tensors.len()).filter(|&i| i != TENSOR) {
                    let tensor = |h: &Held| Held { step: h.step, tensors: vec![h.tensors[i].clone()] };
                    assert_same(
                        &tensor(&held[t]),
                        &tensor(&reference[t]),
                        &format!("{}: tensor {i}", at(backend)),
                    );
                }
                if elementwise(case) && case.storage == Storage::F32 {
                    for (k, (got, want)) in
                        held[t].tensors[TENSOR].iter().zip(&reference[t].tensors[TENSOR]).enumerate()
                    {
                        let e = own(case, k);
                        for j in (0..got.bits.len()).filter(|&j| j != e) {
                            assert_eq!(
                                got.bits[j],
                                want.bits[j],
                                "{}: {}[{j}], a neighbour",
                                at(backend),
                                got.name
                            );
                        }
                    }
                }
            }
        }
        let text = cell(case, &runs.gpu);
        assert_eq!(cell(case, &runs.cpu), text, "{what}, gradient {bad}: the CPU's cell against the GPU's");
        assert_eq!(
            cell(case, &runs.oracle),
            text,
            "{what}, gradient {bad}: the oracle's cell against the GPU's"
        );
        cells.push(text);
    }
    format!("| {} | {} | {} | {} | {} |", case.name, storage(case), cells[0], cells[1], cells[2])
}

/// Checks the cases `pick` selects and that `docs/non-finite.md` has each one's row.
fn check_rows(pick: impl Fn(&Case) -> bool) {
    let _turn = crate::common::gpu_turn();
    let table = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/non-finite.md"))
        .unwrap_or_else(|e| panic!("docs/non-finite.md: {e}"));
    let mut missing = Vec::new();
    for case in cases().iter().filter(|c| pick(c)) {
        let row = check(case);
        if !table.lines().any(|line| line == row) {
            missing.push(row);
        }
    }
    assert_clean();
    assert!(
        missing.is_empty(),
        "docs/non-finite.md lacks these rows, as the runs give them:\n{}",
        missing.join("\n")
    );
}

#[test]
fn a_non_finite_gradient_element_in_an_elementwise_family_with_f32_state() {
    check_rows(|c| c.storage == Storage::F32 && elementwise(c));
}

#[test]
fn a_non_finite_gradient_element_in_lamb_adafactor_and_muon() {
    check_rows(|c| !elementwise(c));
}

#[test]
fn a_non_finite_gradient_element_with_8bit_and_4bit_state() {
    check_rows(|c| c.storage != Storage::F32);
}
