//! Scheduling one step: every tensor cut into chunks, and the chunks of all tensors in one
//! parallel iteration, so that many small tensors cost one fork-join rather than one each.

use rayon::prelude::*;

use super::host::{HostSlice, HostSliceMut};
use super::kernels::Kernel;
use super::state_memory::StateTensor;
use super::storage::{self, Job, Stores};

/// Elements per work item: enough that rayon's per-item cost vanishes next to the item's
/// own work (smaller items measured slower, PERF.md), few enough that one 16 Mi-element
/// tensor still makes 128 items to spread over many cores.
const CHUNK: usize = 128 * 1024;

/// Runs `kernel` over every tensor. The slices have been checked: each gradient and state
/// tensor has its parameter's length, and `state[i]` holds tensor i's state in the kernel's
/// slot order.
/// `compensation` holds each tensor's Kahan compensation, or is empty.
pub(crate) fn run(
    kernel: &Kernel,
    stores: &Stores,
    params: &mut [HostSliceMut<'_>],
    grads: &[HostSlice<'_>],
    state: &mut [Vec<StateTensor>],
    compensation: &mut [StateTensor],
) {
    let state = state.iter_mut().map(Vec::as_mut_slice);
    run_jobs(kernel, stores, jobs(params, grads.iter().copied(), state, compensation));
}

/// Runs `kernel` over `jobs` in one parallel iteration.
pub(crate) fn run_jobs(kernel: &Kernel, stores: &Stores, jobs: Vec<Job<'_>>) {
    jobs.into_par_iter().for_each(|job| storage::run(kernel, stores, job));
}

/// Every tensor cut into chunks of [`CHUNK`] elements, each job naming its tensor by its
/// ordinal. `grads` and `state` give one entry per parameter (iterators, so that a family
/// whose gradients or state are made per step, as Muon's, needs no list of them).
pub(crate) fn jobs<'a>(
    params: &'a mut [HostSliceMut<'_>],
    grads: impl IntoIterator<Item = HostSlice<'a>>,
    state: impl IntoIterator<Item = &'a mut [StateTensor]>,
    compensation: &'a mut [StateTensor],
) -> Vec<Job<'a>> {
    let items: usize = params.iter().map(|p| p.len().div_ceil(CHUNK)).sum();
    let mut jobs = Vec::with_capacity(items);
    let mut compensation = compensation.iter_mut();
    for (i, ((param, grad), state)) in params.iter_mut().zip(grads).zip(state).enumerate() {
        let mut slots = state.iter_mut().map(StateTensor::as_mut_slice);
        let mut rest = Job {
            param: param.reborrow(),
            grad,
            state: std::array::from_fn(|_| slots.next().unwrap_or_default()),
            compensation: compensation.next().map(StateTensor::as_mut_slice).unwrap_or_default(),
            ordinal: i as u32,
            first: 0,
        };
        while !rest.is_empty() {
            let (chunk, tail) = rest.split_at(CHUNK);
            jobs.push(chunk);
            rest = tail;
        }
    }
    jobs
}
