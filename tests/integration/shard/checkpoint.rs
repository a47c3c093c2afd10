//! Per-rank checkpoints that another number of ranks loads: saved on N ranks after some
//! steps, loaded on M, continued, and compared with the unsharded run throughout.

use std::path::Path;

use super::*;
use crate::common::ctx;
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut, HostTensor};
use wgpu_optim::shard::{GradReduction, ShardedOptimizer};
use wgpu_optim::{Adam, Error, Optimizer, ParamGroup, Sgd, Tensor};

/// Steps before the save and after the load.
const BEFORE: std::ops::RangeInclusive<u64> = 1..=3;
const AFTER: std::ops::RangeInclusive<u64> = 4..=5;

fn host(values: &[Vec<f64>]) -> Vec<HostTensor> {
    host_tensors(values, &DTYPES)
}

/// `size` CPU ranks from `start` (every rank's parameters), loading `load` first if given,
/// stepping `steps` and saving into `save` if given; rank 0's parameters after.
fn cpu_ranks(
    size: usize,
    algorithm: Algorithm,
    start: &[Vec<f64>],
    load: Option<&Path>,
    steps: std::ops::RangeInclusive<u64>,
    save: Option<&Path>,
) -> Vec<Vec<f64>> {
    let results = on_ranks(size, |comm| {
        let rank = comm.rank();
        let mut params = host(start);
        let slices: Vec<HostSlice<'_>> = params.iter().map(HostTensor::as_slice).collect();
        let mut opt = sharded_cpu(comm, algorithm, &slices);
        if let Some(dir) = load {
            opt.load(dir).unwrap();
        }
        for t in steps.clone() {
            let grads = host(&rank_grads(rank, t));
            let grads: Vec<HostSlice<'_>> = grads.iter().map(HostTensor::as_slice).collect();
            let mut slices: Vec<HostSliceMut<'_>> = params.iter_mut().map(HostTensor::as_mut_slice).collect();
            opt.step(&mut slices, &grads).unwrap();
        }
        assert_eq!(opt.step_count(), *steps.end());
        if let Some(dir) = save {
            opt.save(dir).unwrap();
        }
        params.iter().map(HostTensor::to_f64).collect::<Vec<_>>()
    });
    results.into_iter().next().unwrap()
}

/// The unsharded CPU run: `BEFORE` on `before` ranks' reduced gradients, then `AFTER` on
/// `after` ranks'.
fn unsharded(algorithm: Algorithm, before: usize, after: usize) -> Vec<Vec<f64>> {
    let mut params = host(&initial_params());
    let slices: Vec<HostSlice<'_>> = params.iter().map(HostTensor::as_slice).collect();
    let mut opt = CpuOptimizer::builder().build(algorithm, &slices).unwrap();
    for t in BEFORE.chain(AFTER) {
        let grads = reduced_grads(if t <= *BEFORE.end() { before } else { after }, t);
        let grads: Vec<HostSlice<'_>> = grads.iter().map(|g| HostSlice::from(&g[..])).collect();
        let mut slices: Vec<HostSliceMut<'_>> = params.iter_mut().map(HostTensor::as_mut_slice).collect();
        opt.step(&mut slices, &grads).unwrap();
    }
    params.iter().map(HostTensor::to_f64).collect()
}

fn algorithms() -> Vec<Algorithm> {
    vec![
        Adam { amsgrad: true, ..Adam::adamw() }.into(),
        Sgd { momentum: 0.9, lr: 0.01, ..Sgd::default() }.into(),
        ScheduleFreeAdamW::default().into(),
        Adan::default().into(),
    ]
}

#[test]
fn a_checkpoint_saved_on_some_ranks_continues_on_others_as_the_unsharded_run() {
    for algorithm in algorithms() {
        for (before, after) in [(3, 2), (3, 1), (1, 3), (2, 4)] {
            let dir = Scratch::new();
            let saved = cpu_ranks(before, algorithm, &initial_params(), None, BEFORE, Some(dir.path()));
            let got = cpu_ranks(after, algorithm, &saved, Some(dir.path()), AFTER, None);
            let want = unsharded(algorithm, before, after);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let same = g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{algorithm:?}, saved on {before} ranks, loaded on {after}: params[{i}] differ"
                );
            }
        }
    }
}

