//! Optimizer state sharded across ranks (ZeRO-1): [`ShardedOptimizer`] (and, with the
//! `cpu` feature, `ShardedCpuOptimizer`), the collectives a sharded step needs
//! ([`Communicator`]) and their transports.
//!
//! A sharded trainer holds the whole model on every rank, reduces the gradients across
//! ranks, updates only its slice of the parameters with only its slice of the state, and
//! gathers the updated slices back (DeepSpeed's ZeRO-1, Megatron's distributed optimizer).
//! What crosses ranks is the gradients (reduce-scattered), the parameter shards
//! (all-gathered), a few scalars (partial norms, found-inf), and a check that every rank
//! was configured alike. Which elements each rank owns: the elementwise families' tensors,
//! LAMB's and Adafactor's lie in the [`FlatLayout`], one flat range cut into equal shards
//! (LAMB's per-tensor sums and Adafactor's row and column sums added across the ranks);
//! Muon's are each given whole to one rank.
//! Checkpoints are one file per rank ([`SHARD_FORMAT`]), loadable on any number of ranks.
//!
//! Every reduction here gives every rank the same bits: the ranks' contributions are
//! gathered and combined in rank order on each rank ([`Communicator::all_reduce_f64`]),
//! never in whatever order a transport's tree happens to add them. A sharded global norm
//! is then one value everywhere, and so is the clip coefficient made from it.
//!
//! Transports: [`InProcess`] (ranks on threads of one process, for tests and for a trainer
//! that drives several devices from one process) and, with the `mpi` feature, `Mpi` (a rank
//! per process under `mpirun`; `examples/shard_mpi.rs` checks it). A rank that leaves the group (panics or
//! ends) or stops answering makes the others' collectives fail with
//! [`Error::Collective`] instead of waiting forever.

#[cfg(feature = "checkpoint")]
mod checkpoint;
#[cfg(feature = "cpu")]
mod cpu;
mod gpu;
mod in_process;
mod layout;
#[cfg(feature = "mpi")]
mod mpi;
mod plan;

#[cfg(feature = "checkpoint")]
pub use checkpoint::SHARD_FORMAT;
#[cfg(feature = "cpu")]
pub use cpu::ShardedCpuOptimizer;
pub use gpu::ShardedOptimizer;
pub use in_process::InProcess;
pub use layout::{FlatLayout, Piece};
#[cfg(feature = "mpi")]
pub use mpi::Mpi;
pub use plan::{GradReduction, StepSplit};

use crate::{Error, Result};

/// How the ranks' values combine in [`Communicator::all_reduce_f64`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// The sum, added in rank order (rank 0's value first).
    Sum,
    /// The largest (NaN if any rank's is NaN, as a norm over NaN gradients is).
    Max,
}

/// The collectives of a sharded step, over a group of ranks that each hold one value of
/// this type and call the same collectives in the same order.
///
/// A transport implements [`Self::all_gather_bytes`]; the rest are built on it, so every
/// transport combines values alike (in rank order, the same bits on every rank).
pub trait Communicator {
    /// This rank, from 0.
    fn rank(&self) -> usize;

    /// The number of ranks in the group.
    fn size(&self) -> usize;

    /// Every rank's `mine`, concatenated in rank order. Every rank passes the same number of
    /// bytes; different lengths are [`Error::Collective`] on every rank, naming them.
    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<u8>>;

    /// Chunk `r` of every rank's `mine` (cut into [`Self::size`] equal chunks), concatenated
    /// in rank order, on rank `r`: the exchange under a reduce-scatter, where each rank
    /// receives only the `(size - 1) / size` of the data it reduces. Built on
    /// [`Self::all_gather_bytes`] (every rank receives everything); a transport with its
    /// own all-to-all overrides it.
    fn all_to_all_bytes(&self, mine: &[u8]) -> Result<Vec<u8>> {
        let chunk = check_chunks(self, "all_to_all", mine.len())?;
        let all = self.all_gather_bytes(mine).map_err(|e| called_as("all_to_all", e))?;
        let rank = self.rank();
        let mut mine_of_each = Vec::with_capacity(mine.len());
        for r in 0..self.size() {
            mine_of_each.extend_from_slice(&all[r * mine.len() + rank * chunk..][..chunk]);
        }
        Ok(mine_of_each)
    }

    /// Rank `r`'s shard of the elementwise sum of every rank's `values` (their length a
    /// multiple of [`Self::size`], shard `r` the `r`-th equal part), added in rank order:
    /// the gradient reduce-scatter of a sharded step.
    fn reduce_scatter_f32(&self, values: &[f32]) -> Result<Vec<f32>> {
        let mut shard = Vec::new();
        self.reduce_scatter_f32_into(values, &mut shard)?;
        Ok(shard)
    }

