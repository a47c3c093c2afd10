// Batched matrix product through workgroup memory, f32 accumulation:
//   C[z] = scale * round(alpha * A[z] B[z] + beta * D[z])      z = the batch index (workgroup z)
// with round = to bfloat16 (nearest even) when ROUND_BF16 is set, else none. Every operand
// is addressed as data[offset + z * batch + row * row_stride + col * col_stride], so a
// transposed operand (X^T in X X^T) or a transposed output is only other strides: no copy.
// All operands live in the one f32 storage binding `data` (the caller's regions never
// overlap C with A, B or D). The prelude (src/gpu/matmul.rs) declares `struct Mm`,
// `TILE_M`, `TILE_N`, `TILE_K`, `MM_WG`, `BINDING_DATA`, `BINDING_PARAMS`,
// `FLAG_ADD`, `FLAG_ROUND_BF16`.
//
// A workgroup of 16 x 16 invocations computes a TILE_M x TILE_N (64 x 64) block of C, each
// invocation a 4 x 4 block, stepping through K by TILE_K with one tile of A and one of B
// in workgroup memory (2 x 4 KiB). Sizes need not be multiples of the tiles: loads past an
// edge read 0, stores past it are skipped.

@group(0) @binding(BINDING_DATA) var<storage, read_write> data: array<f32>;
@group(0) @binding(BINDING_PARAMS) var<uniform> mm: Mm;

var<workgroup> a_tile: array<f32, TILE_M * TILE_K>; // row-major
var<workgroup> b_tile: array<f32, TILE_K * TILE_N>; // row-major

fn round_bf16(v: f32) -> f32 {
    let bits = bitcast<u32>(v);
    if ((bits & 0x7f800000u) == 0x7f800000u) {
        return v; // infinities and NaN unchanged
    }
    let rounded = bits + 0x7fffu + ((bits >> 16u) & 1u);
    return bitcast<f32>(rounded & 0xffff0000u);
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
    var acc: array<f32, 16>;
    for (var k0 = 0u; k0 < mm.k; k0 += TILE_K) {
        // Each invocation loads TILE_M * TILE_K / (MM_WG * MM_WG) elements of each tile.
        for (var t = 0u; t < TILE_M * TILE_K / (MM_WG * MM_WG); t++) {
            let e = li + t * MM_WG * MM_WG;
            let ar = e / TILE_K;
            let ak = e % TILE_K;
            var av = 0.0;
            if (row0 + ar < mm.m && k0 + ak < mm.k) {
                av = data[a_base + (row0 + ar) * mm.a_row + (k0 + ak) * mm.a_col];
            }
            a_tile[e] = av;
            let bk = e / TILE_N;
            let bc = e % TILE_N;
            var bv = 0.0;
            if (k0 + bk < mm.k && col0 + bc < mm.n) {
                bv = data[b_base + (k0 + bk) * mm.b_row + (col0 + bc) * mm.b_col];
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
    for (var i = 0u; i < 4u; i++) {
        let r = row0 + lid.y * 4u + i;
        for (var j = 0u; j < 4u; j++) {
            let c = col0 + lid.x * 4u + j;
            if (r < mm.m && c < mm.n) {
                var v = mm.alpha * acc[i * 4u + j];
                if ((mm.flags & FLAG_ADD) != 0u) {
                    v += mm.beta * data[d_base + r * mm.d_row + c * mm.d_col];
                }
                if ((mm.flags & FLAG_ROUND_BF16) != 0u) {
                    v = round_bf16(v);
                }
                data[c_base + r * mm.c_row + c * mm.c_col] = mm.scale * v;
            }
        }
    }
}
