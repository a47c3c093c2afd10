//! The host/shader contract of a low-bit step's group 1 (8-bit and 4-bit alike): the
//! dispatch's table entry as a `#[repr(C)]` Pod struct whose WGSL declaration and reader are
//! generated from the same field list by `shader_struct!`, as the multi-tensor table's are
//! (the layout test in `gpu::q8::tests` checks naga's offsets against Rust's). The table
//! itself is the multi-tensor table's: a [`crate::gpu::kernel::TableHead`], then `vec4<u32>`
//! rows, then the workgroup map.

use crate::step::fields::shader_struct;

/// The most states a segment has ([`crate::q8::MAX_STATES`], which both backends enforce),
/// one lane of a `vec4<u32>` row each (a 4-bit step uses two of them, Adam's moments).
pub(crate) const MAX_STATES: usize = crate::q8::MAX_STATES;

/// Lanes of a segment's per-state words: a `vec4<u32>` row, the lanes past
/// [`MAX_STATES`] unused.
pub(crate) const STATE_LANES: usize = 4;

// `Segment` holds the states' words as `vec4<u32>`, and shaders/q8_codes.wgsl, q8_serial.wgsl
// and q8_f32.wgsl keep per-state values as `vec4` lanes (`.x` to `.w`, a line per state): that
// is the bound, and a family of more states is refused 8-bit state rather than compiled.
const _: () = assert!(MAX_STATES == 4 && MAX_STATES <= STATE_LANES);

shader_struct! {
    /// One segment (a tensor, or a chunk of one) in a dispatch's table. Bases are relative
    /// to the dispatch's bindings; states are in the order of the variant's state kinds.
    /// `segment_at(r)` in WGSL reads one from its rows.
    #[derive(Default, Eq)]
    Segment {
        /// Elements.
        n: u32,
        /// Blocks: of the format's block size with quantized states (8-bit's last may be
        /// partial), of the f32 entry point's with f32 states.
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
        /// Pads `values` to its own `vec4<u32>` row; always 0.
        reserved: [u32; 2],
        /// Per state: its first word (codes, four or eight to a word, or f32 values) in the
        /// arena; the lanes past [`MAX_STATES`] are 0.
        values: [u32; STATE_LANES],
        /// Per state: its first scale word (8-bit's absmax) in the arena (quantized states
        /// only).
        scale: [u32; STATE_LANES],
    }
}

/// Rows (`vec4<u32>`) of one table entry.
pub(crate) const ENTRY_ROWS: usize = Segment::ROWS;
