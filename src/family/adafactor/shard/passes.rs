//! The arithmetic of [`super::ShardedAdafactor`]'s three phases over one tensor's piece.
//!
//! A piece is cut into chunks of about [`CHUNK`] elements, each within one matrix of a
//! batch and, where a row is shorter than a chunk, of whole rows (a piece's first and last
//! rows may be partial). The chunks run on the CPU backend's threads (the `cpu` feature;
//! in order without it), each summing into its own partial sums, which are then added in
//! chunk order: the cut depends on the shape and the piece alone, so the same inputs give
//! the same bits on any number of threads.

use std::ops::Range;

use super::ShardTensor;
use crate::family::adafactor::contract::AdafactorUniform64;

/// Elements per chunk: rayon's cost per chunk vanishes next to its work.
const CHUNK: usize = 64 * 1024;
/// Rows whose squares a column adds in f32 before they go into its f64 sum.
const FLUSH: usize = 64;
/// Independent partial sums of a row: the loops vectorize over them.
const LANES: usize = 8;

/// torch's `lerp` (two forms, below and above a weight of one half), in f32 as the passes
/// take it.
fn lerp(start: f32, end: f32, weight: f32) -> f32 {
    let diff = end - start;
    if weight.abs() < 0.5 {
        start + weight * diff
    } else {
        end - diff * (1.0 - weight)
    }
}

/// `torch.clamp(x, min=lo)`: a NaN stays NaN.
fn clamp_min(x: f32, lo: f32) -> f32 {
    if x.is_nan() {
        x
    } else {
        x.max(lo)
    }
}

/// One chunk of a piece, with its partial sums.
#[derive(Clone, Debug, Default)]
struct Chunk {
    /// Its elements, counted from the piece's first.
    elements: Range<usize>,
    /// A matrix: the batch it lies in, its first row (counted over the batches' rows), and
    /// the first column of its column sums.
    batch: usize,
    first_row: usize,
    first_col: usize,
    /// Its sum of `p^2`, and of `U^2`.
    p2: f64,
    u2: f64,
    /// A matrix: the sums of `g^2` of each row it touches.
    rows: Vec<f64>,
    /// A matrix: the sums of `g^2` of each column it touches (from `first_col`), and the
    /// current run of rows' in f32.
    cols: Vec<f64>,
    acc: Vec<f32>,
}

/// A piece's working values between the phases of a step, made with its state.
#[derive(Clone, Debug, Default)]
pub(super) struct Scratch {
    chunks: Vec<Chunk>,
    /// A matrix: each batch's clamped mean of `row_var`.
    denoms: Vec<f32>,
    /// A matrix, each batch: whether no element's `eps1^2` floor can bind and its factors
    /// are finite, so that `U = g sqrt(denom / R_r) / sqrt(C_c)`, a row's factor times a
    /// column's.
    exact: Vec<bool>,
    /// A matrix: `1 / sqrt(col_var)` of each column (`batches * cols`).
    col_inv: Vec<f32>,
}

impl Scratch {
    /// The working values of the piece `elements` of a tensor of `dims` (`None`: a vector).
    pub(super) fn new(dims: Option<(usize, usize, usize)>, elements: &Range<u64>) -> Self {
        let (start, end) = (elements.start as usize, elements.end as usize);
        let Some((batches, rows, cols)) = dims else {
            let chunks = (start..end)
                .step_by(CHUNK)
                .map(|at| Chunk { elements: at - start..(at + CHUNK).min(end) - start, ..Chunk::default() })
                .collect();
            return Scratch { chunks, ..Scratch::default() };
        };
        let span = if cols <= CHUNK { CHUNK / cols * cols } else { CHUNK };
        let matrix = rows * cols;
        let mut chunks = Vec::new();
        let mut at = start;
        while at < end {
            let next = end.min((at / span + 1) * span).min((at / matrix + 1) * matrix);
            let (first_row, last_row) = (at / cols, (next - 1) / cols);
            let (first_col, touched) = if first_row == last_row { (at % cols, next - at) } else { (0, cols) };
            chunks.push(Chunk {
                elements: at - start..next - start,
                batch: at / matrix,
                first_row,
                first_col,
                rows: vec![0.0; last_row - first_row + 1],
                cols: vec![0.0; touched],
                acc: vec![0.0; touched],
                ..Chunk::default()
            });
            at = next;
        }
        Scratch {
            chunks,
            denoms: vec![0.0; batches],
            exact: vec![false; batches],
            col_inv: vec![0.0; batches * cols],
        }
    }
}

