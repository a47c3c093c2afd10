//! Adafactor in the flat layout: shards cut its matrices in the middle of rows (and of
//! batched matrices), each rank holds the whole factors of the matrices it has a piece of,
//! and each matrix's row and column sums, its sum of `p^2` and its update's sum of squares
//! are added across the ranks. Against the unsharded optimizer within the f32 tolerance of
//! the vectors (the sharded sums are f64 over pieces, the unsharded ones f32 by blocks), and
//! every rank's parameters the same bits.

use super::*;
use crate::common::{assert_close, ctx, gpu_turn, Tolerance};
use std::path::Path;
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut, HostTensor};
use wgpu_optim::shard::{GradReduction, ShardedCpuOptimizer, ShardedOptimizer};
use wgpu_optim::{Adafactor, Error, GradClip, Optimizer, ParamGroup, Tensor};

/// A batch of matrices, a matrix of odd sizes, a vector, a one-column matrix, a one-row
/// matrix, a longer vector.
const SHAPES: [&[usize]; 6] = [&[3, 10, 7], &[33, 17], &[40], &[5, 1], &[1, 64], &[129]];
const TYPES: [DType; 6] = [DType::F32, DType::BF16, DType::F32, DType::F16, DType::F32, DType::F32];

fn shapes() -> Vec<Vec<usize>> {
    SHAPES.iter().map(|s| s.to_vec()).collect()
}

fn lens() -> Vec<usize> {
    SHAPES.iter().map(|s| s.iter().product()).collect()
}

fn start() -> Vec<Vec<f64>> {
    let mut rng = Rng::new(31);
    lens().iter().zip(TYPES).map(|(&n, dtype)| rounded(&rng.vec(n, 1.0), dtype)).collect()
}

/// Rank `rank`'s gradients at step `t` (f32). The 33x17 matrix's third row is zero on every
/// rank, so that its `row_var` stays 0 and the `eps1^2` floor binds there.
fn grads(rank: usize, t: u64) -> Vec<Vec<f32>> {
    let mut rng = Rng::new(500 + 11 * t + rank as u64);
    let mut grads: Vec<Vec<f32>> =
        lens().iter().map(|&n| rng.vec(n, 0.5).iter().map(|&g| g as f32).collect()).collect();
    grads[1][2 * 17..3 * 17].fill(0.0);
    grads
}

/// The gradients the sharded step reduces to: the f32 sum in rank order, over the ranks.
fn reduced(size: usize, t: u64) -> Vec<Vec<f32>> {
    let per_rank: Vec<_> = (0..size).map(|r| grads(r, t)).collect();
    let sum = |i: usize, e: usize| (1..size).fold(per_rank[0][i][e], |acc, r| acc + per_rank[r][i][e]);
    lens().iter().enumerate().map(|(i, &n)| (0..n).map(|e| sum(i, e) / size as f32).collect()).collect()
}

fn configs() -> [Adafactor; 2] {
    [
        Adafactor { weight_decay: 0.1, ..Adafactor::default() },
        Adafactor {
            lr: 0.05,
            eps1: Some(1e-3),
            beta2_decay: -0.6,
            d: 1.5,
            maximize: true,
            ..Adafactor::default()
        },
    ]
}

fn host(values: &[Vec<f64>]) -> Vec<HostTensor> {
    host_tensors(values, &TYPES)
}

/// The unsharded CPU optimizer over steps `steps` of `size` ranks' reduced gradients.
fn unsharded(config: Adafactor, size: usize, steps: std::ops::RangeInclusive<u64>) -> Vec<Vec<f64>> {
    let mut params = host(&start());
    let slices: Vec<HostSlice<'_>> = params.iter().map(HostTensor::as_slice).collect();
    let mut opt = CpuOptimizer::builder().param_shapes(shapes()).build(config, &slices).unwrap();
    for t in steps {
        let grads = reduced(size, t);
        let grads: Vec<HostSlice<'_>> = grads.iter().map(|g| HostSlice::from(&g[..])).collect();
        let mut slices: Vec<HostSliceMut<'_>> = params.iter_mut().map(HostTensor::as_mut_slice).collect();
        opt.step(&mut slices, &grads).unwrap();
    }
    params.iter().map(HostTensor::to_f64).collect()
}

