//! The WGSL of an 8-bit-state step: the family's own body (`shaders/adam.wgsl`,
//! `momentum.wgsl`), run four elements per invocation, between a prelude that dequantizes
//! one block's codes and an epilogue that takes the block's new absmax (a workgroup
//! reduction) and requantizes. One workgroup owns one block at a time, so the reduction
//! never leaves it, and each invocation owns one `u32` word of four codes per state, so no
//! two invocations write one word. On CPU adapters one invocation owns a block instead,
//! keeping its new states in private memory until their absmax is known.

use std::fmt::Write;

use crate::gpu::kernel::{entry_row_wgsl, nan_helpers, CLIP_BINDING, TABLE_ROWS};
use crate::q8::lut::{CodeTable, BUCKETS, BUCKETS_PER_SIGN, INFINITY, ONE, SMALLEST};
use crate::step::clip::ClipHeader;
use crate::step::{Family, Slot, Switches};
use crate::{DType, StateKind};

/// Invocations per workgroup: 64 invocations of four elements cover one block of 256.
pub(crate) const WORKGROUP: u32 = 64;

/// Words of the tables binding before the code tables: the signed map, then the unsigned.
const MAPS_WORDS: usize = 512;

/// The binding of the code tables: both maps (f32 bits), then the signed and the unsigned
/// [`crate::q8::lut::CodeTable`] entries.
pub(crate) fn tables_words() -> Vec<u32> {
    let (signed, unsigned) = (CodeTable::signed(), CodeTable::unsigned());
    let mut words = Vec::with_capacity(MAPS_WORDS + 2 * BUCKETS);
    words.extend(signed.map().iter().map(|c| c.to_bits()));
    words.extend(unsigned.map().iter().map(|c| c.to_bits()));
    words.extend_from_slice(signed.entries());
    words.extend_from_slice(unsigned.entries());
    words
}

/// `u32` fields of a segment's entry in the dispatch's table, in order: its elements and
/// blocks, its first workgroup within the dispatch and its count of workgroups, its first
/// parameter and gradient within their bindings, and `s<k>`, state k's first word (codes,
/// or f32 values), `a<k>` its first absmax word, in the state arena.
pub(crate) const SEGMENT_FIELDS: [&str; 12] =
    ["n", "blocks", "first_group", "groups", "param", "grad", "s0", "a0", "s1", "a1", "unused0", "unused1"];

/// Rows (`vec4<u32>`) of one table entry.
pub(crate) const ENTRY_ROWS: usize = SEGMENT_FIELDS.len() / 4;

/// The dispatch's table (the multi-tensor path's layout: a header row, the entries, the
/// workgroup map), `seg` (the workgroup's segment, private) and the functions that find and
/// load it.
fn table_wgsl() -> String {
    let mut s = String::from("struct Segment {\n");
    for field in SEGMENT_FIELDS {
        let _ = writeln!(s, "    {field}: u32,");
    }
    let _ = write!(
        s,
        "}}\nvar<private> seg: Segment;\n\
         struct Table {{\n    head: vec4<u32>,\n    rows: array<vec4<u32>, {TABLE_ROWS}>,\n}}\n\
         @group(1) @binding(0) var<uniform> table: Table;\n{}\
         fn load_segment(e: u32) {{\n",
        entry_row_wgsl(ENTRY_ROWS)
    );
    const LANES: [&str; 4] = ["x", "y", "z", "w"];
    for (f, field) in SEGMENT_FIELDS.iter().enumerate() {
        let _ = writeln!(s, "    seg.{field} = table.rows[e + {}u].{};", f / 4, LANES[f % 4]);
    }
    s.push_str("}\n");
    s
}

