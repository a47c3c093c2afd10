//! The WGSL of a 4-bit-state step: Adam's body (`src/family/adam/adam.wgsl`), run four elements per
//! call of `update`, between loads that dequantize half a word of each state's codes (a
//! `u32` word holds eight 4-bit codes, two per byte, element 2j in the high nibble, so the
//! buffer's bytes are torchao's packed codes) and stores that take the block's new scale
//! and requantize a whole word. An invocation owns one word per state (two calls of
//! `update`), so no two invocations write one word.
//!
//! The files are `gpu::q8`'s where the logic is the same: `q8.wgsl` (the family's loads and
//! stores over four elements), `q8_clip.wgsl`/`q8_unclipped.wgsl`, and `q8_f32.wgsl` (the
//! entry point of f32 states, run with 8-bit's constants). 4-bit's own are `q4_codes.wgsl`
//! (the maps, torchao's code search, packing, each state's part of a step) and the entry
//! points `q4_workgroup.wgsl` (a workgroup owns `BLOCKS_PER_GROUP` blocks at a time, each
//! block's scale a tree reduction over its words) or `q4_serial.wgsl` (an invocation owns a
//! block, for CPU adapters).
//!
//! The prelude declares what `gpu::q8::shader` documents for `q8.wgsl` (`R`, `S`, the
//! constants, the table and `struct Segment` of [`crate::gpu::blockwise::layout`], the bindings, the state
//! loads and stores, `struct Hyper`), and with 4-bit states: `MAP0`, `MAP1` (state k's map,
//! 16 f32 each), `ZERO0`, `ZERO1` (the code a non-finite value takes), `count0(x)`,
//! `count1(x)` (the number of state k's thresholds not above x: its code), `MIN_SCALE`,
//! `INFINITY` (the bits of +inf), `BLOCKS_PER_GROUP` and `KEPT` (halves of a block).

use std::fmt::Write;

use super::Variant;
use crate::gpu::blockwise::layout::MAX_STATES;
use crate::gpu::blockwise::wgsl;
use crate::q4::{map_for, thresholds, zero_code, MIN_SCALE};

/// Codes per `u32` word of 4-bit state.
pub(crate) const CODES_PER_WORD: u32 = 8;

/// Invocations per workgroup of the serial and f32 entry points, and the least of the
/// workgroup entry point (which takes whole blocks).
pub(crate) const WORKGROUP: u32 = 64;

/// Elements per block of an f32-state segment (`q8_f32.wgsl` takes four per invocation).
pub(crate) const F32_BLOCK: u32 = 4 * WORKGROUP;

/// Blocks a workgroup of the workgroup entry point owns at a time: enough for
/// [`WORKGROUP`] invocations, at least one.
pub(crate) fn blocks_per_group(block_size: u32) -> u32 {
    (WORKGROUP / (block_size / CODES_PER_WORD)).max(1)
}

/// 4-bit codes, and the entry points of 4-bit states (the other files are 8-bit's:
/// `gpu::blockwise::wgsl`).
const CODES: &str = include_str!("../../../shaders/q4_codes.wgsl");
const WORKGROUP_ENTRY: &str = include_str!("../../../shaders/q4_workgroup.wgsl");
const SERIAL_ENTRY: &str = include_str!("../../../shaders/q4_serial.wgsl");

/// The full WGSL of `variant`: the [`prelude`], then the files it runs.
pub(crate) fn compose(variant: &Variant) -> String {
    let mut s = prelude(variant);
    // Only Adam keeps 4-bit state (`q4::check_algorithm`).
    s.push_str(variant.switches.family().update_wgsl());
    wgsl::push_files(&mut s, variant, CODES, SERIAL_ENTRY, WORKGROUP_ENTRY);
    s
}

/// A WGSL `f32` literal that parses back to `x` exactly (Rust's shortest round trip).
fn literal(x: f32) -> String {
    format!("{x:?}f")
}

/// What the files of `shaders/` need from Rust (see the module's documentation).
pub(crate) fn prelude(variant: &Variant) -> String {
    let kinds = &variant.kinds;
    assert!(kinds.len() <= 2, "a 4-bit step keeps at most Adam's two moments");
    // Which families 4-bit state runs is theirs to say (`FamilyLowBit::q4_refusal`, checked
    // when an optimizer is built); the kernel only bounds the count of states it codes.
    let family = variant.switches.family();
    let mut s = String::new();
    // `write!` into a String cannot fail, so its results are ignored.
    let _ = writeln!(s, "// wgpu-optim {} kernel over blockwise 4-bit state", family.name());
    s.push_str("alias R = vec4<f32>;\nalias S = f32;\n");
    // f32 states run `q8_f32.wgsl` with 8-bit's shape: four elements per invocation over
    // blocks of 256.
    let (block, per_word, workgroup) = if variant.quantized {
        let words = variant.block_size / CODES_PER_WORD;
        let workgroup = if variant.serial { WORKGROUP } else { words * blocks_per_group(variant.block_size) };
        (variant.block_size, CODES_PER_WORD, workgroup)
    } else {
        (F32_BLOCK, 4, WORKGROUP)
    };
    let constants = [
        ("BLOCK_SIZE", block),
        ("CODES_PER_WORD", per_word),
        ("BLOCK_WORDS", block / per_word),
        ("WORKGROUP", workgroup),
        ("BLOCKS_PER_GROUP", blocks_per_group(variant.block_size)),
        ("KEPT", 2 * (variant.block_size / CODES_PER_WORD)),
        ("STATES", kinds.len() as u32),
        ("MAX_STATES", MAX_STATES as u32),
        ("INFINITY", f32::INFINITY.to_bits()),
    ];
    for (name, value) in constants {
        let _ = writeln!(s, "const {name}: u32 = {value}u;");
    }
    // The engine's three buffers, at 8-bit's binding numbers (no code tables).
    wgsl::bindings(&mut s, variant);
    if variant.quantized {
        let _ = writeln!(s, "const MIN_SCALE: f32 = {};", literal(MIN_SCALE));
        // Both maps are declared whatever the kinds, so the files may name both.
        for k in 0..2 {
            let kind = kinds.get(k).copied().unwrap_or(crate::StateKind::ExpAvgSq);
            let map = map_for(kind);
            let entries: Vec<String> = map.iter().map(|&x| literal(x)).collect();
            let _ = writeln!(s, "const MAP{k} = array<f32, 16>({});", entries.join(", "));
            let _ = writeln!(s, "const ZERO{k}: u32 = {}u;", zero_code(&map));
            // torchao's code of a finite x: the number of thresholds not above it, 15
            // comparisons with constants (`q4::thresholds`).
            let counts: Vec<String> =
                thresholds(&map).iter().map(|&t| format!("u32(x >= {})", literal(t))).collect();
            let _ = writeln!(s, "fn count{k}(x: f32) -> u32 {{\n    return {};\n}}", counts.join(" + "));
        }
    }
    wgsl::states_and_scalars(&mut s, variant);
    s
}
