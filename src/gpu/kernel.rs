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
}

impl Family {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Family::Adam => "adam",
            Family::Momentum => "momentum",
            Family::Adagrad => "adagrad",
        }
    }

    /// The WGSL body, embedded at build time.
    pub(crate) fn source(self) -> &'static str {
        match self {
            Family::Adam => include_str!("../../shaders/adam.wgsl"),
            Family::Momentum => include_str!("../../shaders/momentum.wgsl"),
            Family::Adagrad => include_str!("../../shaders/adagrad.wgsl"),
        }
    }

    /// Slots the kernel reads, in the order the engine receives them. State slots carry
    /// PyTorch's `state_dict` names.
    pub(crate) fn inputs(self) -> &'static [&'static str] {
        match self {
            Family::Adam => &["param", "grad", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"],
            Family::Momentum => &["param", "grad", "momentum_buffer"],
            Family::Adagrad => &["param", "grad", "sum"],
        }
    }

    /// Slots the kernel writes, in the order the engine receives them.
    pub(crate) fn outputs(self) -> &'static [&'static str] {
        match self {
            Family::Adam => &["param", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"],
            Family::Momentum => &["param", "momentum_buffer"],
            Family::Adagrad => &["param", "sum"],
        }
    }

    /// Number of `R` scalars in the family's hyperparameter uniform.
    pub(crate) fn hyper_len(self) -> usize {
        match self {
            Family::Adam => 10,
            Family::Momentum => 6,
            Family::Adagrad => 3,
        }
    }

    /// The `override` constants the body declares, in the order `KernelStep` stores them.
    pub(crate) fn override_names(self) -> &'static [&'static str] {
        match self {
            Family::Adam => &["AMSGRAD", "EPS_AFTER_CORRECTION", "MAXIMIZE", "WEIGHT_DECAY"],
            Family::Momentum => &["MAXIMIZE", "NESTEROV", "VELOCITY", "WEIGHT_DECAY"],
            Family::Adagrad => &["MAXIMIZE", "WEIGHT_DECAY"],
        }
    }
}

/// One storage binding of a layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct BindingDesc {
    pub(crate) dtype: DType,
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

/// Everything that selects one compiled pipeline.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct VariantKey {
    pub(crate) family: Family,
    /// The type the arithmetic runs in (and the hyperparameter uniform holds).
    pub(crate) math: DType,
    pub(crate) layout: BindingLayout,
    /// Values of the family's pipeline-overridable constants.
    pub(crate) overrides: [u32; crate::gpu::step::MAX_OVERRIDES],
}

/// Invocations per workgroup. 256 is WebGPU's default `max_compute_invocations_per_workgroup`.
pub(crate) const WORKGROUP_SIZE: u32 = 256;

/// The full WGSL of one variant: generated prelude, then the family's body.
pub(crate) fn compose(key: &VariantKey) -> String {
    let math = key.math.wgsl_storage();
    let mut s = String::new();
    // `write!` into a String cannot fail.
    let _ = writeln!(s, "// wgpu-optim {} kernel, math in {math}", key.family.name());
    let _ = writeln!(s, "alias R = {math};");
    let _ = writeln!(s, "override WG: u32 = {WORKGROUP_SIZE}u;");
    let _ = writeln!(s, "struct Segment {{\n    n: u32,");
    for b in 0..key.layout.bindings.len() {
        let _ = writeln!(s, "    base{b}: u32,");
    }
    let _ = writeln!(s, "}}\n@group(1) @binding(0) var<uniform> seg: Segment;");
    for (b, desc) in key.layout.bindings.iter().enumerate() {
        let access = if desc.read_write { "read_write" } else { "read" };
        let _ = writeln!(
            s,
            "@group(1) @binding({}) var<storage, {access}> buf{b}: array<{}>;",
            b + 1,
            desc.dtype.wgsl_storage()
        );
    }
    for (slot, binding) in key.family.inputs().iter().zip(&key.layout.inputs) {
        match binding {
            Some(b) => {
                let _ = writeln!(s, "fn load_{slot}(i: u32) -> R {{ return R(buf{b}[seg.base{b} + i]); }}");
            }
            None => {
                let _ = writeln!(s, "fn load_{slot}(i: u32) -> R {{ return R(0); }}");
            }
        }
    }
    for (slot, binding) in key.family.outputs().iter().zip(&key.layout.outputs) {
        match binding {
            Some(b) => {
                let storage = key.layout.bindings[*b].dtype.wgsl_storage();
                let _ = writeln!(
                    s,
                    "fn store_{slot}(i: u32, v: R) {{ buf{b}[seg.base{b} + i] = {storage}(v); }}"
                );
            }
            None => {
                let _ = writeln!(s, "fn store_{slot}(i: u32, v: R) {{ }}");
            }
        }
    }
    s.push_str(key.family.source());
    s
}
