//! The collectives over MPI (feature `mpi`): one rank per process, started by `mpirun`.

use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::{Communicator as _, CommunicatorCollectives as _};

use super::Communicator;
use crate::{Error, Result};

/// This process's rank of an MPI communicator (usually the world of
/// `mpi::initialize()`'s universe, which the trainer keeps alive for the run).
///
/// MPI has no timeout: a rank that exits ends the job (`mpirun` kills the others), but a
/// rank that panics and unwinds hangs it, as dropping the universe waits for the others in
/// `MPI_Finalize`. [`Mpi::abort_on_panic`] turns a panic into `MPI_Abort`, which ends the
/// job at once.
pub struct Mpi {
    world: SimpleCommunicator,
}

impl std::fmt::Debug for Mpi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mpi").field("rank", &self.rank()).field("size", &self.size()).finish()
    }
}

impl Mpi {
    /// The collectives over `world`.
    pub fn new(world: SimpleCommunicator) -> Self {
        Mpi { world }
    }

    /// Installs a panic hook that prints the panic and aborts the whole MPI job with
    /// `code`, so that a rank that panics mid-step does not leave the others waiting.
    pub fn abort_on_panic(code: i32) {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            SimpleCommunicator::world().abort(code);
        }));
    }
}

impl Communicator for Mpi {
    fn rank(&self) -> usize {
        // MPI ranks and sizes are non-negative `int`s.
        self.world.rank() as usize
    }

    fn size(&self) -> usize {
        self.world.size() as usize
    }

    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<u8>> {
        // MPI's all-gather needs one length on every rank; exchange them first so that
        // ranks that differ are an error on every rank, not undefined behaviour.
        let length = mine.len() as u64;
        let mut lengths = vec![0u64; self.size()];
        self.world.all_gather_into(&length, &mut lengths[..]);
        if lengths.iter().any(|&l| l != length) {
            return Err(Error::Collective {
                operation: "all_gather".into(),
                rank: self.rank(),
                size: self.size(),
                problem: format!("the ranks passed different lengths (bytes, by rank): {lengths:?}"),
            });
        }
        let mut all = vec![0u8; mine.len() * self.size()];
        if !mine.is_empty() {
            self.world.all_gather_into(mine, &mut all[..]);
        }
        Ok(all)
    }

    fn all_to_all_bytes(&self, mine: &[u8]) -> Result<Vec<u8>> {
        // The same length on every rank, and one that splits into a chunk per rank.
        let all_lengths = self.all_gather_bytes(&(mine.len() as u64).to_le_bytes())?;
        if all_lengths.chunks(8).any(|l| l != (mine.len() as u64).to_le_bytes())
            || !mine.len().is_multiple_of(self.size())
        {
            return Err(Error::Collective {
                operation: "all_to_all".into(),
                rank: self.rank(),
                size: self.size(),
                problem: format!(
                    "every rank passes one length that splits into {} equal chunks; this rank passed {} bytes",
                    self.size(),
                    mine.len()
                ),
            });
        }
        let mut out = vec![0u8; mine.len()];
        if !mine.is_empty() {
            self.world.all_to_all_into(mine, &mut out[..]);
        }
        Ok(out)
    }

    fn barrier(&self) -> Result<()> {
        self.world.barrier();
        Ok(())
    }
}
