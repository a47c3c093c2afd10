//! The sharded optimizer on the GPU: every rank a thread with parameters of its own on the
//! shared device.

use super::*;
use crate::common::{assert_close, ctx, gpu_turn, Tolerance};
use wgpu_optim::shard::{GradReduction, ShardedOptimizer};
use wgpu_optim::{Adam, GpuContext, GradClip, NormType, Optimizer, OptimizerBuilder, ParamGroup, Tensor};

fn upload_params(ctx: &GpuContext, dtypes: &[DType; 5]) -> Vec<Tensor> {
    initial_params().iter().zip(*dtypes).map(|(v, dtype)| ctx.upload("param", v, dtype)).collect()
}

fn upload_grads(ctx: &GpuContext, grads: &[Vec<f64>]) -> Vec<Tensor> {
    grads.iter().zip(DTYPES).map(|(g, dtype)| ctx.upload("grad", g, dtype)).collect()
}

/// Every rank's parameters (bytes) and last norm after `STEPS` sharded steps, with the
/// first two tensors in one group and the rest in another at half the learning rate.
fn sharded_run(
    size: usize,
    builder: &OptimizerBuilder,
    algorithm: Algorithm,
    dtypes: &[DType; 5],
) -> Vec<(Vec<Vec<u8>>, Option<f64>, u64)> {
    let ctx = ctx();
    on_ranks(size, |comm| {
        let rank = comm.rank();
        let params = upload_params(&ctx, dtypes);
        let mut opt = ShardedOptimizer::build(
            &ctx,
            comm,
            builder.clone(),
            GradReduction::Mean,
            groups(algorithm, &params),
        )
        .unwrap();
        for t in 1..=STEPS {
            let grads = upload_grads(&ctx, &rank_grads(rank, t));
            opt.step(&grads).unwrap();
        }
        assert_eq!(opt.step_count(), if opt.shard_pieces().is_empty() { 0 } else { STEPS });
        let bytes = params.iter().map(|p| ctx.read_bytes(p).unwrap()).collect();
        (bytes, opt.grad_norm().unwrap(), opt.state_bytes().unwrap())
    })
}

fn groups(algorithm: Algorithm, params: &[Tensor]) -> Vec<ParamGroup> {
    let second = algorithm.with_lr(algorithm.lr() / 2.0);
    vec![ParamGroup::new(algorithm, &params[..2]), ParamGroup::new(second, &params[2..])]
}

/// The unsharded optimizer's parameters (bytes) and last norm on the reduced gradients.
fn unsharded_run(
    size: usize,
    builder: &OptimizerBuilder,
    algorithm: Algorithm,
    dtypes: &[DType; 5],
) -> (Vec<Vec<u8>>, Option<f64>) {
    let ctx = ctx();
    let params = upload_params(&ctx, dtypes);
    let mut opt = builder.clone().build_groups(&ctx, groups(algorithm, &params)).unwrap();
    for t in 1..=STEPS {
        let grads: Vec<Tensor> = reduced_grads(size, t).iter().map(|g| ctx.upload_f32("grad", g)).collect();
        opt.step(&grads).unwrap();
    }
    let norm = opt.grad_norm().ok();
    (params.iter().map(|p| ctx.read_bytes(p).unwrap()).collect(), norm)
}

#[test]
fn each_elementwise_family_on_1_to_4_ranks_is_the_unsharded_step_bit_for_bit() {
    let _turn = gpu_turn();
    let builder = Optimizer::builder();
    for algorithm in one_of_each_family() {
        for size in 1..=4 {
            let (want, _) = unsharded_run(size, &builder, algorithm, &DTYPES);
            for (rank, (got, _, _)) in sharded_run(size, &builder, algorithm, &DTYPES).into_iter().enumerate()
            {
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(g == w, "{algorithm:?} on {size} ranks: rank {rank}'s params[{i}] differ");
                }
            }
        }
    }
}

