//! The families whose step looks at whole tensors: Muon's Newton-Schulz, sharded as
//! Megatron's layer-wise optimizer does it (each tensor whole on one owner rank, longest
//! first to the least loaded), and LAMB's norms and Adafactor's row and column sums, whose
//! tensors lie in the flat layout with each tensor's sums combined across the ranks' pieces
//! of it; the other groups' tensors (an AdamW group here) in the flat layout.

use super::*;
use crate::common::{assert_close, ctx, gpu_turn, Tolerance};
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut};
use wgpu_optim::shard::{GradReduction, ShardedCpuOptimizer, ShardedOptimizer};
use wgpu_optim::{Adafactor, Adam, Lamb, Muon, Optimizer, ParamGroup, Tensor};

/// Matrices of several shapes (the largest first in no order), then two vectors.
const SHAPES: [[usize; 2]; 5] = [[32, 64], [64, 32], [16, 48], [100, 20], [8, 8]];
const VECTORS: [usize; 2] = [37, 300];

fn values(seed: u64) -> Vec<Vec<f32>> {
    let mut rng = Rng::new(seed);
    let lens = SHAPES.iter().map(|s| s[0] * s[1]).chain(VECTORS);
    lens.map(|n| rng.vec(n, 1.0).iter().map(|&v| v as f32).collect()).collect()
}

fn grads(rank: usize, t: u64) -> Vec<Vec<f32>> {
    values(900 + 13 * t + rank as u64)
}

fn reduced(size: usize, t: u64) -> Vec<Vec<f32>> {
    let per_rank: Vec<_> = (0..size).map(|r| grads(r, t)).collect();
    (0..per_rank[0].len())
        .map(|i| {
            (0..per_rank[0][i].len())
                .map(|e| (1..size).fold(per_rank[0][i][e], |acc, r| acc + per_rank[r][i][e]) / size as f32)
                .collect()
        })
        .collect()
}

fn shapes() -> Vec<Vec<usize>> {
    SHAPES.iter().map(|s| s.to_vec()).chain(VECTORS.iter().map(|&n| vec![n])).collect()
}

/// Whether the family's tensors step whole on owner ranks (Muon), or lie in the flat layout
/// with each tensor's sums combined across ranks (LAMB, Adafactor).
fn stepped_whole(family: Algorithm) -> bool {
    matches!(family, Algorithm::Muon(_))
}

/// The families whose step looks at whole tensors, each as the matrices' group.
fn whole_families() -> [Algorithm; 3] {
    [Muon { lr: 0.02, ..Muon::default() }.into(), Lamb::default().into(), Adafactor::default().into()]
}

fn groups(family: Algorithm, params: &[Tensor]) -> Vec<ParamGroup> {
    vec![
        ParamGroup::new(family, &params[..SHAPES.len()]),
        ParamGroup::new(Adam::adamw(), &params[SHAPES.len()..]),
    ]
}

#[test]
fn whole_and_summed_tensors_on_gpu_ranks_are_the_unsharded_step() {
    let _turn = gpu_turn();
    let ctx = ctx();
    for (family, size) in whole_families().into_iter().flat_map(|f| (1..=4).map(move |n| (f, n))) {
        let want: Vec<Vec<u8>> = {
            let params: Vec<Tensor> = values(1).iter().map(|p| ctx.upload_f32("param", p)).collect();
            let builder = Optimizer::builder().param_shapes(shapes());
            let mut opt = builder.build_groups(&ctx, groups(family, &params)).unwrap();
            for t in 1..=STEPS {
                let grads: Vec<Tensor> = reduced(size, t).iter().map(|g| ctx.upload_f32("grad", g)).collect();
                opt.step(&grads).unwrap();
            }
            params.iter().map(|p| ctx.read_bytes(p).unwrap()).collect()
        };
        let ranks = on_ranks(size, |comm| {
            let rank = comm.rank();
            let params: Vec<Tensor> = values(1).iter().map(|p| ctx.upload_f32("param", p)).collect();
            let builder = Optimizer::builder().param_shapes(shapes());
            let mut opt =
                ShardedOptimizer::build(&ctx, comm, builder, GradReduction::Mean, groups(family, &params))
                    .unwrap();
            for t in 1..=STEPS {
                let grads: Vec<Tensor> = grads(rank, t).iter().map(|g| ctx.upload_f32("grad", g)).collect();
                opt.step(&grads).unwrap();
            }
            let owned: Vec<usize> = opt
                .shard_pieces()
                .into_iter()
                .filter(|(tensor, elements)| *tensor < SHAPES.len() && elements.end - elements.start > 0)
                .map(|(tensor, elements)| {
                    let len = (SHAPES[tensor][0] * SHAPES[tensor][1]) as u64;
                    if stepped_whole(family) {
                        assert_eq!(
                            elements,
                            0..len,
                            "rank {rank} holds a piece of matrix {tensor}, not all of it"
                        );
                    }
                    tensor
                })
                .collect();
            (params.iter().map(|p| ctx.read_bytes(p).unwrap()).collect::<Vec<_>>(), owned)
        });
        let mut owners: Vec<usize> = ranks.iter().flat_map(|(_, owned)| owned.clone()).collect();
        owners.sort_unstable();
        if !stepped_whole(family) {
            // LAMB's and Adafactor's matrices lie in the flat layout, cut among the ranks.
            owners.dedup();
        }
        assert_eq!(
            owners,
            (0..SHAPES.len()).collect::<Vec<_>>(),
            "{family:?} on {size} ranks: one owner each"
        );
        for (rank, (got, _)) in ranks.iter().enumerate() {
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let what = format!("{family:?} on {size} ranks: rank {rank}'s params[{i}]");
                match family {
                    // Newton-Schulz of the same matrix on the same device: the same bits.
                    Algorithm::Muon(_) => assert!(g == w, "{what} differ from the unsharded step"),
                    // LAMB's sums run over the gradients' buffers in workgroup partials, and
                    // the sharded step's gradients lie in one buffer (the unsharded test's in
                    // one each), so the sums' order differs; Adafactor's sharded sums are
                    // f64 over the pieces: within the vectors' f32 tolerance.
                    _ => assert_close(&what, &decode_f32(g), &decode_f32(w), Tolerance::F32),
                }
            }
        }
    }
}

