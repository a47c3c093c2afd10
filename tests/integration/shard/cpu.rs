//! The sharded optimizer on the CPU backend.

use super::*;
use crate::common::{assert_close, Tolerance};
use wgpu_optim::cpu::{CpuOptimizer, CpuOptimizerBuilder, HostSlice, HostSliceMut, HostTensor};
use wgpu_optim::shard::{GradReduction, ShardedCpuOptimizer};
use wgpu_optim::{Adam, GradClip, NormType, Rounding, StateKind};

/// The parameters as host tensors of their dtypes.
fn host_params(dtypes: &[DType; 5]) -> Vec<HostTensor> {
    host_tensors(&initial_params(), dtypes)
}

/// Every rank's parameters and last global norm after `STEPS` sharded steps of `algorithm`.
fn sharded_run(
    size: usize,
    builder: &CpuOptimizerBuilder,
    algorithm: Algorithm,
    dtypes: &[DType; 5],
) -> Vec<(Vec<HostTensor>, Option<f64>)> {
    on_ranks(size, |comm| {
        let rank = comm.rank();
        let mut params = host_params(dtypes);
        let slices: Vec<HostSlice<'_>> = params.iter().map(HostTensor::as_slice).collect();
        let mut opt =
            ShardedCpuOptimizer::build(comm, builder.clone(), GradReduction::Mean, algorithm, &slices)
                .unwrap();
        for t in 1..=STEPS {
            let grads: Vec<HostTensor> = host_tensors(&rank_grads(rank, t), &DTYPES);
            let grads: Vec<HostSlice<'_>> = grads.iter().map(HostTensor::as_slice).collect();
            let mut slices: Vec<HostSliceMut<'_>> = params.iter_mut().map(HostTensor::as_mut_slice).collect();
            opt.step(&mut slices, &grads).unwrap();
        }
        assert_eq!(opt.step_count(), STEPS);
        (params, opt.grad_norm())
    })
}

/// The unsharded optimizer's parameters and last norm after `STEPS` steps on the
/// gradients `size` ranks reduce to.
fn unsharded_run(
    size: usize,
    builder: &CpuOptimizerBuilder,
    algorithm: Algorithm,
    dtypes: &[DType; 5],
) -> (Vec<HostTensor>, Option<f64>) {
    let mut params = host_params(dtypes);
    let slices: Vec<HostSlice<'_>> = params.iter().map(HostTensor::as_slice).collect();
    let mut opt = builder.clone().build(algorithm, &slices).unwrap();
    for t in 1..=STEPS {
        let grads = reduced_grads(size, t);
        let grads: Vec<HostSlice<'_>> = grads.iter().map(|g| HostSlice::from(&g[..])).collect();
        let mut slices: Vec<HostSliceMut<'_>> = params.iter_mut().map(HostTensor::as_mut_slice).collect();
        opt.step(&mut slices, &grads).unwrap();
    }
    (params, opt.grad_norm())
}

#[test]
fn every_elementwise_family_on_1_to_4_ranks_is_the_unsharded_step_bit_for_bit() {
    let builder = CpuOptimizer::builder();
    for algorithm in elementwise_families() {
        for size in 1..=4 {
            let (want, _) = unsharded_run(size, &builder, algorithm, &DTYPES);
            for (rank, (got, _)) in sharded_run(size, &builder, algorithm, &DTYPES).into_iter().enumerate() {
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g, w, "{algorithm:?} on {size} ranks: rank {rank}'s params[{i}]");
                }
            }
        }
    }
}

