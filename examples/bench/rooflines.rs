//! The two rooflines a row is compared with, measured in the same run: the adapter's copy
//! bandwidth (a plain copy shader with the update's reads and writes) and the host's
//! bandwidth for a comparable in-place loop.

use std::time::Instant;

use rayon::prelude::*;
use wgpu_optim::{GpuContext, Result};
use wgpu_optim_testkit::CopyRoofline;

/// The roofline kernels, timed between the repetitions of each measurement: this machine's
/// bandwidth drifts, so a roofline timed at another moment would not be comparable. Only
/// the latest shape's is kept (consecutive cases of one shape reuse it): one per shape for
/// the whole run held every case's arrays to the end, 24 GiB for `--full` on the CPU alone.
#[derive(Default)]
pub struct Rooflines {
    gpu: Option<((u32, u32, u64), CopyRoofline)>,
    host: Option<((u32, u32, usize), HostLoop)>,
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
        let key = (reads, writes, elements);
        let entry = match self.gpu.take() {
            Some(entry) if entry.0 == key => entry,
            previous => {
                // The previous shape's buffers go before the new ones are allocated.
                drop(previous);
                (key, CopyRoofline::new(ctx, elements, reads, writes)?)
            }
        };
        Ok(&self.gpu.insert(entry).1)
    }

    /// The host's in-place loop over f32 arrays moving `bytes` per pass.
    pub fn host(&mut self, bytes: u64, reads: u32, writes: u32) -> &mut HostLoop {
        let elements = elements_for(bytes, reads, writes) as usize;
        let key = (reads, writes, elements);
        let entry = match self.host.take() {
            Some(entry) if entry.0 == key => entry,
            previous => {
                // The previous shape's arrays go before the new ones are allocated.
                drop(previous);
                (key, HostLoop::new(elements, reads, writes))
            }
        };
        &mut self.host.insert(entry).1
    }
}

/// `writes` f32 arrays updated in place from themselves and a gradient array. Where the
/// update reads more than its operands (gradient clipping's norm), a separate pass reads
/// the gradient first, as the norm does: at 1 Mi elements the gradient then stays in the
/// last-level cache for the update in both, where a second array read in the same pass
/// did not, and clipped Adam read 115-120 % of that roofline.
pub struct HostLoop {
    written: Vec<HostArray>,
    gradient: HostArray,
    /// Passes over the gradient alone before the update's pass.
    gradient_passes: u32,
    /// Bytes read plus written by one pass.
    pub bytes: u64,
}

impl HostLoop {
    fn new(elements: usize, reads: u32, writes: u32) -> Self {
        // Laid out as a step's operands: the parameter (written) and the gradients (read only)
        // on the heap, the state (the other written arrays) where the CPU optimizer keeps it,
        // at the parameter's offset within a page.
        let param = HostArray::heap(elements, 0.5);
        let phase = param.as_slice().as_ptr() as usize;
        let state = (1..writes).map(|k| HostArray::state(elements, 0.5 + k as f32, phase));
        let mut host = HostLoop {
            written: std::iter::once(param).chain(state).collect(),
            gradient: HostArray::heap(elements, 1e-3),
            gradient_passes: reads - writes - 1,
            bytes: 4 * u64::from(reads + writes) * elements as u64,
        };
        host.time(); // first touch
        host
    }

    /// One pass, timed.
    pub fn time(&mut self) -> std::time::Duration {
        let mut written: Vec<&mut [f32]> = self.written.iter_mut().map(HostArray::as_mut_slice).collect();
        let gradient = self.gradient.as_slice();
        let start = Instant::now();
        for _ in 0..self.gradient_passes {
            std::hint::black_box(read_pass(gradient));
        }
        inplace_pass(&mut written, gradient);
        start.elapsed()
    }
}

/// One roofline array: a parameter or gradient on the heap, as a trainer allocates them, or
/// a state tensor as the CPU optimizer keeps its own (on Linux, from 2 MiB up, an anonymous
/// mapping advised onto transparent huge pages, starting at the parameter's offset within a
/// page). With every array on the heap the roofline paid TLB misses that the optimizer's
/// state did not, and f32 Adam read 106-117 % of it.
enum HostArray {
    Heap(Vec<f32>),
    #[cfg(target_os = "linux")]
    Mapped {
        map: memmap2::MmapMut,
        phase: usize,
    },
}

impl HostArray {
    fn heap(elements: usize, value: f32) -> Self {
        HostArray::Heap(vec![value; elements])
    }