/// What a CPU rank reports after its steps.
struct Rank {
    params: Vec<Vec<f64>>,
    pieces: Vec<(usize, std::ops::Range<u64>)>,
    state_bytes: u64,
}

/// `size` sharded CPU ranks from `from`, loading `load` first if given, stepping `steps`,
/// saving into `save` if given.
fn cpu_ranks(
    config: Adafactor,
    size: usize,
    from: &[Vec<f64>],
    load: Option<&Path>,
    steps: std::ops::RangeInclusive<u64>,
    save: Option<&Path>,
) -> Vec<Rank> {
    on_ranks(size, |comm| {
        let rank = comm.rank();
        let mut params = host(from);
        let slices: Vec<HostSlice<'_>> = params.iter().map(HostTensor::as_slice).collect();
        let builder = CpuOptimizer::builder().param_shapes(shapes());
        let mut opt =
            ShardedCpuOptimizer::build(comm, builder, GradReduction::Mean, config, &slices).unwrap();
        if let Some(dir) = load {
            opt.load(dir).unwrap();
        }
        for t in steps.clone() {
            let grads = grads(rank, t);
            let grads: Vec<HostSlice<'_>> = grads.iter().map(|g| HostSlice::from(&g[..])).collect();
            let mut slices: Vec<HostSliceMut<'_>> = params.iter_mut().map(HostTensor::as_mut_slice).collect();
            opt.step(&mut slices, &grads).unwrap();
        }
        if let Some(dir) = save {
            opt.save(dir).unwrap();
        }
        Rank {
            params: params.iter().map(HostTensor::to_f64).collect(),
            pieces: opt.shard_pieces(),
            state_bytes: opt.state_bytes(),
        }
    })
}

/// Every rank's parameters the same bits, and rank 0's within each dtype's tolerance of
/// `want`.
fn check(what: &str, ranks: &[Vec<Vec<f64>>], want: &[Vec<f64>]) {
    for (rank, got) in ranks.iter().enumerate() {
        let same =
            got.iter().zip(&ranks[0]).all(|(a, b)| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()));
        assert!(same, "{what}: rank {rank}'s parameters differ from rank 0's");
    }
    for (i, (g, w)) in ranks[0].iter().zip(want).enumerate() {
        assert_close(&format!("{what}: params[{i}]"), g, w, Tolerance::stored(TYPES[i]));
    }
}

#[test]
fn pieces_that_cut_rows_step_as_the_unsharded_optimizer_on_cpu_ranks() {
    for config in configs() {
        for size in 1..=4 {
            let want = unsharded(config, size, 1..=STEPS + 2);
            let ranks = cpu_ranks(config, size, &start(), None, 1..=STEPS + 2, None);
            let what = format!("{config:?} on {size} CPU ranks");
            check(&what, &ranks.iter().map(|r| r.params.clone()).collect::<Vec<_>>(), &want);
            // Each rank keeps the whole factors of the matrices it holds a piece of and its
            // pieces' elements of the vectors' variance: counted from its states.
            for (rank, r) in ranks.iter().enumerate() {
                let expected: u64 = r
                    .pieces
                    .iter()
                    .filter(|(_, e)| e.end > e.start)
                    .map(|(i, e)| match SHAPES[*i] {
                        [.., rows, cols] if SHAPES[*i].len() >= 2 => {
                            let batches: usize = SHAPES[*i][..SHAPES[*i].len() - 2].iter().product();
                            4 * (batches * (rows + cols)) as u64
                        }
                        _ => 4 * (e.end - e.start),
                    })
                    .sum();
                assert_eq!(r.state_bytes, expected, "{what}: rank {rank}'s state bytes");
            }
            // The vectors' variance is split: the ranks' elements add up to the vectors'.
            let vector_elements: u64 = ranks
                .iter()
                .flat_map(|r| {
                    r.pieces.iter().filter(|(i, _)| SHAPES[*i].len() == 1).map(|(_, e)| e.end - e.start)
                })
                .sum();
            assert_eq!(vector_elements, 40 + 129, "{what}: the vectors' elements over the ranks");
            if size == 3 {
                let cut = ranks.iter().flat_map(|r| &r.pieces).any(|(i, e)| {
                    let cols = *SHAPES[*i].last().unwrap() as u64;
                    SHAPES[*i].len() >= 2 && cols > 1 && (e.start % cols != 0 || e.end % cols != 0)
                });
                assert!(cut, "{what}: no shard cuts a matrix in the middle of a row");
            }
        }
    }
}

