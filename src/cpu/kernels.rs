//! The CPU kernels' machinery: the storage leaves a family's loops are written for (f32 and
//! bf16 elements, f16 registers, 8-bit blocks), and the kernel that runs a family's loops,
//! picked once per step ([`Kernel::new`]). Each family's loops, the update of its WGSL in f32
//! operation for operation so that the CPU rounds where the GPU does, live in its folder
//! (`crate::family::<name>::cpu`) with its selection tree and its `loops`, which the family
//! registry (`crate::step`) calls for a step of that family.
//!
//! Every switch is a const generic: each combination is its own loop with no branch per
//! element, which the compiler vectorizes.

use half::{bf16, f16};

use super::convert::bf16_bits;
use super::q8;
use crate::step::{CpuUpdate, KernelStep};

pub(crate) use crate::step::MAX_STATE;

/// A storage type the loops read and write directly: f32, or bf16, whose conversions are
/// integer operations the compiler vectorizes with the update, so a bf16 step is one pass
/// (f16 converts a register of elements per instruction, `super::f16_lanes`; mixed storage goes
/// through f32 blocks, `super::storage`).
pub(crate) trait Element: Copy + Send + Sync + 'static {
    /// Runs this type's loop of `update`.
    fn run(update: &dyn Update, scale: f32, operands: Operands<'_, Self>);
    fn widen(self) -> f32;
    /// Rounded to nearest even, as `shaders/convert.wgsl` stores it.
    fn narrow(x: f32) -> Self;
}

impl Element for f32 {
    fn run(update: &dyn Update, scale: f32, operands: Operands<'_, Self>) {
        update.run_f32(scale, operands)
    }

    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }

    #[inline(always)]
    fn narrow(x: f32) -> Self {
        x
    }
}

impl Element for bf16 {
    fn run(update: &dyn Update, scale: f32, operands: Operands<'_, Self>) {
        update.run_bf16(scale, operands)
    }

    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }

    #[inline(always)]
    fn narrow(x: f32) -> Self {
        bf16::from_bits(bf16_bits(x))
    }
}

/// One run of elements of each operand, all the same length and storage type.
pub(crate) struct Operands<'a, E = f32> {
    pub(crate) param: &'a mut [E],
    pub(crate) grad: &'a [E],
    /// The family's state slots in the order of `Algorithm::state_kinds` (which is the
    /// kernels' slot order); slots the family does not have are empty.
    pub(crate) state: [&'a mut [E]; MAX_STATE],
}

/// A family's uniform with `maximize` as a run-time flag: the loops negate each gradient by
/// flipping its sign bit ([`Self::signed`], the shader's `-g` exactly, NaN included) rather
/// than compiling a loop for each sign; the bench measured no cost (PERF.md, "Run-time
/// switches"). Reads as the uniform itself otherwise.
pub(crate) struct Signed<U> {
    uniform: U,
    /// XORed into each gradient's bits: the sign bit with `maximize`, else 0.
    gradient_sign: u32,
}

impl<U> Signed<U> {
    pub(crate) fn new(uniform: U, maximize: bool) -> Self {
        Signed { uniform, gradient_sign: if maximize { 1 << 31 } else { 0 } }
    }

    /// `g`, negated where the step maximizes.
    #[inline(always)]
    pub(crate) fn signed(&self, g: f32) -> f32 {
        f32::from_bits(g.to_bits() ^ self.gradient_sign)
    }
}

impl<U> std::ops::Deref for Signed<U> {
    type Target = U;
    fn deref(&self) -> &U {
        &self.uniform
    }
}

/// A family's loop: the uniform, the gradient clipping coefficient, the operands.
pub(crate) type Loop<U, E = f32> = for<'a> fn(&U, f32, <E as Leaf>::Operands<'a>);

/// A family's loop compiled for its switches, for each storage type the loops take directly.
pub(crate) struct Loops<U> {
    pub(crate) f32: Loop<U>,
    pub(crate) bf16: Loop<U, bf16>,
    pub(crate) f16: Loop<U, f16>,
    pub(crate) q8: Loop<U, Q8>,
}

impl<U: Send + Sync + 'static> Loops<U> {
    /// One step's update: these loops with the uniform they read.
    pub(crate) fn with_uniform(self, uniform: U) -> Bound<U> {
        Bound { uniform, loops: self }
    }
}

