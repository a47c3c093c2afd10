//! The generated prelude of the update, unscale and norm kernels (see the parent module's
//! doc for what it declares), composed with the program's body and its entry point.

use std::fmt::Write;

use super::table_layout::table_wgsl;
use super::{binding_wgsl, Program, Scalars, Storage, VariantKey, NORM_FOLD, WORKGROUP_SIZE};
use crate::step::clip::ClipHeader;
use crate::step::device::DeviceHeader;
use crate::step::rounding::{self, RoundingHeader};
use crate::step::Slot;
use crate::{DType, StateKind};

/// The fields of `CurrentSegment` (the private `seg`, which `select_entry` fills from the
/// table; no host layout) before its per-binding bases.
const SEGMENT_HEADER: [&str; 4] = ["n", "pair_shift", "pair_first", "pair_step"];
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
        s.push_str(include_str!("../../../shaders/convert.wgsl"));
    }
    if rng {
        s.push_str(include_str!("../../../shaders/stochastic.wgsl"));
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
        s.push_str(include_str!("../../../shaders/norm_combine.wgsl"));
        s.push_str(include_str!("../../../shaders/grad_norm.wgsl"));
    }
    s.push_str(key.program.source());
    s.push_str(&scalars_wgsl(key, rng));
    if key.program.takes_norm() {
        // The gradient as the norm sees it: as loaded, or unscaled (and stored).
        let term = if matches!(key.program, Program::UnscaleNorm(_)) { "unscale(i)" } else { "load_grad(i)" };
        let _ = writeln!(s, "fn norm_term(i: u32) -> R {{\n    return {term};\n}}");
        s.push_str(include_str!("../../../shaders/entry_norm.wgsl"));
    } else if let Scalars::Passes(passes) = key.scalars {
        s.push_str(&(passes.entry_wgsl)(vector, key.pairs()));
    } else if key.pairs() {
        s.push_str(include_str!("../../../shaders/entry_pair.wgsl"));
    } else {
        s.push_str(include_str!("../../../shaders/entry_element.wgsl"));
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
            s.push_str(include_str!("../../../shaders/device.wgsl"));
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
        Scalars::Passes(passes) => {
            let _ = write!(
                s,
                "\n@group(GROUP_SCALARS) @binding(BINDING_HYPER) var<uniform> {hyper_binding};\n\
                 var<private> hp: Hyper;\n\
                 alias PassPartial = {};\n\
                 @group(GROUP_SCALARS) @binding(BINDING_PASS_PARTIALS) var<storage, read_write> pass_partials: array<PassPartial>;\n\
                 @group(GROUP_SCALARS) @binding(BINDING_PASS_INDEX) var<storage, read> pass_index: array<u32>;\n",
                passes.partial
            );
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
        include_str!("../../../shaders/nan_f64.wgsl").to_string()
    } else {
        let (bits, mask) = if vector { ("vec4<u32>", "vec4<bool>") } else { ("u32", "bool") };
        format!("alias NanBits = {bits};\nalias NanMask = {mask};\n")
            + include_str!("../../../shaders/nan_bits.wgsl")
    };
    is_nan + include_str!("../../../shaders/nan.wgsl")
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
