// The entry point of update and unscale kernels whose invocations take one access (an
// element, or four with vec4 math) per iteration: the entry's workgroups stride over its
// accesses.
//
// The generated prelude (src/gpu/kernel/prelude.rs) supplies:
//   WG                      the workgroup size (a const).
//   table, table_row(r)     the dispatch's table and its row r as a `TableRow` (n, pair_shift,
//                           first_group, groups).
//   select_entry(w) -> e    finds workgroup w's entry, loads it into `seg` (n, pair_shift,
//                           pair_first, pair_step and the bases), returns its first row.
//   prologue() -> bool      the invocation's private copies of the step's scalars; false
//                           where the step is skipped (capturable mode after AMP found an
//                           infinity).
//   setup(e)                per-entry state (stochastic rounding's key); may be empty.
//   update(i)               the body (shaders/<family>.wgsl, or unscale.wgsl): access i.

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    if !prologue() {
        return;
    }
    let e = select_entry(wid.x);
    setup(e);
    let row = table_row(e);
    let stride = row.groups * WG;
    for (var i = (wid.x - row.first_group) * WG + lid; i < seg.n; i += stride) {
        update(i);
    }
}
