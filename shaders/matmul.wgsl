// Batched matrix product through workgroup memory, f32 accumulation:
//   C[z] = scale * round(alpha * A[z] B[z] + beta * D[z])      z = the batch index (workgroup z)
// with round = to bfloat16 (nearest even) when ROUND_BF16 is set, else none. Every operand
// is addressed as element offset + z * batch + row * row_stride + col * col_stride of its
// storage type, so a transposed operand (X^T in X X^T) or a transposed output is only other
// strides: no copy. All operands live in the one storage binding `data` (the caller's
// regions never overlap C with A, B or D), held as bits, so that no 16-bit pair passes
// through an f32 value whose NaN pattern an implementation may change: an f32 operand's
// element e is word e, a 16-bit one's (bfloat16 or f16, `STORAGE_*` in `mm.dtypes`, two
// bits per operand) is half e % 2 of word e / 2, the low half first. A 16-bit C is written
// a word (two columns) at a time by the invocation that owns both columns, so no two
// invocations write one word (the host checks the layout: columns adjacent, even offset,
// row and batch strides, even n). The prelude (src/gpu/matmul.rs) declares `struct Mm`,
// `TILE_M`, `TILE_N`, `TILE_K`, `MM_WG`, `BINDING_DATA`, `BINDING_PARAMS`, `FLAG_ADD`,
// `FLAG_ROUND_BF16`, `STORAGE_*`, `SHIFT_*`, and shaders/convert.wgsl's conversions.
//
// A workgroup of 16 x 16 invocations computes a TILE_M x TILE_N (64 x 64) block of C, each
// invocation a 4 x 4 block, stepping through K by TILE_K with one tile of A and one of B
// in workgroup memory (2 x 4 KiB). Sizes need not be multiples of the tiles: loads past an
// edge read 0, stores past it are skipped.

@group(0) @binding(BINDING_DATA) var<storage, read_write> data: array<u32>; // bits: f32 words, or two 16-bit halves
@group(0) @binding(BINDING_PARAMS) var<uniform> mm: Mm;

var<workgroup> a_tile: array<f32, TILE_M * TILE_K>; // row-major
var<workgroup> b_tile: array<f32, TILE_K * TILE_N>; // row-major

// The storage type of the operand at `shift` in `dtypes`.
fn operand_dtype(dtypes: u32, shift: u32) -> u32 {
    return (dtypes >> shift) & 3u;
}

// Element `e` of an operand stored as `dtype`.
fn load_element(e: u32, dtype: u32) -> f32 {
    if (dtype == STORAGE_F32) {
        return bitcast<f32>(data[e]);
    }
    let bits16 = (data[e >> 1u] >> ((e & 1u) * 16u)) & 0xffffu;
    if (dtype == STORAGE_BF16) {
        return bf16_value(bits16);
    }
    return f16_value(bits16);
}

@compute @workgroup_size(MM_WG, MM_WG, 1)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let z = wg.z;
    let row0 = wg.y * TILE_M;
    let col0 = wg.x * TILE_N;
    let a_base = mm.a_offset + z * mm.a_batch;
    let b_base = mm.b_offset + z * mm.b_batch;
    let a_storage = operand_dtype(mm.dtypes, SHIFT_A);
    let b_storage = operand_dtype(mm.dtypes, SHIFT_B);
    var acc: array<f32, 16>;
    for (var k0 = 0u; k0 < mm.k; k0 += TILE_K) {
        // Each invocation loads TILE_M * TILE_K / (MM_WG * MM_WG) elements of each tile.
        for (var t = 0u; t < TILE_M * TILE_K / (MM_WG * MM_WG); t++) {
            let e = li + t * MM_WG * MM_WG;
            let ar = e / TILE_K;
            let ak = e % TILE_K;
            var av = 0.0;
            if (row0 + ar < mm.m && k0 + ak < mm.k) {
                av = load_element(a_base + (row0 + ar) * mm.a_row + (k0 + ak) * mm.a_col, a_storage);
            }
            a_tile[e] = av;
            let bk = e / TILE_N;
            let bc = e % TILE_N;
            var bv = 0.0;
            if (k0 + bk < mm.k && col0 + bc < mm.n) {
                bv = load_element(b_base + (k0 + bk) * mm.b_row + (col0 + bc) * mm.b_col, b_storage);
            }
            b_tile[e] = bv;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TILE_K; kk++) {
            var a: array<f32, 4>;
            var b: array<f32, 4>;
            for (var i = 0u; i < 4u; i++) {
                a[i] = a_tile[(lid.y * 4u + i) * TILE_K + kk];
                b[i] = b_tile[kk * TILE_N + lid.x * 4u + i];
            }
            for (var i = 0u; i < 4u; i++) {
                for (var j = 0u; j < 4u; j++) {
                    acc[i * 4u + j] = fma(a[i], b[j], acc[i * 4u + j]);
                }
            }
        }
        workgroupBarrier();
    }
    let d_base = mm.d_offset + z * mm.d_batch;
    let c_base = mm.c_offset + z * mm.c_batch;
    let d_storage = operand_dtype(mm.dtypes, SHIFT_D);
    let c_storage = operand_dtype(mm.dtypes, SHIFT_C);
    for (var i = 0u; i < 4u; i++) {
        let r = row0 + lid.y * 4u + i;
        var results: array<f32, 4>;
        for (var j = 0u; j < 4u; j++) {
            let c = col0 + lid.x * 4u + j;
            if (r < mm.m && c < mm.n) {
                var v = mm.alpha * acc[i * 4u + j];
                if ((mm.flags & FLAG_ADD) != 0u) {
                    v += mm.beta * load_element(d_base + r * mm.d_row + c * mm.d_col, d_storage);
                }
                if ((mm.flags & FLAG_ROUND_BF16) != 0u) {
                    v = round_bf16(v);
                }
                results[j] = mm.scale * v;
                if (c_storage == STORAGE_F32) {
                    data[c_base + r * mm.c_row + c * mm.c_col] = bitcast<u32>(results[j]);
                }
            }
        }
        // A 16-bit C: columns 2j and 2j + 1 (both inside or both past the edge: n is even)
        // share a word.
        if (c_storage != STORAGE_F32 && r < mm.m) {
            for (var j = 0u; j < 4u; j += 2u) {
                let c = col0 + lid.x * 4u + j;
                if (c < mm.n) {
                    let word = half_bits(results[j], c_storage) | (half_bits(results[j + 1u], c_storage) << 16u);
                    data[(c_base + r * mm.c_row + c) >> 1u] = word;
                }
            }
        }
    }
}
