// `select_entry(w)` of the update, unscale and norm kernels: finds workgroup w's entry, loads
// it into the private `seg`, and returns the entry's first row.
//
// The generated prelude supplies, before this file: `table` and `entry_row(w)`
// (shaders/table.wgsl), `table_row(r)` (row r as a `TableRow`), the private `seg`
// (n, pair_shift, pair_first, pair_step and base<b> for every binding b), and
// `load_bases(e)`, which fills each `seg.base<b>` from entry e's rows.

fn select_entry(w: u32) -> u32 {
    let e = entry_row(w);
    let row = table_row(e);
    seg.n = row.n;
    seg.pair_shift = row.pair_shift;
    seg.pair_first = table.head.pair_first;
    seg.pair_step = table.head.pair_step;
    load_bases(e);
    return e;
}
