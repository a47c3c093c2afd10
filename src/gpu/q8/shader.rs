//! The WGSL of an 8-bit-state step: the family's own body (`shaders/adam.wgsl`,
//! `momentum.wgsl`), run four elements per invocation, between loads that dequantize one
//! word of each state's codes and stores that take the block's new absmax (a workgroup
//! reduction) and requantize. One workgroup owns one block at a time, so the reduction
//! never leaves it, and each invocation owns one `u32` word of four codes per state, so no
//! two invocations write one word. On CPU adapters one invocation owns a block instead,
//! keeping its new states in private memory until their absmax is known.
//!
//! A kernel's source is a generated prelude followed by files of `shaders/`, each of which
//! documents what it needs from the prelude and what it provides:
//!
//! - the family's body (`adam.wgsl`, `momentum.wgsl`): `update`;
//! - `q8.wgsl`: the family's `load_param`, `load_grad`, `store_param`, `store_param_copy`
//!   over four elements, the private `seg`, `first`, `live`, `old_states`, `new_states`,
//!   `hp`, and `load_scalars`;
//! - `q8_clip.wgsl` or `q8_unclipped.wgsl`: `clip(g)` and `load_clip()`;
//! - f32 states: `q8_f32.wgsl`, the entry point; 8-bit states: `q8_codes.wgsl`
//!   (`dequantize`, `code`, `largest`, and each state's part of a step) and the entry point
//!   of `q8_workgroup.wgsl` (a workgroup per block) or `q8_serial.wgsl` (an invocation).
//!
//! The files name states 0, 1 and 2 (`MAX_STATES`) under conditions on the constant
//! `STATES` rather than looping over them: once inlined, every state index is a constant,
//! so a CPU adapter's compiler keeps each state's values in registers.
//!
//! The prelude ([`prelude`]) is generated from typed Rust definitions only (the table, the
//! bindings, the states' loads and stores and the scalars by `gpu::blockwise::wgsl`, as
//! 4-bit's are):
//!
//! - constants: `BLOCK_SIZE` ([`crate::q8::BLOCK_SIZE`]), [`CODES_PER_WORD`],
//!   [`BLOCK_WORDS`], [`WORKGROUP`], [`FAN_IN`], `STATES` (the variant's state count),
//!   `MAX_STATES` ([`crate::gpu::blockwise::layout`]), and `BINDING_<NAME>` for every constant of
//!   `gpu::kernel::binding`; with 8-bit states also
//!   `crate::q8::lut`'s `SMALLEST`, `ONE`, `INFINITY`, `BUCKET_SHIFT`, `BUCKETS_PER_SIGN`,
//!   and `CODINGS`, each state's map, table and code of 0 in the code tables' binding
//!   ([`tables_words`]);
//! - `alias R = vec4<f32>` and `alias S = f32`;
//! - the multi-tensor kernels' table declarations (`gpu::kernel::table_head_wgsl`):
//!   `struct TableHead`, `struct Table`, its binding `table`, `TABLE_ROWS`, `ENTRY_ROWS`
//!   (the rows of one entry), `MAP_ENTRIES_PER_ROW` and `entry_row(w)`, the first row of
//!   workgroup `w`'s entry; `struct Segment` ([`crate::gpu::blockwise::layout::Segment`]) and
//!   `segment_at(r)`, the segment whose first row is `r`;
//! - the storage bindings `params`, `state`, with 8-bit states `tables`, and without the
//!   gradients in the parameters' buffer `grads`, at `gpu::kernel::binding`'s `Q8_*` numbers;
//!   `grad_at(j)`, gradient j from whichever binding holds them;
//! - `is_nan`, `max_propagating_nan` (`gpu::kernel::nan_helpers`);
//! - per state k of the variant, `load_<state>` and `store_<state>` (PyTorch's state
//!   names) reading `old_states[k]` and writing `new_states[k]`; every other slot of the
//!   family reads 0 and stores nothing;
//! - the family's override constants, `struct Hyper` and its binding `hp_base`; clipped,
//!   `struct ClipHeader` and its binding `clip_state`.

use std::fmt::Write;

use super::Variant;
use crate::gpu::blockwise::layout::MAX_STATES;
use crate::gpu::blockwise::wgsl;
use crate::q8::lut::{CodeTable, BUCKETS, BUCKETS_PER_SIGN, BUCKET_SHIFT, INFINITY, ONE, SMALLEST};
use crate::q8::BLOCK_SIZE;
use crate::step::Family;

/// Codes per `u32` word of 8-bit state, and elements per invocation (`R` is a `vec4`).
pub(crate) const CODES_PER_WORD: u32 = 4;

/// Words of codes per block.
pub(crate) const BLOCK_WORDS: u32 = BLOCK_SIZE as u32 / CODES_PER_WORD;

/// Invocations per workgroup: one per word of a block's codes.
pub(crate) const WORKGROUP: u32 = BLOCK_WORDS;

/// Fan-in of the workgroup's reduction of the block's absmax: two levels, each barrier of
/// which costs a CPU adapter a switch through every invocation.
pub(crate) const FAN_IN: u32 = 8;

const _: () = assert!(FAN_IN * FAN_IN == WORKGROUP);

/// Words of one map in the code tables' binding (a code's value, as f32 bits).
const MAP_WORDS: usize = 256;

