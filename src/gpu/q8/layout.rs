//! The host/shader contract of an 8-bit step's group 1: the dispatch's table entry as a
//! `#[repr(C)]` Pod struct whose WGSL declaration and reader are generated from the same
//! field list by `shader_struct!`, as the multi-tensor table's are (the layout test in
//! `gpu::q8::tests` checks naga's offsets against Rust's). The table itself is the
//! multi-tensor table's: a [`crate::gpu::table::TableHead`], then `vec4<u32>` rows, then the
//! workgroup map.

use crate::step::fields::shader_struct;

/// The most states a segment has (Adam's two moments).
pub(crate) const MAX_STATES: usize = 2;

// `Segment` holds the states' words as `vec2<u32>`, and shaders/q8_codes.wgsl, q8_serial.wgsl
// and q8_f32.wgsl keep them as `vec2` pairs (`.x`, `.y`): a third state changes those too.
const _: () = assert!(MAX_STATES == 2);

shader_struct! {
    /// One segment (a tensor, or a chunk of one) in a dispatch's table. Bases are relative
    /// to the dispatch's bindings; states are in the order of the variant's state kinds.
    /// `segment_at(r)` in WGSL reads one from its rows.
    #[derive(Default, Eq)]
    Segment {
        /// Elements.
        n: u32,
        /// Blocks of [`crate::q8::BLOCK_SIZE`] elements (the last may be partial).
        blocks: u32,
        /// The segment's first workgroup within the dispatch.
        first_group: u32,
        /// Workgroups the segment takes.
        groups: u32,
        /// The first parameter within the parameters' binding, in elements.
        param: u32,
        /// The first gradient within the gradients' binding (or the parameters', where the
        /// gradients lie there), in elements.
        grad: u32,
        /// Per state: its first word (codes, four to a word, or f32 values) in the arena.
        values: [u32; MAX_STATES],
        /// Per state: its first absmax word in the arena (8-bit states only).
        absmax: [u32; MAX_STATES],
        /// Pads the entry to whole `vec4<u32>` rows; always 0.
        reserved: [u32; 2],
    }
}

/// Rows (`vec4<u32>`) of one table entry.
pub(crate) const ENTRY_ROWS: usize = Segment::ROWS;