#[test]
fn a_checkpoint_of_pieces_continues_on_other_ranks_as_the_unsharded_run() {
    let config = configs()[0];
    for (before, after) in [(3, 2), (1, 3), (4, 1)] {
        let dir = Scratch::new();
        let saved = cpu_ranks(config, before, &start(), None, 1..=3, Some(dir.path())).remove(0).params;
        let ranks = cpu_ranks(config, after, &saved, Some(dir.path()), 4..=5, None);
        // The unsharded run on the same reduced gradients: `before` ranks', then `after`'s.
        let mut params = host(&start());
        let slices: Vec<HostSlice<'_>> = params.iter().map(HostTensor::as_slice).collect();
        let mut opt = CpuOptimizer::builder().param_shapes(shapes()).build(config, &slices).unwrap();
        for t in 1..=5 {
            let grads = reduced(if t <= 3 { before } else { after }, t);
            let grads: Vec<HostSlice<'_>> = grads.iter().map(|g| HostSlice::from(&g[..])).collect();
            let mut slices: Vec<HostSliceMut<'_>> = params.iter_mut().map(HostTensor::as_mut_slice).collect();
            opt.step(&mut slices, &grads).unwrap();
        }
        let want: Vec<Vec<f64>> = params.iter().map(HostTensor::to_f64).collect();
        let what = format!("Adafactor saved on {before} ranks, loaded on {after}");
        check(&what, &ranks.into_iter().map(|r| r.params).collect::<Vec<_>>(), &want);
    }
}

#[test]
fn gpu_ranks_step_adafactor_pieces_as_cpu_ranks_do() {
    let _turn = gpu_turn();
    let ctx = ctx();
    let [first, second] = configs();
    for size in [1, 2, 3] {
        // Two groups (the first three tensors, the rest), the second's learning rate changed
        // after two steps.
        let gpu: Vec<Vec<Vec<f64>>> = on_ranks(size, |comm| {
            let rank = comm.rank();
            let params: Vec<Tensor> =
                start().iter().zip(TYPES).map(|(v, dtype)| ctx.upload("param", v, dtype)).collect();
            let groups = vec![ParamGroup::new(first, &params[..3]), ParamGroup::new(second, &params[3..])];
            let builder = Optimizer::builder().param_shapes(shapes());
            let mut opt = ShardedOptimizer::build(&ctx, comm, builder, GradReduction::Mean, groups).unwrap();
            for t in 1..=4 {
                if t == 3 {
                    opt.set_group_lr(1, 0.02).unwrap();
                }
                let grads: Vec<Tensor> = grads(rank, t).iter().map(|g| ctx.upload_f32("grad", g)).collect();
                opt.step(&grads).unwrap();
            }
            params.iter().map(|p| ctx.read(p).unwrap()).collect()
        });
        // The unsharded GPU optimizer over the reduced gradients.
        let want: Vec<Vec<f64>> = {
            let params: Vec<Tensor> =
                start().iter().zip(TYPES).map(|(v, dtype)| ctx.upload("param", v, dtype)).collect();
            let groups = vec![ParamGroup::new(first, &params[..3]), ParamGroup::new(second, &params[3..])];
            let mut opt = Optimizer::builder().param_shapes(shapes()).build_groups(&ctx, groups).unwrap();
            for t in 1..=4 {
                if t == 3 {
                    opt.set_group_lr(1, 0.02).unwrap();
                }
                let grads: Vec<Tensor> = reduced(size, t).iter().map(|g| ctx.upload_f32("grad", g)).collect();
                opt.step(&grads).unwrap();
            }
            params.iter().map(|p| ctx.read(p).unwrap()).collect()
        };
        check(&format!("two Adafactor groups on {size} GPU ranks"), &gpu, &want);
    }
    // One group: the GPU ranks' pieces take the CPU ranks' steps, the same bits.
    let config = configs()[1];
    let gpu: Vec<Vec<f64>> = on_ranks(3, |comm| {
        let rank = comm.rank();
        let params: Vec<Tensor> =
            start().iter().zip(TYPES).map(|(v, dtype)| ctx.upload("param", v, dtype)).collect();
        let groups = vec![ParamGroup::new(config, &params)];
        let builder = Optimizer::builder().param_shapes(shapes());
        let mut opt = ShardedOptimizer::build(&ctx, comm, builder, GradReduction::Mean, groups).unwrap();
        for t in 1..=3 {
            let grads: Vec<Tensor> = grads(rank, t).iter().map(|g| ctx.upload_f32("grad", g)).collect();
            opt.step(&grads).unwrap();
        }
        params.iter().map(|p| ctx.read(p).unwrap()).collect()
    })
    .remove(0);
    let cpu = cpu_ranks(config, 3, &start(), None, 1..=3, None).remove(0).params;
    for (i, (g, c)) in gpu.iter().zip(&cpu).enumerate() {
        let same = g.iter().zip(c).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "Adafactor on 3 GPU ranks and on 3 CPU ranks: params[{i}] differ");
    }
}

