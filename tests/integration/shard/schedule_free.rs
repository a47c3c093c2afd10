//! Schedule-Free's `eval()` and `train()` on sharded optimizers: each rank swaps its
//! pieces and the pieces are gathered, so every rank holds the point the unsharded
//! optimizer's swap gives.

use super::*;
use crate::common::{ctx, gpu_turn};
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut, HostTensor};
use wgpu_optim::shard::{GradReduction, ShardedCpuOptimizer, ShardedOptimizer};
use wgpu_optim::{Optimizer, ParamGroup, Tensor};

fn bits(values: &[Vec<f64>]) -> Vec<Vec<u64>> {
    values.iter().map(|v| v.iter().map(|x| x.to_bits()).collect()).collect()
}

/// The unsharded CPU optimizer's parameters after `STEPS` steps, after `eval()`, and after
/// `train()` and one more step, on the gradients `size` ranks reduce to.
fn unsharded(size: usize) -> [Vec<Vec<f64>>; 3] {
    let mut params: Vec<HostTensor> = host_tensors(&initial_params(), &DTYPES);
    let slices: Vec<HostSlice<'_>> = params.iter().map(HostTensor::as_slice).collect();
    let mut opt = CpuOptimizer::builder().build(ScheduleFreeAdamW::default(), &slices).unwrap();
    let read = |params: &[HostTensor]| params.iter().map(HostTensor::to_f64).collect::<Vec<_>>();
    let step = |opt: &mut CpuOptimizer, params: &mut Vec<HostTensor>, t: u64| {
        let grads = reduced_grads(size, t);
        let grads: Vec<HostSlice<'_>> = grads.iter().map(|g| HostSlice::from(&g[..])).collect();
        let mut slices: Vec<HostSliceMut<'_>> = params.iter_mut().map(HostTensor::as_mut_slice).collect();
        opt.step(&mut slices, &grads).unwrap();
    };
    for t in 1..=STEPS {
        step(&mut opt, &mut params, t);
    }
    let trained = read(&params);
    let mut slices: Vec<HostSliceMut<'_>> = params.iter_mut().map(HostTensor::as_mut_slice).collect();
    opt.eval(&mut slices).unwrap();
    let evaluated = read(&params);
    let mut slices: Vec<HostSliceMut<'_>> = params.iter_mut().map(HostTensor::as_mut_slice).collect();
    opt.train(&mut slices).unwrap();
    step(&mut opt, &mut params, STEPS + 1);
    [trained, evaluated, read(&params)]
}

#[test]
fn eval_and_train_on_cpu_ranks_swap_as_the_unsharded_optimizer() {
    for size in 1..=4 {
        let want = unsharded(size);
        let ranks = on_ranks(size, |comm| {
            let rank = comm.rank();
            let mut params: Vec<HostTensor> = host_tensors(&initial_params(), &DTYPES);
            let slices: Vec<HostSlice<'_>> = params.iter().map(HostTensor::as_slice).collect();
            let algorithm = ScheduleFreeAdamW::default();
            let mut opt = sharded_cpu(comm, algorithm, &slices);
            let read = |params: &[HostTensor]| params.iter().map(HostTensor::to_f64).collect::<Vec<_>>();
            let step = |opt: &mut ShardedCpuOptimizer<_>, params: &mut Vec<HostTensor>, t: u64| {
                let grads: Vec<HostTensor> = host_tensors(&rank_grads(rank, t), &DTYPES);
                let grads: Vec<HostSlice<'_>> = grads.iter().map(HostTensor::as_slice).collect();
                let mut slices: Vec<HostSliceMut<'_>> =
                    params.iter_mut().map(HostTensor::as_mut_slice).collect();
                opt.step(&mut slices, &grads)
            };
            for t in 1..=STEPS {
                step(&mut opt, &mut params, t).unwrap();
            }
            let trained = read(&params);
            let mut slices: Vec<HostSliceMut<'_>> = params.iter_mut().map(HostTensor::as_mut_slice).collect();
            opt.eval(&mut slices).unwrap();
            let evaluated = read(&params);
            let refused = step(&mut opt, &mut params, STEPS + 1).is_err();
            let mut slices: Vec<HostSliceMut<'_>> = params.iter_mut().map(HostTensor::as_mut_slice).collect();
            opt.train(&mut slices).unwrap();
            step(&mut opt, &mut params, STEPS + 1).unwrap();
            ([trained, evaluated, read(&params)], refused)
        });
        for (rank, (got, refused)) in ranks.iter().enumerate() {
            assert!(refused, "{size} ranks: rank {rank} stepped in eval mode");
            for (stage, (g, w)) in
                ["trained", "after eval", "after train and a step"].iter().zip(got.iter().zip(&want))
            {
                assert!(bits(g) == bits(w), "{size} ranks: rank {rank}'s parameters {stage} differ");
            }
        }
    }
}

#[test]
fn eval_and_train_on_gpu_ranks_swap_as_the_unsharded_optimizer() {
    let _turn = gpu_turn();
    let ctx = ctx();
    let size = 3;
    let want = unsharded(size);
    let ranks = on_ranks(size, |comm| {
        let rank = comm.rank();
        let params: Vec<Tensor> =
            initial_params().iter().zip(DTYPES).map(|(v, dtype)| ctx.upload("param", v, dtype)).collect();
        let groups = vec![ParamGroup::new(ScheduleFreeAdamW::default(), &params)];
        let mut opt =
            ShardedOptimizer::build(&ctx, comm, Optimizer::builder(), GradReduction::Mean, groups).unwrap();
        let read = |params: &[Tensor]| params.iter().map(|p| ctx.read(p).unwrap()).collect::<Vec<_>>();
        let upload = |t: u64| -> Vec<Tensor> {
            rank_grads(rank, t).iter().zip(DTYPES).map(|(g, dtype)| ctx.upload("grad", g, dtype)).collect()
        };
        for t in 1..=STEPS {
            opt.step(&upload(t)).unwrap();
        }
        let trained = read(&params);
        opt.eval().unwrap();
        let evaluated = read(&params);
        opt.train().unwrap();
        opt.step(&upload(STEPS + 1)).unwrap();
        [trained, evaluated, read(&params)]
    });
    for (rank, got) in ranks.iter().enumerate() {
        for (stage, (g, w)) in
            ["trained", "after eval", "after train and a step"].iter().zip(got.iter().zip(&want))
        {
            assert!(
                bits(g) == bits(w),
                "GPU ranks: rank {rank}'s parameters {stage} differ from the CPU's unsharded"
            );
        }
    }
}