/// Runs `f` on every item: on the CPU backend's threads where it is compiled in.
#[cfg(feature = "cpu")]
fn each<T: Send>(items: &mut [T], f: impl Fn(&mut T) + Sync + Send) {
    use rayon::prelude::*;
    items.par_iter_mut().for_each(f);
}

/// Runs `f` on every item, in order.
#[cfg(not(feature = "cpu"))]
fn each<T: Send>(items: &mut [T], f: impl Fn(&mut T) + Sync + Send) {
    items.iter_mut().for_each(f);
}

/// `slice` cut into the chunks' elements.
fn split<'a, T>(mut slice: &'a mut [T], chunks: &[Chunk]) -> Vec<&'a mut [T]> {
    let mut parts = Vec::with_capacity(chunks.len());
    for chunk in chunks {
        let (part, rest) = std::mem::take(&mut slice).split_at_mut(chunk.elements.len());
        parts.push(part);
        slice = rest;
    }
    parts
}

/// `(sum a^2, sum b^2)` of two slices of one length, each in [`LANES`] f32 lanes added in
/// order.
fn squares(a: &[f32], b: &[f32]) -> (f32, f32) {
    let (mut a2, mut b2) = ([0f32; LANES], [0f32; LANES]);
    let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (a_tail, b_tail) = (ac.remainder(), bc.remainder());
    for (a, b) in ac.zip(bc) {
        for k in 0..LANES {
            a2[k] += a[k] * a[k];
            b2[k] += b[k] * b[k];
        }
    }
    for (k, (a, b)) in a_tail.iter().zip(b_tail).enumerate() {
        a2[k] += a * a;
        b2[k] += b * b;
    }
    (a2.iter().sum(), b2.iter().sum())
}

/// `sum (g inv)^2` of a row's gradients and its columns' `1 / sqrt(col_var)`, in [`LANES`]
/// f32 lanes added in order.
fn scaled_squares(g: &[f32], inv: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    let (gc, ic) = (g.chunks_exact(LANES), inv[..g.len()].chunks_exact(LANES));
    let (g_tail, i_tail) = (gc.remainder(), ic.remainder());
    for (g, inv) in gc.zip(ic) {
        for k in 0..LANES {
            let u = g[k] * inv[k];
            lanes[k] += u * u;
        }
    }
    for (k, (g, inv)) in g_tail.iter().zip(i_tail).enumerate() {
        let u = g * inv;
        lanes[k] += u * u;
    }
    lanes.iter().sum()
}

/// The rows a run of `len` elements starting at element `start` of a matrix of `cols`
/// columns (batches' rows counted on) touches: each row's index and the run's elements in
/// it, counted from the run's first.
pub(super) fn segments(start: usize, len: usize, cols: usize) -> impl Iterator<Item = (usize, Range<usize>)> {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at >= len {
            return None;
        }
        let row = (start + at) / cols;
        let end = ((row + 1) * cols - start).min(len);
        let segment = at..end;
        at = end;
        Some((row, segment))
    })
}

/// Phase 1 over a piece `p`, `g`: into `sums` (the tensor's place in the first
/// all-reduce), the sum of `p^2` and, for a matrix, the rows' and columns' partial sums of
/// `g^2`; for a vector, its `variance` and its sum of `U^2`.
pub(super) fn first_sums(tensor: &mut ShardTensor, hp: &AdafactorUniform64, p: &[f32], g: &[f32], sums: &mut [f64]) {
    let start = tensor.elements.start as usize;
    let chunks = &mut tensor.scratch.chunks;
    let Some((batches, rows, cols)) = tensor.dims else {
        let (weight, sign, floor) = (hp.weight as f32, hp.sign as f32, tensor.eps1 * tensor.eps1);
        let variance = split(&mut tensor.first, chunks);
        let mut work: Vec<(&mut Chunk, &mut [f32])> = chunks.iter_mut().zip(variance).collect();
        each(&mut work, |(chunk, variance)| {
            let (p, g) = (&p[chunk.elements.clone()], &g[chunk.elements.clone()]);
            let (mut p2, mut u2) = (0f64, 0f64);
            for ((v, &g), &p) in variance.iter_mut().zip(g).zip(p) {
                let g = g * sign;
                *v = lerp(*v, g * g, weight);
                let u = g / clamp_min(*v, floor).sqrt();
                u2 += f64::from(u) * f64::from(u);
                p2 += f64::from(p) * f64::from(p);
            }
            (chunk.p2, chunk.u2) = (p2, u2);
        });
        sums[0] = chunks.iter().map(|c| c.p2).sum();
        sums[1] = chunks.iter().map(|c| c.u2).sum();
        return;
    };
    each(chunks, |chunk| {
        let (p, g) = (&p[chunk.elements.clone()], &g[chunk.elements.clone()]);
        let first = start + chunk.elements.start;
        chunk.p2 = 0.0;
        chunk.rows.fill(0.0);
        chunk.cols.fill(0.0);
        let flush = |chunk: &mut Chunk| {
            for (sum, acc) in chunk.cols.iter_mut().zip(chunk.acc.iter_mut()) {
                *sum += f64::from(*acc);
                *acc = 0.0;
            }
        };
        for (n, (row, segment)) in segments(first, g.len(), cols).enumerate() {
            let col = (first + segment.start) % cols - chunk.first_col;
            let (g, p) = (&g[segment.clone()], &p[segment]);
            let (row_g2, row_p2) = squares(g, p);
            chunk.rows[row - chunk.first_row] += f64::from(row_g2);
            chunk.p2 += f64::from(row_p2);
            for (acc, &g) in chunk.acc[col..].iter_mut().zip(g) {
                *acc += g * g;
            }
            if (n + 1) % FLUSH == 0 {
                flush(chunk);
            }
        }
        flush(chunk);
    });
    let (head, rest) = sums.split_at_mut(2);
    let (row_sums, col_sums) = rest[..batches * (rows + cols)].split_at_mut(batches * rows);
    head[0] = 0.0;
    for chunk in chunks.iter() {
        head[0] += chunk.p2;
        for (sum, part) in row_sums[chunk.first_row..].iter_mut().zip(&chunk.rows) {
            *sum += part;
        }
        let at = chunk.batch * cols + chunk.first_col;
        for (sum, part) in col_sums[at..].iter_mut().zip(&chunk.cols) {
            *sum += part;
        }
    }
}