#[test]
fn clipping_on_the_gpu_gives_every_rank_the_same_norm_bits_close_to_the_unsharded_norm() {
    let _turn = gpu_turn();
    let clips = [GradClip::l2(0.5), GradClip { max_norm: 0.25, norm_type: NormType::Inf }];
    for clip in clips {
        let builder = Optimizer::builder().grad_clip(clip);
        let algorithm: Algorithm = Adam::adamw().into();
        for size in [1, 3] {
            let (want, want_norm) = unsharded_run(size, &builder, algorithm, &DTYPES);
            let want_norm = want_norm.expect("the unsharded optimizer clips");
            let ranks = sharded_run(size, &builder, algorithm, &DTYPES);
            let norm = ranks[0].1.expect("a rank with a shard reports the norm");
            for (rank, (got, got_norm, _)) in ranks.iter().enumerate() {
                assert_eq!(got_norm.map(f64::to_bits), Some(norm.to_bits()), "{clip:?}: rank {rank}'s norm");
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let (g, w) = (decode(g, DTYPES[i]), decode(w, DTYPES[i]));
                    assert_close(
                        &format!("{clip:?}, {size} ranks, rank {rank}, params[{i}]"),
                        &g,
                        &w,
                        Tolerance::stored(DTYPES[i]),
                    );
                }
            }
            assert_close(
                &format!("{clip:?}: the norm on {size} ranks"),
                &[norm],
                &[want_norm],
                Tolerance::F32,
            );
        }
    }
}

#[test]
fn each_rank_keeps_its_share_of_the_state_on_its_device() {
    let _turn = gpu_turn();
    let builder = Optimizer::builder();
    let algorithm: Algorithm = Adam::default().into();
    let elements: u64 = LENS.iter().map(|&l| l as u64).sum();
    let unsharded = {
        let ctx = ctx();
        let params = upload_params(&ctx, &DTYPES);
        let opt = builder.clone().build_groups(&ctx, groups(algorithm, &params)).unwrap();
        (0..params.len())
            .flat_map(|i| wgpu_optim::StateKind::ALL.iter().map(move |k| (i, *k)))
            .filter_map(|(i, k)| opt.tensor_state(i, k).map(Tensor::byte_len))
            .sum::<u64>()
    };
    for size in 2..=4 {
        let per_rank: Vec<u64> =
            sharded_run(size, &builder, algorithm, &DTYPES).into_iter().map(|(_, _, s)| s).collect();
        assert_eq!(per_rank.iter().sum::<u64>(), unsharded, "{size} ranks hold the state once between them");
        // Two moments of at most 4 bytes per element, over ceil(elements / N) elements.
        let most = 2 * 4 * elements.div_ceil(size as u64);
        assert!(per_rank.iter().all(|&b| b <= most), "{size} ranks: {per_rank:?}, each at most {most}");
    }
}

fn decode(bytes: &[u8], dtype: DType) -> Vec<f64> {
    match dtype {
        DType::F32 => {
            bytes.chunks_exact(4).map(|b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))).collect()
        }
        DType::F16 => {
            bytes.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f64()).collect()
        }
        DType::BF16 => {
            bytes.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f64()).collect()
        }
        _ => unreachable!("the tests' dtypes"),
    }
}

#[test]
fn master_weights_on_1_to_4_ranks_are_the_unsharded_step_bit_for_bit() {
    let _turn = gpu_turn();
    let builder = Optimizer::builder().master_weights(true);
    let algorithm: Algorithm = Adam::adamw().into();
    for size in 1..=4 {
        let (want, _) = unsharded_run(size, &builder, algorithm, &DTYPES);
        for (rank, (got, _, _)) in sharded_run(size, &builder, algorithm, &DTYPES).into_iter().enumerate() {
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(g == w, "master weights on {size} ranks: rank {rank}'s params[{i}] differ");
            }
        }
    }
}

