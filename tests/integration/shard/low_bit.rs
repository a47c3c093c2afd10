//! 8-bit and 4-bit state sharded: blocks start at shard boundaries, and whether a tensor's
//! state is low-bit follows the whole tensor's size on every rank, never its piece's
//! (bitsandbytes#2080 and torchao#4912 are the bugs where sharding flipped it).

use super::*;
use crate::common::{ctx, gpu_turn};
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut};
use wgpu_optim::q4::Q4States;
use wgpu_optim::q8::Q8States;
use wgpu_optim::shard::{GradReduction, ShardedCpuOptimizer, ShardedOptimizer};
use wgpu_optim::{Adam, Lion, Optimizer, ParamGroup, StateStorage, Tensor};

/// Tensors above, at and below the default thresholds (4096 elements for both formats):
/// on 3 and 4 ranks the pieces of the first two are below them.
const LOW_BIT_LENS: [usize; 4] = [9000, 4096, 3000, 300];

fn storages() -> [StateStorage; 2] {
    [StateStorage::Q8(Q8States::default()), StateStorage::Q4(Q4States::default())]
}

fn start() -> Vec<Vec<f32>> {
    let mut rng = Rng::new(3);
    LOW_BIT_LENS.iter().map(|&n| rng.vec(n, 1.0).iter().map(|&v| v as f32).collect()).collect()
}

fn grads(rank: usize, t: u64) -> Vec<Vec<f32>> {
    let mut rng = Rng::new(500 + 31 * t + rank as u64);
    LOW_BIT_LENS.iter().map(|&n| rng.vec(n, 0.5).iter().map(|&v| v as f32).collect()).collect()
}

fn reduced(size: usize, t: u64) -> Vec<Vec<f32>> {
    let per_rank: Vec<_> = (0..size).map(|r| grads(r, t)).collect();
    (0..LOW_BIT_LENS.len())
        .map(|i| {
            (0..LOW_BIT_LENS[i])
                .map(|e| (1..size).fold(per_rank[0][i][e], |acc, r| acc + per_rank[r][i][e]) / size as f32)
                .collect()
        })
        .collect()
}

/// The unsharded CPU optimizer's parameters and state bytes after `STEPS` steps.
fn unsharded(storage: StateStorage, algorithm: Algorithm, size: usize) -> (Vec<Vec<f32>>, u64) {
    let mut params = start();
    let slices: Vec<HostSlice<'_>> = params.iter().map(|p| HostSlice::from(&p[..])).collect();
    let mut opt = CpuOptimizer::builder().state_storage(storage).build(algorithm, &slices).unwrap();
    for t in 1..=STEPS {
        let grads = reduced(size, t);
        let grads: Vec<HostSlice<'_>> = grads.iter().map(|g| HostSlice::from(&g[..])).collect();
        let mut slices: Vec<HostSliceMut<'_>> =
            params.iter_mut().map(|p| HostSliceMut::from(&mut p[..])).collect();
        opt.step(&mut slices, &grads).unwrap();
    }
    let bytes = (0..LOW_BIT_LENS.len())
        .flat_map(|i| wgpu_optim::StateKind::ALL.iter().map(move |k| (i, *k)))
        .map(|(i, k)| match opt.state(i, k) {
            Some(wgpu_optim::cpu::StateView::Q8(wgpu_optim::q8::StoredState::Q8 { codes, absmax })) => {
                (codes.len() + 4 * absmax.len()) as u64
            }
            Some(wgpu_optim::cpu::StateView::Q4(wgpu_optim::q4::Q4State::Q4 { codes, scale })) => {
                (codes.len() + 4 * scale.len()) as u64
            }
            Some(wgpu_optim::cpu::StateView::Q8(wgpu_optim::q8::StoredState::F32(v))) => 4 * v.len() as u64,
            Some(wgpu_optim::cpu::StateView::Q4(wgpu_optim::q4::Q4State::F32(v))) => 4 * v.len() as u64,
            _ => 0,
        })
        .sum();
    (params, bytes)
}