/// Phase 2 of a matrix: its `row_var` and `col_var` from the totals (`sums`, the tensor's
/// place in the first all-reduce), each batch's clamped mean of `row_var` and whether its
/// floor can bind, and the partial sum of `U^2` over the piece (of gradients `g`).
pub(super) fn factors(tensor: &mut ShardTensor, hp: &AdafactorUniform64, g: &[f32], sums: &[f64]) -> f64 {
    let Some((batches, rows, cols)) = tensor.dims else { return 0.0 };
    let weight = hp.weight as f32;
    let (row_sums, col_sums) = sums[2..2 + batches * (rows + cols)].split_at(batches * rows);
    for (v, sum) in tensor.first.iter_mut().zip(row_sums) {
        *v = lerp(*v, (sum / cols as f64) as f32, weight);
    }
    for (v, sum) in tensor.second.iter_mut().zip(col_sums) {
        *v = lerp(*v, (sum / rows as f64) as f32, weight);
    }
    let floor = tensor.eps1 * tensor.eps1;
    let scratch = &mut tensor.scratch;
    for b in 0..batches {
        let (rv, cv) = (&tensor.first[b * rows..(b + 1) * rows], &tensor.second[b * cols..(b + 1) * cols]);
        let mean = rv.iter().map(|&v| f64::from(v)).sum::<f64>() / rows as f64;
        let denom = clamp_min(mean as f32, tensor.eps1);
        scratch.denoms[b] = denom;
        // A finite mean means every `row_var` is finite; the smallest `V` is the smallest
        // row's over the denominator times the smallest column's.
        let smallest = |values: &[f32]| values.iter().fold(f32::INFINITY, |a, v| a.min(*v));
        let (min_r, min_c) = (smallest(rv), smallest(cv));
        let finite = denom.is_finite() && cv.iter().all(|c| c.is_finite());
        scratch.exact[b] = finite && min_r > 0.0 && min_c > 0.0 && min_r / denom * min_c >= floor;
        for (inv, c) in scratch.col_inv[b * cols..(b + 1) * cols].iter_mut().zip(cv) {
            *inv = 1.0 / c.sqrt();
        }
    }
    let start = tensor.elements.start as usize;
    let (row_var, col_var) = (&tensor.first[..], &tensor.second[..]);
    let (denoms, exact, col_inv) = (&scratch.denoms[..], &scratch.exact[..], &scratch.col_inv[..]);
    each(&mut scratch.chunks, |chunk| {
        let (g, first, b) = (&g[chunk.elements.clone()], start + chunk.elements.start, chunk.batch);
        chunk.u2 = 0.0;
        for (row, segment) in segments(first, g.len(), cols) {
            let at = b * cols + (first + segment.start) % cols;
            let g = &g[segment];
            if exact[b] {
                let row_factor2 = denoms[b] / row_var[row];
                chunk.u2 += f64::from(scaled_squares(g, &col_inv[at..])) * f64::from(row_factor2);
            } else {
                for (&g, &c) in g.iter().zip(&col_var[at..]) {
                    let u = g / clamp_min(row_var[row] / denoms[b] * c, floor).sqrt();
                    chunk.u2 += f64::from(u) * f64::from(u);
                }
            }
        }
    });
    scratch.chunks.iter().map(|c| c.u2).sum()
}

