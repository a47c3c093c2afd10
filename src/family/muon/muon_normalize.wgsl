// Muon's Newton-Schulz input: X = U / max(||U||_F, eps), with U (rows x cols, the
// parameter's layout) read from its region and X written transposed when the matrix is
// tall (rows > cols), so that X is always min x max. One workgroup per matrix (the batch
// index is the workgroup's x); the norm's sum of squares is a fixed partition over the
// workgroup's invocations and a fixed tree in workgroup memory: deterministic, no atomics.
// With ROUND_BF16 every value is rounded to bfloat16 as torch's bfloat16 tensors are: U
// as it is cast, the norm, eps, and the quotient. U is f32; X is f32, or bfloat16 or f16
// (`nm.x_storage`, element e in half e % 2 of word e / 2), then written a word at a time by
// the invocation that owns both of its elements (`count` is even). The products' prelude
// (src/gpu/matmul.rs) declares `BINDING_DATA`, `BINDING_PARAMS`, `FLAG_ROUND_BF16`,
// `STORAGE_*`, `round_bf16`, `half_bits` and shaders/convert.wgsl's conversions;
// normalize.rs adds `struct Norm` and `NORM_WG` (a power of two).

@group(0) @binding(BINDING_DATA) var<storage, read_write> data: array<u32>; // bits, as in shaders/matmul.wgsl
@group(0) @binding(BINDING_PARAMS) var<uniform> nm: Norm;

var<workgroup> partial: array<f32, NORM_WG>;

fn ns_round(v: f32) -> f32 {
    if ((nm.flags & FLAG_ROUND_BF16) != 0u) {
        return round_bf16(v);
    }
    return v;
}

@compute @workgroup_size(NORM_WG, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let z = wg.x;
    let count = nm.rows * nm.cols;
    let u_base = nm.u_offset + z * count;
    let x_base = nm.x_offset + z * count;
    var sum = 0.0;
    for (var e = li; e < count; e += NORM_WG) {
        let v = ns_round(bitcast<f32>(data[u_base + e]));
        sum = fma(v, v, sum);
    }
    partial[li] = sum;
    workgroupBarrier();
    for (var stride = NORM_WG / 2u; stride > 0u; stride >>= 1u) {
        if (li < stride) {
            partial[li] += partial[li + stride];
        }
        workgroupBarrier();
    }
    let norm = ns_round(max(ns_round(sqrt(partial[0])), ns_round(nm.eps)));
    let tall = nm.rows > nm.cols;
    if (nm.x_storage == STORAGE_F32) {
        for (var e = li; e < count; e += NORM_WG) {
            let r = e / nm.cols;
            let c = e % nm.cols;
            // X[c][r] (rows columns per row) for a tall matrix, X[r][c] otherwise.
            let dest = select(e, c * nm.rows + r, tall);
            data[x_base + dest] = bitcast<u32>(ns_round(ns_round(bitcast<f32>(data[u_base + e])) / norm));
        }
        return;
    }
    // A 16-bit X, a word (X's elements 2w and 2w + 1) per iteration.
    for (var w = li; w < count / 2u; w += NORM_WG) {
        var bits = 0u;
        for (var h = 0u; h < 2u; h++) {
            let dest = 2u * w + h;
            // X is min x max: a tall matrix's X[c][r] is U[r][c].
            let source = select(dest, (dest % nm.rows) * nm.cols + dest / nm.rows, tall);
            let x = ns_round(ns_round(bitcast<f32>(data[u_base + source])) / norm);
            bits |= half_bits(x, nm.x_storage) << (16u * h);
        }
        data[(x_base + 2u * w) >> 1u] = bits;
    }
}
