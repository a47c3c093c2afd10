// The entry point of the gradient-norm passes: each invocation folds the elements it strides
// over into one f32 with `accumulate`, the workgroup folds its WG invocations' values with
// `combine` in a fixed order (WG / NORM_FOLD sums of NORM_FOLD, then their sum), and
// invocation 0 writes the result to the workgroup's own slot: the dispatch's first slot
// (`table.head.first_workgroup`) plus its workgroup index. The same inputs and dispatch give
// the same bits on every run.
//
// The generated prelude supplies:
//   WG, NORM_FOLD           the workgroup size and the fold's group size (consts; NORM_FOLD
//                           divides WG).
//   table, table_row(r), select_entry(w)   as for entry_element.wgsl.
//   partials                group 0's array of partial norms.
//   norm_term(i) -> R       access i as the norm sees it (loaded, or unscaled and stored).
//   accumulate, combine     grad_norm.wgsl and norm_combine.wgsl.
// The pass reads no scalars beyond its bindings, so it has no prologue.

var<workgroup> norm_lanes: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let e = select_entry(wid.x);
    let row = table_row(e);
    let stride = row.groups * WG;
    var acc = 0.0;
    for (var i = (wid.x - row.first_group) * WG + lid; i < seg.n; i += stride) {
        acc = accumulate(acc, norm_term(i));
    }
    norm_lanes[lid] = acc;
    // Two levels, so that each barrier is followed by short loops.
    workgroupBarrier();
    if lid < WG / NORM_FOLD {
        var sum = norm_lanes[NORM_FOLD * lid];
        for (var k = 1u; k < NORM_FOLD; k++) {
            sum = combine(sum, norm_lanes[NORM_FOLD * lid + k]);
        }
        norm_lanes[NORM_FOLD * lid] = sum;
    }
    workgroupBarrier();
    if lid == 0u {
        var sum = norm_lanes[0];
        for (var k = 1u; k < WG / NORM_FOLD; k++) {
            sum = combine(sum, norm_lanes[NORM_FOLD * k]);
        }
        partials[table.head.first_workgroup + wid.x] = sum;
    }
}