#[test]
fn clipping_gives_every_rank_the_same_norm_bits_close_to_the_unsharded_norm() {
    let adan = Adan { max_grad_norm: 0.5, ..Adan::default() };
    let cases: [(CpuOptimizerBuilder, Algorithm, f64); 3] = [
        (CpuOptimizer::builder().grad_clip(GradClip::l2(0.5)), Adam::adamw().into(), 0.5),
        (
            CpuOptimizer::builder().grad_clip(GradClip { max_norm: 0.25, norm_type: NormType::Inf }),
            Adam::adamw().into(),
            0.25,
        ),
        (CpuOptimizer::builder(), adan.into(), 0.5),
    ];
    for (builder, algorithm, max_norm) in cases {
        for size in 1..=4 {
            let (want, want_norm) = unsharded_run(size, &builder, algorithm, &DTYPES);
            let want_norm = want_norm.expect("the unsharded optimizer clips");
            let ranks = sharded_run(size, &builder, algorithm, &DTYPES);
            let norm = ranks[0].1.expect("a sharded optimizer that clips reports the norm");
            assert!(
                want_norm > max_norm,
                "{algorithm:?}: the norm {want_norm} must exceed {max_norm}, or nothing is clipped"
            );
            for (rank, (got, got_norm)) in ranks.iter().enumerate() {
                assert_eq!(
                    got_norm.map(f64::to_bits),
                    Some(norm.to_bits()),
                    "rank {rank}'s norm on {size} ranks"
                );
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let tolerance = Tolerance::stored(g.dtype());
                    assert_close(
                        &format!("{algorithm:?}, {size} ranks, rank {rank}, params[{i}]"),
                        &g.to_f64(),
                        &w.to_f64(),
                        tolerance,
                    );
                }
            }
            assert_close(
                &format!("{algorithm:?}: norm on {size} ranks"),
                &[norm],
                &[want_norm],
                Tolerance::F32,
            );
        }
    }
}

#[test]
fn each_rank_holds_its_shard_of_the_state_counted_from_its_tensors() {
    let lens = [1000usize, 333, 4096, 7];
    let params: Vec<Vec<f32>> = lens.iter().map(|&n| vec![0.5; n]).collect();
    let slices: Vec<HostSlice<'_>> = params.iter().map(|p| HostSlice::from(&p[..])).collect();
    let unsharded = CpuOptimizer::builder().build(Adam::default(), &slices).unwrap();
    let unsharded_bytes: u64 = (0..lens.len())
        .flat_map(|i| StateKind::ALL.iter().map(move |k| (i, *k)))
        .filter_map(|(i, k)| unsharded.state(i, k).and_then(|v| v.dense()))
        .map(|s| s.len() as u64 * 4)
        .sum();
    assert_eq!(unsharded_bytes, 2 * 4 * lens.iter().sum::<usize>() as u64, "Adam keeps two f32 moments");
    for size in 1..=4 {
        let per_rank = on_ranks(size, |comm| {
            let opt = sharded_cpu(comm, Adam::default(), &slices);
            opt.state_bytes()
        });
        assert_eq!(
            per_rank.iter().sum::<u64>(),
            unsharded_bytes,
            "{size} ranks hold the state once between them"
        );
        let share = unsharded_bytes.div_ceil(size as u64);
        for (rank, bytes) in per_rank.iter().enumerate() {
            // A shard is ceil(elements / N) elements; padding lies at the end of the last.
            assert!(
                *bytes <= share + 8,
                "rank {rank} of {size} holds {bytes} bytes, over 1/{size} ({share})"
            );
        }
    }
}

#[test]
fn stochastic_and_kahan_rounding_on_1_to_4_ranks_are_the_unsharded_step_bit_for_bit() {
    // A piece's stochastic rounding hashes its elements under its whole tensor's ordinal
    // and element indices, so the random bits are the unsharded step's.
    let roundings = [Rounding::Stochastic { seed: 7, state: true }, Rounding::Kahan];
    let algorithms: [Algorithm; 2] =
        [Adam::adamw().into(), wgpu_optim::Sgd { momentum: 0.9, ..Default::default() }.into()];
    for rounding in roundings {
        let builder = CpuOptimizer::builder().rounding(rounding);
        for algorithm in algorithms {
            for size in 1..=4 {
                let (want, _) = unsharded_run(size, &builder, algorithm, &PARAMS_16);
                for (rank, (got, _)) in
                    sharded_run(size, &builder, algorithm, &PARAMS_16).into_iter().enumerate()
                {
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(
                            g, w,
                            "{rounding:?} {algorithm:?} on {size} ranks: rank {rank}'s params[{i}]"
                        );
                    }
                }
            }
        }
    }
}
