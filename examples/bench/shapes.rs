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
