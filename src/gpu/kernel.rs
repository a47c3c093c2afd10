//! Kernel programs: one WGSL body per algorithm family (plus AMP's unscale), the storage
//! slots it reads and writes, and the prelude that binds those slots for one binding layout.
//!
//! The body only calls `load_<slot>(i)` and `store_<slot>(i, value)` in the math type `R`;
//! the generated prelude maps each slot to a storage binding (shared when tensors alias)
//! with the element shift of the current segment, or to a stub when the slot is absent. The
//! override constants and the uniform struct are declared from the step contract
//! ([`crate::step`]), the table's structs from [`crate::gpu::table`], the binding numbers
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

use std::fmt::Write;

use crate::gpu::table::{RngRow, TableHead, TableRow};
use crate::step::clip::{ClipHeader, NormType};
use crate::step::device::DeviceHeader;
use crate::step::rounding::{self, RoundingHeader, Stochastic};
use crate::step::{Override, Slot, Switches};
use crate::{DType, StateKind};

/// What a compiled kernel computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Program {
    /// An optimizer family's update with its compile-time switches.
    Update(Switches),
    /// AMP: gradients multiplied by the device's `inv_scale`, non-finite ones flagged.
    Unscale,
    /// Gradient clipping's first pass: each workgroup's partial norm of the gradients it
    /// reads, written to its own slot (`shaders/grad_norm.wgsl`).
    GradNorm(NormType),
    /// AMP's unscale and clipping's first pass in one read of the gradients: each gradient
    /// unscaled (non-finite ones flagged) and its partial norm taken after unscaling.
    UnscaleNorm(NormType),
}

impl Program {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Program::Update(s) => s.family().name(),
            Program::Unscale => "unscale",
            Program::GradNorm(_) => "grad norm",
            Program::UnscaleNorm(_) => "unscale and grad norm",
        }
    }

    /// The WGSL body, embedded at build time.
    fn source(self) -> &'static str {
        match self {
            // Adafactor's is "": not elementwise, its own passes (`gpu::adafactor`) run it.
            Program::Update(s) => s.family().update_wgsl(),
            Program::Unscale | Program::UnscaleNorm(_) => include_str!("../../shaders/unscale.wgsl"),
            Program::GradNorm(_) => "",
        }
    }

    /// The body's `at_step`, which derives the step-dependent uniform fields from the
    /// device's step counter and learning rate (capturable mode).
    fn capturable_source(self) -> &'static str {
        match self {
            // "" for the families capturable mode refuses (each folder says why).
            Program::Update(s) => s.family().capturable_wgsl(),
            Program::Unscale | Program::GradNorm(_) | Program::UnscaleNorm(_) => "",
        }
    }

    /// Whether the kernel writes partial gradient norms (and runs the norm entry point).
    pub(crate) fn takes_norm(self) -> bool {
        matches!(self, Program::GradNorm(_) | Program::UnscaleNorm(_))
    }

    /// Slots the kernel reads, in the order the engine receives them.
    pub(crate) fn inputs(self) -> &'static [Slot] {
        match self {
            Program::Update(s) => s.family().inputs(),
            Program::Unscale | Program::GradNorm(_) | Program::UnscaleNorm(_) => &[Slot::Grad],
        }
    }

    /// Slots the kernel writes, in the order the engine receives them.
    pub(crate) fn outputs(self) -> &'static [Slot] {
        match self {
            Program::Update(s) => s.family().outputs(),
            Program::Unscale | Program::UnscaleNorm(_) => &[Slot::Grad],
            Program::GradNorm(_) => &[],
        }
    }

    /// The override constants, declared in the prelude and set at pipeline creation.
    pub(crate) fn overrides(self) -> Vec<Override> {
        match self {
            Program::Update(s) => s.overrides(),
            Program::Unscale => Vec::new(),
            Program::GradNorm(norm) | Program::UnscaleNorm(norm) => {
                vec![Override::Bool("NORM_INF", norm == NormType::Inf)]
            }
        }
    }
}

/// How a binding's elements are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Storage {
    /// `array<f32>`, `array<f64>` or (with `enable f16;`) `array<f16>`.
    Native(DType),
    /// Pairs of 16-bit values in `array<u32>`: bf16 always, f16 where the adapter lacks
    /// `SHADER_F16` or the packed path is forced.
    Packed(DType),
}

impl Storage {
    pub(crate) fn dtype(self) -> DType {
        match self {
            Storage::Native(d) | Storage::Packed(d) => d,
        }
    }
}

/// One storage binding of a layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct BindingDesc {
    pub(crate) storage: Storage,
    /// `read_write` when the buffer is written anywhere in the dispatch (wgpu tracks usage per
    /// buffer, so even a disjoint read-only binding of a written buffer is a conflict).
    pub(crate) read_write: bool,
}

/// How the slots of one tensor's update map onto storage bindings.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct BindingLayout {
    /// Binding index per input slot; `None` for an absent slot.
    pub(crate) inputs: Vec<Option<usize>>,
    /// Binding index per output slot; `None` for an absent slot.
    pub(crate) outputs: Vec<Option<usize>>,
    pub(crate) bindings: Vec<BindingDesc>,
}

impl BindingLayout {
    /// Whether any written binding packs two elements per word. Then each invocation
    /// updates an aligned pair of elements, so that no two invocations write one word.
    pub(crate) fn pairs(&self) -> bool {
        self.outputs.iter().flatten().any(|&b| matches!(self.bindings[b].storage, Storage::Packed(_)))
    }
}

/// What bind group 0 holds, which is where the step's scalars come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Scalars {
    /// The hyperparameter uniform, computed on the host each step.
    Host,
    /// Capturable mode: the uniform's constants, the device's step counter and AMP flag,
    /// and the group's learning rate on the device.
    Device,
    /// Gradient clipping's partial norms: one f32 slot per workgroup, written.
    Norm,
    /// The AMP unscale pass: the device state, read-write.
    Unscale,
    /// The unscale pass that also takes partial norms: the device state, read-write, and
    /// the partials, written.
    UnscaleNorm,
    /// LAMB's two table passes: the hyperparameter uniform, the partial sums (written) and
    /// the index with the norms (read) (`gpu::lamb`).
    Lamb,
}

impl Scalars {
    /// Group 0's storage bindings, which count against the same per-stage limit as the
    /// tensors': capturable mode's device state and learning rate (the device state also
    /// holds the clip coefficient), the clip buffer of clipping host-scalar updates, and
    /// the norm partials or the device state of the other passes.
    pub(crate) fn storage_bindings(self, clip: bool) -> u32 {
        match self {
            Scalars::Host => u32::from(clip),
            Scalars::Device => 2,
            Scalars::Norm | Scalars::Unscale => 1,
            Scalars::UnscaleNorm => 2,
            Scalars::Lamb => 2,
        }
    }
}

