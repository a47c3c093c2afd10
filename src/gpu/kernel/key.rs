//! The variant key: everything that selects one compiled pipeline (the program, its
//! scalars, the math type, the binding layout, the access width, clipping and rounding).

use super::Program;
use crate::step::rounding::Stochastic;
use crate::DType;

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
    /// A family's table passes ([`TablePasses`]): the hyperparameter uniform, one partial
    /// per workgroup (written) and the family's index buffer (read).
    Passes(&'static TablePasses),
}

/// Passes of a family's update that are not elementwise but run in the multi-tensor
/// table's machinery all the same (LAMB's moments and apply passes, around each tensor's
/// norms): group 0 holds the uniform, `pass_partials` (one `PassPartial` per workgroup,
/// written) and `pass_index` (`u32` words the family lays out, read), and the family writes
/// the entry point. The prelude knows no family: it declares these from this description.
#[derive(Debug)]
pub(crate) struct TablePasses {
    /// The family's name: one family's passes from another's in a pipeline key.
    pub(crate) name: &'static str,
    /// The WGSL type of one workgroup's partial (`alias PassPartial`).
    pub(crate) partial: &'static str,
    /// The entry point, given whether accesses are `vec4` (`vector`) and whether packed
    /// outputs take an aligned pair of elements at a time (`pairs`).
    pub(crate) entry_wgsl: fn(vector: bool, pairs: bool) -> String,
}

// A key tells passes apart by their family's name (function pointers have no stable
// identity to compare).
impl PartialEq for TablePasses {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for TablePasses {}

impl std::hash::Hash for TablePasses {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
    }
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
            Scalars::Passes(_) => 2,
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