/// Where each map and [`CodeTable`] lies in the code tables' binding, in words: the signed
/// map, the unsigned map, the signed table, the unsigned table.
const SIGNED_MAP: usize = 0;
const UNSIGNED_MAP: usize = MAP_WORDS;
const SIGNED_TABLE: usize = 2 * MAP_WORDS;
const UNSIGNED_TABLE: usize = SIGNED_TABLE + BUCKETS;

/// The binding of the code tables: both maps (f32 bits), then the signed and the unsigned
/// [`crate::q8::lut::CodeTable`] entries.
pub(crate) fn tables_words() -> Vec<u32> {
    let (signed, unsigned) = (CodeTable::signed(), CodeTable::unsigned());
    let mut words = Vec::with_capacity(UNSIGNED_TABLE + BUCKETS);
    words.extend(signed.map().iter().map(|c| c.to_bits()));
    words.extend(unsigned.map().iter().map(|c| c.to_bits()));
    debug_assert_eq!(words.len(), SIGNED_TABLE);
    words.extend_from_slice(signed.entries());
    debug_assert_eq!(words.len(), UNSIGNED_TABLE);
    words.extend_from_slice(unsigned.entries());
    words
}

/// 8-bit codes, and the entry points of 8-bit states.
const CODES: &str = include_str!("../../../shaders/q8_codes.wgsl");
const WORKGROUP_ENTRY: &str = include_str!("../../../shaders/q8_workgroup.wgsl");
const SERIAL_ENTRY: &str = include_str!("../../../shaders/q8_serial.wgsl");

/// The full WGSL of `variant`: the [`prelude`], then the files of `shaders/` it runs (see
/// the module's documentation).
pub(crate) fn compose(variant: &Variant) -> String {
    let mut s = prelude(variant);
    s.push_str(match variant.switches.family() {
        Family::Adam => include_str!("../../../shaders/adam.wgsl"),
        Family::Momentum => include_str!("../../../shaders/momentum.wgsl"),
        Family::Adagrad => include_str!("../../../shaders/adagrad.wgsl"),
        Family::Lion => include_str!("../../../shaders/lion.wgsl"),
        // Refused with 8-bit state (`q8::check_options`); never composed.
        Family::ScheduleFree => include_str!("../../../shaders/schedule_free.wgsl"),
        // Refused with 8-bit state (`q8::check_algorithm`); never composed.
        Family::Adafactor => "",
        // Refused with 8-bit state (`q8::check_algorithm`); never composed.
        Family::Muon => include_str!("../../../shaders/muon.wgsl"),
        Family::RmsProp => include_str!("../../../shaders/rmsprop.wgsl"),
        Family::Ademamix => include_str!("../../../shaders/ademamix.wgsl"),
        // Refused with 8-bit state (`q8::check_algorithm`); never composed.
        Family::Lamb => "",
    });
    wgsl::push_files(&mut s, variant, CODES, SERIAL_ENTRY, WORKGROUP_ENTRY);
    s
}

/// What the files of `shaders/` need from Rust (see the module's documentation).
pub(crate) fn prelude(variant: &Variant) -> String {
    let kinds = &variant.kinds;
    assert!(kinds.len() <= MAX_STATES, "an 8-bit step keeps at most {MAX_STATES} states");
    let family = variant.switches.family();
    let mut s = String::new();
    // `write!` into a String cannot fail, so its results are ignored.
    let _ = writeln!(s, "// wgpu-optim {} kernel over blockwise 8-bit state", family.name());
    s.push_str("alias R = vec4<f32>;\nalias S = f32;\n");
    let constants = [
        ("BLOCK_SIZE", BLOCK_SIZE),
        ("CODES_PER_WORD", CODES_PER_WORD as usize),
        ("BLOCK_WORDS", BLOCK_WORDS as usize),
        ("WORKGROUP", WORKGROUP as usize),
        ("FAN_IN", FAN_IN as usize),
        ("STATES", kinds.len()),
        ("MAX_STATES", MAX_STATES),
    ];
    for (name, value) in constants {
        let _ = writeln!(s, "const {name}: u32 = {value}u;");
    }
    wgsl::bindings(&mut s, variant);
    if variant.quantized {
        wgsl::storage(&mut s, "Q8_CODE_TABLES", "read", "tables", "u32");
        let constants = [
            ("SMALLEST", SMALLEST),
            ("ONE", ONE),
            ("INFINITY", INFINITY),
            ("BUCKET_SHIFT", BUCKET_SHIFT),
            ("BUCKETS_PER_SIGN", BUCKETS_PER_SIGN as u32),
        ];
        for (name, value) in constants {
            let _ = writeln!(s, "const {name}: u32 = {value}u;");
        }
        let codings: Vec<String> = kinds
            .iter()
            .map(|kind| {
                let (map, table) = if crate::q8::is_signed(*kind) {
                    (SIGNED_MAP, SIGNED_TABLE)
                } else {
                    (UNSIGNED_MAP, UNSIGNED_TABLE)
                };
                format!("Coding({map}u, {table}u, {}u)", CodeTable::for_kind(*kind).zero())
            })
            .collect();
        let _ = writeln!(s, "const CODINGS = array<Coding, STATES>({});", codings.join(", "));
    }
    wgsl::states_and_scalars(&mut s, variant);
    s
}