/// Everything that selects one compiled pipeline.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct VariantKey {
    pub(crate) scalars: Scalars,
    pub(crate) program: Program,
    /// The type the arithmetic runs in (and the hyperparameter uniform holds).
    pub(crate) math: DType,
    pub(crate) layout: BindingLayout,
    /// Elements per load and store: 1, or 4 (`vec4`, or two words of packed halves) where the
    /// math is f32 and the elements line up on 4-element boundaries in every buffer.
    pub(crate) width: u32,
    /// Gradient clipping: the update multiplies each gradient by the clip buffer's
    /// coefficient as it loads it (group 0 then binds that buffer too).
    pub(crate) clip: bool,
    /// Which 16-bit stores round stochastically. (Kahan compensation needs no switch: it is
    /// on where the compensation slot is bound.)
    pub(crate) stochastic: Stochastic,
}

impl VariantKey {
    /// The scalar (one element per access) variant; segments choose their width.
    pub(crate) fn new(scalars: Scalars, program: Program, math: DType, layout: BindingLayout) -> Self {
        VariantKey {
            scalars,
            program,
            math,
            layout,
            width: 1,
            clip: false,
            stochastic: Stochastic::default(),
        }
    }

    /// This variant, loading clipped gradients when `clip` is true.
    pub(crate) fn clipped(self, clip: bool) -> VariantKey {
        VariantKey { clip, ..self }
    }

    /// This variant with the given stochastic stores.
    pub(crate) fn with_stochastic(self, stochastic: Stochastic) -> VariantKey {
        VariantKey { stochastic, ..self }
    }

    /// This variant with `width` elements per access.
    pub(crate) fn with_width(&self, width: u32) -> VariantKey {
        VariantKey { width, ..self.clone() }
    }

    /// Whether each invocation updates an aligned pair of elements, so that no two
    /// invocations write one word: one element per access with a packed output. (Four
    /// elements per access own two whole words.)
    pub(crate) fn pairs(&self) -> bool {
        self.width == 1 && self.layout.pairs()
    }
}

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
pub(crate) mod binding {
    /// Bind group 0 of every pass: its scalars (hyperparameters, device state, clip buffer,
    /// norm partials); the only group of the passes without a table.
    pub(crate) const GROUP_SCALARS: u32 = 0;
    /// Bind group 1 of the update kernels (multi-tensor and 8-bit): the dispatch's table and
    /// tensor bindings, one bind group per dispatch.
    pub(crate) const GROUP_TABLE: u32 = 1;

    /// Group 0 of update kernels (8-bit ones too): the hyperparameter uniform slot.
    pub(crate) const HYPER: u32 = 0;
    /// Group 0 of capturable update kernels: the device state (step counter, AMP flag, clip
    /// coefficient), read.
    pub(crate) const DEVICE_STATE: u32 = 1;
    /// Group 0 of capturable update kernels: the group's learning rate, one f32.
    pub(crate) const DEVICE_LR: u32 = 2;
    /// Group 0 of host-scalar update kernels that clip (8-bit ones too): the clip buffer,
    /// read.
    pub(crate) const CLIP: u32 = 3;
    /// Group 0 of the unscale passes and of the step-advancing kernel (one layout serves
    /// both): the device state, read-write.
    pub(crate) const DEVICE_STATE_RW: u32 = 0;
    /// Group 0 of the gradient-norm pass: one partial norm per workgroup, written.
    pub(crate) const NORM_PARTIALS: u32 = 0;
    /// Group 0 of the pass that unscales and takes partial norms: the partials, written.
    pub(crate) const UNSCALE_NORM_PARTIALS: u32 = 1;
    /// Group 0 of the clip finalize pass: the partial norms, read.
    pub(crate) const FINALIZE_PARTIALS: u32 = 0;
    /// Group 0 of the clip finalize pass: the clip buffer, written.
    pub(crate) const FINALIZE_CLIP: u32 = 1;
    /// Group 0 of the clip finalize pass in capturable mode: the device state, written
    /// (the coefficient, for capturable update kernels).
    pub(crate) const FINALIZE_DEVICE_STATE: u32 = 2;
    /// Group 1: the dispatch's table (a uniform), multi-tensor and 8-bit alike.
    pub(crate) const TABLE: u32 = 0;
    /// Group 1: the first tensor binding; storage binding `b` of a layout is `TENSORS + b`.
    pub(crate) const TENSORS: u32 = 1;
    /// Group 1 of 8-bit kernels: the parameters, read and written.
    pub(crate) const Q8_PARAMS: u32 = 1;
    /// Group 1 of 8-bit kernels: the gradients, read, where they are not in the parameters'
    /// buffer.
    pub(crate) const Q8_GRADS: u32 = 2;
    /// Group 1 of 8-bit kernels: the state arena, read and written.
    pub(crate) const Q8_STATE: u32 = 3;
    /// Group 1 of 8-bit kernels with 8-bit states: the code tables, read.
    pub(crate) const Q8_CODE_TABLES: u32 = 4;

    // Pipeline layouts list their bind group layouts in group order (`gpu/pipeline.rs`, the
    // clip and advance passes in `optimizer/`), so the numbers must be these.
    const _: () = assert!(GROUP_SCALARS == 0 && GROUP_TABLE == 1);

    /// Every constant with its WGSL name.
    pub(super) const ALL: [(&str, u32); 18] = [
        ("GROUP_SCALARS", GROUP_SCALARS),
        ("GROUP_TABLE", GROUP_TABLE),
        ("BINDING_HYPER", HYPER),
        ("BINDING_DEVICE_STATE", DEVICE_STATE),
        ("BINDING_DEVICE_LR", DEVICE_LR),
        ("BINDING_CLIP", CLIP),
        ("BINDING_DEVICE_STATE_RW", DEVICE_STATE_RW),
        ("BINDING_NORM_PARTIALS", NORM_PARTIALS),
        ("BINDING_UNSCALE_NORM_PARTIALS", UNSCALE_NORM_PARTIALS),
        ("BINDING_FINALIZE_PARTIALS", FINALIZE_PARTIALS),
        ("BINDING_FINALIZE_CLIP", FINALIZE_CLIP),
        ("BINDING_FINALIZE_DEVICE_STATE", FINALIZE_DEVICE_STATE),
        ("BINDING_TABLE", TABLE),
        ("BINDING_TENSORS", TENSORS),
        ("BINDING_Q8_PARAMS", Q8_PARAMS),
        ("BINDING_Q8_GRADS", Q8_GRADS),
        ("BINDING_Q8_STATE", Q8_STATE),
        ("BINDING_Q8_CODE_TABLES", Q8_CODE_TABLES),
    ];
}

