//! AMP across ranks: scaled gradients reduced, unscaled and checked; a NaN or infinity in
//! any rank's gradients makes every rank skip the step.

use super::*;
use crate::common::{ctx, gpu_turn};
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut, HostTensor};
use wgpu_optim::shard::{GradReduction, ShardedOptimizer};
use wgpu_optim::{Adam, Error, Optimizer, ParamGroup, Tensor};

const SCALE: f64 = 1024.0;
/// The step whose gradients hold an infinity on rank 1.
const OVERFLOW: u64 = 2;

/// Rank `rank`'s gradients of the scaled loss at step `t` (exact: the scale is a power of
/// two), with an infinity on rank 1 at [`OVERFLOW`].
fn scaled_grads(rank: usize, t: u64) -> Vec<Vec<f64>> {
    let mut grads: Vec<Vec<f64>> =
        rank_grads(rank, t).iter().map(|g| g.iter().map(|v| v * SCALE).collect()).collect();
    if rank == 1 && t == OVERFLOW {
        grads[0][5] = f64::INFINITY;
    }
    grads
}

/// The unsharded run: the steps other than [`OVERFLOW`], on the reduced gradients unscaled
/// as the sharded step unscales them (`(sum / ranks) * inv_scale` in f32).
fn unsharded(size: usize) -> Vec<Vec<f64>> {
    let mut params: Vec<HostTensor> = host_tensors(&initial_params(), &DTYPES);
    let slices: Vec<HostSlice<'_>> = params.iter().map(HostTensor::as_slice).collect();
    let mut opt = CpuOptimizer::builder().build(Adam::adamw(), &slices).unwrap();
    for t in (1..=STEPS).filter(|&t| t != OVERFLOW) {
        let per_rank: Vec<_> = (0..size).map(|r| scaled_grads(r, t)).collect();
        let grads: Vec<Vec<f32>> = (0..LENS.len())
            .map(|i| {
                (0..LENS[i])
                    .map(|e| {
                        let sum =
                            (1..size).fold(per_rank[0][i][e] as f32, |acc, r| acc + per_rank[r][i][e] as f32);
                        sum / size as f32 * (1.0 / SCALE as f32)
                    })
                    .collect()
            })
            .collect();
        let grads: Vec<HostSlice<'_>> = grads.iter().map(|g| HostSlice::from(&g[..])).collect();
        let mut slices: Vec<HostSliceMut<'_>> = params.iter_mut().map(HostTensor::as_mut_slice).collect();
        opt.step(&mut slices, &grads).unwrap();
    }
    params.iter().map(HostTensor::to_f64).collect()
}

fn bits(values: &[Vec<f64>]) -> Vec<Vec<u64>> {
    values.iter().map(|v| v.iter().map(|x| x.to_bits()).collect()).collect()
}

#[test]
fn an_infinity_on_one_rank_makes_every_rank_skip_the_step_on_the_cpu() {
    let size = 3;
    let results = on_ranks(size, |comm| {
        let rank = comm.rank();
        let mut params: Vec<HostTensor> = host_tensors(&initial_params(), &DTYPES);
        let slices: Vec<HostSlice<'_>> = params.iter().map(HostTensor::as_slice).collect();
        let mut opt = sharded_cpu(comm, Adam::adamw(), &slices);
        let mut stepped = Vec::new();
        for t in 1..=STEPS {
            let grads: Vec<HostTensor> = host_tensors(&scaled_grads(rank, t), &DTYPES);
            let grads: Vec<HostSlice<'_>> = grads.iter().map(HostTensor::as_slice).collect();
            let mut slices: Vec<HostSliceMut<'_>> = params.iter_mut().map(HostTensor::as_mut_slice).collect();
            stepped.push(opt.step_scaled(&mut slices, &grads, (1.0 / SCALE) as f32).unwrap());
        }
        let mut slices: Vec<HostSliceMut<'_>> = params.iter_mut().map(HostTensor::as_mut_slice).collect();
        let refused = opt.step_scaled(&mut slices, &[], 0.0);
        (stepped, opt.step_count(), params.iter().map(HostTensor::to_f64).collect::<Vec<_>>(), refused)
    });
    let want = unsharded(size);
    for (rank, (stepped, count, params, refused)) in results.into_iter().enumerate() {
        assert_eq!(stepped, [true, false, true], "rank {rank}: the overflow step is skipped everywhere");
        assert_eq!(count, STEPS - 1, "rank {rank}: a skipped step is not counted");
        assert!(bits(&params) == bits(&want), "rank {rank}: the parameters differ from the unsharded run");
        assert!(matches!(refused, Err(Error::BadValue { .. })), "rank {rank}: inv_scale 0 gave {refused:?}");
    }
}

#[test]
fn an_infinity_on_one_rank_makes_every_rank_skip_the_step_on_the_gpu() {
    let _turn = gpu_turn();
    let ctx = ctx();
    let size = 3;
    let results = on_ranks(size, |comm| {
        let rank = comm.rank();
        let params: Vec<Tensor> =
            initial_params().iter().zip(DTYPES).map(|(v, dtype)| ctx.upload("param", v, dtype)).collect();
        let groups = vec![ParamGroup::new(Adam::adamw(), &params)];
        let mut opt =
            ShardedOptimizer::build(&ctx, comm, Optimizer::builder(), GradReduction::Mean, groups).unwrap();
        let mut stepped = Vec::new();
        for t in 1..=STEPS {
            let grads: Vec<Tensor> = scaled_grads(rank, t)
                .iter()
                .zip(DTYPES)
                .map(|(g, dtype)| ctx.upload("grad", g, dtype))
                .collect();
            stepped.push(opt.step_scaled(&grads, (1.0 / SCALE) as f32).unwrap());
        }
        (stepped, params.iter().map(|p| ctx.read(p).unwrap()).collect::<Vec<_>>())
    });
    let want = unsharded(size);
    for (rank, (stepped, params)) in results.into_iter().enumerate() {
        assert_eq!(stepped, [true, false, true], "rank {rank}: the overflow step is skipped everywhere");
        assert!(bits(&params) == bits(&want), "rank {rank}: the parameters differ from the unsharded run");
    }
}