/// The full WGSL of one variant: `quantized` states (codes and absmax) or f32 states (a
/// tensor below `min_8bit_size`), the gradient read from its own binding or, when
/// `grad_in_params`, from the parameters' (the same buffer); 8-bit blocks owned by a
/// workgroup each, or, when `serial`, by one invocation each (for CPU adapters); with
/// `clip`, each gradient scaled by the clip buffer's coefficient as it is loaded.
pub(crate) fn compose(
    switches: &Switches,
    kinds: &[StateKind],
    quantized: bool,
    grad_in_params: bool,
    serial: bool,
    clip: bool,
) -> String {
    let family = switches.family();
    let mut s = String::new();
    let _ = writeln!(s, "// wgpu-optim {} kernel over blockwise 8-bit state", family.name());
    s.push_str("alias R = vec4<f32>;\nalias S = f32;\n");
    s.push_str(&table_wgsl());
    s.push_str("@group(1) @binding(1) var<storage, read_write> params: array<f32>;\n");
    let grads = if grad_in_params {
        "params"
    } else {
        s.push_str("@group(1) @binding(2) var<storage, read> grads: array<f32>;\n");
        "grads"
    };
    s.push_str("@group(1) @binding(3) var<storage, read_write> state: array<u32>;\n");
    if quantized {
        s.push_str("@group(1) @binding(4) var<storage, read> tables: array<u32>;\n");
    }
    s.push_str(&nan_helpers(DType::F32, true));
    // The invocation's first element within the segment, and which of its four exist.
    s.push_str("var<private> first: u32;\nvar<private> live: vec4<bool>;\n");
    // Lanes past the tensor's end read its last element (so every load is in bounds and
    // branch-free) and are never written.
    // With clipping the gradient as stored is scaled as it is loaded, as PyTorch scales the
    // gradients in place before the step (the f32 kernels do the same).
    let grad_loader = if clip { "grad_stored" } else { "grad" };
    for ((slot, loader), array) in
        [("param", "param"), ("grad", grad_loader)].into_iter().zip(["params", grads])
    {
        let _ = writeln!(
            s,
            "fn load_{loader}(i: u32) -> R {{\n    let at = seg.{slot} + first;\n    let last = seg.{slot} + seg.n - 1u;\n    \
             return vec4({array}[min(at, last)], {array}[min(at + 1u, last)], {array}[min(at + 2u, last)], {array}[min(at + 3u, last)]);\n}}"
        );
    }
    s.push_str(
        "fn store_param(i: u32, v: R) {\n    let at = seg.param + first;\n    \
         if live.x { params[at] = v.x; }\n    if live.y { params[at + 1u] = v.y; }\n    \
         if live.z { params[at + 2u] = v.z; }\n    if live.w { params[at + 3u] = v.w; }\n}\n\
         fn store_param_copy(i: u32, v: R) {}\n",
    );
    // State k's value before the update (`old<k>`) and after (`new<k>`).
    for (k, kind) in kinds.iter().enumerate() {
        let _ = writeln!(
            s,
            "var<private> old{k}: R;\nvar<private> new{k}: R;\n\
             fn load_{name}(i: u32) -> R {{ return old{k}; }}\nfn store_{name}(i: u32, v: R) {{ new{k} = v; }}",
            name = kind.torch_name()
        );
    }
    // Slots of the family these algorithms leave unbound.
    let bound = |slot: &Slot| {
        matches!(slot, Slot::Param | Slot::Grad | Slot::ParamCopy)
            || matches!(slot, Slot::State(kind) if kinds.contains(kind))
    };
    for slot in family.inputs().iter().filter(|slot| !bound(slot)) {
        let _ = writeln!(s, "fn load_{}(i: u32) -> R {{ return R(0.0); }}", slot.name());
    }
    for slot in family.outputs().iter().filter(|slot| !bound(slot)) {
        let _ = writeln!(s, "fn store_{}(i: u32, v: R) {{}}", slot.name());
    }
    for o in switches.overrides() {
        s.push_str(&o.wgsl());
    }
    s.push_str(&switches.uniform_wgsl());
    s.push_str(match family {
        Family::Adam => include_str!("../../../shaders/adam.wgsl"),
        Family::Momentum => include_str!("../../../shaders/momentum.wgsl"),
        Family::Adagrad => include_str!("../../../shaders/adagrad.wgsl"),
    });
    // A private copy, loaded first thing by every entry point: a CPU adapter's compiler
    // cannot keep uniform values in registers across storage writes that might alias them.
    s.push_str("\n@group(0) @binding(0) var<uniform> hp_base: Hyper;\nvar<private> hp: Hyper;\n");
    s.push_str(&scalars_wgsl(clip));
    if quantized {
        s.push_str(&quantized_entry(kinds, serial));
    } else {
        s.push_str(&f32_entry(kinds));
    }
    s
}

/// `load_scalars`, which every entry point calls first: private copies of the
/// hyperparameters and, with `clip`, of the clip coefficient (which `load_grad` applies).
fn scalars_wgsl(clip: bool) -> String {
    if !clip {
        return "fn load_scalars() {\n    hp = hp_base;\n}\n".into();
    }
    ClipHeader::wgsl()
        + &format!(
            "@group(0) @binding({CLIP_BINDING}) var<storage, read> clip_state: ClipState;
var<private> clip_coefficient: f32;
fn load_grad(i: u32) -> R {{
    return load_grad_stored(i) * clip_coefficient;
}}
fn load_scalars() {{
    hp = hp_base;
    clip_coefficient = clip_state.coefficient;
}}
"
        )
}

