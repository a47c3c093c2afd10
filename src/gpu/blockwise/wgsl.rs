//! The parts of a low-bit kernel's generated prelude that 8-bit's and 4-bit's share: the
//! table and its `struct Segment`, the three storage bindings the engine binds, and after
//! the format's own code declarations, each state's loads and stores, the family's unbound
//! slots, its overrides and scalars; and the files of `shaders/` both formats run
//! ([`push_files`]). What each file reads from the prelude is documented by
//! `gpu::q8::shader` and the files themselves.

use std::fmt::Write;

use super::layout::{Segment, ENTRY_ROWS};
use super::Variant;
use crate::gpu::kernel::{binding_wgsl, nan_helpers, table_head_wgsl};
use crate::step::clip::ClipHeader;
use crate::step::Slot;
use crate::DType;

/// A storage binding of group 1 at `gpu::kernel::binding`'s `BINDING_{binding}`: `name`, an
/// array of `element` with `access`.
pub(in crate::gpu) fn storage(s: &mut String, binding: &str, access: &str, name: &str, element: &str) {
    // `write!` into a String cannot fail, so its results are ignored.
    let _ = writeln!(
        s,
        "@group(GROUP_TABLE) @binding(BINDING_{binding}) var<storage, {access}> {name}: array<{element}>;"
    );
}

/// The binding numbers, the table, `struct Segment` and `segment_at(r)`, the bindings
/// `params` and `state`, `grads` unless the gradients lie in the parameters' buffer, and
/// `grad_at(j)`, which reads whichever holds them.
pub(in crate::gpu) fn bindings(s: &mut String, variant: &Variant) {
    s.push_str(&binding_wgsl());
    s.push_str(&table_head_wgsl(ENTRY_ROWS));
    s.push_str(&Segment::wgsl());
    s.push_str(&Segment::reader_wgsl("segment_at"));
    storage(s, "Q8_PARAMS", "read_write", "params", "f32");
    if variant.grad_in_params {
        s.push_str("fn grad_at(j: u32) -> f32 {\n    return params[j];\n}\n");
    } else {
        storage(s, "Q8_GRADS", "read", "grads", "f32");
        s.push_str("fn grad_at(j: u32) -> f32 {\n    return grads[j];\n}\n");
    }
    storage(s, "Q8_STATE", "read_write", "state", "u32");
}

/// The NaN helpers; per state k of the variant, `load_<state>` and `store_<state>` reading
/// `old_states[k]` and writing `new_states[k]`; every other slot of the family reading 0
/// and storing nothing; the family's override constants, `struct Hyper` and its binding
/// `hp_base`; clipped, `struct ClipHeader` and its binding `clip_state`.
pub(in crate::gpu) fn states_and_scalars(s: &mut String, variant: &Variant) {
    let kinds = &variant.kinds;
    let family = variant.switches.family();
    s.push_str(&nan_helpers(DType::F32, true));
    // shaders/q8.wgsl's stores keep a restarted element's parameter; its states are zeroed
    // here.
    let _ = writeln!(s, "const RESTART_NON_FINITE: bool = {};", variant.restart_non_finite);
    let stored = if variant.restart_non_finite { "select(v, R(0.0), restart)" } else { "v" };
    for (k, kind) in kinds.iter().enumerate() {
        let _ = writeln!(
            s,
            "fn load_{name}(i: u32) -> R {{\n    return old_states[{k}];\n}}\n\
             fn store_{name}(i: u32, v: R) {{\n    new_states[{k}] = {stored};\n}}",
            name = kind.torch_name()
        );
    }
    // Slots of the family these algorithms leave unbound.
    let bound = |slot: &Slot| {
        matches!(slot, Slot::Param | Slot::Grad | Slot::ParamCopy)
            || matches!(slot, Slot::State(kind) if kinds.contains(kind))
    };
    for slot in family.inputs().iter().filter(|slot| !bound(slot)) {
        let _ = writeln!(s, "fn load_{}(i: u32) -> R {{\n    return R(0.0);\n}}", slot.name());
    }
    for slot in family.outputs().iter().filter(|slot| !bound(slot)) {
        let _ = writeln!(s, "fn store_{}(i: u32, v: R) {{}}", slot.name());
    }
    for o in variant.switches.overrides() {
        s.push_str(&o.wgsl());
    }
    s.push_str(&variant.switches.uniform_wgsl());
    let _ = writeln!(s, "@group(GROUP_SCALARS) @binding(BINDING_HYPER) var<uniform> hp_base: Hyper;");
    if variant.clip {
        s.push_str(&ClipHeader::wgsl());
        let _ = writeln!(
            s,
            "@group(GROUP_SCALARS) @binding(BINDING_CLIP) var<storage, read> clip_state: ClipHeader;"
        );
    }
}

/// The family's loads and stores over four elements, common to every variant of both
/// formats.
const COMMON: &str = include_str!("../../../shaders/q8.wgsl");
/// `clip(g)` and `load_clip()`, clipped and not.
const CLIPPED: &str = include_str!("../../../shaders/q8_clip.wgsl");
const UNCLIPPED: &str = include_str!("../../../shaders/q8_unclipped.wgsl");
/// The entry point of f32 states, both formats'.
const F32_ENTRY: &str = include_str!("../../../shaders/q8_f32.wgsl");

/// The files a kernel runs after the family's body: `q8.wgsl`, `q8_clip.wgsl` or
/// `q8_unclipped.wgsl`, then `q8_f32.wgsl` for f32 states, or the format's `codes` and
/// its entry point (`serial_entry` or `workgroup_entry`) for quantized ones.
pub(in crate::gpu) fn push_files(
    s: &mut String,
    variant: &Variant,
    codes: &str,
    serial_entry: &str,
    workgroup_entry: &str,
) {
    s.push_str(COMMON);
    s.push_str(if variant.clip { CLIPPED } else { UNCLIPPED });
    match (variant.quantized, variant.serial) {
        (false, _) => s.push_str(F32_ENTRY),
        (true, serial) => {
            s.push_str(codes);
            s.push_str(if serial { serial_entry } else { workgroup_entry });
        }
    }
}