/// The fields of `CurrentSegment` (the private `seg`, which `select_entry` fills from the
/// table; no host layout) before its per-binding bases.
const SEGMENT_HEADER: [&str; 4] = ["n", "pair_shift", "pair_first", "pair_step"];

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

/// The full WGSL of one variant: the generated prelude (see the module doc for what it
/// declares), the family's body, the functions the entry point calls, and the entry point
/// (`shaders/entry_*.wgsl`).
pub(crate) fn compose(key: &VariantKey) -> String {
    let math = key.math.wgsl_math();
    let vector = key.width == 4;
    let bindings = &key.layout.bindings;
    let rng = key.stochastic.any();
    let mut s = String::new();
    // `write!` into a String cannot fail, so its results are ignored.
    if bindings.iter().any(|b| b.storage == Storage::Native(DType::F16)) {
        s.push_str("enable f16;\n");
    }
    let _ = writeln!(s, "// wgpu-optim {} kernel, math in {math}", key.program.name());
    if vector {
        let _ = writeln!(s, "alias R = vec4<{math}>;");
    } else {
        let _ = writeln!(s, "alias R = {math};");
    }
    let _ = writeln!(s, "alias S = {math};");
    let _ = writeln!(s, "const WG: u32 = {WORKGROUP_SIZE}u;");
    s.push_str(&binding_wgsl());
    s.push_str("struct CurrentSegment {\n");
    for field in SEGMENT_HEADER {
        let _ = writeln!(s, "    {field}: u32,");
    }
    for b in 0..bindings.len() {
        let _ = writeln!(s, "    base{b}: u32,");
    }
    s.push_str("}\nvar<private> seg: CurrentSegment;\n");
    s.push_str(&table_wgsl(bindings.len(), rng));
    s.push_str(&nan_helpers(key.math, vector));
    if bindings.iter().any(|b| b.storage.dtype().size() == 2) {
        s.push_str(include_str!("../../shaders/convert.wgsl"));
    }
    if rng {
        s.push_str(include_str!("../../shaders/stochastic.wgsl"));
    }
    for (b, desc) in bindings.iter().enumerate() {
        let access = if desc.read_write { "read_write" } else { "read" };
        let element = match (desc.storage, vector) {
            (Storage::Native(d), false) => d.wgsl_math().to_string(),
            (Storage::Native(d), true) => format!("vec4<{}>", d.wgsl_math()),
            (Storage::Packed(_), false) => "u32".to_string(),
            // Four halves per access: two words.
            (Storage::Packed(_), true) => "vec2<u32>".to_string(),
        };
        let _ = writeln!(
            s,
            "@group(GROUP_TABLE) @binding(BINDING_TENSORS + {b}u) var<storage, {access}> buf{b}: array<{element}>;"
        );
    }
    for (slot, binding) in key.program.inputs().iter().map(|s| s.name()).zip(&key.layout.inputs) {
        let body = match binding {
            Some(b) => load_expression(*b, bindings[*b].storage, vector),
            None => "return R(S(0));".to_string(),
        };
        if key.clip && slot == "grad" {
            // The clip coefficient applies to the gradient as loaded, as PyTorch scales the
            // gradients in place before the step.
            let _ = writeln!(s, "fn load_grad_stored(i: u32) -> R {{ {body} }}");
            // Read once into a private copy by `prologue` (as `hp`).
            let _ = writeln!(
                s,
                "var<private> clip_coefficient: f32;\n\
                 fn load_grad(i: u32) -> R {{ return load_grad_stored(i) * S(clip_coefficient); }}"
            );
        } else {
            let _ = writeln!(s, "fn load_{slot}(i: u32) -> R {{ {body} }}");
        }
    }
    let outputs = key.program.outputs();
    let kahan = outputs
        .iter()
        .position(|slot| *slot == Slot::State(StateKind::KahanCompensation))
        .is_some_and(|k| key.layout.outputs[k].is_some());
    for (slot, binding) in outputs.iter().zip(&key.layout.outputs) {
        let round = match slot {
            Slot::Param if kahan => Round::Kahan,
            Slot::Param if key.stochastic.params => Round::Stochastic(rounding::stream(None)),
            Slot::State(kind) if key.stochastic.state && *kind != StateKind::KahanCompensation => {
                Round::Stochastic(rounding::stream(Some(*kind)))
            }
            _ => Round::Nearest,
        };
        let body =
            binding.map(|b| store_statement(b, bindings[b].storage, vector, round)).unwrap_or_default();
        let _ = writeln!(s, "fn store_{}(i: u32, v: R) {{ {body} }}", slot.name());
    }
    for o in key.program.overrides() {
        s.push_str(&o.wgsl());
    }
    if let Program::Update(switches) = key.program {
        s.push_str(&switches.uniform_wgsl());
        if rng {
            // The seed and step follow the family's uniform in the same slot.
            s.push_str(&RoundingHeader::slot_wgsl(switches.uniform_bytes(key.math)));
        }
    }
    if key.program.takes_norm() {
        let lanes = if vector { "g" } else { "vec4(g, 0.0, 0.0, 0.0)" };
        let _ = writeln!(s, "fn lanes(g: R) -> vec4<f32> {{ return {lanes}; }}");
        let _ = writeln!(s, "const NORM_FOLD: u32 = {NORM_FOLD}u;");
        s.push_str(include_str!("../../shaders/norm_combine.wgsl"));
        s.push_str(include_str!("../../shaders/grad_norm.wgsl"));
    }
    s.push_str(key.program.source());
    s.push_str(&scalars_wgsl(key, rng));
    if key.program.takes_norm() {
        // The gradient as the norm sees it: as loaded, or unscaled (and stored).
        let term = if matches!(key.program, Program::UnscaleNorm(_)) { "unscale(i)" } else { "load_grad(i)" };
        let _ = writeln!(s, "fn norm_term(i: u32) -> R {{\n    return {term};\n}}");
        s.push_str(include_str!("../../shaders/entry_norm.wgsl"));
    } else if matches!(key.program, Program::Update(Switches::Lamb(_))) {
        s.push_str(&crate::gpu::lamb::entry_wgsl(vector, key.pairs()));
    } else if key.pairs() {
        s.push_str(include_str!("../../shaders/entry_pair.wgsl"));
    } else {
        s.push_str(include_str!("../../shaders/entry_element.wgsl"));
    }
    s
}