/// State fields of state `k` in the segment.
fn fields(k: usize) -> (String, String) {
    (format!("seg.s{k}"), format!("seg.a{k}"))
}

/// f32 state: each invocation's four values in four words.
fn f32_entry(kinds: &[StateKind]) -> String {
    let mut load = String::new();
    let mut store = String::new();
    for k in 0..kinds.len() {
        let (words, _) = fields(k);
        let _ = write!(
            load,
            "\n        old{k} = bitcast<vec4<f32>>(vec4(state[{words} + min(first, last)], state[{words} + min(first + 1u, last)], \
             state[{words} + min(first + 2u, last)], state[{words} + min(first + 3u, last)]));"
        );
        let _ = write!(
            store,
            "\n        let bits{k} = bitcast<vec4<u32>>(new{k});\n        \
             if live.x {{ state[{words} + first] = bits{k}.x; }}\n        if live.y {{ state[{words} + first + 1u] = bits{k}.y; }}\n        \
             if live.z {{ state[{words} + first + 2u] = bits{k}.z; }}\n        if live.w {{ state[{words} + first + 3u] = bits{k}.w; }}"
        );
    }
    format!(
        "@compute @workgroup_size({WORKGROUP})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
    load_scalars();
    load_segment(entry_row(wid.x));
    let last = seg.n - 1u;
    for (var b = wid.x - seg.first_group; b < seg.blocks; b += seg.groups) {{
        first = b * 256u + lid * 4u;
        live = (vec4(first) + vec4(0u, 1u, 2u, 3u)) < vec4(seg.n);{load}
        update(0u);{store}
    }}
}}
"
    )
}

