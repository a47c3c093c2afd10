//! The dispatch table's layout (its head, its entries' rows and its workgroup map) and the
//! WGSL that declares and reads it; `gpu::table` fills it.

use std::fmt::Write;

use crate::step::fields::shader_struct;

shader_struct! {
    /// The head of a dispatch's table (`table.head` in WGSL).
    #[derive(Default, Eq)]
    TableHead {
        /// Entries (rows of segments) in the table.
        rows: u32,
        /// Pair mode's first pair of each invocation's stride: 0, or the phase (0 or 1).
        pair_first: u32,
        /// Pair mode's stride between an invocation's pairs, in units of the stride: 1, or 2
        /// when even and odd pairs run in two phases.
        pair_step: u32,
        /// Workgroups of the batch's earlier dispatches: where the gradient-norm pass puts
        /// this dispatch's first partial.
        first_workgroup: u32,
    }
}

shader_struct! {
    /// The first row of a table entry (`table_row(e)` in WGSL).
    #[derive(Default, Eq)]
    TableRow {
        /// Accesses (elements, or vec4s) in the segment.
        n: u32,
        /// Pair mode: 1 where the segment starts on the odd half of a packed word.
        pair_shift: u32,
        /// The entry's first workgroup within the dispatch.
        first_group: u32,
        /// The entry's workgroups: the stride of its grid-stride loop.
        groups: u32,
    }
}

shader_struct! {
    /// The last row of a table entry with stochastic stores: what the rounding hash takes
    /// from the segment (`rng_row(...)` in WGSL).
    #[derive(Default, Eq)]
    RngRow {
        /// The tensor's ordinal.
        ordinal: u32,
        /// The segment's first element in its tensor, low 32 bits.
        first_lo: u32,
        /// The segment's first element in its tensor, high 32 bits.
        first_hi: u32,
        /// 0.
        reserved: u32,
    }
}

/// `vec4<u32>` rows of a dispatch's table after its [`TableHead`]: each entry's rows, then
/// the workgroup map. The table is one uniform binding of 16 KiB, which every adapter allows
/// (downlevel included).
pub(crate) const TABLE_ROWS: usize = 1023;
/// Bytes of a dispatch's table binding.
pub(crate) const TABLE_BYTES: u64 = (std::mem::size_of::<TableHead>() + 16 * TABLE_ROWS) as u64;

/// The row of an entry where its bases start, after its [`TableRow`].
const ENTRY_BASES: usize = 1;

/// `u32` words in a row of the table (a `vec4<u32>`): the bases of as many bindings.
pub(crate) const WORDS_PER_ROW: usize = 4;

/// Bits of one workgroup map entry: an entry index as a `u16` (entries and map rows together
/// stay under [`TABLE_ROWS`], so every index fits).
pub(crate) const MAP_ENTRY_BITS: usize = 16;

/// Workgroup map entries packed into one `u32` word.
pub(crate) const MAP_ENTRIES_PER_WORD: usize = 32 / MAP_ENTRY_BITS;

/// Workgroups per row of the workgroup map.
pub(crate) const MAP_ENTRIES_PER_ROW: usize = MAP_ENTRIES_PER_WORD * WORDS_PER_ROW;

/// `vec4<u32>` rows per table entry of a layout with `bindings` storage bindings: its
/// [`TableRow`], then the bases, [`WORDS_PER_ROW`] to a row, then with stochastic stores
/// its [`RngRow`].
pub(crate) fn rows_per_entry(bindings: usize, stochastic: bool) -> usize {
    ENTRY_BASES + bindings.div_ceil(WORDS_PER_ROW) + usize::from(stochastic)
}

/// Rows of the workgroup map that follows a table's entries: each workgroup's entry as a
/// `u16`, [`MAP_ENTRIES_PER_ROW`] to a row. A lookup is one load, where a search over the
/// entries would take a dependent load per step, which a CPU adapter runs per invocation.
pub(crate) fn map_rows(workgroups: usize) -> usize {
    workgroups.div_ceil(MAP_ENTRIES_PER_ROW)
}

/// What every multi-tensor table declares, whatever its entries hold: `struct TableHead`,
/// `struct Table` (the head, then [`TABLE_ROWS`] `vec4<u32>` rows), `table` at
/// `BINDING_TABLE` of group 1 (so after [`binding_wgsl`](super::binding_wgsl)), `TABLE_ROWS`, `ENTRY_ROWS`
/// (`per_entry`, the rows of one entry), `MAP_ENTRIES_PER_ROW`, and `entry_row(w)`, the first
/// row of workgroup `w`'s entry.
pub(crate) fn table_head_wgsl(per_entry: usize) -> String {
    let mut s = TableHead::wgsl();
    let constants = [
        ("TABLE_ROWS", TABLE_ROWS),
        ("ENTRY_ROWS", per_entry),
        ("WORDS_PER_ROW", WORDS_PER_ROW),
        ("MAP_ENTRY_BITS", MAP_ENTRY_BITS),
        ("MAP_ENTRIES_PER_WORD", MAP_ENTRIES_PER_WORD),
        ("MAP_ENTRIES_PER_ROW", MAP_ENTRIES_PER_ROW),
    ];
    for (name, value) in constants {
        let _ = writeln!(s, "const {name}: u32 = {value}u;");
    }
    s + include_str!("../../../shaders/table.wgsl")
}

/// The dispatch's table of segments (its [`TableHead`], each entry's [`TableRow`], bases and
/// [`RngRow`], the workgroup map) and `select_entry(w)` (`shaders/table_select.wgsl`), which
/// finds the entry whose workgroups include workgroup `w` in the workgroup map
/// ([`map_rows`]), loads it into `seg` and returns its first row; with stochastic stores
/// `rng_begin` (`shaders/table_rng.wgsl`).
pub(super) fn table_wgsl(bindings: usize, stochastic: bool) -> String {
    let per_entry = rows_per_entry(bindings, stochastic);
    let mut s = table_head_wgsl(per_entry) + &TableRow::wgsl() + &TableRow::reader_wgsl("table_row");
    let _ = writeln!(s, "const ENTRY_BASES: u32 = {ENTRY_BASES}u;");
    // The one part that depends on the layout: each binding's base, from its row and word.
    s.push_str("fn load_bases(e: u32) {\n");
    for b in 0..bindings {
        let _ = writeln!(
            s,
            "    seg.base{b} = table.rows[e + ENTRY_BASES + {}u][{}u];",
            b / WORDS_PER_ROW,
            b % WORDS_PER_ROW
        );
    }
    s.push_str("}\n");
    s.push_str(include_str!("../../../shaders/table_select.wgsl"));
    if stochastic {
        s.push_str(&RngRow::wgsl());
        s.push_str(&RngRow::reader_wgsl("rng_row"));
        let _ = writeln!(s, "const ENTRY_RNG: u32 = {}u;", per_entry - 1);
        s.push_str(include_str!("../../../shaders/table_rng.wgsl"));
    }
    s
}
