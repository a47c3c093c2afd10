//! Multi-tensor dispatches: segments (of any tensors) that run the same compiled variant
//! over the same buffers are updated by one dispatch, each segment a row of the dispatch's
//! table, the way `multi_tensor_apply` walks the chunks of many tensors in one launch.
//!
//! A binding of such a dispatch covers the union of its rows' ranges in that buffer, so
//! tensors packed into a few buffers (a trainer's flat parameter and gradient buffers, the
//! optimizer's own state arenas) cost one dispatch per variant; tensors in buffers of their
//! own still cost one each. Each row gets workgroups in proportion to its length, and
//! `select_entry` in the shader finds a workgroup's row with one load from the table's
//! workgroup map ([`workgroup_map`]), which lists every workgroup's row.
//!
//! The table's fixed-size parts are the Pod structs [`TableHead`], [`TableRow`] and
//! [`RngRow`] (`gpu::kernel`, beside the WGSL that reads them), whose WGSL declarations are
//! generated from the same definitions; the bases and the workgroup map are `vec4<u32>` rows
//! at offsets the prelude names (`ENTRY_BASES`, `ENTRY_RNG`, `MAP_ENTRIES_PER_ROW`).
//!
//! Path of a table field: [`TableDispatch::table`] fills [`TableRow::groups`] → the
//! generated `struct TableRow` and its reader `table_row` (`gpu/kernel/table_layout.rs`) →
//! `row.groups` in `shaders/entry_element.wgsl`. The naga test in `gpu/kernel/tests.rs`
//! checks that WGSL lays out every such struct as `#[repr(C)]` does.

use crate::gpu::kernel::{
    map_rows, rows_per_entry, Program, RngRow, Storage, TableHead, TableRow, VariantKey, MAP_ENTRIES_PER_ROW,
    MAP_ENTRIES_PER_WORD, MAP_ENTRY_BITS, MAX_WORKGROUPS, TABLE_ROWS, WORDS_PER_ROW, WORKGROUP_SIZE,
};
use crate::gpu::packing::{cover, overlap, pack_greedy};
use crate::gpu::plan::{SegmentPlan, TensorPlan};

/// One binding of a dispatch: a byte range of a buffer.
#[derive(Clone, Debug)]
pub(crate) struct Span {
    pub(crate) buffer: wgpu::Buffer,
    pub(crate) offset: u64,
    pub(crate) end: u64,
}

/// One segment as a row of a dispatch's table.
#[derive(Clone, Debug)]
struct Row {
    /// Accesses (elements, or vec4s) in the segment.
    n: u32,
    pair_shift: u32,
    /// Workgroups the row would take uncapped.
    wanted: u32,
    /// Per binding: the byte range of the row's own elements, for the overlap check.
    bytes: Vec<(u64, u64)>,
    /// The tensor's ordinal and the segment's first element in it (stochastic rounding's
    /// counter).
    ordinal: u32,
    first: u64,
}

/// A dispatch's variant, bindings and rows.
#[derive(Clone, Debug)]
pub(crate) struct TableDispatch {
    pub(crate) key: VariantKey,
    /// Pair mode's `(pair_first, pair_step)`: `(0, 1)`, or one of two phases `(k, 2)`.
    pair: (u32, u32),
    pub(crate) spans: Vec<Span>,
    rows: Vec<Row>,
}

impl TableDispatch {
    fn new(key: VariantKey, pair: (u32, u32), segment: &SegmentPlan, row: Row) -> Self {
        let spans = segment
            .ranges
            .iter()
            .map(|r| Span { buffer: r.buffer.clone(), offset: r.offset, end: r.offset + r.size })
            .collect();
        TableDispatch { key, pair, spans, rows: vec![row] }
    }

    /// Adds `row` if the table keeps room for its rows and workgroup map, every binding's
    /// union with the segment's range stays within `max_binding` bytes, the row's elements
    /// stay addressable from the union's start, and the row shares no byte with the rows
    /// already in (a race within one dispatch).
    fn try_add(&mut self, segment: &SegmentPlan, row: &Row, max_binding: u64) -> bool {
        let wanted: u64 = self.rows.iter().chain([row]).map(|r| u64::from(r.wanted)).sum();
        let per_entry = rows_per_entry(self.spans.len(), self.key.stochastic.any());
        if !table_fits(self.rows.len() + 1, per_entry, wanted) {
            return false;
        }
        let mut spans = self.spans.clone();
        for (b, (span, range)) in spans.iter_mut().zip(&segment.ranges).enumerate() {
            // The plan aligned every range's offset already.
            let (offset, end) = cover((span.offset, span.end), (range.offset, range.offset + range.size), 1);
            let unit = unit_bytes(self.key.layout.bindings[b].storage, self.key.width);
            let addressable = (span.offset - offset) % unit == 0 && (range.offset - offset) % unit == 0;
            if end - offset > max_binding || !addressable {
                return false;
            }
            *span = Span { buffer: span.buffer.clone(), offset, end };
        }
        let overlaps = self.rows.iter().any(|other| {
            row.bytes.iter().zip(&segment.ranges).any(|(bytes, range)| {
                other
                    .bytes
                    .iter()
                    .zip(&self.spans)
                    .any(|(taken, span)| span.buffer == range.buffer && overlap(*bytes, *taken))
            })
        });
        if overlaps {
            return false;
        }
        self.spans = spans;
        self.rows.push(row.clone());
        true
    }

