//! The CPU kernels' machinery: the storage leaves a family's loops are written for (f32 and
//! bf16 elements, f16 registers, 8-bit blocks), and the kernel that picks a family's loop
//! once per step ([`Kernel::new`]). Each family's loops, the update of its WGSL in f32
//! operation for operation so that the CPU rounds where the GPU does, live in its folder
//! (`crate::family::<name>::cpu`).
//!
//! Every switch is a const generic: each combination is its own loop with no branch per
//! element, which the compiler vectorizes.

use half::{bf16, f16};

use super::convert::bf16_bits;
use super::q8;
use crate::family::adagrad::cpu::{adagrad, adagrad_f16, adagrad_loop};
use crate::family::adam::cpu::{adam, adam_f16, adam_loop, adam_q8};
use crate::family::ademamix::cpu::{ademamix, ademamix_f16, ademamix_loop, ademamix_q8};
use crate::family::lamb::cpu::{lamb_apply, lamb_apply_f16, lamb_loop};
use crate::family::lion::cpu::{lion, lion_f16, lion_loop, lion_q8};
use crate::family::momentum::cpu::{momentum, momentum_f16, momentum_loop, momentum_q8};
use crate::family::muon::cpu::{muon, muon_f16, muon_loop};
use crate::family::rmsprop::cpu::{rmsprop, rmsprop_f16, rmsprop_loop, rmsprop_q8};
use crate::family::schedule_free::cpu::{schedule_free, schedule_free_f16, schedule_free_loop};
use crate::step::{AdagradUniform, AdamUniform, KernelStep, MomentumUniform};
use crate::step::{AdemamixUniform, LambUniform, LionUniform, MuonUniform};
use crate::step::{RmsPropUniform, ScheduleFreeUniform};

/// The most state tensors any family keeps (AMSGrad's three).
pub(crate) const MAX_STATE: usize = 3;

/// A storage type the loops read and write directly: f32, or bf16, whose conversions are
/// integer operations the compiler vectorizes with the update, so a bf16 step is one pass
/// (f16 converts a register of elements per instruction, `super::f16_lanes`; mixed storage goes
/// through f32 blocks, `super::storage`).
pub(crate) trait Element: Copy + Send + Sync + 'static {
    /// This type's loop among a family's `loops`.
    fn pick<U>(loops: &Loops<U>) -> Loop<U, Self>;
    fn widen(self) -> f32;
    /// Rounded to nearest even, as `shaders/convert.wgsl` stores it.
    fn narrow(x: f32) -> Self;
}

