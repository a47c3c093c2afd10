//! One non-finite gradient element (NaN, +inf, -inf) in a matrix, a batch of matrices and a
//! vector: both backends follow torch's rule, checked three ways at every step: the rule
//! itself (which elements and states go NaN or infinite), the f64 oracle's pattern with the
//! finite values close to it, and the GPU and the CPU backend bit for bit.
//!
//! The values lie on a grid of 1/64, so every sum of squares is exact in f32 whatever the
//! order of its terms: the backends add in different orders, and with exact sums only their
//! element-wise formulas, which they share, decide the bits.

use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut, HostTensor};
use wgpu_optim::{adafactor_state_kinds, Adafactor, DType, Optimizer, Tensor};
use wgpu_optim_testkit::oracle::{AdafactorOracle, ToOracle};

use super::{host, oracle_states};
use crate::common::{ctx, download, Rng};

/// A matrix, a batch of two matrices, a vector.
const SHAPES: [&[usize]; 3] = [&[8, 15], &[2, 8, 15], &[33]];
/// Each tensor's poisoned element: row 3 column 7; batch 1 row 2 column 3; element 17.
const POISONED: [usize; 3] = [3 * 15 + 7, (8 + 2) * 15 + 3, 17];

/// Per step, per tensor: the parameter, then its states in `adafactor_state_kinds` order.
type Trajectory = Vec<Vec<Vec<f64>>>;

fn grid(rng: &mut Rng, n: usize) -> Vec<f64> {
    (0..n).map(|_| (rng.uniform() * 64.0).floor() / 64.0).collect()
}

/// `steps` steps of the default Adafactor on the oracle, the GPU and the CPU backend. The
/// gradients are zero before step `at` (which leaves the parameters on the grid), `bad` at
/// each tensor's poisoned element at step `at`, on the grid elsewhere.
fn run(bad: f64, at: usize, steps: usize, seed: u64) -> [Trajectory; 3] {
    let ctx = ctx();
    let mut rng = Rng::new(seed);
    let config = Adafactor::default();
    let shapes: Vec<Vec<usize>> = SHAPES.iter().map(|s| s.to_vec()).collect();
    let lens: Vec<usize> = shapes.iter().map(|s| s.iter().product()).collect();
    let start: Vec<Vec<f64>> = lens.iter().map(|&n| grid(&mut rng, n)).collect();
    let grads: Vec<Vec<Vec<f64>>> = (1..=steps)
        .map(|t| {
            let mut g: Vec<Vec<f64>> = lens.iter().map(|&n| grid(&mut rng, n)).collect();
            for (g, &k) in g.iter_mut().zip(&POISONED) {
                if t < at {
                    g.fill(0.0);
                } else if t == at {
                    g[k] = bad;
                }
            }
            g
        })
        .collect();

    let mut oracle = AdafactorOracle::new(config.to_oracle(), shapes.clone(), DType::F32.to_oracle());
    let mut want = start.clone();
    let params: Vec<Tensor> = start.iter().map(|p| ctx.upload("param", p, DType::F32)).collect();
    let grad_tensors: Vec<Tensor> = lens.iter().map(|&n| ctx.zeros("grad", n as u64, DType::F32)).collect();
    let mut gpu = Optimizer::builder().param_shapes(shapes.clone()).build(&ctx, config, &params).unwrap();
    let mut cpu_params: Vec<HostTensor> = start.iter().map(|p| host(p, DType::F32)).collect();
    let views: Vec<HostSlice<'_>> = cpu_params.iter().map(HostTensor::as_slice).collect();
    let mut cpu = CpuOptimizer::builder().param_shapes(shapes.clone()).build(config, &views).unwrap();
    let mut trajectories: [Trajectory; 3] = Default::default();
    for g in &grads {
        oracle.step(&mut want, g);
        for (t, g) in grad_tensors.iter().zip(g) {
            ctx.write(t, g).unwrap();
        }
        gpu.step(&grad_tensors).unwrap();
        let host_grads: Vec<HostTensor> = g.iter().map(|g| host(g, DType::F32)).collect();
        let grad_views: Vec<HostSlice<'_>> = host_grads.iter().map(HostTensor::as_slice).collect();
        let mut param_views: Vec<HostSliceMut<'_>> =
            cpu_params.iter_mut().map(HostTensor::as_mut_slice).collect();
        cpu.step(&mut param_views, &grad_views).unwrap();

        let (mut o, mut gp, mut c) = (Vec::new(), Vec::new(), Vec::new());
        for (i, shape) in shapes.iter().enumerate() {
            o.push(want[i].clone());
            o.extend(oracle_states(&oracle, i));
            gp.push(download(&ctx, &params[i]));
            c.push(cpu_params[i].to_f64());
            for kind in adafactor_state_kinds(shape) {
                gp.push(download(&ctx, gpu.state(i, *kind).unwrap().and_then(|s| s.dense()).unwrap()));
                c.push(cpu.state(i, *kind).and_then(|s| s.dense()).unwrap().to_f64());
            }
        }
        trajectories[0].push(o);
        trajectories[1].push(gp);
        trajectories[2].push(c);
    }
    trajectories
}

/// The arrays of a step in `Trajectory` order, named.
const NAMES: [&str; 7] =
    ["param[0]", "row_var[0]", "col_var[0]", "param[1]", "row_var[1]", "col_var[1]", "param[2]"];
const VARIANCE: &str = "variance[2]";

fn name(k: usize) -> &'static str {
    NAMES.get(k).copied().unwrap_or(VARIANCE)
}