    /// Workgroups per row ([`share_workgroups`]).
    fn groups(&self) -> Vec<u32> {
        share_workgroups(&self.rows.iter().map(|r| r.wanted).collect::<Vec<_>>())
    }

    /// Workgroups the dispatch launches.
    pub(crate) fn workgroups(&self) -> u32 {
        self.groups().iter().sum()
    }

    /// The tensor ordinal of each workgroup the dispatch launches, in workgroup order.
    pub(crate) fn owners(&self) -> Vec<u32> {
        let groups = self.groups();
        self.rows
            .iter()
            .zip(groups)
            .flat_map(|(row, g)| std::iter::repeat_n(row.ordinal, g as usize))
            .collect()
    }

    /// The table's words: the [`TableHead`], then per row its [`TableRow`] and the bases of
    /// every binding, relative to the dispatch's spans, four to a row, and with stochastic
    /// stores its [`RngRow`]; then the workgroup map, each workgroup's row index as a `u16`,
    /// two to a word.
    pub(crate) fn table(&self, segments: &[&SegmentPlan], first_workgroup: u32) -> Vec<u32> {
        let stochastic = self.key.stochastic.any();
        let head = TableHead {
            rows: self.rows.len() as u32,
            pair_first: self.pair.0,
            pair_step: self.pair.1,
            first_workgroup,
        };
        let mut words = head.words().to_vec();
        let mut first_group = 0;
        let groups = self.groups();
        for ((row, segment), &groups) in self.rows.iter().zip(segments).zip(&groups) {
            words.extend(TableRow { n: row.n, pair_shift: row.pair_shift, first_group, groups }.words());
            let mut bases = vec![0u32; WORDS_PER_ROW * self.spans.len().div_ceil(WORDS_PER_ROW)];
            for (b, (range, span)) in segment.ranges.iter().zip(&self.spans).enumerate() {
                let unit = unit_bytes(self.key.layout.bindings[b].storage, self.key.width);
                bases[b] = range.base + ((range.offset - span.offset) / unit) as u32;
            }
            words.extend(bases);
            if stochastic {
                let rng = RngRow {
                    ordinal: row.ordinal,
                    first_lo: row.first as u32,
                    first_hi: (row.first >> 32) as u32,
                    reserved: 0,
                };
                words.extend(rng.words());
            }
            first_group += groups;
        }
        debug_assert_eq!(
            words.len(),
            4 * (1 + rows_per_entry(self.spans.len(), stochastic) * self.rows.len())
        );
        words.extend(workgroup_map(&groups));
        debug_assert!(words.len() <= 4 * (1 + TABLE_ROWS));
        words
    }
}

/// Workgroups per entry of a dispatch whose entries want `wanted`: what each wants, scaled
/// down together so that the dispatch launches about [`MAX_WORKGROUPS`] at most (every
/// entry keeps at least one, so at most the cap plus one per entry).
pub(crate) fn share_workgroups(wanted: &[u32]) -> Vec<u32> {
    let total: u64 = wanted.iter().map(|&w| u64::from(w)).sum();
    let cap = u64::from(MAX_WORKGROUPS);
    wanted
        .iter()
        .map(|&w| if total <= cap { w } else { (u64::from(w) * cap / total).max(1) as u32 })
        .collect()
}

/// Whether a table of `entries` entries of `per_entry` rows each, wanting `wanted`
/// workgroups in all, fits in [`TABLE_ROWS`] with its workgroup map.
pub(crate) fn table_fits(entries: usize, per_entry: usize, wanted: u64) -> bool {
    let launched = wanted.min(u64::from(MAX_WORKGROUPS) + entries as u64) as usize;
    per_entry * entries + map_rows(launched) <= TABLE_ROWS
}

/// The workgroup map of a table whose entries take `groups` workgroups each: every
/// workgroup's entry index as a `u16`, two to a word, padded to whole rows.
pub(crate) fn workgroup_map(groups: &[u32]) -> Vec<u32> {
    let mut map: Vec<u16> = Vec::new();
    for (k, &g) in groups.iter().enumerate() {
        map.extend(std::iter::repeat_n(k as u16, g as usize));
    }
    map.resize(MAP_ENTRIES_PER_ROW * map_rows(map.len()), 0);
    map.chunks_exact(MAP_ENTRIES_PER_WORD)
        .map(|word| word.iter().rev().fold(0, |packed, &entry| packed << MAP_ENTRY_BITS | u32::from(entry)))
        .collect()
}