/// Group 0's declarations for `key`'s scalars and, for the element and pair entry points,
/// `prologue()` (the invocation's private copies of the scalars; false where capturable
/// mode skips the step) and `setup(e)` (per-entry state: stochastic rounding's key).
fn scalars_wgsl(key: &VariantKey, rng: bool) -> String {
    let mut s = String::new();
    // What `prologue` and `setup` run.
    let mut prologue = Vec::new();
    let mut setup = Vec::new();
    // With stochastic stores the uniform slot is `HyperSlot` (the family's `Hyper`, then the
    // seed and step), copied into `hp` per invocation.
    let (hyper_binding, hyper) =
        if rng { ("hp_slot: HyperSlot", "hp_slot.hyper") } else { ("hp_base: Hyper", "hp_base") };
    match key.scalars {
        Scalars::Host => {
            // A private copy: a CPU adapter's compiler cannot keep uniform values in registers
            // across the loop's storage writes, which might alias them, and reloads them every
            // iteration.
            let _ = write!(
                s,
                "\n@group(GROUP_SCALARS) @binding(BINDING_HYPER) var<uniform> {hyper_binding};\nvar<private> hp: Hyper;\n"
            );
            prologue.push(format!("hp = {hyper};"));
            if rng {
                setup.push(
                    "rng_begin(e, hp_slot.rounding.seed_lo, hp_slot.rounding.seed_hi, hp_slot.rounding.step);"
                        .to_string(),
                );
            }
        }
        Scalars::Device => {
            s.push_str(&DeviceHeader::wgsl_for(false));
            s.push_str(include_str!("../../shaders/device.wgsl"));
            s.push_str(key.program.capturable_source());
            let _ = write!(
                s,
                "\n@group(GROUP_SCALARS) @binding(BINDING_HYPER) var<uniform> {hyper_binding};\n\
                 @group(GROUP_SCALARS) @binding(BINDING_DEVICE_STATE) var<storage, read> device_state: DeviceHeader;\n\
                 @group(GROUP_SCALARS) @binding(BINDING_DEVICE_LR) var<storage, read> device_lr: f32;\n\
                 var<private> hp: Hyper;\n",
            );
            // A step skipped by AMP changes nothing.
            prologue.push("if device_state.found_inf != 0u {\n        return false;\n    }".to_string());
            prologue.push(format!("hp = at_step({hyper}, f32(device_state.step), device_lr);"));
            if rng {
                // The device's step: the one the bias corrections use (AMP skips excluded).
                setup.push(
                    "rng_begin(e, hp_slot.rounding.seed_lo, hp_slot.rounding.seed_hi, device_state.step);"
                        .to_string(),
                );
            }
        }
        Scalars::Unscale => {
            s.push_str(&DeviceHeader::wgsl_for(true));
            s.push_str(
                "@group(GROUP_SCALARS) @binding(BINDING_DEVICE_STATE_RW) var<storage, read_write> device_state: DeviceHeader;\n",
            );
        }
        Scalars::Norm => {
            s.push_str(
                "@group(GROUP_SCALARS) @binding(BINDING_NORM_PARTIALS) var<storage, read_write> partials: array<f32>;\n",
            );
        }
        Scalars::Lamb => {
            s.push_str(&crate::gpu::lamb::scalars_wgsl(hyper_binding));
            prologue.push(format!("hp = {hyper};"));
        }
        Scalars::UnscaleNorm => {
            s.push_str(&DeviceHeader::wgsl_for(true));
            s.push_str(
                "@group(GROUP_SCALARS) @binding(BINDING_DEVICE_STATE_RW) var<storage, read_write> device_state: DeviceHeader;\n\
                 @group(GROUP_SCALARS) @binding(BINDING_UNSCALE_NORM_PARTIALS) var<storage, read_write> partials: array<f32>;\n",
            );
        }
    }
    if key.clip {
        // Capturable kernels find the coefficient in the device state, saving a binding.
        let coefficient = match key.scalars {
            Scalars::Device => "device_state.clip_coefficient",
            _ => "clip_state.coefficient",
        };
        prologue.push(format!("clip_coefficient = {coefficient};"));
    }
    if key.clip && key.scalars != Scalars::Device {
        s.push_str(&ClipHeader::wgsl());
        s.push_str(
            "@group(GROUP_SCALARS) @binding(BINDING_CLIP) var<storage, read> clip_state: ClipHeader;\n",
        );
    }
    if key.program.takes_norm() {
        // The norm entry point reads no scalars beyond its bindings.
        debug_assert!(prologue.is_empty() && setup.is_empty(), "{key:?}");
        return s;
    }
    s.push_str("fn prologue() -> bool {\n");
    for line in prologue {
        let _ = writeln!(s, "    {line}");
    }
    s.push_str("    return true;\n}\nfn setup(e: u32) {\n");
    for line in setup {
        let _ = writeln!(s, "    {line}");
    }
    s.push_str("}\n");
    s
}

/// How a store rounds its f32 value to a 16-bit type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Round {
    /// To nearest even.
    Nearest,
    /// Stochastically, with the random bits of this stream (`step::rounding::stream`).
    Stochastic(u32),
    /// To nearest even, with the Kahan compensation read and written beside it.
    Kahan,
}

/// `max_propagating_nan(a, b)`: NaN if either is NaN (as `torch.maximum`), else `max(a, b)`.
/// NaN is found from the bits, which no compiler may assume away.
pub(crate) fn nan_helpers(math: DType, vector: bool) -> String {
    let is_nan = if math == DType::F64 {
        // No 64-bit integers (nor a size-changing bitcast) without extensions.
        include_str!("../../shaders/nan_f64.wgsl").to_string()
    } else {
        let (bits, mask) = if vector { ("vec4<u32>", "vec4<bool>") } else { ("u32", "bool") };
        format!("alias NanBits = {bits};\nalias NanMask = {mask};\n")
            + include_str!("../../shaders/nan_bits.wgsl")
    };
    is_nan + include_str!("../../shaders/nan.wgsl")
}

fn load_expression(b: usize, storage: Storage, vector: bool) -> String {
    let half = |decode: &str| {
        format!(
            "let j = seg.base{b} + i; return R({decode}((buf{b}[j >> 1u] >> ((j & 1u) * 16u)) & 0xffffu));"
        )
    };
    match storage {
        Storage::Native(_) => format!("return R(buf{b}[seg.base{b} + i]);"),
        Storage::Packed(DType::BF16) if vector => {
            format!("return bf16_value4(halves(buf{b}[seg.base{b} + i]));")
        }
        Storage::Packed(_) if vector => format!("return f16_value4(halves(buf{b}[seg.base{b} + i]));"),
        Storage::Packed(DType::BF16) => half("bf16_value"),
        Storage::Packed(_) => half("f16_value"),
    }
}