#[test]
fn adafactor_is_refused_on_every_rank_without_shapes_or_with_what_its_passes_do_not_run() {
    let values = host(&start());
    let slices: Vec<HostSlice<'_>> = values.iter().map(HostTensor::as_slice).collect();
    let slices = &slices;
    let build = |builder: wgpu_optim::cpu::CpuOptimizerBuilder| {
        on_ranks(2, |comm| {
            ShardedCpuOptimizer::build(comm, builder.clone(), GradReduction::Mean, configs()[0], slices).err()
        })
    };
    for error in build(CpuOptimizer::builder()) {
        assert!(
            matches!(error, Some(Error::NeedsOption { option: "param_shapes", .. })),
            "without shapes: {error:?}"
        );
    }
    let clipped = CpuOptimizer::builder().param_shapes(shapes()).grad_clip(GradClip::l2(1.0));
    for error in build(clipped) {
        assert!(
            matches!(error, Some(Error::ConflictingOptions { first: "grad_clip", .. })),
            "with clipping: {error:?}"
        );
    }
    let mut wrong = shapes();
    wrong[1] = vec![17, 34];
    for error in build(CpuOptimizer::builder().param_shapes(wrong)) {
        assert!(matches!(error, Some(Error::LengthMismatch { .. })), "with a wrong shape: {error:?}");
    }
    // A refused learning rate changes nothing: the next steps are the unsharded ones.
    let ranks = on_ranks(2, |comm| {
        let rank = comm.rank();
        let mut params = host(&start());
        let slices: Vec<HostSlice<'_>> = params.iter().map(HostTensor::as_slice).collect();
        let builder = CpuOptimizer::builder().param_shapes(shapes());
        let mut opt =
            ShardedCpuOptimizer::build(comm, builder, GradReduction::Mean, configs()[0], &slices).unwrap();
        assert!(opt.set_lr(-1.0).is_err(), "a negative learning rate is refused");
        for t in 1..=2 {
            let grads = grads(rank, t);
            let grads: Vec<HostSlice<'_>> = grads.iter().map(|g| HostSlice::from(&g[..])).collect();
            let mut slices: Vec<HostSliceMut<'_>> = params.iter_mut().map(HostTensor::as_mut_slice).collect();
            opt.step(&mut slices, &grads).unwrap();
        }
        params.iter().map(HostTensor::to_f64).collect::<Vec<_>>()
    });
    check("after a refused learning rate", &ranks, &unsharded(configs()[0], 2, 1..=2));
}