#[test]
fn a_gpu_checkpoint_loads_on_the_cpu_backend_and_on_other_gpu_ranks() {
    let _turn = crate::common::gpu_turn();
    let ctx = ctx();
    let algorithm: Algorithm = Adam { amsgrad: true, ..Adam::adamw() }.into();
    let dir = Scratch::new();
    let saved: Vec<Vec<f64>> = on_ranks(3, |comm| {
        let rank = comm.rank();
        let params: Vec<Tensor> =
            initial_params().iter().zip(DTYPES).map(|(v, dtype)| ctx.upload("param", v, dtype)).collect();
        let groups = vec![ParamGroup::new(algorithm, &params)];
        let mut opt =
            ShardedOptimizer::build(&ctx, comm, Optimizer::builder(), GradReduction::Mean, groups).unwrap();
        for t in BEFORE {
            let grads: Vec<Tensor> = rank_grads(rank, t)
                .iter()
                .zip(DTYPES)
                .map(|(g, dtype)| ctx.upload("grad", g, dtype))
                .collect();
            opt.step(&grads).unwrap();
        }
        opt.save(dir.path()).unwrap();
        params.iter().map(|p| ctx.read(p).unwrap()).collect::<Vec<_>>()
    })
    .remove(0);
    let want = unsharded(algorithm, 3, 2);
    let on_cpu = cpu_ranks(2, algorithm, &saved, Some(dir.path()), AFTER, None);
    let on_gpu: Vec<Vec<f64>> = on_ranks(2, |comm| {
        let rank = comm.rank();
        let params: Vec<Tensor> =
            saved.iter().zip(DTYPES).map(|(v, dtype)| ctx.upload("param", v, dtype)).collect();
        let groups = vec![ParamGroup::new(algorithm, &params)];
        let mut opt =
            ShardedOptimizer::build(&ctx, comm, Optimizer::builder(), GradReduction::Mean, groups).unwrap();
        opt.load(dir.path()).unwrap();
        for t in AFTER {
            let grads: Vec<Tensor> = rank_grads(rank, t)
                .iter()
                .zip(DTYPES)
                .map(|(g, dtype)| ctx.upload("grad", g, dtype))
                .collect();
            opt.step(&grads).unwrap();
        }
        params.iter().map(|p| ctx.read(p).unwrap()).collect::<Vec<_>>()
    })
    .remove(0);
    for (i, w) in want.iter().enumerate() {
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert!(bits(&on_cpu[i]) == bits(w), "saved on the GPU, continued on the CPU: params[{i}] differ");
        assert!(bits(&on_gpu[i]) == bits(w), "saved on 3 GPU ranks, continued on 2: params[{i}] differ");
    }
}

#[test]
fn a_checkpoint_of_other_tensors_or_a_corrupt_one_is_refused_on_every_rank() {
    let dir = Scratch::new();
    let algorithm: Algorithm = Adam::adamw().into();
    cpu_ranks(2, algorithm, &initial_params(), None, BEFORE, Some(dir.path()));
    let load = |params: Vec<f32>| {
        on_ranks(2, |comm| {
            let mut opt = sharded_cpu(comm, algorithm, &[HostSlice::from(&params[..])]);
            opt.load(dir.path())
        })
    };
    for (rank, result) in load(vec![0.5; 100]).into_iter().enumerate() {
        match result {
            Err(Error::BadFile { problem, .. }) => {
                assert!(problem.contains("other tensors"), "rank {rank}: {problem}")
            }
            other => panic!("rank {rank}: expected a refusal, got {other:?}"),
        }
    }
    let file = dir.path().join("rank-1-of-2.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&file, bytes).unwrap();
    let results = on_ranks(2, |comm| {
        let mut params = host(&initial_params());
        let slices: Vec<HostSlice<'_>> = params.iter_mut().map(|p| p.as_slice()).collect();
        let mut opt = sharded_cpu(comm, algorithm, &slices);
        opt.load(dir.path())
    });
    for (rank, result) in results.into_iter().enumerate() {
        match result {
            Err(Error::BadFile { problem, .. }) => {
                assert!(problem.contains("corrupt"), "rank {rank}: {problem}")
            }
            other => panic!("rank {rank}: expected the corrupt file refused, got {other:?}"),
        }
    }
}
