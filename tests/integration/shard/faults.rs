//! Ranks built differently, refusals, and a rank that leaves mid-run.

use std::time::Instant;

use super::*;
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut};
use wgpu_optim::shard::{GradReduction, ShardedCpuOptimizer};
use wgpu_optim::{Adam, DType, Error, Rounding, StateStorage};

/// This rank's Adam over one parameter, `params`.
fn adam_on(
    comm: wgpu_optim::shard::InProcess,
    params: &[f32],
) -> ShardedCpuOptimizer<wgpu_optim::shard::InProcess> {
    let slices = [HostSlice::from(params)];
    ShardedCpuOptimizer::build(comm, CpuOptimizer::builder(), GradReduction::Mean, Adam::default(), &slices)
        .unwrap()
}

#[test]
fn ranks_built_with_different_configurations_are_refused_on_every_rank_before_any_step() {
    let params = vec![0.5f32; 100];
    let results = on_ranks(3, |comm| {
        let lr = if comm.rank() == 2 { 2e-3 } else { 1e-3 };
        let algorithm = Adam { lr, ..Adam::default() };
        ShardedCpuOptimizer::build(
            comm,
            CpuOptimizer::builder(),
            GradReduction::Mean,
            algorithm,
            &[HostSlice::from(&params[..])],
        )
        .map(drop)
    });
    for (rank, result) in results.into_iter().enumerate() {
        match result {
            Err(Error::Collective { operation, problem, .. }) => {
                assert!(operation.contains("configuration"), "rank {rank}: {operation}");
                assert!(problem.contains("rank 2"), "rank {rank}: {problem}");
            }
            other => panic!("rank {rank}: expected a refused configuration, got {other:?}"),
        }
    }
}

#[test]
fn what_a_sharded_step_does_not_run_yet_is_refused_with_the_reason() {
    let params = vec![0.5f32; 100];
    let slices = [HostSlice::from(&params[..])];
    let refused = |builder: wgpu_optim::cpu::CpuOptimizerBuilder, algorithm: Algorithm, second: &str| {
        let result = on_ranks(1, |comm| {
            ShardedCpuOptimizer::build(comm, builder.clone(), GradReduction::Sum, algorithm, &slices)
                .map(drop)
        });
        match &result[0] {
            Err(Error::ConflictingOptions { first: "sharding", second: got, reason }) => {
                assert_eq!(*got, second, "{reason}");
                assert!(!reason.is_empty());
            }
            other => panic!("{second}: expected a refusal, got {other:?}"),
        }
    };
    refused(
        CpuOptimizer::builder().state_storage(StateStorage::Dtype(DType::F64)),
        Adam::default().into(),
        "state_storage",
    );
    refused(
        CpuOptimizer::builder().rounding(Rounding::Stochastic { seed: 1, state: false }),
        wgpu_optim::Muon::default().into(),
        "rounding",
    );
}

#[test]
fn a_step_with_the_wrong_gradients_on_every_rank_is_refused_and_the_next_step_meets() {
    let results = on_ranks(2, |comm| {
        let mut params = vec![0.5f32; 100];
        let mut opt = adam_on(comm, &params);
        let short = vec![0.1f32; 99];
        let refused = opt.step(&mut [HostSliceMut::from(&mut params[..])], &[HostSlice::from(&short[..])]);
        // Both ranks were refused alike, so the next step still meets in its collectives.
        let grads = vec![0.1f32; 100];
        opt.step(&mut [HostSliceMut::from(&mut params[..])], &[HostSlice::from(&grads[..])]).unwrap();
        (refused, params)
    });
    for (rank, (refused, _)) in results.iter().enumerate() {
        assert!(matches!(refused, Err(Error::LengthMismatch { .. })), "rank {rank}: {refused:?}");
    }
    assert_eq!(results[0].1, results[1].1);
}

#[test]
fn a_rank_that_panics_mid_run_ends_the_others_steps_with_an_error_within_seconds() {
    let params = vec![0.5f32; 1000];
    let started = Instant::now();
    let results = on_ranks(3, |comm| {
        let rank = comm.rank();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut mine = params.clone();
            let mut opt = adam_on(comm, &mine);
            let grads = vec![0.1f32; 1000];
            for t in 0..5 {
                if rank == 1 && t == 2 {
                    panic!("rank 1 fails mid-run");
                }
                opt.step(&mut [HostSliceMut::from(&mut mine[..])], &[HostSlice::from(&grads[..])])?;
            }
            Ok::<_, Error>(())
        }));
        (rank, outcome.map_err(|_| "panicked"))
    });
    assert!(started.elapsed().as_secs() < 10, "the others took {:?} to give up", started.elapsed());
    for (rank, outcome) in results {
        match (rank, outcome) {
            (1, Err(_)) => {}
            (_, Ok(Err(Error::Collective { problem, .. }))) => {
                assert!(problem.contains("rank 1"), "rank {rank}: {problem}")
            }
            (rank, other) => panic!("rank {rank}: expected a collective error, got {other:?}"),
        }
    }
}

#[test]
fn a_step_refused_on_one_rank_is_an_error_on_every_rank_and_the_next_step_meets() {
    let results = on_ranks(3, |comm| {
        let rank = comm.rank();
        let mut params = vec![0.5f32; 100];
        let mut opt = adam_on(comm, &params);
        let grads = vec![0.1f32; if rank == 1 { 99 } else { 100 }];
        let refused = opt.step(&mut [HostSliceMut::from(&mut params[..])], &[HostSlice::from(&grads[..])]);
        let unchanged = params.iter().all(|&p| p == 0.5);
        let grads = vec![0.1f32; 100];
        opt.step(&mut [HostSliceMut::from(&mut params[..])], &[HostSlice::from(&grads[..])]).unwrap();
        (refused, unchanged, params)
    });
    for (rank, (refused, unchanged, _)) in results.iter().enumerate() {
        match (rank, refused) {
            (1, Err(Error::LengthMismatch { .. })) => {}
            (_, Err(Error::Collective { operation, problem, .. })) if rank != 1 => {
                assert_eq!(operation, "step", "rank {rank}");
                assert!(problem.contains("another rank's step failed"), "rank {rank}: {problem}");
            }
            (rank, other) => panic!("rank {rank}: expected the refusal on every rank, got {other:?}"),
        }
        assert!(unchanged, "rank {rank}: a refused step changed the parameters");
    }
    assert!(results.iter().all(|(_, _, p)| *p == results[0].2), "the next step left the ranks apart");
}
