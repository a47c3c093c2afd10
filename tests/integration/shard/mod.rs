//! The sharded optimizers (`wgpu_optim::shard`) against the unsharded step: each case runs
//! 1 to 4 in-process ranks on threads, every rank with gradients of its own, and compares
//! every rank's parameters with an unsharded optimizer stepped on the ranks' gradients
//! reduced as the sharded step reduces them (an f32 sum in rank order, then the mean).

#[cfg(all(feature = "cpu", feature = "checkpoint"))]
mod adafactor;
#[cfg(feature = "cpu")]
mod amp;
#[cfg(all(feature = "cpu", feature = "checkpoint"))]
mod checkpoint;
#[cfg(feature = "cpu")]
mod cpu;
#[cfg(feature = "cpu")]
mod faults;
mod gpu;
#[cfg(feature = "cpu")]
mod low_bit;
#[cfg(feature = "cpu")]
mod schedule_free;
#[cfg(feature = "cpu")]
mod whole;

use std::time::Duration;

use wgpu_optim::shard::{Communicator, InProcess};
use wgpu_optim::{AdEMAMix, Adan, Adopt, Algorithm, DType, Lion, ScheduleFreeAdamW};
use wgpu_optim_testkit::cases::{
    adagrad_variants, adam_switch_combinations, rmsprop_variants, sgd_variants, Rng,
};

/// Tensor lengths whose flat range 1 to 4 ranks cut in the middle of tensors (and one
/// tensor of one element, which lies in one shard).
pub const LENS: [usize; 5] = [37, 300, 1, 129, 64];
/// Their dtypes: the shards' pieces keep each tensor's.
pub const DTYPES: [DType; 5] = [DType::F32, DType::BF16, DType::F32, DType::F16, DType::F32];
/// 16-bit parameters of the same lengths, for stochastic rounding (which f32 ones refuse).
pub const PARAMS_16: [DType; 5] = [DType::BF16, DType::BF16, DType::F16, DType::F16, DType::BF16];
/// Steps per case.
pub const STEPS: u64 = 3;

/// A directory of its own under the system's temporary directory, removed when dropped.
#[cfg(feature = "checkpoint")]
pub struct Scratch(std::path::PathBuf);

#[cfg(feature = "checkpoint")]
impl Scratch {
    pub fn new() -> Self {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("wgpu-optim-shard-{}-{n}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        Scratch(dir)
    }

    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

#[cfg(feature = "checkpoint")]
impl Drop for Scratch {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

/// The sharded CPU optimizer of `algorithm` over `params` with the default options and the
/// mean of the ranks' gradients.
#[cfg(feature = "cpu")]
pub fn sharded_cpu(
    comm: InProcess,
    algorithm: impl Into<Algorithm>,
    params: &[wgpu_optim::cpu::HostSlice<'_>],
) -> wgpu_optim::shard::ShardedCpuOptimizer<InProcess> {
    use wgpu_optim::shard::{GradReduction, ShardedCpuOptimizer};
    let builder = wgpu_optim::cpu::CpuOptimizer::builder();
    ShardedCpuOptimizer::build(comm, builder, GradReduction::Mean, algorithm, params).unwrap()
}

/// Runs `rank` on `size` in-process ranks, one thread each, and returns their results in
/// rank order.
pub fn on_ranks<T: Send>(size: usize, rank: impl Fn(InProcess) -> T + Sync) -> Vec<T> {
    let group = InProcess::group(size, Duration::from_secs(30)).expect("a group");
    let rank = &rank;
    std::thread::scope(|scope| {
        let handles: Vec<_> = group.into_iter().map(|comm| scope.spawn(move || rank(comm))).collect();
        handles.into_iter().map(|h| h.join().expect("a rank panicked")).collect()
    })
}

/// The parameters' initial values, the same on every rank.
pub fn initial_params() -> Vec<Vec<f64>> {
    let mut rng = Rng::new(7);
    LENS.iter().map(|&len| rng.vec(len, 1.0)).collect()
}

/// Rank `rank`'s gradients at step `t`, rounded to each tensor's dtype.
pub fn rank_grads(rank: usize, t: u64) -> Vec<Vec<f64>> {
    let mut rng = Rng::new(1000 + 17 * t + rank as u64);
    LENS.iter().zip(DTYPES).map(|(&len, dtype)| rounded(&rng.vec(len, 0.5), dtype)).collect()
}

/// The gradients the sharded step reduces to at step `t` over `size` ranks: each element
/// the f32 sum of the ranks' values in rank order, divided by `size` in f32.
pub fn reduced_grads(size: usize, t: u64) -> Vec<Vec<f32>> {
    let per_rank: Vec<_> = (0..size).map(|r| rank_grads(r, t)).collect();
    (0..LENS.len())
        .map(|i| {
            (0..LENS[i])
                .map(|e| {
                    let sum =
                        (1..size).fold(per_rank[0][i][e] as f32, |acc, r| acc + per_rank[r][i][e] as f32);
                    sum / size as f32
                })
                .collect()
        })
        .collect()
}

/// `values` rounded to `dtype` (to nearest even), as f64.
pub fn rounded(values: &[f64], dtype: DType) -> Vec<f64> {
    match dtype {
        DType::F16 => values.iter().map(|&v| half::f16::from_f64(v).to_f64()).collect(),
        DType::BF16 => values.iter().map(|&v| half::bf16::from_f64(v).to_f64()).collect(),
        DType::F32 => values.iter().map(|&v| f64::from(v as f32)).collect(),
        _ => values.to_vec(),
    }
}

/// `values` as host tensors of `dtypes` (rounded to each).
#[cfg(feature = "cpu")]
pub fn host_tensors(values: &[Vec<f64>], dtypes: &[DType]) -> Vec<wgpu_optim::cpu::HostTensor> {
    values
        .iter()
        .zip(dtypes)
        .map(|(v, &dtype)| wgpu_optim::cpu::HostTensor::from_f64(dtype, v).unwrap())
        .collect()
}

/// Every elementwise family, with the swept variants of the families that have them.
pub fn elementwise_families() -> Vec<Algorithm> {
    let mut all = adam_switch_combinations();
    all.extend(sgd_variants());
    all.extend(adagrad_variants());
    all.extend(rmsprop_variants());
    all.push(Lion::default().into());
    all.push(AdEMAMix::default().into());
    all.push(ScheduleFreeAdamW::default().into());
    all.push(Adan::default().into());
    all.push(Adopt::default().into());
    all
}

/// One configuration of each elementwise family, for the GPU, where each compiles kernels.
pub fn one_of_each_family() -> Vec<Algorithm> {
    use wgpu_optim::{Adagrad, Adam, RmsProp, Sgd};
    vec![
        Adam { amsgrad: true, weight_decay: 0.0625, ..Adam::adamw() }.into(),
        Sgd { momentum: 0.9, nesterov: true, lr: 0.01, ..Sgd::default() }.into(),
        Adagrad::default().into(),
        RmsProp { centered: true, momentum: 0.9, ..RmsProp::default() }.into(),
        Lion::default().into(),
        AdEMAMix::default().into(),
        ScheduleFreeAdamW::default().into(),
        Adan::default().into(),
        Adopt::default().into(),
    ]
}
