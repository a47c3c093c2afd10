//! The WGSL of an 8-bit-state step: the family's own body (`src/family/adam/adam.wgsl`,
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
//! - f32 states: `q8_f32.wgsl`, the entry point; 8-bit states: `q8_nearest.wgsl` (the
//!   nearest code by a table load, `code`, or by arithmetic, `codes_arith`), `q8_codes.wgsl`
//!   (`dequantize`, `encode`, `largest`, and each state's part of a step) and the entry
//!   point of `q8_workgroup.wgsl` (a workgroup per block) or `q8_serial.wgsl` (an
//!   invocation).
//!
//! Both ways of finding a code give `crate::q8::nearest_code`'s code bit for bit; which one
//! a kernel uses ([`Requantize`]) is a matter of speed. On a CPU adapter (lavapipe) the
//! arithmetic is faster: the table load is a gather of eight lanes, while the arithmetic
//! takes vector instructions and no load, and its few words with a value near a switch are
//! found again from the table after their block (`q8_serial.wgsl`, where one invocation
//! owns a block; a CPU adapter runs an `if` masked for every invocation, so a branch per
//! word to the table would cost its loads everywhere). PERF.md has the figures. On a real
//! GPU the table lives in L1 or workgroup memory and one load per value is cheap, and the
//! arithmetic's branch to the table runs per word (a workgroup owns a block): the table is
//! kept there, unmeasured. The environment variable `WGPU_OPTIM_Q8_REQUANTIZE` (`table` or
//! `arithmetic`), read when an optimizer with 8-bit state is built, overrides the choice,
//! for measuring both on any adapter (the bench included:
//! `WGPU_OPTIM_Q8_REQUANTIZE=table bench --states q8`).
//!
//! The files name states 0 to 3 (`MAX_STATES`) under conditions on the constant
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
//!   `crate::q8::arith`'s `FIRST_SWITCH`, `NEAR`, `FLOOR`, `CLAMP`, `ARITHMETIC` (the
//!   variant's [`Requantize`]), `DEFERRED` (arithmetic in the serial entry point), `CODINGS`, each state's map, table and code of 0 in the code
//!   tables' binding ([`tables_words`]) and its map's top code, and per map the decade
//!   constants of its `crate::q8::arith::Quantizer` (`struct Decade`, `decade_signed`,
//!   `decade_unsigned`: [`quantizer_wgsl`]);
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

pub(crate) use crate::gpu::blockwise::Requantize;

use super::Variant;
use crate::gpu::blockwise::layout::MAX_STATES;
use crate::gpu::blockwise::wgsl;
use crate::q8::lut::{CodeTable, BUCKETS, BUCKETS_PER_SIGN, BUCKET_SHIFT, INFINITY, ONE, SMALLEST};
use crate::q8::BLOCK_SIZE;

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

// shaders/q8_serial.wgsl marks a block's words in two u32.
const _: () = assert!(BLOCK_WORDS <= 64);

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

/// The nearest code by arithmetic or by the table (the probe tests it alone).
#[cfg(test)]
const NEAREST: &str = include_str!("../../../shaders/q8_nearest.wgsl");
/// 8-bit codes (the nearest code, then the codes' loads and stores), and the entry points
/// of 8-bit states.
const CODES: &str =
    concat!(include_str!("../../../shaders/q8_nearest.wgsl"), include_str!("../../../shaders/q8_codes.wgsl"));
const WORKGROUP_ENTRY: &str = include_str!("../../../shaders/q8_workgroup.wgsl");
const SERIAL_ENTRY: &str = include_str!("../../../shaders/q8_serial.wgsl");

/// The full WGSL of `variant`: the [`prelude`], then the files of `shaders/` it runs (see
/// the module's documentation).
pub(crate) fn compose(variant: &Variant) -> String {
    let mut s = prelude(variant);
    // Families without an 8-bit form are refused before any variant is composed
    // (`q8::check_algorithm`).
    s.push_str(variant.switches.family().update_wgsl());
    wgsl::push_files(&mut s, variant, CODES, SERIAL_ENTRY, WORKGROUP_ENTRY);
    s
}