/// Muon and LAMB bit for bit; Adafactor, whose sharded sums are f64 over the pieces, within
/// the vectors' f32 tolerance.
#[test]
fn tensors_stepped_whole_or_summed_on_cpu_ranks_are_the_unsharded_step() {
    for muon in whole_families() {
        let matrices = || values(1)[..SHAPES.len()].to_vec();
        let matrix_shapes = || shapes()[..SHAPES.len()].to_vec();
        for size in [2, 3] {
            let mut want = matrices();
            {
                let slices: Vec<HostSlice<'_>> = want.iter().map(|p| HostSlice::from(&p[..])).collect();
                let mut opt =
                    CpuOptimizer::builder().param_shapes(matrix_shapes()).build(muon, &slices).unwrap();
                for t in 1..=STEPS {
                    let grads = reduced(size, t);
                    let grads: Vec<HostSlice<'_>> =
                        grads[..SHAPES.len()].iter().map(|g| HostSlice::from(&g[..])).collect();
                    let mut slices: Vec<HostSliceMut<'_>> =
                        want.iter_mut().map(|p| HostSliceMut::from(&mut p[..])).collect();
                    opt.step(&mut slices, &grads).unwrap();
                }
            }
            let ranks = on_ranks(size, |comm| {
                let rank = comm.rank();
                let mut params = matrices();
                let slices: Vec<HostSlice<'_>> = params.iter().map(|p| HostSlice::from(&p[..])).collect();
                let builder = CpuOptimizer::builder().param_shapes(matrix_shapes());
                let mut opt =
                    ShardedCpuOptimizer::build(comm, builder, GradReduction::Mean, muon, &slices).unwrap();
                for t in 1..=STEPS {
                    let grads = grads(rank, t);
                    let grads: Vec<HostSlice<'_>> =
                        grads[..SHAPES.len()].iter().map(|g| HostSlice::from(&g[..])).collect();
                    let mut slices: Vec<HostSliceMut<'_>> =
                        params.iter_mut().map(|p| HostSliceMut::from(&mut p[..])).collect();
                    opt.step(&mut slices, &grads).unwrap();
                }
                params
            });
            for (rank, got) in ranks.iter().enumerate() {
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    if let Algorithm::Adafactor(_) = muon {
                        let (g, w) = (widen(g), widen(w));
                        let what = format!("{muon:?} on {size} CPU ranks: rank {rank}'s matrix {i}");
                        assert_close(&what, &g, &w, Tolerance::F32);
                        continue;
                    }
                    let same = g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits());
                    let what = format!("{muon:?} on {size} CPU ranks: rank {rank}'s matrix {i}");
                    assert!(same, "{what} differs from the unsharded step");
                }
            }
        }
    }
}

fn widen(values: &[f32]) -> Vec<f64> {
    values.iter().map(|&v| f64::from(v)).collect()
}

fn decode_f32(bytes: &[u8]) -> Vec<f64> {
    bytes.chunks_exact(4).map(|b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))).collect()
}