/// 8-bit state: dequantize the invocation's code word of each state, update, reduce the
/// block's largest finite magnitude (as bits, infinities and NaN left out as `q8::quantize`
/// leaves them) over the workgroup, and requantize (a non-finite value to the code of 0).
fn quantized_entry(kinds: &[StateKind], serial: bool) -> String {
    let mut load = String::new();
    let mut reduce_own = String::new();
    let mut scale = String::new();
    let mut store = String::new();
    let mut store_absmax = String::new();
    for (k, kind) in kinds.iter().enumerate() {
        let (words, absmax) = fields(k);
        let (map, table) =
            if crate::q8::is_signed(*kind) { (0, MAPS_WORDS) } else { (256, MAPS_WORDS + BUCKETS) };
        let zero = CodeTable::for_kind(*kind).zero();
        let lane = ["x", "y"][k];
        let _ = write!(
            load,
            "\n        let scale{k} = bitcast<f32>(state[{absmax} + b]);\n        \
             let word{k} = select(0u, state[{words} + b * 64u + w], live.x);\n        \
             old{k} = vec4(bitcast<f32>(tables[{map}u + (word{k} & 0xffu)]), \
             bitcast<f32>(tables[{map}u + ((word{k} >> 8u) & 0xffu)]), \
             bitcast<f32>(tables[{map}u + ((word{k} >> 16u) & 0xffu)]), \
             bitcast<f32>(tables[{map}u + (word{k} >> 24u)])) * scale{k};"
        );
        let _ = write!(reduce_own, "\n        own.{lane} = largest(new{k});");
        // The block's new absmax, once it is known: 1 for an all-zero block.
        let _ = write!(
            scale,
            "\n        absmax{k} = select(bitcast<f32>(block_max.{lane}), 1.0, block_max.{lane} == 0u);"
        );
        let _ = write!(
            store,
            "\n        let scaled{k} = new{k} / absmax{k};\n        \
             // Bytes past the tensor's end stay 0.\n        \
             let codes{k} = code({table}u, {zero}u, scaled{k}.x) | select(0u, code({table}u, {zero}u, scaled{k}.y) << 8u, live.y) | \
             select(0u, code({table}u, {zero}u, scaled{k}.z) << 16u, live.z) | select(0u, code({table}u, {zero}u, scaled{k}.w) << 24u, live.w);\n        \
             if live.x {{\n            state[{words} + b * 64u + w] = codes{k};\n        }}"
        );
        let _ = write!(store_absmax, "\n        state[{absmax} + b] = bitcast<u32>(absmax{k});");
    }
    let declare_absmax: String = (0..kinds.len()).map(|k| format!("\n    var absmax{k} = 1.0;")).collect();
    let helpers = format!(
        "// `CodeTable::code` (src/q8/lut.rs): the bucket of the clamped magnitude, per sign; NaN
// and the infinities take `zero`, the code of 0.
fn code(table: u32, zero: u32, x: f32) -> u32 {{
    let bits = bitcast<u32>(x);
    let magnitude = clamp(bits & 0x7fffffffu, {SMALLEST}u, {ONE}u);
    let entry = tables[table + (bits >> 31u) * {BUCKETS_PER_SIGN}u + ((magnitude - {SMALLEST}u) >> 16u)];
    let c = select(entry & 0xffu, (entry >> 8u) & 0xffu, (magnitude & 0xffffu) >= (entry >> 16u));
    return select(c, zero, (bits & 0x7fffffffu) >= {INFINITY}u);
}}
// The largest finite magnitude of the live lanes, as the bits of |x|: a NaN or infinity
// would spoil its whole block's scale, so it counts as 0.
fn largest(v: R) -> u32 {{
    let magnitude = bitcast<vec4<u32>>(v) & vec4(0x7fffffffu);
    let bits = select(vec4(0u), magnitude, live & (magnitude < vec4({INFINITY}u)));
    return max(max(bits.x, bits.y), max(bits.z, bits.w));
}}
"
    );
    if serial {
        let kept: String =
            (0..kinds.len()).map(|k| format!("var<private> kept{k}: array<R, 64>;\n")).collect();
        let keep: String = (0..kinds.len()).map(|k| format!("\n            kept{k}[w] = new{k};")).collect();
        let recall: String =
            (0..kinds.len()).map(|k| format!("\n            new{k} = kept{k}[w];")).collect();
        // Every word of the block reads the old absmax, so the new one is written last.
        return helpers
            + &format!(
                "// One invocation per block, for CPU adapters (which run a workgroup barrier as a switch
// through every invocation): the block's update with its new states kept in private
// memory, then, their largest magnitude known, the states requantized.
{kept}@compute @workgroup_size({WORKGROUP})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{{declare_absmax}
    load_scalars();
    load_segment(entry_row(wid.x));
    for (var b = (wid.x - seg.first_group) * {WORKGROUP}u + lid; b < seg.blocks; b += seg.groups * {WORKGROUP}u) {{
        var block_max = vec2(0u);
        var words = 0u;
        for (var w = 0u; w < 64u; w++) {{
            first = b * 256u + w * 4u;
            live = (vec4(first) + vec4(0u, 1u, 2u, 3u)) < vec4(seg.n);
            if !live.x {{
                break;
            }}{load}
            update(0u);
            var own = vec2(0u);{reduce_own}
            block_max = max(block_max, own);{keep}
            words = w + 1u;
        }}{scale}
        for (var w = 0u; w < words; w++) {{
            first = b * 256u + w * 4u;
            live = (vec4(first) + vec4(0u, 1u, 2u, 3u)) < vec4(seg.n);{recall}{store}
        }}{store_absmax}
    }}
}}
"
            );
    }
    helpers
        + &format!(
            "var<workgroup> lanes: array<vec2<u32>, {WORKGROUP}>;
var<workgroup> entry: u32;
@compute @workgroup_size({WORKGROUP})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{{declare_absmax}
    let w = lid;
    load_scalars();
    // One search per workgroup, and a value the barriers below may depend on.
    if lid == 0u {{
        entry = entry_row(wid.x);
    }}
    let e = workgroupUniformLoad(&entry);
    load_segment(e);
    let blocks = table.rows[e].y;
    let groups = table.rows[e].w;
    for (var b = wid.x - table.rows[e].z; b < blocks; b += groups) {{
        first = b * 256u + lid * 4u;
        live = (vec4(first) + vec4(0u, 1u, 2u, 3u)) < vec4(seg.n);{load}
        update(0u);
        var own = vec2(0u);{reduce_own}
        lanes[lid] = own;
        // Two levels of 8 (each barrier costs a CPU adapter a switch through every invocation).
        workgroupBarrier();
        if lid < 8u {{
            var m = lanes[8u * lid];
            for (var j = 1u; j < 8u; j++) {{
                m = max(m, lanes[8u * lid + j]);
            }}
            lanes[8u * lid] = m;
        }}
        workgroupBarrier();
        var block_max = lanes[0];
        for (var j = 1u; j < 8u; j++) {{
            block_max = max(block_max, lanes[8u * j]);
        }}{scale}{store}
        if lid == 0u {{{store_absmax}
        }}
        // The next block reuses `lanes`.
        workgroupBarrier();
    }}
}}
"
        )
}