    /// `phase`: an address whose offset within a 4 KiB page the elements start at.
    fn state(elements: usize, value: f32, phase: usize) -> Self {
        #[cfg(target_os = "linux")]
        if elements * 4 >= 2 << 20 {
            let phase = phase % 4096;
            if let Ok(map) = memmap2::MmapMut::map_anon(phase + elements * 4) {
                // Advice only: without THP the mapping still works, on small pages.
                let _ = map.advise(memmap2::Advice::HugePage);
                let mut array = HostArray::Mapped { map, phase };
                array.as_mut_slice().fill(value);
                return array;
            }
        }
        let _ = phase;
        HostArray::heap(elements, value)
    }

    fn as_slice(&self) -> &[f32] {
        match self {
            HostArray::Heap(v) => v,
            #[cfg(target_os = "linux")]
            HostArray::Mapped { map, phase } => bytemuck::cast_slice(&map[*phase..]),
        }
    }

    fn as_mut_slice(&mut self) -> &mut [f32] {
        match self {
            HostArray::Heap(v) => v,
            #[cfg(target_os = "linux")]
            HostArray::Mapped { map, phase } => bytemuck::cast_slice_mut(&mut map[*phase..]),
        }
    }
}

/// A buffer larger than any last-level cache, read to evict everything else. The CPU rows
/// time each step and each roofline pass after a flush: a working set that fits a cache
/// (28 MB for 1 Mi-element Adam) otherwise stays in it for one side and not the other,
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
fn inplace_pass(written: &mut [&mut [f32]], gradient: &[f32]) {
    match written.len() {
        1 => pass::<1>(written, gradient),
        2 => pass::<2>(written, gradient),
        3 => pass::<3>(written, gradient),
        4 => pass::<4>(written, gradient),
        w => unreachable!("no roofline loop for {w} written arrays"),
    }
}

/// The CPU backend's work items (128 Ki elements), so both divide the work alike.
const CHUNK: usize = 1 << 17;

/// `W` arrays updated in place from themselves and the gradient, on all cores in chunks;
/// the array count is a constant so the element loop unrolls.
fn pass<const W: usize>(written: &mut [&mut [f32]], gradient: &[f32]) {
    let len = written[0].len();
    let mut chunks: Vec<Vec<&mut [f32]>> = (0..len.div_ceil(CHUNK)).map(|_| Vec::with_capacity(W)).collect();
    for array in written.iter_mut() {
        for (k, chunk) in array.chunks_mut(CHUNK).enumerate() {
            chunks[k].push(chunk);
        }
    }
    chunks.into_par_iter().zip(gradient.par_chunks(CHUNK)).for_each(|(outs, g)| {
        let Ok(mut outs): Result<[&mut [f32]; W], _> = outs.try_into() else { return };
        chunk_pass(&mut outs, g);
    });
}

/// A sum over `values` on all cores, as a gradient norm reads them.
fn read_pass(values: &[f32]) -> f32 {
    values.par_chunks(CHUNK).map(chunk_sum).sum()
}

/// One chunk, compiled for the same vector extensions as the CPU backend's loops. It must be
/// a function of its own: the closure that rayon runs does not inherit the target features
/// of the function it is written in, and without them this loop ran as SSE2 code, slower
/// than the AVX-512 update it bounds (CPU fractions of 120 to 350 %).
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn chunk_pass<const W: usize>(outs: &mut [&mut [f32]; W], gradient: &[f32]) {
    // Every slice cut to one length, so the loop needs no bounds checks.
    let n = outs.iter().map(|o| o.len()).fold(gradient.len(), usize::min);
    let gradient = &gradient[..n];
    let mut outs = outs.each_mut().map(|o| &mut o[..n]);
    for i in 0..n {
        for out in outs.iter_mut() {
            out[i] = out[i] * 0.999 + gradient[i];
        }
    }
}

/// A sum of `values` in sixteen lanes, so the compiler may vectorize it (a float sum in
/// order would not be).
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn chunk_sum(values: &[f32]) -> f32 {
    let (whole, tail) = values.as_chunks::<16>();
    let mut lanes = [0.0f32; 16];
    for chunk in whole {
        for (lane, v) in lanes.iter_mut().zip(chunk) {
            *lane += v * v;
        }
    }
    lanes.iter().sum::<f32>() + tail.iter().map(|v| v * v).sum::<f32>()
}
