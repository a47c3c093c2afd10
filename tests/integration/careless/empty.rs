//! Zero-size tensors first, in the middle, last, several, alone, in a group of their own,
//! and in two groups, for every family and storage on both backends (groups on the GPU, whose
//! optimizer has them): the build succeeds, the empty tensors stay empty with their states
//! untouched, and every other tensor steps bit for bit as in the same run without them.

use super::cases::{assert_clean, assert_same, cases, shapes, values, Case, Cpu, Gpu, Held};

/// The empty shapes a case's tensors may take: Muon's are matrices, Adafactor's factored
/// (`[0, n]`, `[n, 0]`) or not (`[0]`).
fn empties(case: &Case) -> Vec<Vec<usize>> {
    if case.is_muon() {
        vec![vec![0, 4], vec![4, 0], vec![0, 0]]
    } else {
        vec![vec![0], vec![0, 4], vec![4, 0]]
    }
}

/// A layout: each entry a real tensor (its index in [`shapes`]) or an empty one (the index
/// in [`empties`]); and the groups' sizes.
#[derive(Clone, Copy)]
enum Slot {
    Real(usize),
    Empty(usize),
}

use Slot::{Empty, Real};

/// Single-group layouts, which both backends run.
const LAYOUTS: [&[Slot]; 4] = [
    &[Empty(0), Real(0), Real(1), Real(2)],
    &[Real(0), Empty(1), Real(1), Real(2)],
    &[Real(0), Real(1), Real(2), Empty(2)],
    &[Empty(1), Real(0), Empty(0), Real(1), Empty(2), Real(2), Empty(1)],
];

/// Grouped layouts (GPU): a group of empty tensors only, first and last; two groups with
/// an empty tensor each.
const GROUPED: [(&[Slot], &[usize]); 3] = [
    (&[Empty(0), Empty(1), Real(0), Real(1), Real(2)], &[2, 3]),
    (&[Real(0), Real(1), Real(2), Empty(2)], &[3, 1]),
    (&[Real(0), Empty(1), Real(1), Empty(0), Real(2)], &[2, 3]),
];

fn shape_of(case: &Case, slot: Slot) -> Vec<usize> {
    match slot {
        Real(i) => shapes(case)[i].clone(),
        Empty(e) => empties(case)[e].clone(),
    }
}

/// Two steps of gradients for the layout: each real tensor's values do not depend on where
/// it sits.
fn data(case: &Case, layout: &[Slot]) -> (Vec<Vec<f32>>, Vec<Vec<Vec<f32>>>) {
    let len = |slot: Slot| shape_of(case, slot).iter().product::<usize>();
    let draw = |slot: Slot, seed: u64| match slot {
        Real(i) => values(len(slot), seed + i as u64, if seed == 1 { 1.0 } else { 0.5 }),
        Empty(_) => Vec::new(),
    };
    let start = layout.iter().map(|&s| draw(s, 1)).collect();
    let steps = (0..2).map(|k| layout.iter().map(|&s| draw(s, 10 + 10 * k)).collect()).collect();
    (start, steps)
}

/// The run's holdings of the real tensors only, in order, and asserts that each empty one
/// holds nothing but empty or zero states.
fn real_part(what: &str, layout: &[Slot], held: Held) -> Held {
    let mut tensors = Vec::new();
    for (slot, arrays) in layout.iter().zip(held.tensors) {
        match slot {
            Real(_) => tensors.push(arrays),
            Empty(_) => {
                assert!(
                    arrays[0].values.is_empty(),
                    "{what}: an empty parameter holds {:?}",
                    arrays[0].values
                );
                for state in &arrays[1..] {
                    // Adafactor's `col_var` of a [0, n] matrix has n elements, never written.
                    assert!(
                        state.values.iter().all(|&v| v == 0.0),
                        "{what}: {} is {:?}",
                        state.name,
                        state.values
                    );
                }
            }
        }
    }
    Held { step: held.step, tensors }
}

/// The layout without its empty tensors, with the group sizes that leaves (a group left
/// with nothing is dropped).
fn without_empties(layout: &[Slot], groups: &[usize]) -> (Vec<Slot>, Vec<usize>) {
    let mut first = 0;
    let mut sizes = Vec::new();
    for &n in groups {
        let real = layout[first..first + n].iter().filter(|s| matches!(s, Real(_))).count();
        if real > 0 {
            sizes.push(real);
        }
        first += n;
    }
    (layout.iter().copied().filter(|s| matches!(s, Real(_))).collect(), sizes)
}

fn gpu_run(case: &Case, layout: &[Slot], groups: &[usize]) -> Held {
    let shapes: Vec<Vec<usize>> = layout.iter().map(|&s| shape_of(case, s)).collect();
    let (start, steps) = data(case, layout);
    let mut gpu = Gpu::build(case, &shapes, &start, groups, 0);
    for set in &steps {
        gpu.step(set);
    }
    gpu.held()
}

fn cpu_run(case: &Case, layout: &[Slot]) -> Held {
    let shapes: Vec<Vec<usize>> = layout.iter().map(|&s| shape_of(case, s)).collect();
    let (start, steps) = data(case, layout);
    let mut cpu = Cpu::new(case, &shapes, &start);
    for set in &steps {
        cpu.step(set);
    }
    cpu.held()
}

fn check(case: &Case) {
    let what = |layout: usize| format!("{} ({:?}), layout {layout}", case.name, case.storage);
    for (l, layout) in LAYOUTS.iter().enumerate() {
        let (real, _) = without_empties(layout, &[layout.len()]);
        let gpu = real_part(&what(l), layout, gpu_run(case, layout, &[layout.len()]));
        assert_same(&gpu, &gpu_run(case, &real, &[real.len()]), &format!("GPU {}", what(l)));
        let cpu = real_part(&what(l), layout, cpu_run(case, layout));
        assert_same(&cpu, &cpu_run(case, &real), &format!("CPU {}", what(l)));
    }
    // Nothing but empty tensors: nothing to compare with, but each stays empty and at 0.
    let only = [Empty(0), Empty(1), Empty(2)];
    real_part(&what(LAYOUTS.len() + GROUPED.len()), &only, gpu_run(case, &only, &[only.len()]));
    real_part(&what(LAYOUTS.len() + GROUPED.len()), &only, cpu_run(case, &only));
    for (l, (layout, groups)) in GROUPED.iter().enumerate() {
        let what = format!("{}, grouped {groups:?}", what(LAYOUTS.len() + l));
        let (real, real_groups) = without_empties(layout, groups);
        let gpu = real_part(&what, layout, gpu_run(case, layout, groups));
        assert_same(&gpu, &gpu_run(case, &real, &real_groups), &format!("GPU {what}"));
    }
}

#[test]
fn empty_tensors_anywhere_are_skipped_by_every_family_on_both_backends() {
    let _turn = crate::common::gpu_turn();
    for case in cases() {
        check(&case);
    }
    assert_clean();
}
