//! Kernel programs: one WGSL body per algorithm family (plus AMP's unscale), the storage
//! slots it reads and writes, and the prelude that binds those slots for one binding layout.
//!
//! The body only calls `load_<slot>(i)` and `store_<slot>(i, value)` in the math type `R`;
//! the generated prelude maps each slot to a storage binding (shared when tensors alias)
//! with the element shift of the current segment, or to a stub when the slot is absent. The
//! override constants and the uniform struct are declared from the step contract
//! ([`crate::step`]), the table's structs from [`table_layout`], the binding numbers
//! from [`binding`]: never written by hand. No kernel source is edited as text: [`compose`]
//! concatenates the generated declarations and the `shaders/` files.
//!
//! # The prelude interface
//!
//! What the generated code declares, and so what every file of `shaders/` in an update,
//! unscale or norm kernel may use:
//!
//! - `R` (the value type: the math scalar, or `vec4` of it with four accesses per element)
//!   and `S` (the math scalar); `WG` (the workgroup size, [`WORKGROUP_SIZE`]);
//!   `BINDING_<NAME>` for every constant of [`binding`].
//! - `struct TableHead`, `struct TableRow`, `table_row(r: u32) -> TableRow` (row `r` of
//!   `table.rows` as a [`TableRow`]), `TABLE_ROWS`, `ENTRY_ROWS`, `ENTRY_BASES`,
//!   `WORDS_PER_ROW`, the workgroup map's `MAP_ENTRY_BITS`, `MAP_ENTRIES_PER_WORD` and
//!   `MAP_ENTRIES_PER_ROW`, and `load_bases(e)` (each binding's base from entry `e`); then
//!   `shaders/table.wgsl` (`struct Table`, `table`, `entry_row(w)`) and
//!   `shaders/table_select.wgsl` (`select_entry(w) -> u32`, which loads workgroup `w`'s
//!   segment into the private `seg`: `n`, `pair_shift`, `pair_first`, `pair_step`,
//!   `base<b>`, and returns its entry's first row). With stochastic stores: `struct RngRow`,
//!   `rng_row` (its reader, as `table_row`), `ENTRY_RNG` and `shaders/table_rng.wgsl`
//!   (`rng_begin(e, seed_lo, seed_hi, step)`).
//! - `is_nan` (`shaders/nan_bits.wgsl`, or `nan_f64.wgsl` in f64) and `max_propagating_nan`
//!   (`shaders/nan.wgsl`); `shaders/convert.wgsl` where a binding holds 16-bit
//!   values; `shaders/stochastic.wgsl` with stochastic stores.
//! - `load_<slot>(i) -> R` for every input slot and `store_<slot>(i, v: R)` for every
//!   output slot of the program ([`Program::inputs`], [`Program::outputs`]).
//! - The program's override constants ([`Program::overrides`]; `FIRST_MOMENT` with its
//!   named values) and, for updates, `struct Hyper` (the family's uniform) and `hp`, its
//!   private copy; `struct HyperSlot` and `struct RoundingHeader` with stochastic stores.
//! - Capturable updates: `struct DeviceHeader`, `device_state`, `device_lr`,
//!   `shaders/device.wgsl` and the family's `at_step` (`shaders/<family>_capturable.wgsl`).
//!   The unscale passes: `device_state` (its `found_inf` atomic). Clipping updates:
//!   `clip_coefficient`, which `load_grad` applies.
//! - Norm passes: `partials`, `NORM_FOLD`, `lanes(g)`, `shaders/norm_combine.wgsl`,
//!   `shaders/grad_norm.wgsl`.
//!
//! Then the program's body (`update(i)`, and `unscale(i)` for AMP), and the functions the
//! entry points call: `prologue() -> bool` and `setup(e)` (update and unscale kernels),
//! `norm_term(i) -> R` (norm passes). Last, one entry point: `shaders/entry_element.wgsl`,
//! `shaders/entry_pair.wgsl` (packed outputs one element at a time) or
//! `shaders/entry_norm.wgsl`.

/// Binding numbers of every kernel the crate compiles, the one place each is defined. The
/// multi-tensor kernels have two bind groups: group 0, the step's scalars (which of them a
/// kernel binds depends on its [`Scalars`]), and group 1, the dispatch's table and tensors.
/// The 8-bit kernels (`gpu::q8`) share group 0's host layouts and the table, and bind their
/// own buffers in group 1. The clip finalize pass and the step-advancing kernel have group 0
/// only. The generated WGSL declares each number as a constant (`BINDING_HYPER`, ...,
/// [`binding_wgsl`]) and binds by name; the layouts and bind groups use the same constants.
///
/// Path of a binding: [`binding::CLIP`] → the clip buffer's entry in the scalars' bind group
/// (`gpu/dispatch.rs`) and its layout (`ScalarLayouts`, `gpu/pipeline.rs`) → `const
/// BINDING_CLIP` in the prelude → `@group(GROUP_SCALARS) @binding(BINDING_CLIP) var<storage, read>
/// clip_state`. The naga tests check every resource's number against these constants.
pub(crate) mod binding;
mod key;
mod passes;
mod prelude;
mod program;
mod table_layout;
#[cfg(test)]
pub(crate) mod tests;

pub(crate) use binding::binding_wgsl;
pub(crate) use key::{BindingDesc, BindingLayout, Scalars, Storage, TablePasses, VariantKey};
pub(crate) use passes::{advance_wgsl, clip_finalize_wgsl};
pub(crate) use prelude::{compose, nan_helpers};
pub(crate) use program::Program;
pub(crate) use table_layout::{
    map_rows, rows_per_entry, table_head_wgsl, RngRow, TableHead, TableRow, MAP_ENTRIES_PER_ROW,
    MAP_ENTRIES_PER_WORD, MAP_ENTRY_BITS, TABLE_BYTES, TABLE_ROWS, WORDS_PER_ROW,
};

/// Invocations per workgroup. 256 is WebGPU's default `max_compute_invocations_per_workgroup`.
/// The generated WGSL declares it as `const WG`.
pub(crate) const WORKGROUP_SIZE: u32 = 256;

/// The gradient-norm entry folds a workgroup's values in groups of this many (then the
/// groups' sums), so that each workgroup barrier is followed by short loops: a CPU adapter
/// runs every barrier as a switch through all of the workgroup's invocations. The generated
/// WGSL declares it as `const NORM_FOLD`.
const NORM_FOLD: u32 = 16;

const _: () = assert!(WORKGROUP_SIZE.is_multiple_of(NORM_FOLD));
// The clip finalize pass folds its workgroup by halves.
const _: () = assert!(WORKGROUP_SIZE.is_power_of_two());

/// The most workgroups one dispatch launches; a grid-stride loop covers the rest. 4096 x 256
/// = 1 M invocations fill any current GPU (an H100 keeps 132 x 2048 = 270 k resident), and
/// on big tensors each invocation then takes several elements, which a CPU adapter needs to
/// amortize its per-invocation cost.
pub(crate) const MAX_WORKGROUPS: u32 = 4096;