/// The environment variable that overrides [`Requantize::chosen`]: `table` or `arithmetic`
/// (any other value is ignored, with a warning in the log).
pub(crate) const REQUANTIZE_VAR: &str = "WGPU_OPTIM_Q8_REQUANTIZE";

impl Requantize {
    /// The way [`REQUANTIZE_VAR`] names, or the faster one measured on an adapter of
    /// `device_type` (see the module's documentation): arithmetic on CPU adapters, the
    /// table elsewhere.
    pub(crate) fn chosen(device_type: wgpu::DeviceType) -> Self {
        match std::env::var(REQUANTIZE_VAR).as_deref() {
            Ok("arithmetic") => return Requantize::Arithmetic,
            Ok("table") => return Requantize::Table,
            Ok(other) => {
                log::warn!("{REQUANTIZE_VAR}={other:?} is neither `table` nor `arithmetic`: ignored")
            }
            Err(_) => {}
        }
        if device_type == wgpu::DeviceType::Cpu {
            Requantize::Arithmetic
        } else {
            Requantize::Table
        }
    }
}

/// `x` (finite) as a WGSL literal of exactly its value: a hexadecimal float.
fn f32_wgsl(x: f32) -> String {
    assert!(x.is_finite() && (x == 0.0 || x.is_normal()), "{x:e} has no normal literal here");
    if x == 0.0 {
        return "0.0f".into();
    }
    let bits = x.to_bits();
    let sign = if bits >> 31 == 1 { "-" } else { "" };
    let exponent = ((bits >> 23) & 0xff) as i32 - 127;
    // 23 bits of fraction, shifted to fill six hexadecimal digits.
    format!("{sign}0x1.{:06x}p{exponent}f", (bits & 0x7f_ffff) << 1)
}

/// The constants of `crate::q8::lut` and `crate::q8::arith` that `shaders/q8_nearest.wgsl`
/// reads, and both maps' decades ([`quantizer_wgsl`]).
fn nearest_wgsl() -> String {
    use crate::q8::arith::{CLAMP, FIRST_SWITCH, FLOOR, NEAR};
    let mut s = String::new();
    let constants = [
        ("SMALLEST", SMALLEST),
        ("ONE", ONE),
        ("INFINITY", INFINITY),
        ("BUCKET_SHIFT", BUCKET_SHIFT),
        ("BUCKETS_PER_SIGN", BUCKETS_PER_SIGN as u32),
        ("FLOOR", FLOOR),
        ("CLAMP", CLAMP.to_bits()),
    ];
    for (name, value) in constants {
        let _ = writeln!(s, "const {name}: u32 = {value}u;");
    }
    let _ = writeln!(s, "const FIRST_SWITCH: f32 = {};", f32_wgsl(FIRST_SWITCH));
    let _ = writeln!(s, "const NEAR: f32 = {};", f32_wgsl(NEAR));
    s.push_str("struct Decade {\n    scale: vec4<f32>,\n    offset: vec4<f32>,\n    base: vec4<i32>,\n}\n");
    s.push_str(&quantizer_wgsl("decade_signed", CodeTable::signed().quantizer()));
    s.push_str(&quantizer_wgsl("decade_unsigned", CodeTable::unsigned().quantizer()));
    s
}