/// How a value is non-finite, if it is (the sign of a NaN is not part of the rule).
fn class(x: f64) -> &'static str {
    if x.is_nan() {
        "NaN"
    } else if x == f64::INFINITY {
        "+inf"
    } else if x == f64::NEG_INFINITY {
        "-inf"
    } else {
        "finite"
    }
}

/// The indices of `values` whose class is `what`.
fn where_class(values: &[f64], what: &str) -> Vec<usize> {
    (0..values.len()).filter(|&k| class(values[k]) == what).collect()
}

/// torch's rule after step `t` for a poisoned element at step `at`, as sets of indices.
/// `lerp(state, g^2, w)` with `g^2 = inf` is NaN for `w >= 1/2` (steps 1 and 2 of the
/// default `w = t^-0.8`: its second form computes `inf - inf (1 - w)`) and +inf below;
/// a state at +inf becomes NaN at the next step (`inf + w (m - inf)`). A NaN or +inf
/// `row_var` makes the clamped mean of its matrix's `row_var` NaN or +inf: then every `V`
/// of that matrix is NaN, or (at +inf, where `V = R C / inf`) NaN on the poisoned row and
/// column and 0 elsewhere, floored to `eps1^2`. `update.norm()` is NaN, and Python's
/// `max(1, NaN)` is 1: the other tensors' elements stay finite, their update unclipped.
fn check_rule(bad: f64, at: usize, t: usize, step: &[Vec<f64>]) {
    let what = |k: usize| format!("{} after step {t} (poisoned at {at} with {bad})", name(k));
    if t < at {
        for (k, values) in step.iter().enumerate() {
            assert_eq!(where_class(values, "finite").len(), values.len(), "{}", what(k));
        }
        return;
    }
    let state_inf = bad.is_infinite() && t == at && (t as f64).powf(-0.8) < 0.5;
    let state = if state_inf { "+inf" } else { "NaN" };
    let all = |n: usize| (0..n).collect::<Vec<usize>>();
    // The matrix: row 3, column 7.
    let (row, col) = (3, 7);
    let cross: Vec<usize> = all(120).into_iter().filter(|k| k / 15 == row || k % 15 == col).collect();
    let matrix = if state_inf { cross } else { all(120) };
    assert_eq!(where_class(&step[0], "NaN"), matrix, "{}", what(0));
    assert_eq!(where_class(&step[0], "finite").len(), 120 - matrix.len(), "{}", what(0));
    assert_eq!(where_class(&step[1], state), vec![row], "{}", what(1));
    assert_eq!(where_class(&step[2], state), vec![col], "{}", what(2));
    // The batch: matrix 1's row 2 and column 3; matrix 0 finite.
    let second: Vec<usize> =
        (120..240).filter(|k| !state_inf || (k - 120) / 15 == 2 || (k - 120) % 15 == 3).collect();
    assert_eq!(where_class(&step[3], "NaN"), second, "{}", what(3));
    assert_eq!(where_class(&step[3], "finite").len(), 240 - second.len(), "{}", what(3));
    assert_eq!(where_class(&step[4], state), vec![8 + 2], "{}", what(4));
    assert_eq!(where_class(&step[5], state), vec![15 + 3], "{}", what(5));
    // The vector: its element alone.
    assert_eq!(where_class(&step[6], "NaN"), vec![17], "{}", what(6));
    assert_eq!(where_class(&step[6], "finite").len(), 32, "{}", what(6));
    assert_eq!(where_class(&step[7], state), vec![17], "{}", what(7));
    for k in [1, 2, 4, 5, 7] {
        assert_eq!(where_class(&step[k], "finite").len(), step[k].len() - 1, "{}", what(k));
    }
}

/// Every step: the rule, the oracle's pattern and values on the GPU, and the CPU backend's
/// bits equal to the GPU's (any NaN equal to any NaN).
fn check(bad: f64, at: usize, steps: usize, seed: u64) {
    let [oracle, gpu, cpu] = run(bad, at, steps, seed);
    for t in 0..steps {
        check_rule(bad, at, t + 1, &oracle[t]);
        for (k, ((want, g), c)) in oracle[t].iter().zip(&gpu[t]).zip(&cpu[t]).enumerate() {
            let what = format!("{} after step {} (poisoned at {at} with {bad})", name(k), t + 1);
            for (e, ((w, g), c)) in want.iter().zip(g).zip(c).enumerate() {
                assert_eq!(class(*g), class(*w), "{what} element {e}: gpu {g}, oracle {w}");
                let same = (g.is_nan() && c.is_nan()) || (*g as f32).to_bits() == (*c as f32).to_bits();
                assert!(same, "{what} element {e}: gpu {g}, cpu {c}");
                if w.is_finite() {
                    assert!(
                        (g - w).abs() <= 2e-6 + 2e-5 * w.abs(),
                        "{what} element {e}: gpu {g}, oracle {w}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_nan_gradient_element_at_the_first_step_follows_torch_on_both_backends_bit_for_bit() {
    check(f64::NAN, 1, 3, 21);
}

#[test]
fn an_infinite_gradient_element_at_the_first_step_follows_torch_on_both_backends_bit_for_bit() {
    check(f64::INFINITY, 1, 3, 22);
    check(f64::NEG_INFINITY, 1, 3, 23);
}

#[test]
fn non_finite_gradient_elements_at_a_later_step_follow_torch_on_both_backends_bit_for_bit() {
    // Step 3 has `w = 3^-0.8 < 1/2`: an infinite gradient leaves its row's and column's
    // states at +inf for one step.
    for (bad, seed) in [(f64::NAN, 24), (f64::INFINITY, 25), (f64::NEG_INFINITY, 26)] {
        check(bad, 3, 4, seed);
    }
}
