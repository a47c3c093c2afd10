//! The two rooflines a row is compared with, measured in the same run: the adapter's copy
//! bandwidth (a plain copy shader with the update's reads and writes) and the host's
//! bandwidth for a comparable in-place loop.

use std::collections::HashMap;
use std::time::Instant;

use rayon::prelude::*;
use wgpu_optim::{GpuContext, Result};
use wgpu_optim_testkit::CopyRoofline;

/// The roofline kernels, built once per shape and timed between the repetitions of each
/// measurement: this machine's bandwidth drifts, so a roofline timed at another moment
/// would not be comparable.
#[derive(Default)]
pub struct Rooflines {
    gpu: HashMap<(u32, u32, u64), CopyRoofline>,
    host: HashMap<(u32, u32, usize), HostLoop>,
}

/// Enough f32 elements per array to move `bytes` with `reads + writes` arrays.
fn elements_for(bytes: u64, reads: u32, writes: u32) -> u64 {
    (bytes / (4 * u64::from(reads + writes))).max(1024)
}

impl Rooflines {
    /// The copy shader moving `bytes` per step with the update's reads and writes. Arrays
    /// are capped at the largest storage binding; bandwidth is a rate, so that only trims
    /// the largest sizes.
    pub fn gpu(&mut self, ctx: &GpuContext, bytes: u64, reads: u32, writes: u32) -> Result<&CopyRoofline> {
        let cap = ctx.report().max_storage_buffer_binding_size / 4 / 16 * 16;
        let elements = elements_for(bytes, reads, writes).min(cap);
        match self.gpu.entry((reads, writes, elements)) {
            std::collections::hash_map::Entry::Occupied(entry) => Ok(entry.into_mut()),
            std::collections::hash_map::Entry::Vacant(entry) => {
                Ok(entry.insert(CopyRoofline::new(ctx, elements, reads, writes)?))
            }
        }
    }

    /// The host's in-place loop over f32 arrays moving `bytes` per pass.
    pub fn host(&mut self, bytes: u64, reads: u32, writes: u32) -> &mut HostLoop {
        let elements = elements_for(bytes, reads, writes) as usize;
        self.host.entry((reads, writes, elements)).or_insert_with(|| HostLoop::new(elements, reads, writes))
    }
}

/// `writes` f32 arrays updated in place from themselves and the other `reads - writes`.
pub struct HostLoop {
    written: Vec<Vec<f32>>,
    read_only: Vec<Vec<f32>>,
    /// Bytes read plus written by one pass.
    pub bytes: u64,
}

impl HostLoop {
    fn new(elements: usize, reads: u32, writes: u32) -> Self {
        let mut host = HostLoop {
            written: (0..writes).map(|k| vec![0.5 + k as f32; elements]).collect(),
            read_only: (writes..reads).map(|k| vec![1e-3 * k as f32; elements]).collect(),
            bytes: 4 * u64::from(reads + writes) * elements as u64,
        };
        host.time(); // first touch
        host
    }

    /// One pass, timed.
    pub fn time(&mut self) -> std::time::Duration {
        let start = Instant::now();
        inplace_pass(&mut self.written, &self.read_only);
        start.elapsed()
    }
}

/// A buffer larger than any last-level cache, read to evict everything else. The CPU rows
/// time each step and each roofline pass after a flush: a working set that fits a cache
/// (16 MB for 1 Mi-element Adam) otherwise stays in it for one side and not the other,
/// and the fraction reads 110 to 150 %. A trainer's forward and backward passes leave the
/// caches as cold between its optimizer steps.
pub struct CacheFlush(Vec<u64>);

impl CacheFlush {
    /// 256 MiB: several times the largest desktop L3.
    pub fn new() -> Self {
        CacheFlush((0..32u64 << 20).collect())
    }

    /// Reads the whole buffer on every core.
    pub fn flush(&self) {
        let sum: u64 = self.0.par_chunks(1 << 16).map(|chunk| chunk.iter().fold(0u64, |a, b| a ^ b)).sum();
        std::hint::black_box(sum);
    }
}

/// GB/s of `bytes` moved in `time`.
pub fn gbps(bytes: u64, time: std::time::Duration) -> f64 {
    bytes as f64 / time.as_secs_f64() / 1e9
}

/// One streaming pass on all cores in chunks the compiler vectorizes.
fn inplace_pass(written: &mut [Vec<f32>], read_only: &[Vec<f32>]) {
    match (written.len(), read_only.len()) {
        (1, 1) => pass::<1, 1>(written, read_only),
        (2, 1) => pass::<2, 1>(written, read_only),
        (3, 1) => pass::<3, 1>(written, read_only),
        (4, 1) => pass::<4, 1>(written, read_only),
        // With gradient clipping's second read of the gradient.
        (2, 2) => pass::<2, 2>(written, read_only),
        (3, 2) => pass::<3, 2>(written, read_only),
        (4, 2) => pass::<4, 2>(written, read_only),
        (w, r) => unreachable!("no roofline loop for {w} written and {r} read-only arrays"),
    }
}

/// `W` arrays updated in place from themselves and the sum of `R` read-only arrays, on all
/// cores in chunks; the array counts are constants so the element loop unrolls.
fn pass<const W: usize, const R: usize>(written: &mut [Vec<f32>], read_only: &[Vec<f32>]) {
    // The CPU backend's work items (128 Ki elements), so both divide the work alike.
    const CHUNK: usize = 1 << 17;
    let len = written[0].len();
    let mut chunks: Vec<Vec<&mut [f32]>> = (0..len.div_ceil(CHUNK)).map(|_| Vec::with_capacity(W)).collect();
    for array in written.iter_mut() {
        for (k, chunk) in array.chunks_mut(CHUNK).enumerate() {
            chunks[k].push(chunk);
        }
    }
    chunks.into_par_iter().enumerate().for_each(|(k, outs)| {
        let start = k * CHUNK;
        let Ok(mut outs): Result<[&mut [f32]; W], _> = outs.try_into() else { return };
        let ins: [&[f32]; R] = std::array::from_fn(|r| &read_only[r][start..start + outs[0].len()]);
        chunk_pass(&mut outs, &ins);
    });
}

/// One chunk, compiled for the same vector extensions as the CPU backend's loops. It must be
/// a function of its own: the closure that rayon runs does not inherit the target features
/// of the function it is written in, and without them this loop ran as SSE2 code, slower
/// than the AVX-512 update it bounds (CPU fractions of 120 to 350 %).
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn chunk_pass<const W: usize, const R: usize>(outs: &mut [&mut [f32]; W], ins: &[&[f32]; R]) {
    for i in 0..outs[0].len() {
        let mut s = 0.0;
        for input in ins {
            s += input[i];
        }
        for out in outs.iter_mut() {
            out[i] = out[i] * 0.999 + s;
        }
    }
}