/// `fn name(m: vec4<f32>) -> Decade`: per lane, the slope, offset and first magnitude index
/// of the decade of `q` that magnitude `m` lies in, the decade being the count of decade
/// starts that `m` reaches (what `q`'s span tables give, without indexing a table).
fn quantizer_wgsl(name: &str, q: &crate::q8::arith::Quantizer) -> String {
    let decade = |k: usize| {
        format!(
            "Decade(vec4({}), vec4({}), vec4({}i))",
            f32_wgsl(q.scale[k]),
            f32_wgsl(q.offset[k]),
            q.base[k]
        )
    };
    let mut s = format!("fn {name}(m: vec4<f32>) -> Decade {{\n    var d = {};\n", decade(0));
    for (k, start) in q.starts.iter().enumerate() {
        let _ = writeln!(
            s,
            "    {{\n        let next = {};\n        let reached = m >= vec4({});\n        \
             d.scale = select(d.scale, next.scale, reached);\n        \
             d.offset = select(d.offset, next.offset, reached);\n        \
             d.base = select(d.base, next.base, reached);\n    }}",
            decade(k + 1),
            f32_wgsl(*start)
        );
    }
    s.push_str("    return d;\n}\n");
    s
}

/// The `Coding` (`shaders/q8_nearest.wgsl`) of a state quantized with the signed map or the
/// unsigned one.
fn coding_wgsl(signed: bool) -> String {
    let (map, table, codes) = if signed {
        (SIGNED_MAP, SIGNED_TABLE, CodeTable::signed())
    } else {
        (UNSIGNED_MAP, UNSIGNED_TABLE, CodeTable::unsigned())
    };
    let q = codes.quantizer();
    format!(
        "Coding({map}u, {table}u, {}u, {signed}, {}, {}i)",
        codes.zero(),
        f32_wgsl(f32::from_bits(q.top_bits)),
        q.top_index
    )
}

/// A kernel that writes, per `vec4<f32>` of binding 1 (`values`), the word of its four
/// nearest codes in the signed or the unsigned map into binding 2 (`codes`), found
/// `requantize`'s way; binding 0 holds [`tables_words`]. Dispatched as (x, y) workgroups
/// of 64, value `x + 65535 * 64 * y`.
#[cfg(test)]
pub(crate) fn nearest_probe(signed: bool, requantize: Requantize) -> String {
    let mut s = String::from("alias R = vec4<f32>;\n");
    s.push_str("@group(0) @binding(0) var<storage, read> tables: array<u32>;\n");
    s.push_str("@group(0) @binding(1) var<storage, read> values: array<vec4<f32>>;\n");
    s.push_str("@group(0) @binding(2) var<storage, read_write> codes: array<u32>;\n");
    s.push_str(&nearest_wgsl());
    let _ = writeln!(s, "const CODING = {};", coding_wgsl(signed));
    let _ = writeln!(s, "const ARITHMETIC: bool = {};", requantize == Requantize::Arithmetic);
    s.push_str(NEAREST);
    s.push_str(
        "@compute @workgroup_size(64)\n\
         fn main(@builtin(global_invocation_id) id: vec3<u32>) {\n    \
         let i = id.x + 65535u * 64u * id.y;\n    \
         if i < arrayLength(&values) {\n        \
         let v = values[i];\n        \
         var c = vec4(code(CODING.table, CODING.zero, v.x), code(CODING.table, CODING.zero, v.y), \
         code(CODING.table, CODING.zero, v.z), code(CODING.table, CODING.zero, v.w));\n        \
         if ARITHMETIC {\n            \
         c = codes_arith(CODING, v);\n        \
         }\n        \
         codes[i] = c.x | c.y << 8u | c.z << 16u | c.w << 24u;\n    \
         }\n}\n",
    );
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
        s.push_str(&nearest_wgsl());
        let arithmetic = variant.requantize == Requantize::Arithmetic;
        let _ = writeln!(s, "const ARITHMETIC: bool = {arithmetic};");
        // The serial entry point finds the codes of words near a switch after its block's.
        let _ = writeln!(s, "const DEFERRED: bool = {};", arithmetic && variant.serial);
        let codings: Vec<String> =
            kinds.iter().map(|kind| coding_wgsl(crate::q8::is_signed(*kind))).collect();
        let _ = writeln!(s, "const CODINGS = array<Coding, STATES>({});", codings.join(", "));
    }
    wgsl::states_and_scalars(&mut s, variant);
    s
}