    /// [`Self::reduce_scatter_f32`] into `shard` (replacing what it held), so that a caller
    /// that reduces every step reuses one buffer.
    fn reduce_scatter_f32_into(&self, values: &[f32], shard: &mut Vec<f32>) -> Result<()> {
        // The crate's targets are little-endian: an f32's bytes are its `to_le_bytes`.
        let mine: &[u8] = bytemuck::cast_slice(values);
        check_chunks(self, "reduce_scatter", mine.len())?;
        shard.clear();
        if self.size() == 1 {
            shard.extend_from_slice(values);
            return Ok(());
        }
        let bytes = self.all_to_all_bytes(mine).map_err(|e| called_as("reduce_scatter", e))?;
        // In place where the allocation is 4-byte aligned (as allocators give), else copied.
        let copied: Vec<f32>;
        let parts: &[f32] = match bytemuck::try_cast_slice(&bytes) {
            Ok(parts) => parts,
            Err(_) => {
                copied = bytemuck::pod_collect_to_vec(&bytes);
                &copied
            }
        };
        let len = values.len() / self.size();
        shard.extend_from_slice(&parts[..len]);
        for rank in 1..self.size() {
            for (acc, value) in shard.iter_mut().zip(&parts[rank * len..(rank + 1) * len]) {
                *acc += value;
            }
        }
        Ok(())
    }

    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<()> {
        self.all_gather_bytes(&[]).map(drop)
    }

    /// `values` combined elementwise across ranks with `op`, in place: gathered, then
    /// combined in rank order on every rank, so that every rank holds the same bits.
    fn all_reduce_f64(&self, values: &mut [f64], op: ReduceOp) -> Result<()> {
        let mine: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let all = self.all_gather_bytes(&mine).map_err(|e| called_as("all_reduce", e))?;
        let per_rank = mine.len();
        for (i, value) in values.iter_mut().enumerate() {
            let at = |rank: usize| {
                let start = rank * per_rank + i * 8;
                let mut bytes = [0u8; 8];
                bytes.copy_from_slice(&all[start..start + 8]);
                f64::from_le_bytes(bytes)
            };
            *value = (1..self.size()).fold(at(0), |acc, rank| match op {
                ReduceOp::Sum => acc + at(rank),
                ReduceOp::Max if acc.is_nan() || at(rank).is_nan() => f64::NAN,
                ReduceOp::Max => acc.max(at(rank)),
            });
        }
        Ok(())
    }

    /// Checks that every rank passes the same `mine` (an encoding of its configuration:
    /// world size, layout, algorithm), so that ranks set up differently are refused before
    /// any step. `what` names it in the error, with the first rank that differs from rank 0.
    fn check_same(&self, what: &str, mine: &[u8]) -> Result<()> {
        let check = |e| called_as(&format!("check_same({what})"), e);
        let lengths = self.all_gather_bytes(&(mine.len() as u64).to_le_bytes()).map_err(check)?;
        let differs = |rank: usize| Error::Collective {
            operation: format!("check_same({what})"),
            rank: self.rank(),
            size: self.size(),
            problem: format!("rank {rank}'s {what} differs from rank 0's"),
        };
        if let Some(rank) = (1..self.size()).find(|r| lengths[r * 8..r * 8 + 8] != lengths[..8]) {
            return Err(differs(rank));
        }
        let all = self.all_gather_bytes(mine).map_err(check)?;
        match (1..self.size()).find(|r| all[r * mine.len()..(r + 1) * mine.len()] != all[..mine.len()]) {
            Some(rank) => Err(differs(rank)),
            None => Ok(()),
        }
    }
}

/// The chunk length of `len` bytes cut into one equal chunk per rank, or why it cannot be.
fn check_chunks<C: Communicator + ?Sized>(comm: &C, operation: &str, len: usize) -> Result<usize> {
    if !len.is_multiple_of(comm.size()) {
        return Err(Error::Collective {
            operation: operation.into(),
            rank: comm.rank(),
            size: comm.size(),
            problem: format!("{len} bytes do not split into {} equal chunks", comm.size()),
        });
    }
    Ok(len / comm.size())
}

/// `error` from the collective under `operation`, named as the caller's: "reduce_scatter
/// (all_to_all (all_gather))" rather than the transport's primitive alone.
fn called_as(operation: &str, error: Error) -> Error {
    match error {
        Error::Collective { operation: inner, rank, size, problem } => {
            Error::Collective { operation: format!("{operation} ({inner})"), rank, size, problem }
        }
        other => other,
    }
}
