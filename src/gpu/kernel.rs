//! Kernel families: one WGSL body per algorithm family, the storage slots it reads and
//! writes, and the prelude that binds those slots for one binding layout.
//!
//! The body only calls `load_<slot>(i)` and `store_<slot>(i, value)` in the math type `R`;
//! the generated prelude maps each slot to a storage binding (shared when tensors alias)
//! with the element shift of the current segment, or to a stub when the slot is absent.

use std::fmt::Write;

use crate::DType;

/// The algorithm families that have a fused kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Family {
    /// Adam, AdamW and AMSGrad in the PyTorch, ONNX and DirectML conventions.
    Adam,
    /// SGD with standard or Nesterov momentum, or none (PyTorch SGD, ONNX Momentum).
    Momentum,
    /// Adagrad (ONNX and PyTorch).
    Adagrad,
    /// AMP: gradients multiplied by the device's `inv_scale`, non-finite ones flagged.
    Unscale,
}

impl Family {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Family::Adam => "adam",
            Family::Momentum => "momentum",
            Family::Adagrad => "adagrad",
            Family::Unscale => "unscale",
        }
    }

    /// The WGSL body, embedded at build time.
    pub(crate) fn source(self) -> &'static str {
        match self {
            Family::Adam => include_str!("../../shaders/adam.wgsl"),
            Family::Momentum => include_str!("../../shaders/momentum.wgsl"),
            Family::Adagrad => include_str!("../../shaders/adagrad.wgsl"),
            Family::Unscale => include_str!("../../shaders/unscale.wgsl"),
        }
    }

    /// The body's `at_step`, which derives the step-dependent uniform fields from the
    /// device's step counter and learning rate (capturable mode).
    pub(crate) fn capturable_source(self) -> &'static str {
        match self {
            Family::Adam => include_str!("../../shaders/adam_capturable.wgsl"),
            Family::Momentum => include_str!("../../shaders/momentum_capturable.wgsl"),
            Family::Adagrad => include_str!("../../shaders/adagrad_capturable.wgsl"),
            Family::Unscale => "",
        }
    }

    /// Slots the kernel reads, in the order the engine receives them. State slots carry
    /// PyTorch's `state_dict` names.
    pub(crate) fn inputs(self) -> &'static [&'static str] {
        match self {
            Family::Adam => &["param", "grad", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"],
            Family::Momentum => &["param", "grad", "momentum_buffer"],
            Family::Adagrad => &["param", "grad", "sum"],
            Family::Unscale => &["grad"],
        }
    }

    /// Slots the kernel writes, in the order the engine receives them. `param_copy` is the
    /// model's low-precision copy of the new parameters in master-weight mode.
    pub(crate) fn outputs(self) -> &'static [&'static str] {
        match self {
            Family::Adam => &["param", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "param_copy"],
            Family::Momentum => &["param", "momentum_buffer", "param_copy"],
            Family::Adagrad => &["param", "sum", "param_copy"],
            Family::Unscale => &["grad"],
        }
    }

    /// Number of `R` scalars in the family's hyperparameter uniform.
    pub(crate) fn hyper_len(self) -> usize {
        match self {
            Family::Adam => 12,
            Family::Momentum => 6,
            Family::Adagrad => 4,
            Family::Unscale => 0,
        }
    }

    /// The `override` constants the body declares, in the order `KernelStep` stores them.
    pub(crate) fn override_names(self) -> &'static [&'static str] {
        match self {
            Family::Adam => {
                &["AMSGRAD", "EPS_AFTER_CORRECTION", "MAXIMIZE", "WEIGHT_DECAY", "FIRST_MOMENT_LERP"]
            }
            Family::Momentum => &["MAXIMIZE", "NESTEROV", "VELOCITY", "WEIGHT_DECAY"],
            Family::Adagrad => &["MAXIMIZE", "WEIGHT_DECAY"],
            Family::Unscale => &[],
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
    /// The AMP unscale pass: the device state, read-write.
    Unscale,
}

/// Everything that selects one compiled pipeline.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct VariantKey {
    pub(crate) scalars: Scalars,
    pub(crate) family: Family,
    /// The type the arithmetic runs in (and the hyperparameter uniform holds).
    pub(crate) math: DType,
    pub(crate) layout: BindingLayout,
    /// Values of the family's pipeline-overridable constants.
    pub(crate) overrides: [u32; crate::gpu::step::MAX_OVERRIDES],
    /// Elements per load and store: 1, or 4 (`vec4`) where every binding is native f32 or
    /// f16 and the elements line up on 4-element boundaries in every buffer.
    pub(crate) width: u32,
}

