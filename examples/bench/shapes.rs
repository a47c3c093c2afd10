//! Model shapes the benchmarks and tests share.

/// GPT-2 small's 148 parameter tensors (124.4 M parameters at `scale` 1), as PyTorch lists
/// them, with every width divided by `scale` (the depth stays 12 layers).
pub fn gpt2_small(scale: u64) -> Vec<u64> {
    let (d, vocab, ctx_len) = (768 / scale, 50257 / scale, 1024 / scale);
    let mut sizes = vec![vocab * d, ctx_len * d];
    for _ in 0..12 {
        sizes.extend([d, d, d * 3 * d, 3 * d, d * d, d, d, d, d * 4 * d, 4 * d, 4 * d * d, d]);
    }
    sizes.extend([d, d]);
    sizes
}

/// Each tensor of `sizes` as a matrix where it can be one, for the algorithms that need
/// shapes (Adafactor): rows of 1024 (GPT-2's widths: 768) where the size divides into two
/// or more of them, a vector otherwise.
#[allow(dead_code)]
pub fn matrices(sizes: &[u64]) -> Vec<Vec<usize>> {
    sizes
        .iter()
        .map(|&n| {
            let n = n as usize;
            match [1024, 768].into_iter().find(|w| n >= 2 * w && n.is_multiple_of(*w)) {
                Some(w) => vec![n / w, w],
                None => vec![n],
            }
        })
        .collect()
}