/// A family's loops for every storage type (a [`Loops`]), from its selection tree `select`,
/// generic over the storage leaf and called with `args`.
macro_rules! every_storage {
    ($select:ident($($args:expr),*)) => {
        $crate::cpu::kernels::Loops {
            f32: $select::<f32>($($args),*),
            bf16: $select::<half::bf16>($($args),*),
            f16: $select::<half::f16>($($args),*),
            q8: $select::<$crate::cpu::kernels::Q8>($($args),*),
        }
    };
}
pub(crate) use every_storage;

/// One step's update of one family for each storage type: its loops with their uniform. The
/// family is erased here, so that the kernel and everything that runs it know no family: the
/// cost is a dynamic call per run of elements, never per element (the loops themselves are
/// each family's own, monomorphized for its switches).
pub(crate) trait Update: Send + Sync {
    fn run_f32(&self, scale: f32, operands: Operands<'_, f32>);
    fn run_bf16(&self, scale: f32, operands: Operands<'_, bf16>);
    fn run_f16(&self, scale: f32, operands: Operands<'_, f16>);
    fn run_q8(&self, scale: f32, job: q8::Job<'_>);
}

/// A family's loops and the uniform they read: one step's update, held by value in the
/// registry's `CpuUpdate` (a step allocates nothing).
pub(crate) struct Bound<U> {
    uniform: U,
    loops: Loops<U>,
}

impl<U: Send + Sync> Update for Bound<U> {
    fn run_f32(&self, scale: f32, operands: Operands<'_, f32>) {
        (self.loops.f32)(&self.uniform, scale, operands)
    }

    fn run_bf16(&self, scale: f32, operands: Operands<'_, bf16>) {
        (self.loops.bf16)(&self.uniform, scale, operands)
    }

    fn run_f16(&self, scale: f32, operands: Operands<'_, f16>) {
        (self.loops.f16)(&self.uniform, scale, operands)
    }

    fn run_q8(&self, scale: f32, job: q8::Job<'_>) {
        (self.loops.q8)(&self.uniform, scale, job)
    }
}

/// A storage type a kernel runs on: what its loops update, and which of a step's loops is
/// its own. Each family's leaf trait (`AdamLeaf`, ...) gives every leaf's loop for each of the
/// family's switches, so that one selection tree per family serves every storage type.
pub(crate) trait Leaf: Sized {
    /// What a loop of this storage type updates.
    type Operands<'a>;
    /// Runs this storage type's loop of `update`.
    fn run(update: &dyn Update, scale: f32, operands: Self::Operands<'_>);
}

/// f32 and bf16: the loops that convert each element in registers.
impl<T: Element> Leaf for T {
    type Operands<'a> = Operands<'a, T>;
    fn run(update: &dyn Update, scale: f32, operands: Self::Operands<'_>) {
        T::run(update, scale, operands)
    }
}

/// f16: the loops that convert a register of elements at a time (`f16_lanes`).
impl Leaf for f16 {
    type Operands<'a> = Operands<'a, f16>;
    fn run(update: &dyn Update, scale: f32, operands: Self::Operands<'_>) {
        update.run_f16(scale, operands)
    }
}

/// Blockwise 8-bit state (`super::q8`) beside f32 parameters and gradients: the loops of
/// the families that have an 8-bit form run in one pass per block ([`q8::each`]); the
/// others' f32 loops run on each block's dequantized state ([`q8::blocked`]). Which is which
/// is each family's leaf impl for `Q8`.
pub(crate) enum Q8 {}

impl Leaf for Q8 {
    type Operands<'a> = q8::Job<'a>;
    fn run(update: &dyn Update, scale: f32, job: Self::Operands<'_>) {
        update.run_q8(scale, job)
    }
}

/// One step's update, with the coefficient every gradient is multiplied by as it is loaded
/// (gradient clipping's; 1 otherwise, which changes no bit), as the GPU kernels load it.
pub(crate) struct Kernel {
    update: CpuUpdate,
    grad_scale: f32,
}

impl Kernel {
    /// The loops and uniform for `step`, gradients unscaled.
    pub(crate) fn new(step: &KernelStep) -> Self {
        Kernel { update: step.cpu_update(), grad_scale: 1.0 }
    }

    /// This kernel with every gradient multiplied by `grad_scale`.
    pub(crate) fn with_grad_scale(self, grad_scale: f32) -> Self {
        Kernel { grad_scale, ..self }
    }

    /// Updates every element of `operands`, all stored as `E`. For f16 only where
    /// `f16_lanes::available()`; elsewhere the blocked path is faster.
    pub(crate) fn run<E: Leaf>(&self, operands: E::Operands<'_>) {
        E::run(self.update.as_update(), self.grad_scale, operands)
    }
}
