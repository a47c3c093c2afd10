//! The two rooflines a row is compared with, measured in the same run: the adapter's copy
//! bandwidth (a plain copy shader with the update's reads and writes) and the host's
//! bandwidth for a comparable in-place loop.

use std::collections::HashMap;
use std::time::Instant;

use rayon::prelude::*;
use wgpu_optim::{CopyRoofline, GpuContext, GpuTimer, Result};

/// Rooflines by (reads, writes), measured once per run.
#[derive(Default)]
pub struct Rooflines {
    gpu: HashMap<(u32, u32, u64), f64>,
    host: HashMap<(u32, u32, u64), f64>,
}

/// Enough f32 elements per array to move `bytes` with `reads + writes` arrays.
fn elements_for(bytes: u64, reads: u32, writes: u32) -> u64 {
    (bytes / (4 * u64::from(reads + writes))).max(1024)
}

impl Rooflines {
    /// The adapter's copy bandwidth in GB/s for `bytes` per step. Arrays are capped at the
    /// largest storage binding; bandwidth is a rate, so that only trims the largest sizes.
    pub fn gpu(
        &mut self,
        ctx: &GpuContext,
        timer: &mut GpuTimer,
        bytes: u64,
        reads: u32,
        writes: u32,
        reps: usize,
    ) -> Result<f64> {
        let cap = ctx.report().max_storage_buffer_binding_size / 4 / 16 * 16;
        let elements = elements_for(bytes, reads, writes).min(cap);
        if let Some(gbps) = self.gpu.get(&(reads, writes, elements)) {
            return Ok(*gbps);
        }
        let copy = CopyRoofline::new(ctx, elements, reads, writes)?;
        copy.median_time(timer, 1)?; // compile and warm
        let time = copy.median_time(timer, reps)?;
        let gbps = copy.bytes as f64 / time.as_secs_f64() / 1e9;
        self.gpu.insert((reads, writes, elements), gbps);
        Ok(gbps)
    }

    /// The host's bandwidth in GB/s for an in-place loop over f32 arrays moving `bytes`:
    /// `writes` arrays updated in place from themselves and the other `reads - writes`.
    pub fn host(&mut self, bytes: u64, reads: u32, writes: u32, reps: usize) -> f64 {
        let elements = elements_for(bytes, reads, writes) as usize;
        if let Some(gbps) = self.host.get(&(reads, writes, elements as u64)) {
            return *gbps;
        }
        let mut written: Vec<Vec<f32>> = (0..writes).map(|k| vec![0.5 + k as f32; elements]).collect();
        let read_only: Vec<Vec<f32>> = (writes..reads).map(|k| vec![1e-3 * k as f32; elements]).collect();
        let mut times = Vec::new();
        for _ in 0..=reps {
            let start = Instant::now();
            inplace_pass(&mut written, &read_only);
            times.push(start.elapsed());
        }
        times.remove(0); // first touch
        times.sort();
        let gbps = (4 * u64::from(reads + writes) * elements as u64) as f64
            / times[times.len() / 2].as_secs_f64()
            / 1e9;
        self.host.insert((reads, writes, elements as u64), gbps);
        gbps
    }
}

/// One streaming pass on all cores in chunks the compiler vectorizes.
fn inplace_pass(written: &mut [Vec<f32>], read_only: &[Vec<f32>]) {
    match (written.len(), read_only.len()) {
        (1, 1) => pass::<1, 1>(written, read_only),
        (2, 1) => pass::<2, 1>(written, read_only),
        (3, 1) => pass::<3, 1>(written, read_only),
        (4, 1) => pass::<4, 1>(written, read_only),
        (w, r) => unreachable!("no roofline loop for {w} written and {r} read-only arrays"),
    }
}

/// `W` arrays updated in place from themselves and the sum of `R` read-only arrays; the
/// array counts are constants so the element loop unrolls and vectorizes.
fn pass<const W: usize, const R: usize>(written: &mut [Vec<f32>], read_only: &[Vec<f32>]) {
    const CHUNK: usize = 1 << 15;
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
        for i in 0..outs[0].len() {
            let mut s = 0.0;
            for input in &ins {
                s += input[i];
            }
            for out in outs.iter_mut() {
                out[i] = out[i] * 0.999 + s;
            }
        }
    });
}