impl Element for f32 {
    fn pick<U>(loops: &Loops<U>) -> Loop<U, Self> {
        loops.f32
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
    fn pick<U>(loops: &Loops<U>) -> Loop<U, Self> {
        loops.bf16
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

/// A family's loop: the uniform, the gradient clipping coefficient, the operands.
pub(crate) type Loop<U, E = f32> = for<'a> fn(&U, f32, <E as Leaves>::Operands<'a>);

/// A family's loop compiled for its switches, for each storage type the loops take directly.
pub(crate) struct Loops<U> {
    f32: Loop<U>,
    bf16: Loop<U, bf16>,
    f16: Loop<U, f16>,
    q8: Loop<U, Q8>,
}

/// One step of one family: the f32 uniform the GPU kernel would read, and its loops.
enum Update {
    Adam(AdamUniform, Loops<AdamUniform>),
    Momentum(MomentumUniform, Loops<MomentumUniform>),
    Adagrad(AdagradUniform, Loops<AdagradUniform>),
    Lion(LionUniform, Loops<LionUniform>),
    ScheduleFree(ScheduleFreeUniform, Loops<ScheduleFreeUniform>),
    /// Adafactor runs its own loops (`cpu::adafactor`): nothing elementwise to do here.
    Adafactor,
    Muon(MuonUniform, Loops<MuonUniform>),
    RmsProp(RmsPropUniform, Loops<RmsPropUniform>),
    Ademamix(AdemamixUniform, Loops<AdemamixUniform>),
    Lamb(LambUniform, Loops<LambUniform>),
}

/// The loop of one storage type for each family's switches, so that one selection tree
/// per family serves every storage type.
pub(crate) trait Leaves: Sized {
    /// What a loop of this storage type updates.
    type Operands<'a>;
    /// This storage type's loop among a family's `loops`.
    fn pick<U>(loops: &Loops<U>) -> Loop<U, Self>;
    fn adam<const A: bool, const E: bool, const M: bool, const D: u8, const F: u32>(
    ) -> Loop<AdamUniform, Self>;
    fn momentum<const M: bool, const W: bool, const V: bool, const N: bool, const R: bool>(
    ) -> Loop<MomentumUniform, Self>;
    fn adagrad<const M: bool, const W: bool>() -> Loop<AdagradUniform, Self>;
    fn lion() -> Loop<LionUniform, Self>;
    fn schedule_free<const S: bool, const W: bool, const F: bool>() -> Loop<ScheduleFreeUniform, Self>;
    fn muon() -> Loop<MuonUniform, Self>;
    fn rmsprop<const M: bool, const W: bool, const C: u8, const B: bool, const R: bool>(
    ) -> Loop<RmsPropUniform, Self>;
    fn ademamix<const A: bool>() -> Loop<AdemamixUniform, Self>;
    fn lamb_apply<const W: bool>() -> Loop<LambUniform, Self>;
}

/// f32 and bf16: the loops that convert each element in registers.
impl<T: Element> Leaves for T {
    type Operands<'a> = Operands<'a, T>;
    fn pick<U>(loops: &Loops<U>) -> Loop<U, Self> {
        T::pick(loops)
    }
    fn adam<const A: bool, const E: bool, const M: bool, const D: u8, const F: u32>(
    ) -> Loop<AdamUniform, Self> {
        adam::<T, A, E, M, D, F>
    }
    fn momentum<const M: bool, const W: bool, const V: bool, const N: bool, const R: bool>(
    ) -> Loop<MomentumUniform, Self> {
        momentum::<T, M, W, V, N, R>
    }
    fn adagrad<const M: bool, const W: bool>() -> Loop<AdagradUniform, Self> {
        adagrad::<T, M, W>
    }
    fn lion() -> Loop<LionUniform, Self> {
        lion::<T>
    }
    fn schedule_free<const S: bool, const W: bool, const F: bool>() -> Loop<ScheduleFreeUniform, Self> {
        schedule_free::<T, S, W, F>
    }
    fn muon() -> Loop<MuonUniform, Self> {
        muon::<T>
    }
    fn rmsprop<const M: bool, const W: bool, const C: u8, const B: bool, const R: bool>(
    ) -> Loop<RmsPropUniform, Self> {
        rmsprop::<T, M, W, C, B, R>
    }
    fn ademamix<const A: bool>() -> Loop<AdemamixUniform, Self> {
        ademamix::<T, A>
    }
    fn lamb_apply<const W: bool>() -> Loop<LambUniform, Self> {
        lamb_apply::<T, W>
    }
}

/// f16: the loops that convert a register of elements at a time (`f16_lanes`).
impl Leaves for f16 {
    type Operands<'a> = Operands<'a, f16>;
    fn pick<U>(loops: &Loops<U>) -> Loop<U, Self> {
        loops.f16
    }
    fn adam<const A: bool, const E: bool, const M: bool, const D: u8, const F: u32>(
    ) -> Loop<AdamUniform, Self> {
        adam_f16::<A, E, M, D, F>
    }
    fn momentum<const M: bool, const W: bool, const V: bool, const N: bool, const R: bool>(
    ) -> Loop<MomentumUniform, Self> {
        momentum_f16::<M, W, V, N, R>
    }
    fn adagrad<const M: bool, const W: bool>() -> Loop<AdagradUniform, Self> {
        adagrad_f16::<M, W>
    }
    fn lion() -> Loop<LionUniform, Self> {
        lion_f16
    }
    fn schedule_free<const S: bool, const W: bool, const F: bool>() -> Loop<ScheduleFreeUniform, Self> {
        schedule_free_f16::<S, W, F>
    }
    fn muon() -> Loop<MuonUniform, Self> {
        muon_f16
    }
    fn rmsprop<const M: bool, const W: bool, const C: u8, const B: bool, const R: bool>(
    ) -> Loop<RmsPropUniform, Self> {
        rmsprop_f16::<M, W, C, B, R>
    }
    fn ademamix<const A: bool>() -> Loop<AdemamixUniform, Self> {
        ademamix_f16::<A>
    }
    fn lamb_apply<const W: bool>() -> Loop<LambUniform, Self> {
        lamb_apply_f16::<W>
    }
}

/// Blockwise 8-bit state (`super::q8`) beside f32 parameters and gradients: the loops of
/// the families that have an 8-bit form (Adam, momentum, Lion, uncentered RMSprop without
/// momentum, AdEMAMix) run in one pass per block ([`q8::each`]); the others' f32 loops run
/// on each block's dequantized state ([`q8::blocked`]).
pub(crate) enum Q8 {}

impl Leaves for Q8 {
    type Operands<'a> = q8::Job<'a>;
    fn pick<U>(loops: &Loops<U>) -> Loop<U, Self> {
        loops.q8
    }
    fn adam<const A: bool, const E: bool, const M: bool, const D: u8, const F: u32>(
    ) -> Loop<AdamUniform, Self> {
        adam_q8::<A, E, M, D, F>
    }
    fn momentum<const M: bool, const W: bool, const V: bool, const N: bool, const R: bool>(
    ) -> Loop<MomentumUniform, Self> {
        momentum_q8::<M, W, V, N, R>
    }
    fn adagrad<const M: bool, const W: bool>() -> Loop<AdagradUniform, Self> {
        |hp, scale, job| q8::blocked(job, q8::NonFinite::Update, |o| adagrad::<f32, M, W>(hp, scale, o))
    }
    fn lion() -> Loop<LionUniform, Self> {
        lion_q8
    }
    fn schedule_free<const S: bool, const W: bool, const F: bool>() -> Loop<ScheduleFreeUniform, Self> {
        |hp, scale, job| {
            q8::blocked(job, q8::NonFinite::Update, |o| schedule_free::<f32, S, W, F>(hp, scale, o))
        }
    }
    fn muon() -> Loop<MuonUniform, Self> {
        |hp, scale, job| q8::blocked(job, q8::NonFinite::Update, |o| muon::<f32>(hp, scale, o))
    }
    fn rmsprop<const M: bool, const W: bool, const C: u8, const B: bool, const R: bool>(
    ) -> Loop<RmsPropUniform, Self> {
        rmsprop_q8::<M, W, C, B, R>
    }
    fn ademamix<const A: bool>() -> Loop<AdemamixUniform, Self> {
        ademamix_q8::<A>
    }
    fn lamb_apply<const W: bool>() -> Loop<LambUniform, Self> {
        |hp, scale, job| q8::blocked(job, q8::NonFinite::Update, |o| lamb_apply::<f32, W>(hp, scale, o))
    }
}

/// One step's update, with the coefficient every gradient is multiplied by as it is loaded
/// (gradient clipping's; 1 otherwise, which changes no bit), as the GPU kernels load it.
pub(crate) struct Kernel {
    update: Update,
    grad_scale: f32,
}

impl Kernel {
    /// The loop and uniform for `step`, gradients unscaled.
    pub(crate) fn new(step: &KernelStep) -> Self {
        Kernel { update: Update::new(step), grad_scale: 1.0 }
    }

    /// This kernel with every gradient multiplied by `grad_scale`.
    pub(crate) fn with_grad_scale(self, grad_scale: f32) -> Self {
        Kernel { grad_scale, ..self }
    }

    /// Updates every element of `operands`, all stored as `E`. For f16 only where
    /// `f16_lanes::available()`; elsewhere the blocked path is faster.
    pub(crate) fn run<E: Leaves>(&self, operands: E::Operands<'_>) {
        let scale = self.grad_scale;
        match &self.update {
            Update::Adam(uniform, loops) => E::pick(loops)(uniform, scale, operands),
            Update::Momentum(uniform, loops) => E::pick(loops)(uniform, scale, operands),
            Update::Adagrad(uniform, loops) => E::pick(loops)(uniform, scale, operands),
            Update::Lion(uniform, loops) => E::pick(loops)(uniform, scale, operands),
            Update::ScheduleFree(uniform, loops) => E::pick(loops)(uniform, scale, operands),
            Update::Adafactor => {}
            Update::Muon(uniform, loops) => E::pick(loops)(uniform, scale, operands),
            Update::RmsProp(uniform, loops) => E::pick(loops)(uniform, scale, operands),
            Update::Ademamix(uniform, loops) => E::pick(loops)(uniform, scale, operands),
            Update::Lamb(uniform, loops) => E::pick(loops)(uniform, scale, operands),
        }
    }
}

/// A family's loops for every storage type, from its selection tree `select`.
macro_rules! loops {
    ($select:ident($switches:expr, $uniform:expr)) => {
        Loops {
            f32: $select::<f32>($switches, $uniform),
            bf16: $select::<bf16>($switches, $uniform),
            f16: $select::<f16>($switches, $uniform),
            q8: $select::<Q8>($switches, $uniform),
        }
    };
}

impl Update {
    fn new(step: &KernelStep) -> Self {
        match step {
            KernelStep::Adam(switches, uniform) => {
                let u = uniform.to_f32();
                Update::Adam(u, loops!(adam_loop(switches, &u)))
            }
            KernelStep::Momentum(switches, uniform) => {
                let u = uniform.to_f32();
                Update::Momentum(u, loops!(momentum_loop(switches, &u)))
            }
            KernelStep::Adagrad(switches, uniform) => {
                let u = uniform.to_f32();
                Update::Adagrad(u, loops!(adagrad_loop(switches, &u)))
            }
            KernelStep::Lion(switches, uniform) => {
                let u = uniform.to_f32();
                Update::Lion(u, loops!(lion_loop(switches, &u)))
            }
            KernelStep::ScheduleFree(switches, uniform) => {
                let u = uniform.to_f32();
                Update::ScheduleFree(u, loops!(schedule_free_loop(switches, &u)))
            }
            KernelStep::Adafactor(..) => Update::Adafactor,
            KernelStep::Muon(switches, uniform) => {
                let u = uniform.to_f32();
                Update::Muon(u, loops!(muon_loop(switches, &u)))
            }
            KernelStep::RmsProp(switches, uniform) => {
                let u = uniform.to_f32();
                Update::RmsProp(u, loops!(rmsprop_loop(switches, &u)))
            }
            KernelStep::Ademamix(switches, uniform) => {
                let u = uniform.to_f32();
                Update::Ademamix(u, loops!(ademamix_loop(switches, &u)))
            }
            KernelStep::Lamb(switches, uniform) => {
                let u = uniform.to_f32();
                Update::Lamb(u, loops!(lamb_loop(switches, &u)))
            }
        }
    }
}
