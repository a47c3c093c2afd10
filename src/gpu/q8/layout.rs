//! The host/shader contract of an 8-bit step's group 1: the binding numbers, and the
//! dispatch's table of segments as a `#[repr(C)]` Pod struct whose WGSL declaration is
//! generated from the same field list (the layout test in `gpu::q8::tests` checks naga's
//! offsets against Rust's).

use crate::gpu::kernel::{TABLE_BYTES, TABLE_ROWS};
use crate::step::fields::wgsl_struct;

/// Group 0: the hyperparameters (and, clipped, the clip buffer at
/// [`crate::gpu::kernel::CLIP_BINDING`]), shared with the f32 kernels' layouts.
pub(crate) const SCALARS_GROUP: u32 = 0;
/// Group 1: the dispatch's table and buffers, one bind group per dispatch.
pub(crate) const SEGMENT_GROUP: u32 = 1;

/// Group 1's binding of the dispatch's table as `vec4<u32>` rows (`table`), which the
/// workgroup map is read from.
pub(crate) const TABLE_BINDING: u32 = 0;
/// The parameters (`params`, read and written).
pub(crate) const PARAMS_BINDING: u32 = 1;
/// The gradients (`grads`, read), where they are not in the parameters' buffer.
pub(crate) const GRADS_BINDING: u32 = 2;
/// The state arena (`state`, read and written).
pub(crate) const STATE_BINDING: u32 = 3;
/// The code tables (`tables`, read): only variants with 8-bit states bind them.
pub(crate) const CODE_TABLES_BINDING: u32 = 4;
/// The same bytes as [`TABLE_BINDING`], as a typed [`Segments`] (`segments`).
pub(crate) const SEGMENTS_BINDING: u32 = 5;

/// The most states a segment has (Adam's two moments).
pub(crate) const MAX_STATES: usize = 2;

/// A Rust field type and the WGSL type that lays out the same way in a uniform.
pub(crate) trait WgslType {
    /// The WGSL spelling.
    const WGSL: &'static str;
}

impl WgslType for u32 {
    const WGSL: &'static str = "u32";
}

impl WgslType for [u32; 2] {
    const WGSL: &'static str = "vec2<u32>";
}

/// Declares a table struct: the `#[repr(C)]` Pod struct, its fields' names, WGSL types and
/// offsets, and its WGSL declaration of the same name.
macro_rules! table_struct {
    (
        $(#[$doc:meta])*
        $name:ident {
            $($(#[$field_doc:meta])* $field:ident: $ty:ty,)*
        }
    ) => {
        $(#[$doc])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
        pub(crate) struct $name {
            $($(#[$field_doc])* pub(crate) $field: $ty,)*
        }

        impl $name {
            /// `(name, WGSL type)` of each field, in declaration order.
            pub(crate) const FIELDS: &'static [(&'static str, &'static str)] =
                &[$((stringify!($field), <$ty as WgslType>::WGSL)),*];
            /// Each field's byte offset, as `#[repr(C)]` lays it out.
            #[cfg(test)]
            pub(crate) const OFFSETS: &'static [usize] = &[$(std::mem::offset_of!($name, $field)),*];

            /// The WGSL declaration, `struct NAME { field: type, ... }`.
            pub(crate) fn wgsl() -> String {
                wgsl_struct(stringify!($name), Self::FIELDS.iter().copied())
            }
        }
    };
}

table_struct! {
    /// One segment (a tensor, or a chunk of one) in a dispatch's table. Bases are relative
    /// to the dispatch's bindings; states are in the order of the variant's state kinds.
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
pub(crate) const ENTRY_ROWS: usize = std::mem::size_of::<Segment>() / 16;

/// Entries the typed view declares: as many as the table's rows hold.
pub(crate) const SEGMENT_CAPACITY: usize = TABLE_ROWS / ENTRY_ROWS;

// An entry is whole rows (a uniform array's stride is a multiple of 16), and the typed view
// lies within the table's binding.
const _: () = assert!(std::mem::size_of::<Segment>().is_multiple_of(16));
const _: () = assert!((16 + SEGMENT_CAPACITY * std::mem::size_of::<Segment>()) as u64 <= TABLE_BYTES);

/// The WGSL of both views of the table: `struct Segment`, and the bindings `table` (the
/// header and `vec4<u32>` rows, which the workgroup map is read from) and `segments` (the
/// same bytes as the header and an array of [`Segment`]).
pub(crate) fn table_views_wgsl() -> String {
    let rows = format!("array<vec4<u32>, {TABLE_ROWS}>");
    let entries = format!("array<Segment, {SEGMENT_CAPACITY}>");
    let table = wgsl_struct("Table", [("head", "vec4<u32>"), ("rows", rows.as_str())].into_iter());
    let segments =
        wgsl_struct("Segments", [("head", "vec4<u32>"), ("entries", entries.as_str())].into_iter());
    format!(
        "{}{table}{segments}\
         @group({SEGMENT_GROUP}) @binding({TABLE_BINDING}) var<uniform> table: Table;\n\
         @group({SEGMENT_GROUP}) @binding({SEGMENTS_BINDING}) var<uniform> segments: Segments;\n",
        Segment::wgsl()
    )
}