#[test]
fn low_bit_state_on_the_cpu_is_the_unsharded_step_bit_for_bit_with_the_whole_tensors_storage() {
    let algorithms: [Algorithm; 2] = [Adam::adamw().into(), Lion::default().into()];
    for storage in storages() {
        for algorithm in algorithms {
            if matches!(storage, StateStorage::Q4(_)) && matches!(algorithm, Algorithm::Lion(_)) {
                continue; // torchao's 4-bit optimizers are Adam's.
            }
            for size in 1..=4 {
                let (want, want_bytes) = unsharded(storage, algorithm, size);
                let ranks = on_ranks(size, |comm| {
                    let rank = comm.rank();
                    let mut params = start();
                    let slices: Vec<HostSlice<'_>> = params.iter().map(|p| HostSlice::from(&p[..])).collect();
                    let builder = CpuOptimizer::builder().state_storage(storage);
                    let mut opt =
                        ShardedCpuOptimizer::build(comm, builder, GradReduction::Mean, algorithm, &slices)
                            .unwrap();
                    for t in 1..=STEPS {
                        let grads = grads(rank, t);
                        let grads: Vec<HostSlice<'_>> =
                            grads.iter().map(|g| HostSlice::from(&g[..])).collect();
                        let mut slices: Vec<HostSliceMut<'_>> =
                            params.iter_mut().map(|p| HostSliceMut::from(&mut p[..])).collect();
                        opt.step(&mut slices, &grads).unwrap();
                    }
                    (params, opt.state_bytes())
                });
                // A piece given f32 state where its tensor has low-bit state (or the
                // reverse) would hold 4 bytes per element where the unsharded holds 1 or
                // half of one, or a block's scale more or less: the sum tells.
                let bytes: u64 = ranks.iter().map(|(_, b)| b).sum();
                assert_eq!(bytes, want_bytes, "{storage:?} {algorithm:?} on {size} ranks: state bytes");
                for (rank, (got, _)) in ranks.iter().enumerate() {
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        let same = g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same,
                            "{storage:?} {algorithm:?} on {size} ranks: rank {rank}'s params[{i}] differ"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn low_bit_state_on_the_gpu_is_the_unsharded_step_bit_for_bit() {
    let _turn = gpu_turn();
    let ctx = ctx();
    let algorithm: Algorithm = Adam::adamw().into();
    for storage in storages() {
        let want: Vec<Vec<u8>> = {
            let params: Vec<Tensor> = start().iter().map(|p| ctx.upload_f32("param", p)).collect();
            let builder = Optimizer::builder().state_storage(storage);
            let mut opt = builder.build(&ctx, algorithm, &params).unwrap();
            for t in 1..=STEPS {
                let grads: Vec<Tensor> = reduced(3, t).iter().map(|g| ctx.upload_f32("grad", g)).collect();
                opt.step(&grads).unwrap();
            }
            params.iter().map(|p| ctx.read_bytes(p).unwrap()).collect()
        };
        let ranks = on_ranks(3, |comm| {
            let rank = comm.rank();
            let params: Vec<Tensor> = start().iter().map(|p| ctx.upload_f32("param", p)).collect();
            let groups = vec![ParamGroup::new(algorithm, &params)];
            let builder = Optimizer::builder().state_storage(storage);
            let mut opt = ShardedOptimizer::build(&ctx, comm, builder, GradReduction::Mean, groups).unwrap();
            for t in 1..=STEPS {
                let grads: Vec<Tensor> = grads(rank, t).iter().map(|g| ctx.upload_f32("grad", g)).collect();
                opt.step(&grads).unwrap();
            }
            params.iter().map(|p| ctx.read_bytes(p).unwrap()).collect::<Vec<_>>()
        });
        for (rank, got) in ranks.iter().enumerate() {
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(g == w, "{storage:?} on 3 GPU ranks: rank {rank}'s params[{i}] differ");
            }
        }
    }
}

/// `size` CPU ranks from `start_params`, loading `load` first if given, stepping `steps`
/// and saving into `save` if given; rank 0's parameters after.
#[cfg(feature = "checkpoint")]
fn cpu_run(
    storage: StateStorage,
    size: usize,
    start_params: &[Vec<f32>],
    load: Option<&std::path::Path>,
    steps: std::ops::RangeInclusive<u64>,
    save: Option<&std::path::Path>,
) -> Vec<Vec<f32>> {
    on_ranks(size, |comm| {
        let rank = comm.rank();
        let mut params = start_params.to_vec();
        let slices: Vec<HostSlice<'_>> = params.iter().map(|p| HostSlice::from(&p[..])).collect();
        let builder = CpuOptimizer::builder().state_storage(storage);
        let mut opt =
            ShardedCpuOptimizer::build(comm, builder, GradReduction::Mean, Adam::adamw(), &slices).unwrap();
        if let Some(dir) = load {
            opt.load(dir).unwrap();
        }
        for t in steps.clone() {
            let grads = grads(rank, t);
            let grads: Vec<HostSlice<'_>> = grads.iter().map(|g| HostSlice::from(&g[..])).collect();
            let mut slices: Vec<HostSliceMut<'_>> =
                params.iter_mut().map(|p| HostSliceMut::from(&mut p[..])).collect();
            opt.step(&mut slices, &grads).unwrap();
        }
        if let Some(dir) = save {
            opt.save(dir).unwrap();
        }
        params
    })
    .remove(0)
}

#[cfg(feature = "checkpoint")]
#[test]
fn low_bit_checkpoints_saved_on_some_ranks_continue_on_others_as_the_unsharded_run() {
    for storage in storages() {
        for (before, after) in [(3, 2), (3, 1), (1, 4), (4, 3)] {
            let dir = std::env::temp_dir()
                .join(format!("wgpu-optim-shard-low-bit-{}-{before}-{after}", std::process::id()));
            std::fs::remove_dir_all(&dir).ok();
            let saved = cpu_run(storage, before, &start(), None, 1..=2, Some(&dir));
            let got = cpu_run(storage, after, &saved, Some(&dir), 3..=4, None);
            std::fs::remove_dir_all(&dir).ok();
            // The unsharded run on the same reduced gradients.
            let mut want = start();
            let slices: Vec<HostSlice<'_>> = want.iter().map(|p| HostSlice::from(&p[..])).collect();
            let mut opt =
                CpuOptimizer::builder().state_storage(storage).build(Adam::adamw(), &slices).unwrap();
            for t in 1..=4 {
                let grads = reduced(if t <= 2 { before } else { after }, t);
                let grads: Vec<HostSlice<'_>> = grads.iter().map(|g| HostSlice::from(&g[..])).collect();
                let mut slices: Vec<HostSliceMut<'_>> =
                    want.iter_mut().map(|p| HostSliceMut::from(&mut p[..])).collect();
                opt.step(&mut slices, &grads).unwrap();
            }
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let same = g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{storage:?}, saved on {before} ranks, continued on {after}: params[{i}] differ"
                );
            }
        }
    }
}

#[cfg(feature = "checkpoint")]
#[test]
fn a_low_bit_gpu_checkpoint_continues_on_cpu_ranks() {
    let _turn = gpu_turn();
    let ctx = ctx();
    for storage in storages() {
        let dir = std::env::temp_dir().join(format!("wgpu-optim-shard-low-bit-gpu-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        let saved: Vec<Vec<f32>> = on_ranks(3, |comm| {
            let rank = comm.rank();
            let params: Vec<Tensor> = start().iter().map(|p| ctx.upload_f32("param", p)).collect();
            let groups = vec![ParamGroup::new(Adam::adamw(), &params)];
            let builder = Optimizer::builder().state_storage(storage);
            let mut opt = ShardedOptimizer::build(&ctx, comm, builder, GradReduction::Mean, groups).unwrap();
            for t in 1..=2 {
                let grads: Vec<Tensor> = grads(rank, t).iter().map(|g| ctx.upload_f32("grad", g)).collect();
                opt.step(&grads).unwrap();
            }
            opt.save(&dir).unwrap();
            params.iter().map(|p| ctx.read_f32(p).unwrap()).collect::<Vec<_>>()
        })
        .remove(0);
        let on_cpu = cpu_run(storage, 2, &saved, Some(&dir), 3..=4, None);
        let from_cpu_save = {
            let dir2 = dir.with_extension("cpu");
            std::fs::remove_dir_all(&dir2).ok();
            let saved_cpu = cpu_run(storage, 3, &start(), None, 1..=2, Some(&dir2));
            let got = cpu_run(storage, 2, &saved_cpu, Some(&dir2), 3..=4, None);
            std::fs::remove_dir_all(&dir2).ok();
            got
        };
        std::fs::remove_dir_all(&dir).ok();
        // The GPU's 8-bit and 4-bit steps are the CPU backend's, bit for bit, so the two
        // saves continue alike.
        for (i, (g, w)) in on_cpu.iter().zip(&from_cpu_save).enumerate() {
            let same = g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{storage:?}: a GPU save continued on the CPU differs from a CPU save at params[{i}]"
            );
        }
    }
}