impl VariantKey {
    /// The scalar (one element per access) variant; segments choose their width.
    pub(crate) fn new(
        scalars: Scalars,
        step: &crate::gpu::step::KernelStep,
        math: DType,
        layout: BindingLayout,
    ) -> Self {
        VariantKey { scalars, family: step.family, math, layout, overrides: step.overrides, width: 1 }
    }

    /// This variant with `width` elements per access.
    pub(crate) fn with_width(&self, width: u32) -> VariantKey {
        VariantKey { width, ..self.clone() }
    }
}

/// Invocations per workgroup. 256 is WebGPU's default `max_compute_invocations_per_workgroup`.
pub(crate) const WORKGROUP_SIZE: u32 = 256;

/// The most workgroups one dispatch launches; a grid-stride loop covers the rest. 4096 x 256
/// = 1 M invocations fill any current GPU (an H100 keeps 132 x 2048 = 270 k resident), and
/// on big tensors each invocation then takes several elements, which lavapipe (a CPU) needs
/// to amortize its per-invocation cost: 16 Mi-element Adam ran at 73 % of the copy roofline
/// with one workgroup per 256 vec4s and 94-100 % with this cap.
pub(crate) const MAX_WORKGROUPS: u32 = 4096;

/// The fields of the per-segment uniform before the per-binding bases.
pub(crate) const SEGMENT_HEADER: [&str; 4] = ["n", "pair_shift", "pair_first", "pair_step"];

/// The full WGSL of one variant: generated prelude, the family's body, the entry point.
pub(crate) fn compose(key: &VariantKey) -> String {
    let math = key.math.wgsl_math();
    let vector = key.width == 4;
    let bindings = &key.layout.bindings;
    let mut s = String::new();
    // `write!` into a String cannot fail, so its results are ignored.
    if bindings.iter().any(|b| b.storage == Storage::Native(DType::F16)) {
        s.push_str("enable f16;\n");
    }
    let _ = writeln!(s, "// wgpu-optim {} kernel, math in {math}", key.family.name());
    if vector {
        let _ = writeln!(s, "alias R = vec4<{math}>;");
    } else {
        let _ = writeln!(s, "alias R = {math};");
    }
    let _ = writeln!(s, "alias S = {math};");
    let _ = writeln!(s, "override WG: u32 = {WORKGROUP_SIZE}u;");
    s.push_str("struct Segment {\n");
    for field in SEGMENT_HEADER {
        let _ = writeln!(s, "    {field}: u32,");
    }
    for b in 0..bindings.len() {
        let _ = writeln!(s, "    base{b}: u32,");
    }
    s.push_str("}\n@group(1) @binding(0) var<uniform> seg: Segment;\n");
    s.push_str(&nan_helpers(key.math, vector));
    if bindings.iter().any(|b| b.storage.dtype().size() == 2) {
        s.push_str(include_str!("../../shaders/convert.wgsl"));
    }
    for (b, desc) in bindings.iter().enumerate() {
        let access = if desc.read_write { "read_write" } else { "read" };
        let element = match (desc.storage, vector) {
            (Storage::Native(d), false) => d.wgsl_math().to_string(),
            (Storage::Native(d), true) => format!("vec4<{}>", d.wgsl_math()),
            (Storage::Packed(_), _) => "u32".to_string(),
        };
        let _ = writeln!(s, "@group(1) @binding({}) var<storage, {access}> buf{b}: array<{element}>;", b + 1);
    }
    for (slot, binding) in key.family.inputs().iter().zip(&key.layout.inputs) {
        let body = match binding {
            Some(b) => load_expression(*b, bindings[*b].storage),
            None => "return R(S(0));".to_string(),
        };
        let _ = writeln!(s, "fn load_{slot}(i: u32) -> R {{ {body} }}");
    }
    for (slot, binding) in key.family.outputs().iter().zip(&key.layout.outputs) {
        let body = binding.map(|b| store_statement(b, bindings[b].storage, vector)).unwrap_or_default();
        let _ = writeln!(s, "fn store_{slot}(i: u32, v: R) {{ {body} }}");
    }
    s.push_str(key.family.source());
    let prologue = match key.scalars {
        Scalars::Host => {
            s.push_str("\n@group(0) @binding(0) var<uniform> hp: Hyper;\n");
            ""
        }
        Scalars::Device => {
            s.push_str(include_str!("../../shaders/device.wgsl"));
            s.push_str(key.family.capturable_source());
            s.push_str(
                "\n@group(0) @binding(0) var<uniform> hp_base: Hyper;\n\
                 @group(0) @binding(1) var<storage, read> device_state: DeviceState;\n\
                 @group(0) @binding(2) var<storage, read> device_lr: f32;\n\
                 var<private> hp: Hyper;\n",
            );
            // A step skipped by AMP changes nothing.
            "if device_state.found_inf != 0u {\n        return;\n    }\n    \
             hp = at_step(hp_base, f32(device_state.step), device_lr);\n    "
        }
        Scalars::Unscale => {
            s.push_str(
                "\nstruct AmpState {\n    step: u32,\n    found_inf: atomic<u32>,\n    inv_scale: f32,\n}\n\
                 @group(0) @binding(0) var<storage, read_write> amp: AmpState;\n",
            );
            ""
        }
    };
    let entry = if key.layout.pairs() { PAIR_ENTRY } else { ELEMENT_ENTRY };
    s.push_str(&entry.replace("{prologue}", prologue));
    s
}