fn store_statement(b: usize, storage: Storage, vector: bool, round: Round) -> String {
    let (encode, decode) = match storage {
        Storage::Native(DType::F16) | Storage::Packed(DType::F16) => ("f16_bits", "f16_value"),
        Storage::Packed(_) => ("bf16_bits", "bf16_value"),
        // f32 and f64 stores are exact: no rounding mode applies.
        Storage::Native(d) if vector => {
            return format!("buf{b}[seg.base{b} + i] = vec4<{}>(v);", d.wgsl_math())
        }
        Storage::Native(d) => return format!("buf{b}[seg.base{b} + i] = {}(v);", d.wgsl_math()),
    };
    let lanes = if vector { "4" } else { "" };
    // The 16-bit bits (u32, or vec4<u32>) of the value `x`.
    let bits = |x: &str| match round {
        Round::Stochastic(stream) if vector => format!("{encode}_sr4({x}, rng_bits4({stream}u, i))"),
        Round::Stochastic(stream) => format!("{encode}_sr(f32({x}), rng_bits({stream}u, i))"),
        _ if vector => format!("{encode}4({x})"),
        _ => format!("{encode}(f32({x}))"),
    };
    // Stores the bits `h`. Native f16 goes through the exact f32 value, so the f16
    // conversion has nothing to round.
    let write = |h: &str| match (storage, vector) {
        (Storage::Native(_), true) => format!("buf{b}[seg.base{b} + i] = vec4<f16>(f16_value4({h}));"),
        (Storage::Native(_), false) => format!("buf{b}[seg.base{b} + i] = f16(f16_value({h}));"),
        (Storage::Packed(_), true) => format!("buf{b}[seg.base{b} + i] = words({h});"),
        (Storage::Packed(_), false) => {
            format!("let j = seg.base{b} + i; buf{b}[j >> 1u] = with_half(buf{b}[j >> 1u], j & 1u, {h});")
        }
    };
    match round {
        // target = p_new + c; p = round(target); c = round(target - p), and c = 0 where the
        // residual is not finite (an infinite or NaN target), so those store as without it.
        // Finiteness from the bits: a compiler may assume `d - d` is 0.
        Round::Kahan => {
            let u = if vector { "vec4<u32>" } else { "u32" };
            format!(
                "let t = v + load_kahan_comp(i); let h = {}; {} let d = t - R({decode}{lanes}(h)); \
                 store_kahan_comp(i, select(d, R(S(0)), (bitcast<{u}>(d) & {u}(0x7f800000u)) == {u}(0x7f800000u)));",
                bits("t"),
                write("h")
            )
        }
        _ => write(&bits("v")),
    }
}

/// `const BINDING_<NAME>: u32` for every constant of [`binding`].
pub(crate) fn binding_wgsl() -> String {
    let mut s = String::new();
    for (name, value) in binding::ALL {
        let _ = writeln!(s, "const {name}: u32 = {value}u;");
    }
    s
}

/// The clip finalize pass's WGSL (`shaders/clip_finalize.wgsl`, one workgroup of `WG`
/// invocations), after its prelude: `WG`, the binding constants, `struct ClipHeader`,
/// `NORM_INF`, `shaders/norm_combine.wgsl` and `publish(coefficient)`, which in capturable
/// mode also writes the coefficient into the device state, where capturable update kernels
/// read it.
pub(crate) fn clip_finalize_wgsl(capturable: bool) -> String {
    let mut s = format!("const WG: u32 = {WORKGROUP_SIZE}u;\n") + &binding_wgsl() + &ClipHeader::wgsl();
    if capturable {
        s.push_str(&DeviceHeader::wgsl_for(false));
        s.push_str(
            "@group(GROUP_SCALARS) @binding(BINDING_FINALIZE_DEVICE_STATE)\n\
             var<storage, read_write> device_state: DeviceHeader;\n\
             fn publish(coefficient: f32) { device_state.clip_coefficient = coefficient; }\n",
        );
    } else {
        s.push_str("fn publish(coefficient: f32) {}\n");
    }
    s.push_str("override NORM_INF: bool;\n");
    s.push_str(include_str!("../../shaders/norm_combine.wgsl"));
    s.push_str(include_str!("../../shaders/clip_finalize.wgsl"));
    s
}

/// The step-advancing kernel's WGSL (`shaders/advance.wgsl`), after its prelude: the binding
/// constants and `struct DeviceHeader`.
pub(crate) fn advance_wgsl() -> String {
    binding_wgsl() + &DeviceHeader::wgsl_for(false) + include_str!("../../shaders/advance.wgsl")
}

/// What every multi-tensor table declares, whatever its entries hold: `struct TableHead`,
/// `struct Table` (the head, then [`TABLE_ROWS`] `vec4<u32>` rows), `table` at
/// `BINDING_TABLE` of group 1 (so after [`binding_wgsl`]), `TABLE_ROWS`, `ENTRY_ROWS`
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
    s + include_str!("../../shaders/table.wgsl")
}