/// Bytes per unit of a binding's base: one access (an element, or a vec4), or one half of
/// a packed word.
fn unit_bytes(storage: Storage, width: u32) -> u64 {
    match storage {
        Storage::Native(dtype) => dtype.size() * u64::from(width),
        Storage::Packed(_) => 2 * u64::from(width),
    }
}

/// Every dispatch of a batch, with the segments of each in row order, shaped for an
/// `adapter` of that type.
pub(crate) fn assemble(
    items: &[(VariantKey, TensorPlan)],
    max_binding: u64,
    adapter: wgpu::DeviceType,
) -> Vec<(TableDispatch, Vec<&SegmentPlan>)> {
    // Each segment as (what its dispatch shares, the segment with its row and pair phase).
    // A segment joins the dispatch still open for its variant and set of buffers (a buffer
    // hashes and compares by identity, which its interior mutability never changes); one
    // with outputs of both parities in pair mode is two dispatches of its own, even pairs
    // then odd pairs.
    let mut entries = Vec::new();
    for (key, plan) in items {
        for segment in &plan.segments {
            let key = key.with_width(segment.width);
            let row = row(&key, plan.ordinal, segment, adapter);
            if key.pairs() && segment.phases == 2 {
                for phase in 0..2 {
                    let half = Row { wanted: row.wanted.div_ceil(2), ..row.clone() };
                    entries.push((None, (key.clone(), (phase, 2), segment, half)));
                }
            } else {
                let buffers: Vec<wgpu::Buffer> = segment.ranges.iter().map(|r| r.buffer.clone()).collect();
                entries.push((Some((key.clone(), buffers)), (key, (0, 1), segment, row)));
            }
        }
    }
    pack_greedy(
        entries,
        |(key, pair, segment, row)| (TableDispatch::new(key, pair, segment, row), vec![segment]),
        |(dispatch, segments), (_, _, segment, row)| {
            let added = dispatch.try_add(segment, row, max_binding);
            if added {
                segments.push(*segment);
            }
            added
        },
    )
}

/// Accesses each invocation takes before the workgroup cap applies. Gradient norms take
/// several, because their per-workgroup reduction costs more than their few bytes per
/// element. Updates take one on a GPU, which hides memory latency with resident
/// invocations, and four on a CPU adapter, which runs each invocation's prologue (the table
/// lookup, the segment's fields) as code; more than four makes big tensors slower there.
fn accesses_per_invocation(key: &VariantKey, adapter: wgpu::DeviceType) -> u32 {
    match (key.program, adapter) {
        (Program::GradNorm(_) | Program::UnscaleNorm(_), _) => 8,
        (_, wgpu::DeviceType::Cpu) => 4,
        _ => 1,
    }
}

/// A segment's row before it joins a dispatch.
fn row(key: &VariantKey, ordinal: u32, segment: &SegmentPlan, adapter: wgpu::DeviceType) -> Row {
    let invocations = if key.pairs() { (segment.len + segment.pair_shift).div_ceil(2) } else { segment.len };
    let bytes = segment
        .ranges
        .iter()
        .enumerate()
        .map(|(b, r)| {
            let unit = unit_bytes(key.layout.bindings[b].storage, key.width);
            let start = r.offset + u64::from(r.base) * unit;
            // Whole words: packed halves are stored a word at a time.
            (start & !3, (start + u64::from(segment.len) * unit).next_multiple_of(4))
        })
        .collect();
    Row {
        n: segment.len,
        pair_shift: segment.pair_shift,
        wanted: invocations.div_ceil(WORKGROUP_SIZE * accesses_per_invocation(key, adapter)).max(1),
        bytes,
        ordinal,
        first: segment.first,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::kernel::TABLE_BYTES;

    #[test]
    fn rows_are_written_in_field_order_and_the_table_is_16_kib() {
        let head = TableHead { rows: 3, pair_first: 1, pair_step: 2, first_workgroup: 7 };
        assert_eq!(head.words(), [3, 1, 2, 7]);
        let row = TableRow { n: 100, pair_shift: 1, first_group: 5, groups: 9 };
        assert_eq!(row.words(), [100, 1, 5, 9]);
        let rng = RngRow { ordinal: 4, first_lo: 6, first_hi: 8, reserved: 0 };
        assert_eq!(rng.words(), [4, 6, 8, 0]);
        assert_eq!(TABLE_BYTES, 16 * 1024);
        // Workgroups 0-2 in entry 0, 3 in entry 1: u16 indices, two to a word, whole rows.
        assert_eq!(workgroup_map(&[3, 1]), [0, 1 << 16, 0, 0]);
    }
}
