//! Ranks on threads of one process: the transport `cargo test` covers the sharding logic
//! with, and one for a trainer that drives several devices from one process.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::Communicator;
use crate::{Error, Result};

/// One rank of a group of ranks in one process, each used from its own thread
/// ([`InProcess::group`]). A collective waits for every rank; it fails on every waiting
/// rank as soon as another rank's handle is dropped (its thread panicked or ended), and
/// after the group's timeout if a rank never comes.
#[derive(Debug)]
pub struct InProcess {
    rank: usize,
    size: usize,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<Round>,
    changed: Condvar,
    timeout: Duration,
}

/// The collective in progress: what each rank brought to it, and the outcome of the last
/// one, which ranks still waiting on it read before the next can complete.
#[derive(Debug)]
struct Round {
    /// Completed collectives.
    done: u64,
    slots: Vec<Option<Vec<u8>>>,
    outcome: std::result::Result<Arc<Vec<u8>>, String>,
    /// The first rank whose handle was dropped.
    left: Option<usize>,
}

impl InProcess {
    /// A group of `size` ranks (at least 1), rank `i` at index `i`, whose collectives give up
    /// after `timeout` without every rank. Hand each to its own thread.
    pub fn group(size: usize, timeout: Duration) -> Result<Vec<InProcess>> {
        if size == 0 {
            return Err(Error::BadValue {
                argument: "size".into(),
                problem: "is 0, but a group has at least one rank".into(),
            });
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(Round {
                done: 0,
                slots: vec![None; size],
                outcome: Ok(Arc::default()),
                left: None,
            }),
            changed: Condvar::new(),
            timeout,
        });
        Ok((0..size).map(|rank| InProcess { rank, size, shared: shared.clone() }).collect())
    }

    fn lock(&self) -> MutexGuard<'_, Round> {
        // A rank that panicked while holding the lock left nothing half-written: every
        // change to the round is one assignment.
        self.shared.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn failed(&self, problem: String) -> Error {
        Error::Collective { operation: "all_gather".into(), rank: self.rank, size: self.size, problem }
    }
}

/// The ranks' bytes concatenated, or why they cannot be.
fn combine(slots: &mut [Option<Vec<u8>>]) -> std::result::Result<Arc<Vec<u8>>, String> {
    let parts: Vec<Vec<u8>> = slots.iter_mut().map(|s| s.take().unwrap_or_default()).collect();
    let lengths: Vec<usize> = parts.iter().map(Vec::len).collect();
    if lengths.iter().any(|&l| l != lengths[0]) {
        return Err(format!("the ranks passed different lengths (bytes, by rank): {lengths:?}"));
    }
    Ok(Arc::new(parts.concat()))
}

impl Communicator for InProcess {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<u8>> {
        let mut round = self.lock();
        if let Some(rank) = round.left {
            return Err(self.failed(format!("rank {rank} has left the group")));
        }
        let this = round.done;
        round.slots[self.rank] = Some(mine.to_vec());
        if round.slots.iter().all(Option::is_some) {
            round.outcome = combine(&mut round.slots);
            round.done += 1;
            self.shared.changed.notify_all();
        } else {
            let deadline = Instant::now() + self.shared.timeout;
            while round.done == this {
                if let Some(rank) = round.left {
                    return Err(
                        self.failed(format!("rank {rank} left the group before joining this collective"))
                    );
                }
                let now = Instant::now();
                if now >= deadline {
                    let missing: Vec<usize> = (0..self.size).filter(|&r| round.slots[r].is_none()).collect();
                    // Withdraw, so that a late rank does not complete a collective this one left.
                    round.slots[self.rank] = None;
                    return Err(self
                        .failed(format!("ranks {missing:?} did not join within {:?}", self.shared.timeout)));
                }
                round = self
                    .shared
                    .changed
                    .wait_timeout(round, deadline - now)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        }
        match &round.outcome {
            Ok(all) => Ok(all.to_vec()),
            Err(problem) => Err(self.failed(problem.clone())),
        }
    }
}

impl Drop for InProcess {
    /// The others' collectives fail from now on instead of waiting for this rank.
    fn drop(&mut self) {
        let mut round = self.lock();
        round.left.get_or_insert(self.rank);
        self.shared.changed.notify_all();
    }
}

#[cfg(test)]
mod tests;