#[cfg(feature = "checkpoint")]
#[test]
fn a_master_weight_checkpoint_continues_on_other_ranks_with_its_masters() {
    let _turn = gpu_turn();
    let ctx = ctx();
    let builder = Optimizer::builder().master_weights(true);
    let algorithm: Algorithm = Adam::adamw().into();
    let dir = std::env::temp_dir().join(format!("wgpu-optim-shard-masters-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    let run =
        |size: usize, start: &[Vec<f64>], load: bool, steps: std::ops::RangeInclusive<u64>, save: bool| {
            on_ranks(size, |comm| {
                let rank = comm.rank();
                let params: Vec<Tensor> =
                    start.iter().zip(DTYPES).map(|(v, dtype)| ctx.upload("param", v, dtype)).collect();
                let groups = groups(algorithm, &params);
                let mut opt =
                    ShardedOptimizer::build(&ctx, comm, builder.clone(), GradReduction::Mean, groups)
                        .unwrap();
                if load {
                    opt.load(&dir).unwrap();
                }
                for t in steps.clone() {
                    opt.step(&upload_grads(&ctx, &rank_grads(rank, t))).unwrap();
                }
                if save {
                    opt.save(&dir).unwrap();
                }
                params.iter().map(|p| ctx.read(p).unwrap()).collect::<Vec<_>>()
            })
            .remove(0)
        };
    let saved = run(3, &initial_params(), false, 1..=2, true);
    let got = run(2, &saved, true, 3..=4, false);
    std::fs::remove_dir_all(&dir).ok();
    // The unsharded run, whose masters never left the device.
    let params = upload_params(&ctx, &DTYPES);
    let mut opt = builder.clone().build_groups(&ctx, groups(algorithm, &params)).unwrap();
    for t in 1..=4 {
        let grads: Vec<Tensor> =
            reduced_grads(if t <= 2 { 3 } else { 2 }, t).iter().map(|g| ctx.upload_f32("grad", g)).collect();
        opt.step(&grads).unwrap();
    }
    for (i, (g, p)) in got.iter().zip(&params).enumerate() {
        let want = ctx.read(p).unwrap();
        let same = g.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "saved on 3 ranks with masters, continued on 2: params[{i}] differ");
    }
}

#[test]
fn stochastic_and_kahan_rounding_on_the_gpu_are_the_unsharded_step_bit_for_bit() {
    let _turn = gpu_turn();
    for rounding in [wgpu_optim::Rounding::Stochastic { seed: 7, state: true }, wgpu_optim::Rounding::Kahan] {
        let builder = Optimizer::builder().rounding(rounding);
        let algorithm: Algorithm = Adam::adamw().into();
        for size in [1, 3] {
            let (want, _) = unsharded_run(size, &builder, algorithm, &PARAMS_16);
            for (rank, (got, _, _)) in
                sharded_run(size, &builder, algorithm, &PARAMS_16).into_iter().enumerate()
            {
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(g == w, "{rounding:?} on {size} ranks: rank {rank}'s params[{i}] differ");
                }
            }
        }
    }
}

#[test]
fn buffers_a_sharded_step_cannot_copy_are_refused_before_any_step_on_every_rank() {
    let _turn = gpu_turn();
    let ctx = ctx();
    let storage_only = |len: u64| {
        let buffer = ctx.device().create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: 4 * len,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Tensor::whole(&buffer, DType::F32).unwrap()
    };
    // Parameters without COPY_SRC: the build, on every rank.
    let built = on_ranks(2, |comm| {
        let params = vec![storage_only(64)];
        let groups = vec![ParamGroup::new(Adam::adamw(), &params)];
        ShardedOptimizer::build(&ctx, comm, Optimizer::builder(), GradReduction::Mean, groups).map(drop)
    });
    for (rank, result) in built.iter().enumerate() {
        assert!(
            matches!(
                result,
                Err(wgpu_optim::Error::MissingUsage { .. } | wgpu_optim::Error::Collective { .. })
            ),
            "rank {rank}: {result:?}"
        );
    }
    // Gradients without COPY_SRC on rank 0 only: the step, on every rank.
    let stepped = on_ranks(2, |comm| {
        let rank = comm.rank();
        let params = vec![ctx.upload_f32("param", &[0.5; 64])];
        let groups = vec![ParamGroup::new(Adam::adamw(), &params)];
        let mut opt =
            ShardedOptimizer::build(&ctx, comm, Optimizer::builder(), GradReduction::Mean, groups).unwrap();
        let grads = if rank == 0 { vec![storage_only(64)] } else { vec![ctx.upload_f32("grad", &[0.1; 64])] };
        let refused = opt.step(&grads);
        (refused, ctx.read_f32(&params[0]).unwrap())
    });
    match &stepped[0].0 {
        Err(wgpu_optim::Error::MissingUsage { argument, needed, .. }) => {
            assert_eq!((argument.as_str(), *needed), ("grads[0]", "COPY_SRC"));
        }
        other => panic!("rank 0: expected its gradients refused, got {other:?}"),
    }
    assert!(matches!(stepped[1].0, Err(wgpu_optim::Error::Collective { .. })), "rank 1: {:?}", stepped[1].0);
    assert!(
        stepped.iter().all(|(_, p)| p.iter().all(|&v| v == 0.5)),
        "a refused step changed the parameters"
    );
}
