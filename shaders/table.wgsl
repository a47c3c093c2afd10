// The table of a multi-tensor dispatch (src/gpu/table.rs), as both table kernels read it:
// the update, unscale and norm kernels (src/gpu/kernel/) and the 8-bit kernels
// (src/gpu/q8/shader.rs).
//
// The generated prelude supplies, before this file:
//   struct TableHead        the table's first row (rows, pair_first, pair_step,
//                           first_workgroup), from gpu::table::TableHead.
//   TABLE_ROWS              vec4<u32> rows after the head.
//   ENTRY_ROWS              rows of one entry.
//   WORDS_PER_ROW           u32 words in a row (4).
//   MAP_ENTRY_BITS,         bits of one workgroup map entry (an entry index), entries in one
//   MAP_ENTRIES_PER_WORD,   word, and entries in one row.
//   MAP_ENTRIES_PER_ROW
//   GROUP_TABLE,            the table's bind group and binding.
//   BINDING_TABLE
//
// This file provides `table` and `entry_row(w)`: the first row of the entry that workgroup w
// works on, from the workgroup map after the table's entries.

struct Table {
    head: TableHead,
    rows: array<vec4<u32>, TABLE_ROWS>,
}

@group(GROUP_TABLE) @binding(BINDING_TABLE) var<uniform> table: Table;

fn entry_row(w: u32) -> u32 {
    let map_row = ENTRY_ROWS * table.head.rows + w / MAP_ENTRIES_PER_ROW;
    let word = table.rows[map_row][(w / MAP_ENTRIES_PER_WORD) % WORDS_PER_ROW];
    let shift = (w % MAP_ENTRIES_PER_WORD) * MAP_ENTRY_BITS;
    return ENTRY_ROWS * ((word >> shift) & ((1u << MAP_ENTRY_BITS) - 1u));
}