/// `max_propagating_nan(a, b)`: NaN if either is NaN (as `torch.maximum`), else `max(a, b)`.
/// NaN is found from the bits, which no compiler may assume away.
fn nan_helpers(math: DType, vector: bool) -> String {
    let is_nan = if math == DType::F64 {
        // No 64-bit integers (nor a size-changing bitcast) without extensions; an ordered
        // comparison is false exactly for NaN.
        "fn is_nan(x: R) -> bool {\n    return !(x == x);\n}\n".to_string()
    } else {
        let (u, b) = if vector { ("vec4<u32>", "vec4<bool>") } else { ("u32", "bool") };
        format!("fn is_nan(x: R) -> {b} {{\n    return (bitcast<{u}>(x) & {u}(0x7fffffffu)) > {u}(0x7f800000u);\n}}\n")
    };
    is_nan + "fn max_propagating_nan(a: R, b: R) -> R {\n    return select(max(a, b), a + b, is_nan(a) | is_nan(b));\n}\n"
}

fn load_expression(b: usize, storage: Storage) -> String {
    let half = |decode: &str| {
        format!(
            "let j = seg.base{b} + i; return R({decode}((buf{b}[j >> 1u] >> ((j & 1u) * 16u)) & 0xffffu));"
        )
    };
    match storage {
        Storage::Native(_) => format!("return R(buf{b}[seg.base{b} + i]);"),
        Storage::Packed(DType::BF16) => half("bf16_value"),
        Storage::Packed(_) => half("f16_value"),
    }
}

fn store_statement(b: usize, storage: Storage, vector: bool) -> String {
    let half = |encode: &str| {
        format!("let j = seg.base{b} + i; buf{b}[j >> 1u] = with_half(buf{b}[j >> 1u], j & 1u, {encode}(f32(v)));")
    };
    match storage {
        // Rounded to nearest even in f32 first, so the f16 conversion is exact.
        Storage::Native(DType::F16) if vector => format!(
            "buf{b}[seg.base{b} + i] = vec4<f16>(f16(f16_value(f16_bits(v.x))), f16(f16_value(f16_bits(v.y))), \
             f16(f16_value(f16_bits(v.z))), f16(f16_value(f16_bits(v.w))));"
        ),
        Storage::Native(DType::F16) => {
            format!("buf{b}[seg.base{b} + i] = f16(f16_value(f16_bits(f32(v))));")
        }
        Storage::Native(d) if vector => format!("buf{b}[seg.base{b} + i] = vec4<{}>(v);", d.wgsl_math()),
        Storage::Native(d) => format!("buf{b}[seg.base{b} + i] = {}(v);", d.wgsl_math()),
        Storage::Packed(DType::BF16) => half("bf16_bits"),
        Storage::Packed(_) => half("f16_bits"),
    }
}

/// One element per invocation and iteration.
const ELEMENT_ENTRY: &str = "
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    {prologue}let stride = groups.x * WG;
    for (var i = gid.x; i < seg.n; i += stride) {
        update(i);
    }
}
";

/// One aligned pair of elements per invocation and iteration: pair k holds the elements
/// 2k - pair_shift and 2k + 1 - pair_shift, which share one word of every packed output
/// whose parity is pair_shift. Outputs of the other parity are updated in two phases
/// (pair_step 2), even pairs then odd pairs, so no word is written by two invocations.
const PAIR_ENTRY: &str = "
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    {prologue}let stride = groups.x * WG * seg.pair_step;
    let pairs = (seg.n + seg.pair_shift + 1u) / 2u;
    for (var k = gid.x * seg.pair_step + seg.pair_first; k < pairs; k += stride) {
        let first = 2u * k;
        if first >= seg.pair_shift {
            update(first - seg.pair_shift);
        }
        let second = first + 1u - seg.pair_shift;
        if second < seg.n {
            update(second);
        }
    }
}
";
