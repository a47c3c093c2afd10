// Gradient clipping's first pass: the gradients' global norm, in pieces. The entry point
// folds each invocation's elements with `accumulate` and a workgroup's invocations with
// `combine`, always in the same order, and writes one partial per workgroup; the finalize
// pass (clip_finalize.wgsl) combines the partials. No float atomics: the same gradients
// give the same bits every run.
//
//   NORM_INF  false: sums of squares (the L2 norm is the root of the total).
//             true: the largest magnitude, NaN if any element is NaN (as torch.max).
// The prelude supplies `lanes(g)` (the loaded value as four lanes, zero-padded) and
// norm_combine.wgsl's `combine`.

fn accumulate(acc: f32, g: R) -> f32 {
    let v = lanes(g);
    if NORM_INF {
        let a = abs(v);
        return combine(acc, combine(combine(a.x, a.y), combine(a.z, a.w)));
    }
    return acc + (v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w);
}