/// The dispatch's table of segments (its [`TableHead`], each entry's [`TableRow`], bases and
/// [`RngRow`], the workgroup map) and `select_entry(w)` (`shaders/table_select.wgsl`), which
/// finds the entry whose workgroups include workgroup `w` in the workgroup map
/// ([`map_rows`]), loads it into `seg` and returns its first row; with stochastic stores
/// `rng_begin` (`shaders/table_rng.wgsl`).
fn table_wgsl(bindings: usize, stochastic: bool) -> String {
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
    s.push_str(include_str!("../../shaders/table_select.wgsl"));
    if stochastic {
        s.push_str(&RngRow::wgsl());
        s.push_str(&RngRow::reader_wgsl("rng_row"));
        let _ = writeln!(s, "const ENTRY_RNG: u32 = {}u;", per_entry - 1);
        s.push_str(include_str!("../../shaders/table_rng.wgsl"));
    }
    s
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::step::device::DeviceHeader;
    use crate::step::{AdafactorUniform, AdafactorUniform64};
    use crate::step::{
        AdagradSwitches, AdagradUniform, AdagradUniform64, AdamSwitches, AdamUniform, AdamUniform64,
        EpsPlacement, FirstMoment, MomentumSwitches, MomentumUniform, MomentumUniform64,
    };
    use crate::step::{AdemamixSwitches, AdemamixUniform, AdemamixUniform64};
    use crate::step::{AdoptSwitches, AdoptUniform, AdoptUniform64};
    use crate::step::{LambUniform, LambUniform64};
    use crate::step::{LionSwitches, LionUniform, LionUniform64};
    use crate::step::{MuonSwitches, MuonUniform, MuonUniform64};
    use crate::step::{ScheduleFreeSwitches, ScheduleFreeUniform, ScheduleFreeUniform64};

    fn is_schedule_free(program: Program) -> bool {
        matches!(program, Program::Update(Switches::ScheduleFree(_)))
    }
    use crate::step::{RmsPropSwitches, RmsPropUniform, RmsPropUniform64};

    /// Every switch combination of every family.
    fn all_switches() -> Vec<Switches> {
        let flags = [false, true];
        let mut all = Vec::new();
        for (amsgrad, maximize, decoupled_weight_decay) in
            flags.iter().flat_map(|a| flags.iter().flat_map(move |m| flags.map(move |d| (*a, *m, d))))
        {
            for eps in [EpsPlacement::AfterCorrection, EpsPlacement::OnRoot] {
                for first_moment in
                    [FirstMoment::Linear, FirstMoment::LerpFromMoment, FirstMoment::LerpFromGrad]
                {
                    all.push(Switches::Adam(AdamSwitches {
                        amsgrad,
                        eps,
                        maximize,
                        decoupled_weight_decay,
                        first_moment,
                        decay_after_update: decoupled_weight_decay && !amsgrad,
                        l2_at_zero: !decoupled_weight_decay && !amsgrad,
                    }));
                }
            }
            all.push(Switches::Momentum(MomentumSwitches {
                maximize,
                nesterov: amsgrad,
                velocity: decoupled_weight_decay,
            }));
            all.push(Switches::Adagrad(AdagradSwitches { maximize }));
            all.push(Switches::RmsProp(RmsPropSwitches {
                maximize,
                centered: amsgrad,
                momentum: decoupled_weight_decay,
                lerp_from_grad: maximize != amsgrad,
                step_with_raw_grad: !maximize && !amsgrad && !decoupled_weight_decay,
            }));
        }
        all.push(Switches::Lion(LionSwitches));
        all.push(Switches::Adopt(AdoptSwitches));
        for swap in flags {
            all.push(Switches::ScheduleFree(ScheduleFreeSwitches { swap }));
        }
        for decay_after_update in flags {
            all.push(Switches::Ademamix(AdemamixSwitches { decay_after_update }));
        }
        for (momentum_pass, nesterov) in flags.iter().flat_map(|m| flags.map(move |n| (*m, n))) {
            all.push(Switches::Muon(MuonSwitches { momentum_pass, nesterov }));
        }
        all
    }

    /// Every slot bound, in place, each state in a binding of its own, the model copy too;
    /// the Kahan compensation only with `kahan`.
    fn layout(program: Program, storage: Storage, kahan: bool) -> BindingLayout {
        let bound = |slot: &Slot| kahan || *slot != Slot::State(StateKind::KahanCompensation);
        let inputs: Vec<Option<usize>> =
            program.inputs().iter().enumerate().map(|(k, slot)| bound(slot).then_some(k)).collect();
        let outputs = program
            .outputs()
            .iter()
            .map(|slot| {
                bound(slot).then(|| program.inputs().iter().position(|s| s == slot).unwrap_or(inputs.len()))
            })
            .collect();
        let bindings = vec![BindingDesc { storage, read_write: true }; inputs.len() + 1];
        BindingLayout { inputs, outputs, bindings }
    }

    /// The store variants of 16-bit storage: nearest even, Kahan, stochastic parameters,
    /// stochastic parameters and state.
    fn store_variants(program: Program, storage: Storage) -> Vec<(bool, Stochastic)> {
        let nearest = (false, Stochastic::default());
        if !matches!(program, Program::Update(_)) || storage.dtype().size() != 2 {
            return vec![nearest];
        }
        vec![
            nearest,
            (true, Stochastic::default()),
            (false, Stochastic { params: true, state: false }),
            (false, Stochastic { params: true, state: true }),
        ]
    }

    /// `(name, offset)` of each member of the struct `name` in a parsed module (the 8-bit
    /// kernels' naga test uses it too).
    pub(crate) fn members(module: &naga::Module, name: &str) -> Vec<(String, u32)> {
        let found = module.types.iter().find(|(_, ty)| ty.name.as_deref() == Some(name));
        match found.map(|(_, ty)| &ty.inner) {
            Some(naga::TypeInner::Struct { members, .. }) => {
                members.iter().map(|m| (m.name.clone().unwrap_or_default(), m.offset)).collect()
            }
            other => panic!("no struct {name} in the module ({other:?})"),
        }
    }

    /// `(name, (group, binding))` of every resource of a parsed module, sorted.
    pub(crate) fn resource_bindings(module: &naga::Module) -> Vec<(String, (u32, u32))> {
        let mut found: Vec<(String, (u32, u32))> = module
            .global_variables
            .iter()
            .filter_map(|(_, g)| {
                let b = g.binding.as_ref()?;
                Some((g.name.clone().unwrap_or_default(), (b.group, b.binding)))
            })
            .collect();
        found.sort();
        found
    }

    /// The value of the `u32` constant `name` of a parsed module.
    fn u32_constant(module: &naga::Module, name: &str) -> Option<u32> {
        let (_, constant) = module.constants.iter().find(|(_, c)| c.name.as_deref() == Some(name))?;
        match module.global_expressions[constant.init] {
            naga::Expression::Literal(naga::Literal::U32(v)) => Some(v),
            _ => None,
        }
    }

    /// The resources a variant's WGSL should bind, at the numbers the host binds them.
    fn expected_bindings(key: &VariantKey) -> Vec<(String, (u32, u32))> {
        let mut expected = vec![("table".to_string(), (binding::GROUP_TABLE, binding::TABLE))];
        for b in 0..key.layout.bindings.len() {
            expected.push((format!("buf{b}"), (binding::GROUP_TABLE, binding::TENSORS + b as u32)));
        }
        let hyper = if key.stochastic.any() { "hp_slot" } else { "hp_base" };
        let group0: &[(&str, u32)] = match key.scalars {
            Scalars::Host => &[(hyper, binding::HYPER)],
            Scalars::Device => &[
                (hyper, binding::HYPER),
                ("device_state", binding::DEVICE_STATE),
                ("device_lr", binding::DEVICE_LR),
            ],
            Scalars::Unscale => &[("device_state", binding::DEVICE_STATE_RW)],
            Scalars::Norm => &[("partials", binding::NORM_PARTIALS)],
            Scalars::UnscaleNorm => {
                &[("device_state", binding::DEVICE_STATE_RW), ("partials", binding::UNSCALE_NORM_PARTIALS)]
            }
            Scalars::Lamb => &[
                (hyper, binding::HYPER),
                ("lamb_partials", crate::gpu::lamb::PARTIALS),
                ("lamb_index", crate::gpu::lamb::INDEX),
            ],
        };
        expected.extend(group0.iter().map(|(name, b)| (name.to_string(), (binding::GROUP_SCALARS, *b))));
        if key.clip && key.scalars == Scalars::Host {
            expected.push(("clip_state".to_string(), (binding::GROUP_SCALARS, binding::CLIP)));
        }
        expected.sort();
        expected
    }

    /// The size of the struct `name` in a parsed module.
    fn struct_span(module: &naga::Module, name: &str) -> u32 {
        let found = module.types.iter().find(|(_, ty)| ty.name.as_deref() == Some(name));
        match found.map(|(_, ty)| &ty.inner) {
            Some(naga::TypeInner::Struct { span, .. }) => *span,
            other => panic!("no struct {name} in the module ({other:?})"),
        }
    }

    fn rust_members(fields: &[&str], offsets: &[usize]) -> Vec<(String, u32)> {
        fields.iter().zip(offsets).map(|(f, o)| (f.to_string(), *o as u32)).collect()
    }

    #[test]
    fn the_clip_finalize_and_advance_passes_validate_and_bind_by_the_named_numbers() {
        let mut validator = naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::all(),
        );
        let parse = |source: &str| {
            naga::front::wgsl::parse_str(source)
                .unwrap_or_else(|e| panic!("{}\n{source}", e.emit_to_string(source)))
        };
        for capturable in [false, true] {
            let source = clip_finalize_wgsl(capturable);
            let module = parse(&source);
            validator.validate(&module).unwrap_or_else(|e| panic!("{e:?}\n{source}"));
            let mut expected = vec![
                ("clip".to_string(), (binding::GROUP_SCALARS, binding::FINALIZE_CLIP)),
                ("partials".to_string(), (binding::GROUP_SCALARS, binding::FINALIZE_PARTIALS)),
            ];
            if capturable {
                expected.push((
                    "device_state".to_string(),
                    (binding::GROUP_SCALARS, binding::FINALIZE_DEVICE_STATE),
                ));
            }
            expected.sort();
            assert_eq!(resource_bindings(&module), expected, "capturable: {capturable}");
            assert_eq!(module.entry_points[0].workgroup_size, [WORKGROUP_SIZE, 1, 1]);
            let header = [("total_norm", 0), ("coefficient", 4), ("max_norm", 8), ("reserved", 12)]
                .map(|(n, o)| (n.to_string(), o));
            assert_eq!(members(&module, "ClipHeader"), header);
        }
        let source = advance_wgsl();
        let module = parse(&source);
        validator.validate(&module).unwrap_or_else(|e| panic!("{e:?}\n{source}"));
        assert_eq!(
            resource_bindings(&module),
            [("state".to_string(), (binding::GROUP_SCALARS, binding::DEVICE_STATE_RW))]
        );
    }

    /// No WGSL file (of `shaders/` and of each family's folder) writes a binding number or a
    /// workgroup size as a literal: each comes from a constant the prelude generates.
    #[test]
    fn shader_files_bind_and_size_workgroups_by_name() {
        let root = env!("CARGO_MANIFEST_DIR");
        let read = |dir: &std::path::Path| -> Vec<std::path::PathBuf> {
            let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{dir:?}: {e}"));
            entries.map(|e| e.unwrap_or_else(|e| panic!("{e}")).path()).collect()
        };
        let mut paths = read(&std::path::Path::new(root).join("shaders"));
        for family in read(&std::path::Path::new(root).join("src/family")).iter().filter(|p| p.is_dir()) {
            paths.extend(read(family).into_iter().filter(|p| p.extension().is_some_and(|e| e == "wgsl")));
        }
        let mut files = 0;
        for path in paths {
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
            for attribute in ["@binding(", "@workgroup_size("] {
                for (at, _) in text.match_indices(attribute) {
                    let next = text[at + attribute.len()..].chars().next();
                    // The step counter's one invocation is the only literal size.
                    let single = text[at..].starts_with("@workgroup_size(1)");
                    assert!(!next.is_some_and(|c| c.is_ascii_digit()) || single, "{path:?}: {}", &text[at..]);
                }
            }
            files += 1;
        }
        assert!(files > 20, "{files} shader files");
    }

    #[test]
    fn every_variant_validates_and_its_structs_lay_out_as_the_rust_ones() {
        let mut validator = naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::all(),
        );
        let mut programs: Vec<Program> = all_switches().into_iter().map(Program::Update).collect();
        programs.extend([
            Program::Unscale,
            Program::GradNorm(NormType::L2),
            Program::GradNorm(NormType::Inf),
            Program::UnscaleNorm(NormType::L2),
            Program::UnscaleNorm(NormType::Inf),
        ]);
        let storages = [
            Storage::Native(DType::F32),
            Storage::Native(DType::F16),
            Storage::Packed(DType::F16),
            Storage::Packed(DType::BF16),
        ];
        for program in programs {
            let pairings =
                [Scalars::Host, Scalars::Device, Scalars::Unscale, Scalars::Norm, Scalars::UnscaleNorm]
                    .into_iter()
                    .filter(|scalars| match program {
                        Program::Update(_) => matches!(scalars, Scalars::Host | Scalars::Device),
                        Program::Unscale => *scalars == Scalars::Unscale,
                        Program::GradNorm(_) => *scalars == Scalars::Norm,
                        Program::UnscaleNorm(_) => *scalars == Scalars::UnscaleNorm,
                    })
                    // Schedule-Free has no capturable form (refused when the optimizer is built).
                    .filter(|scalars| !(is_schedule_free(program) && *scalars == Scalars::Device))
                    // Nor has Muon (refused when the optimizer is built).
                    .filter(|scalars| {
                        !(matches!(program, Program::Update(Switches::Muon(_)))
                            && *scalars == Scalars::Device)
                    })
                    .flat_map(|scalars| {
                        let clips: &[bool] =
                            if matches!(program, Program::Update(_)) { &[false, true] } else { &[false] };
                        clips.iter().map(move |clip| (scalars, *clip))
                    });
            for (scalars, clip) in pairings {
                for (math, storage, width) in storages
                    .iter()
                    .flat_map(|s| [(DType::F32, *s, 1), (DType::F32, *s, 4)])
                    .chain([(DType::F64, Storage::Native(DType::F64), 1)])
                {
                    // Capturable math is f32, and the unscale pass runs one element at a time.
                    if (math == DType::F64 && scalars != Scalars::Host)
                        || (width == 4 && matches!(program, Program::Unscale | Program::UnscaleNorm(_)))
                    {
                        continue;
                    }
                    for (kahan, stochastic) in store_variants(program, storage) {
                        let layout = layout(program, storage, kahan);
                        let key = VariantKey { scalars, program, math, layout, width, stochastic, clip };
                        let source = compose(&key);
                        if kahan {
                            assert!(source.contains("store_kahan_comp(i, select("), "{key:?}");
                        }
                        if stochastic.any() {
                            assert!(source.contains("_sr") && source.contains("rng_begin(e, "), "{key:?}");
                        } else {
                            assert!(!source.contains("rng_begin"), "{key:?}");
                        }
                        let module = naga::front::wgsl::parse_str(&source)
                            .unwrap_or_else(|e| panic!("{key:?}: {}\n{source}", e.emit_to_string(&source)));
                        validator.validate(&module).unwrap_or_else(|e| panic!("{key:?}: {e:?}\n{source}"));
                        let wide = math == DType::F64;
                        if let Program::Update(switches) = program {
                            let expected = match (switches, wide) {
                                (Switches::Adam(_), false) => {
                                    rust_members(AdamUniform::FIELDS, AdamUniform::OFFSETS)
                                }
                                (Switches::Adam(_), true) => {
                                    rust_members(AdamUniform::FIELDS, AdamUniform64::OFFSETS)
                                }
                                (Switches::Momentum(_), false) => {
                                    rust_members(MomentumUniform::FIELDS, MomentumUniform::OFFSETS)
                                }
                                (Switches::Momentum(_), true) => {
                                    rust_members(MomentumUniform::FIELDS, MomentumUniform64::OFFSETS)
                                }
                                (Switches::Adagrad(_), false) => {
                                    rust_members(AdagradUniform::FIELDS, AdagradUniform::OFFSETS)
                                }
                                (Switches::Adagrad(_), true) => {
                                    rust_members(AdagradUniform::FIELDS, AdagradUniform64::OFFSETS)
                                }
                                (Switches::Lion(_), false) => {
                                    rust_members(LionUniform::FIELDS, LionUniform::OFFSETS)
                                }
                                (Switches::Lion(_), true) => {
                                    rust_members(LionUniform::FIELDS, LionUniform64::OFFSETS)
                                }
                                (Switches::ScheduleFree(_), false) => {
                                    rust_members(ScheduleFreeUniform::FIELDS, ScheduleFreeUniform::OFFSETS)
                                }
                                (Switches::ScheduleFree(_), true) => {
                                    rust_members(ScheduleFreeUniform::FIELDS, ScheduleFreeUniform64::OFFSETS)
                                }
                                (Switches::Adafactor(_), false) => {
                                    rust_members(AdafactorUniform::FIELDS, AdafactorUniform::OFFSETS)
                                }
                                (Switches::Adafactor(_), true) => {
                                    rust_members(AdafactorUniform::FIELDS, AdafactorUniform64::OFFSETS)
                                }
                                (Switches::Muon(_), false) => {
                                    rust_members(MuonUniform::FIELDS, MuonUniform::OFFSETS)
                                }
                                (Switches::Muon(_), true) => {
                                    rust_members(MuonUniform::FIELDS, MuonUniform64::OFFSETS)
                                }
                                (Switches::RmsProp(_), false) => {
                                    rust_members(RmsPropUniform::FIELDS, RmsPropUniform::OFFSETS)
                                }
                                (Switches::RmsProp(_), true) => {
                                    rust_members(RmsPropUniform::FIELDS, RmsPropUniform64::OFFSETS)
                                }
                                (Switches::Ademamix(_), false) => {
                                    rust_members(AdemamixUniform::FIELDS, AdemamixUniform::OFFSETS)
                                }
                                (Switches::Ademamix(_), true) => {
                                    rust_members(AdemamixUniform::FIELDS, AdemamixUniform64::OFFSETS)
                                }
                                (Switches::Lamb(_), false) => {
                                    rust_members(LambUniform::FIELDS, LambUniform::OFFSETS)
                                }
                                (Switches::Lamb(_), true) => {
                                    rust_members(LambUniform::FIELDS, LambUniform64::OFFSETS)
                                }
                                (Switches::Adopt(_), false) => {
                                    rust_members(AdoptUniform::FIELDS, AdoptUniform::OFFSETS)
                                }
                                (Switches::Adopt(_), true) => {
                                    rust_members(AdoptUniform::FIELDS, AdoptUniform64::OFFSETS)
                                }
                            };
                            assert_eq!(members(&module, "Hyper"), expected, "{key:?}");
                        }
                        assert_eq!(resource_bindings(&module), expected_bindings(&key), "{key:?}");
                        if let Program::Update(Switches::Adam(_)) = program {
                            for (name, value) in FirstMoment::CHOICES {
                                assert_eq!(u32_constant(&module, name), Some(*value), "{key:?}");
                            }
                        }
                        let table_rows = [
                            ("TableHead", rust_members(TableHead::FIELDS, TableHead::OFFSETS)),
                            ("TableRow", rust_members(TableRow::FIELDS, TableRow::OFFSETS)),
                        ];
                        for (name, expected) in table_rows {
                            assert_eq!(members(&module, name), expected, "{key:?}");
                        }
                        let head = std::mem::size_of::<TableHead>() as u32;
                        let table = [("head".to_string(), 0), ("rows".to_string(), head)];
                        assert_eq!(members(&module, "Table"), table, "{key:?}");
                        assert_eq!(u64::from(struct_span(&module, "Table")), TABLE_BYTES, "{key:?}");
                        if clip && scalars == Scalars::Host {
                            let header =
                                [("total_norm", 0), ("coefficient", 4), ("max_norm", 8), ("reserved", 12)]
                                    .map(|(n, o)| (n.to_string(), o));
                            assert_eq!(members(&module, "ClipHeader"), header, "{key:?}");
                        }
                        if matches!(scalars, Scalars::Device | Scalars::Unscale | Scalars::UnscaleNorm) {
                            let header = [
                                ("step", DeviceHeader::STEP),
                                ("found_inf", DeviceHeader::FOUND_INF),
                                ("inv_scale", DeviceHeader::INV_SCALE),
                                ("clip_coefficient", DeviceHeader::CLIP_COEFFICIENT),
                            ]
                            .map(|(n, o)| (n.to_string(), o as u32));
                            assert_eq!(members(&module, "DeviceHeader"), header, "{key:?}");
                        }
                        if stochastic.any() {
                            let fields = [("seed_lo", 0u32), ("seed_hi", 4), ("step", 8), ("reserved", 12)];
                            let fields = fields.map(|(n, o)| (n.to_string(), o));
                            assert_eq!(members(&module, "RoundingHeader"), fields, "{key:?}");
                            assert_eq!(
                                members(&module, "RngRow"),
                                rust_members(RngRow::FIELDS, RngRow::OFFSETS),
                                "{key:?}"
                            );
                            let slot = members(&module, "HyperSlot");
                            assert_eq!(
                                slot.last(),
                                Some(&("rounding".to_string(), RoundingHeader::OFFSET as u32)),
                                "{key:?}"
                            );
                        }
                    }
                }
            }
        }
    }
}
