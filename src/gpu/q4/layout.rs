//! The host/shader contract of a 4-bit step's group 1, as `gpu::q8::layout`'s: the
//! dispatch's table entry as a `#[repr(C)]` Pod struct whose WGSL declaration and reader
//! are generated from the same field list by `shader_struct!`. The field names that
//! `shaders/q8.wgsl` and `shaders/q8_f32.wgsl` read (`n`, `param`, `grad`, `values`,
//! `blocks`, `first_group`, `groups`) are theirs: 4-bit steps reuse those files.

use crate::step::fields::shader_struct;

/// The slots of per-state values the shared files index (`shaders/q8.wgsl` keeps three
/// states' values); a 4-bit step uses two of them, Adam's moments.
pub(crate) const MAX_STATES: usize = 3;

/// Lanes of a segment's per-state words: a `vec4<u32>` row.
pub(crate) const STATE_LANES: usize = 4;

shader_struct! {
    /// One segment (a tensor, or a chunk of one) in a dispatch's table. Bases are relative
    /// to the dispatch's bindings; states are in the order of the variant's state kinds.
    #[derive(Default, Eq)]
    Segment {
        /// Elements.
        n: u32,
        /// Blocks: of `block_size` with 4-bit states, of 256 with f32 states.
        blocks: u32,
        /// The segment's first workgroup within the dispatch.
        first_group: u32,
        /// Workgroups the segment takes.
        groups: u32,
        /// The first parameter within the parameters' binding, in elements.
        param: u32,
        /// The first gradient within the gradients' binding (or the parameters'), in elements.
        grad: u32,
        /// Pads `values` to its own `vec4<u32>` row; always 0.
        reserved: [u32; 2],
        /// Per state: its first word (codes, eight to a word, or f32 values) in the arena.
        values: [u32; STATE_LANES],
        /// Per state: its first scale word in the arena (4-bit states only).
        scale: [u32; STATE_LANES],
    }
}

/// Rows (`vec4<u32>`) of one table entry.
pub(crate) const ENTRY_ROWS: usize = Segment::ROWS;
