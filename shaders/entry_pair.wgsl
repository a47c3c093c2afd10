// The entry point of update kernels that write packed 16-bit outputs one element at a time:
// each invocation takes one aligned pair of elements per iteration. Pair k holds the elements
// 2k - pair_shift and 2k + 1 - pair_shift, which share one word of every packed output whose
// parity is pair_shift. Outputs of the other parity are updated in two phases (pair_step 2),
// even pairs then odd pairs, so no word is written by two invocations.
//
// The generated prelude supplies the same names as for entry_element.wgsl: WG, table,
// table_row, select_entry (which also loads seg.pair_shift, seg.pair_first and
// seg.pair_step), prologue, setup and update.

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    if !prologue() {
        return;
    }
    let e = select_entry(wid.x);
    setup(e);
    let row = table_row(e);
    let stride = row.groups * WG * seg.pair_step;
    let pairs = (seg.n + seg.pair_shift + 1u) / 2u;
    for (var k = ((wid.x - row.first_group) * WG + lid) * seg.pair_step + seg.pair_first; k < pairs; k += stride) {
        let first = 2u * k;
        if first >= seg.pair_shift {
            update(first - seg.pair_shift);
        }
        let second = first + 1u - seg.pair_shift;
        if second < seg.n {
            update(second);
        }
    }
}
