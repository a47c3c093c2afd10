// The entry point of LAMB's two table passes (src/family/lamb/lamb.wgsl, src/family/lamb/shader.rs). The
// entry's workgroups stride over its accesses, one at a time, or with PAIRS one aligned pair
// of elements at a time (as entry_pair.wgsl, for packed 16-bit outputs). Each workgroup has
// a slot, `table.head.first_workgroup` plus its index:
//   moments pass: the workgroup folds its invocations' `lamb_sums` in a fixed order
//                 (WG / LAMB_FOLD sums of LAMB_FOLD, then their sum, as grad_norm.wgsl) and
//                 writes them to `pass_partials[slot]`;
//   apply pass:   the workgroup's tensor is `pass_index[4 + slot]`; its applied ratio is in
//                 the norms the combine pass wrote (src/family/lamb/shader.rs, `IndexLayout`).
//
// The generated prelude supplies WG, table, table_row, select_entry, prologue (host scalars:
// always true), setup, update, APPLY, PAIRS, LAMB_FOLD, lamb_sums, lamb_rate, pass_partials,
// pass_index and hp.

var<workgroup> lamb_lanes: array<vec2<f32>, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    // Host scalars: the prologue copies them and never skips (no early return before the
    // barriers below).
    _ = prologue();
    let e = select_entry(wid.x);
    setup(e);
    let row = table_row(e);
    let slot = table.head.first_workgroup + wid.x;
    if APPLY {
        let t = pass_index[4u + slot];
        lamb_rate = f32(hp.step_size) * bitcast<f32>(pass_index[pass_index[2] + 4u * t + 3u]);
    }
    if PAIRS {
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
    } else {
        let stride = row.groups * WG;
        for (var i = (wid.x - row.first_group) * WG + lid; i < seg.n; i += stride) {
            update(i);
        }
    }
    if APPLY {
        return;
    }
    lamb_lanes[lid] = lamb_sums;
    workgroupBarrier();
    if lid < WG / LAMB_FOLD {
        var sum = lamb_lanes[LAMB_FOLD * lid];
        for (var k = 1u; k < LAMB_FOLD; k++) {
            sum += lamb_lanes[LAMB_FOLD * lid + k];
        }
        lamb_lanes[LAMB_FOLD * lid] = sum;
    }
    workgroupBarrier();
    if lid == 0u {
        var sum = lamb_lanes[0];
        for (var k = 1u; k < WG / LAMB_FOLD; k++) {
            sum += lamb_lanes[LAMB_FOLD * k];
        }
        pass_partials[slot] = sum;
    }
}