/// Phase 3: `p = p decay - scale U` over a piece. A matrix's `U` is `g / sqrt(max(row_var /
/// denom col_var, eps1^2))` (the factors' product in the passes' order), or where no floor
/// binds its row's factor times its column's; a vector's `g / sqrt(max(variance, eps1^2))`.
pub(super) fn update(tensor: &ShardTensor, hp: &AdafactorUniform64, scale: f32, p: &mut [f32], g: &[f32]) {
    let (decay, sign, floor) = (hp.decay as f32, hp.sign as f32, tensor.eps1 * tensor.eps1);
    let start = tensor.elements.start as usize;
    let (first, second, scratch) = (&tensor.first[..], &tensor.second[..], &tensor.scratch);
    let (denoms, exact, col_inv) = (&scratch.denoms[..], &scratch.exact[..], &scratch.col_inv[..]);
    let parts = split(p, &scratch.chunks);
    let mut work: Vec<(&Chunk, &mut [f32])> = scratch.chunks.iter().zip(parts).collect();
    let Some((_, _, cols)) = tensor.dims else {
        each(&mut work, |(chunk, p)| {
            let range = chunk.elements.clone();
            for ((p, &g), &v) in p.iter_mut().zip(&g[range.clone()]).zip(&first[range]) {
                let u = g * sign / clamp_min(v, floor).sqrt();
                *p = *p * decay - scale * u;
            }
        });
        return;
    };
    each(&mut work, |(chunk, p)| {
        let (g, at, b) = (&g[chunk.elements.clone()], start + chunk.elements.start, chunk.batch);
        for (row, segment) in segments(at, g.len(), cols) {
            let col = b * cols + (at + segment.start) % cols;
            let (p, g) = (&mut p[segment.clone()], &g[segment]);
            let (row_var, denom) = (first[row], denoms[b]);
            if exact[b] {
                let factor = sign * (denom / row_var).sqrt();
                for ((p, &g), &inv) in p.iter_mut().zip(g).zip(&col_inv[col..]) {
                    *p = *p * decay - scale * (g * factor * inv);
                }
            } else {
                for ((p, &g), &c) in p.iter_mut().zip(g).zip(&second[col..]) {
                    let u = g * sign / clamp_min(row_var / denom * c, floor).sqrt();
                    *p = *p * decay - scale * u;
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A piece's rows: whole rows, a row cut at both ends, and a piece inside one row.
    #[test]
    fn a_piece_is_cut_into_the_rows_it_touches() {
        let got: Vec<_> = segments(5, 12, 4).collect();
        assert_eq!(got, vec![(1, 0..3), (2, 3..7), (3, 7..11), (4, 11..12)]);
        let inside: Vec<_> = segments(9, 2, 4).collect();
        assert_eq!(inside, vec![(2, 0..2)]);
        assert_eq!(segments(0, 0, 4).count(), 0);
    }

    /// Chunks of whole rows within one matrix of a batch, a piece's partial rows at its
    /// ends; rows longer than a chunk cut within the row.
    #[test]
    fn a_piece_is_cut_into_chunks_within_a_matrix_and_of_whole_rows() {
        let rows = CHUNK / 1000;
        let scratch = Scratch::new(Some((2, rows, 1000)), &(500..(2 * rows * 1000) as u64));
        let cuts: Vec<(Range<usize>, usize, usize, usize)> =
            scratch.chunks.iter().map(|c| (c.elements.clone(), c.batch, c.first_row, c.first_col)).collect();
        let span = rows * 1000;
        assert_eq!(
            cuts,
            vec![
                (0..span - 500, 0, 0, 0),
                (span - 500..2 * span - 500, 1, rows, 0),
            ]
        );
        let long = Scratch::new(Some((1, 2, 3 * CHUNK)), &(CHUNK as u64 / 2..3 * CHUNK as u64));
        let cuts: Vec<(Range<usize>, usize, usize)> =
            long.chunks.iter().map(|c| (c.elements.clone(), c.first_row, c.first_col)).collect();
        let half = CHUNK / 2;
        assert_eq!(
            cuts,
            vec![(0..half, 0, half), (half..half + CHUNK, 0, CHUNK), (half + CHUNK..half + 2 * CHUNK, 0, 2 * CHUNK)]
        );
        assert!(long.chunks.iter().all(|c| c.cols.len() == c.elements.len()));
    }
}
