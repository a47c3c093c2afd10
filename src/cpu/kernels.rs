//! The update formulas of the family shaders (`shaders/<family>.wgsl`) in f32,
//! operation for operation, so the CPU rounds where the GPU does.
//!
//! Every switch is a const generic: each combination is its own loop with no branch per
//! element, which the compiler vectorizes. [`Kernel::new`] picks the loop once per step.

use half::{bf16, f16};

use super::convert::bf16_bits;
use super::f16_lanes;
use super::q8;
use crate::step::{
    AdagradSwitches, AdagradUniform, AdamSwitches, AdamUniform, EpsPlacement, FirstMoment, KernelStep,
    MomentumSwitches, MomentumUniform,
};
use crate::step::{AdemamixSwitches, AdemamixUniform};
use crate::step::{LambSwitches, LambUniform};
use crate::step::{LionSwitches, LionUniform};
use crate::step::{MuonSwitches, MuonUniform};
use crate::step::{RmsPropSwitches, RmsPropUniform};
use crate::step::{ScheduleFreeSwitches, ScheduleFreeUniform};

/// The most state tensors any family keeps (AMSGrad's three).
pub(super) const MAX_STATE: usize = 3;

/// A storage type the loops read and write directly: f32, or bf16, whose conversions are
/// integer operations the compiler vectorizes with the update, so a bf16 step is one pass
/// (f16 converts a register of elements per instruction, `super::f16_lanes`; mixed storage goes
/// through f32 blocks, `super::storage`).
pub(super) trait Element: Copy + Send + Sync + 'static {
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
pub(super) struct Operands<'a, E = f32> {
    pub(super) param: &'a mut [E],
    pub(super) grad: &'a [E],
    /// The family's state slots in the order of `Algorithm::state_kinds` (which is the
    /// kernels' slot order); slots the family does not have are empty.
    pub(super) state: [&'a mut [E]; MAX_STATE],
}

/// A family's loop: the uniform, the gradient clipping coefficient, the operands.
pub(super) type Loop<U, E = f32> = for<'a> fn(&U, f32, <E as Leaves>::Operands<'a>);

/// A family's loop compiled for its switches, for each storage type the loops take directly.
pub(super) struct Loops<U> {
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
pub(super) trait Leaves: Sized {
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
pub(super) enum Q8 {}

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
pub(super) struct Kernel {
    update: Update,
    grad_scale: f32,
}

impl Kernel {
    /// The loop and uniform for `step`, gradients unscaled.
    pub(super) fn new(step: &KernelStep) -> Self {
        Kernel { update: Update::new(step), grad_scale: 1.0 }
    }

    /// This kernel with every gradient multiplied by `grad_scale`.
    pub(super) fn with_grad_scale(self, grad_scale: f32) -> Self {
        Kernel { grad_scale, ..self }
    }

    /// Updates every element of `operands`, all stored as `E`. For f16 only where
    /// `f16_lanes::available()`; elsewhere the blocked path is faster.
    pub(super) fn run<E: Leaves>(&self, operands: E::Operands<'_>) {
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

// How weight decay enters an Adam update (a const generic cannot be an enum). The shader
// tests the L2 coefficient against 0 at run time; here that test picks the loop.
const NO_DECAY: u8 = 0;
const L2: u8 = 1;
const DECOUPLED: u8 = 2;
/// Decoupled decay after the update (bitsandbytes' kernels: `AdamSwitches::decay_after_update`).
const DECOUPLED_AFTER: u8 = 3;

// The forms of the first moment, `FirstMoment` as a const generic (the shader's values).
const LINEAR: u32 = FirstMoment::Linear.code();
const LERP_FROM_MOMENT: u32 = FirstMoment::LerpFromMoment.code();
const LERP_FROM_GRAD: u32 = FirstMoment::LerpFromGrad.code();

/// One element of `shaders/adam.wgsl`: returns `(p_new, m, v, v_hat)`.
#[inline(always)]
fn adam_element<
    const AMSGRAD: bool,
    const EPS_AFTER_CORRECTION: bool,
    const MAXIMIZE: bool,
    const DECAY: u8,
    const MOMENT: u32,
>(
    hp: &AdamUniform,
    mut p: f32,
    mut g: f32,
    m_prev: f32,
    v_prev: f32,
    v_max_prev: f32,
) -> (f32, f32, f32, f32) {
    if MAXIMIZE {
        g = -g;
    }
    if DECAY == L2 {
        g += hp.weight_decay * p;
    } else if DECAY == DECOUPLED {
        p *= hp.decay;
    }
    let m = match MOMENT {
        LERP_FROM_MOMENT => m_prev + hp.one_minus_beta1 * (g - m_prev),
        LERP_FROM_GRAD => g - (g - m_prev) * (1.0 - hp.one_minus_beta1),
        _ => hp.beta1 * m_prev + hp.one_minus_beta1 * g,
    };
    let v = hp.beta2 * v_prev + hp.one_minus_beta2 * g * g;
    // torch.maximum propagates NaN; f32::max would drop it.
    let v_hat = if !AMSGRAD {
        v
    } else if v_max_prev.is_nan() || v.is_nan() {
        v_max_prev + v
    } else {
        v_max_prev.max(v)
    };
    let denom = if EPS_AFTER_CORRECTION {
        v_hat.sqrt() / hp.sqrt_bias_correction2 + hp.eps
    } else {
        v_hat.sqrt() + hp.eps
    };
    let p_new = (p - hp.step_size * (m / denom)) * hp.post_scale;
    let p_new = if DECAY == DECOUPLED_AFTER { p_new * hp.decay } else { p_new };
    (p_new, m, v, v_hat)
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn adam<
    E: Element,
    const AMSGRAD: bool,
    const EPS_AFTER_CORRECTION: bool,
    const MAXIMIZE: bool,
    const DECAY: u8,
    const MOMENT: u32,
>(
    hp: &AdamUniform,
    scale: f32,
    o: Operands<'_, E>,
) {
    let update = adam_element::<AMSGRAD, EPS_AFTER_CORRECTION, MAXIMIZE, DECAY, MOMENT>;
    let [exp_avg, exp_avg_sq, max_exp_avg_sq] = o.state;
    let rows = o.param.iter_mut().zip(o.grad).zip(exp_avg.iter_mut()).zip(exp_avg_sq.iter_mut());
    if AMSGRAD {
        for ((((p, g), m), v), v_max) in rows.zip(max_exp_avg_sq.iter_mut()) {
            let new = update(hp, p.widen(), g.widen() * scale, m.widen(), v.widen(), v_max.widen());
            (*p, *m, *v, *v_max) = (E::narrow(new.0), E::narrow(new.1), E::narrow(new.2), E::narrow(new.3));
        }
    } else {
        // No maximum is kept: the slot is empty and the shader's absent load reads 0.
        for (((p, g), m), v) in rows {
            let new = update(hp, p.widen(), g.widen() * scale, m.widen(), v.widen(), 0.0);
            (*p, *m, *v) = (E::narrow(new.0), E::narrow(new.1), E::narrow(new.2));
        }
    }
}

/// [`adam`] on f16 operands, a register (sixteen or eight elements) at a time.
fn adam_f16<
    const AMSGRAD: bool,
    const EPS_AFTER_CORRECTION: bool,
    const MAXIMIZE: bool,
    const DECAY: u8,
    const MOMENT: u32,
>(
    hp: &AdamUniform,
    scale: f32,
    o: Operands<'_, f16>,
) {
    let update = adam_element::<AMSGRAD, EPS_AFTER_CORRECTION, MAXIMIZE, DECAY, MOMENT>;
    let [exp_avg, exp_avg_sq, max_exp_avg_sq] = o.state;
    if AMSGRAD {
        f16_lanes::each(
            [o.param, exp_avg, exp_avg_sq, max_exp_avg_sq],
            o.grad,
            #[inline(always)]
            |g, [p, m, v, v_max]| {
                let new = update(hp, p, g * scale, m, v, v_max);
                [new.0, new.1, new.2, new.3]
            },
        );
    } else {
        f16_lanes::each(
            [o.param, exp_avg, exp_avg_sq],
            o.grad,
            #[inline(always)]
            |g, [p, m, v]| {
                let new = update(hp, p, g * scale, m, v, 0.0);
                [new.0, new.1, new.2]
            },
        );
    }
}

/// [`adam`] over 8-bit state, one pass per block.
fn adam_q8<
    const AMSGRAD: bool,
    const EPS_AFTER_CORRECTION: bool,
    const MAXIMIZE: bool,
    const DECAY: u8,
    const MOMENT: u32,
>(
    hp: &AdamUniform,
    scale: f32,
    job: q8::Job<'_>,
) {
    let update = adam_element::<AMSGRAD, EPS_AFTER_CORRECTION, MAXIMIZE, DECAY, MOMENT>;
    let blocked = |o: Operands<'_, f32>| {
        adam::<f32, AMSGRAD, EPS_AFTER_CORRECTION, MAXIMIZE, DECAY, MOMENT>(hp, scale, o)
    };
    if AMSGRAD {
        q8::each::<_, true>(
            job,
            #[inline(always)]
            |g, p, [m, v, v_max]| {
                let new = update(hp, p, g * scale, m, v, v_max);
                (new.0, [new.1, new.2, new.3])
            },
            blocked,
        );
    } else {
        q8::each::<_, true>(
            job,
            #[inline(always)]
            |g, p, [m, v]| {
                let new = update(hp, p, g * scale, m, v, 0.0);
                (new.0, [new.1, new.2])
            },
            blocked,
        );
    }
}

fn adam_loop<T: Leaves>(s: &AdamSwitches, u: &AdamUniform) -> Loop<AdamUniform, T> {
    fn moment<T: Leaves, const A: bool, const E: bool, const M: bool, const D: u8>(
        s: &AdamSwitches,
    ) -> Loop<AdamUniform, T> {
        match s.first_moment {
            FirstMoment::Linear => T::adam::<A, E, M, D, LINEAR>(),
            FirstMoment::LerpFromMoment => T::adam::<A, E, M, D, LERP_FROM_MOMENT>(),
            FirstMoment::LerpFromGrad => T::adam::<A, E, M, D, LERP_FROM_GRAD>(),
        }
    }
    fn decay<T: Leaves, const A: bool, const E: bool, const M: bool>(
        s: &AdamSwitches,
        u: &AdamUniform,
    ) -> Loop<AdamUniform, T> {
        if s.decoupled_weight_decay {
            moment::<T, A, E, M, DECOUPLED>(s)
        } else if u.weight_decay != 0.0 || s.l2_at_zero {
            moment::<T, A, E, M, L2>(s)
        } else {
            moment::<T, A, E, M, NO_DECAY>(s)
        }
    }
    fn maximize<T: Leaves, const A: bool, const E: bool>(
        s: &AdamSwitches,
        u: &AdamUniform,
    ) -> Loop<AdamUniform, T> {
        if s.maximize {
            decay::<T, A, E, true>(s, u)
        } else {
            decay::<T, A, E, false>(s, u)
        }
    }
    fn eps<T: Leaves, const A: bool>(s: &AdamSwitches, u: &AdamUniform) -> Loop<AdamUniform, T> {
        match s.eps {
            EpsPlacement::AfterCorrection => maximize::<T, A, true>(s, u),
            EpsPlacement::OnRoot => maximize::<T, A, false>(s, u),
        }
    }
    // bitsandbytes' form (`q8::kernel_step`), which has neither AMSGrad nor a lerp: its few
    // loops alone, rather than every other switch's loops once more.
    fn bitsandbytes<T: Leaves>(s: &AdamSwitches) -> Loop<AdamUniform, T> {
        debug_assert!(!s.amsgrad && s.first_moment == FirstMoment::Linear, "{s:?}");
        match (s.eps, s.maximize) {
            (EpsPlacement::AfterCorrection, false) => {
                T::adam::<false, true, false, DECOUPLED_AFTER, LINEAR>()
            }
            (EpsPlacement::AfterCorrection, true) => T::adam::<false, true, true, DECOUPLED_AFTER, LINEAR>(),
            (EpsPlacement::OnRoot, false) => T::adam::<false, false, false, DECOUPLED_AFTER, LINEAR>(),
            (EpsPlacement::OnRoot, true) => T::adam::<false, false, true, DECOUPLED_AFTER, LINEAR>(),
        }
    }
    if s.decoupled_weight_decay && s.decay_after_update {
        bitsandbytes::<T>(s)
    } else if s.amsgrad {
        eps::<T, true>(s, u)
    } else {
        eps::<T, false>(s, u)
    }
}

/// One element of `shaders/momentum.wgsl`: returns `(p_new, v)`.
#[inline(always)]
fn momentum_element<
    const MAXIMIZE: bool,
    const WEIGHT_DECAY: bool,
    const VELOCITY: bool,
    const NESTEROV: bool,
    const RESTART: bool,
>(
    hp: &MomentumUniform,
    p: f32,
    mut g: f32,
    v_prev: f32,
) -> (f32, f32) {
    if MAXIMIZE {
        g = -g;
    }
    if WEIGHT_DECAY {
        g += hp.weight_decay * p;
    }
    let mut direction = g;
    let mut v = v_prev;
    if VELOCITY {
        v = if RESTART { g } else { hp.velocity_decay * v_prev + hp.grad_scale * g };
        direction = if NESTEROV { g + hp.nesterov_scale * v } else { v };
    }
    (p - hp.lr * direction, v)
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn momentum<
    E: Element,
    const MAXIMIZE: bool,
    const WEIGHT_DECAY: bool,
    const VELOCITY: bool,
    const NESTEROV: bool,
    const RESTART: bool,
>(
    hp: &MomentumUniform,
    scale: f32,
    o: Operands<'_, E>,
) {
    let update = momentum_element::<MAXIMIZE, WEIGHT_DECAY, VELOCITY, NESTEROV, RESTART>;
    let [buffer, ..] = o.state;
    if VELOCITY {
        for ((p, g), v) in o.param.iter_mut().zip(o.grad).zip(buffer.iter_mut()) {
            let (new_p, new_v) = update(hp, p.widen(), g.widen() * scale, v.widen());
            (*p, *v) = (E::narrow(new_p), E::narrow(new_v));
        }
    } else {
        // Plain SGD keeps no buffer (PyTorch's momentum = 0).
        for (p, g) in o.param.iter_mut().zip(o.grad) {
            *p = E::narrow(update(hp, p.widen(), g.widen() * scale, 0.0).0);
        }
    }
}

/// [`momentum`] over 8-bit state, one pass per block.
fn momentum_q8<
    const MAXIMIZE: bool,
    const WEIGHT_DECAY: bool,
    const VELOCITY: bool,
    const NESTEROV: bool,
    const RESTART: bool,
>(
    hp: &MomentumUniform,
    scale: f32,
    job: q8::Job<'_>,
) {
    let update = momentum_element::<MAXIMIZE, WEIGHT_DECAY, VELOCITY, NESTEROV, RESTART>;
    q8::each::<_, false>(
        job,
        #[inline(always)]
        |g, p, [v]| {
            let (p, v) = update(hp, p, g * scale, v);
            (p, [v])
        },
        |o| momentum::<f32, MAXIMIZE, WEIGHT_DECAY, VELOCITY, NESTEROV, RESTART>(hp, scale, o),
    );
}

/// [`momentum`] on f16 operands, a register (sixteen or eight elements) at a time.
fn momentum_f16<
    const MAXIMIZE: bool,
    const WEIGHT_DECAY: bool,
    const VELOCITY: bool,
    const NESTEROV: bool,
    const RESTART: bool,
>(
    hp: &MomentumUniform,
    scale: f32,
    o: Operands<'_, f16>,
) {
    let update = momentum_element::<MAXIMIZE, WEIGHT_DECAY, VELOCITY, NESTEROV, RESTART>;
    let [buffer, ..] = o.state;
    if VELOCITY {
        f16_lanes::each(
            [o.param, buffer],
            o.grad,
            #[inline(always)]
            |g, [p, v]| {
                let (p, v) = update(hp, p, g * scale, v);
                [p, v]
            },
        );
    } else {
        f16_lanes::each(
            [o.param],
            o.grad,
            #[inline(always)]
            |g, [p]| [update(hp, p, g * scale, 0.0).0],
        );
    }
}

fn momentum_loop<E: Leaves>(s: &MomentumSwitches, u: &MomentumUniform) -> Loop<MomentumUniform, E> {
    // The shader's run-time tests of the uniform (`restart`, a zero L2 coefficient) are the
    // same for every element: here they pick the loop.
    fn restart<E: Leaves, const M: bool, const W: bool, const N: bool>(
        restart: bool,
    ) -> Loop<MomentumUniform, E> {
        if restart {
            E::momentum::<M, W, true, N, true>()
        } else {
            E::momentum::<M, W, true, N, false>()
        }
    }
    fn velocity<E: Leaves, const M: bool, const W: bool>(
        s: &MomentumSwitches,
        u: &MomentumUniform,
    ) -> Loop<MomentumUniform, E> {
        match (s.velocity, s.nesterov) {
            (true, true) => restart::<E, M, W, true>(u.restart != 0),
            (true, false) => restart::<E, M, W, false>(u.restart != 0),
            // Without a buffer neither Nesterov nor the restart has any effect.
            (false, _) => E::momentum::<M, W, false, false, false>(),
        }
    }
    fn weight_decay<E: Leaves, const M: bool>(
        s: &MomentumSwitches,
        u: &MomentumUniform,
    ) -> Loop<MomentumUniform, E> {
        if u.weight_decay != 0.0 {
            velocity::<E, M, true>(s, u)
        } else {
            velocity::<E, M, false>(s, u)
        }
    }
    if s.maximize {
        weight_decay::<E, true>(s, u)
    } else {
        weight_decay::<E, false>(s, u)
    }
}

/// One element of `shaders/adagrad.wgsl`: returns `(p_new, h)`.
#[inline(always)]
fn adagrad_element<const MAXIMIZE: bool, const WEIGHT_DECAY: bool>(
    hp: &AdagradUniform,
    p: f32,
    mut g: f32,
    h_prev: f32,
) -> (f32, f32) {
    if MAXIMIZE {
        g = -g;
    }
    if WEIGHT_DECAY {
        g += hp.weight_decay * p;
    }
    let h = h_prev + g * g;
    let p_new = p - hp.lr * (g / (h.sqrt() + hp.eps));
    (p_new, h)
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn adagrad<E: Element, const MAXIMIZE: bool, const WEIGHT_DECAY: bool>(
    hp: &AdagradUniform,
    scale: f32,
    o: Operands<'_, E>,
) {
    let update = adagrad_element::<MAXIMIZE, WEIGHT_DECAY>;
    let [sum, ..] = o.state;
    for ((p, g), h) in o.param.iter_mut().zip(o.grad).zip(sum.iter_mut()) {
        let (new_p, new_h) = update(hp, p.widen(), g.widen() * scale, h.widen());
        (*p, *h) = (E::narrow(new_p), E::narrow(new_h));
    }
}

/// [`adagrad`] on f16 operands, a register (sixteen or eight elements) at a time.
fn adagrad_f16<const MAXIMIZE: bool, const WEIGHT_DECAY: bool>(
    hp: &AdagradUniform,
    scale: f32,
    o: Operands<'_, f16>,
) {
    let update = adagrad_element::<MAXIMIZE, WEIGHT_DECAY>;
    let [sum, ..] = o.state;
    f16_lanes::each(
        [o.param, sum],
        o.grad,
        #[inline(always)]
        |g, [p, h]| {
            let (p, h) = update(hp, p, g * scale, h);
            [p, h]
        },
    );
}

fn adagrad_loop<E: Leaves>(s: &AdagradSwitches, u: &AdagradUniform) -> Loop<AdagradUniform, E> {
    match (s.maximize, u.weight_decay != 0.0) {
        (false, false) => E::adagrad::<false, false>(),
        (false, true) => E::adagrad::<false, true>(),
        (true, false) => E::adagrad::<true, false>(),
        (true, true) => E::adagrad::<true, true>(),
    }
}

/// One element of `shaders/lion.wgsl`: returns `(p_new, m)`.
#[inline(always)]
fn lion_element(hp: &LionUniform, p: f32, g: f32, m_prev: f32) -> (f32, f32) {
    let c = hp.beta1 * m_prev + hp.one_minus_beta1 * g;
    // torch.sign and bitsandbytes' `sgn`, `(0 < c) - (c < 0)`: 0 for 0 (f32::signum gives 1)
    // and for NaN, so a NaN gradient leaves its parameter to the decay.
    let direction = if c > 0.0 {
        1.0
    } else if c < 0.0 {
        -1.0
    } else {
        0.0
    };
    let p_new = p * hp.decay - hp.lr * direction;
    let m = hp.beta2 * m_prev + hp.one_minus_beta2 * g;
    (p_new, m)
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn lion<E: Element>(hp: &LionUniform, scale: f32, o: Operands<'_, E>) {
    let [exp_avg, ..] = o.state;
    for ((p, g), m) in o.param.iter_mut().zip(o.grad).zip(exp_avg.iter_mut()) {
        let (new_p, new_m) = lion_element(hp, p.widen(), g.widen() * scale, m.widen());
        (*p, *m) = (E::narrow(new_p), E::narrow(new_m));
    }
}

/// [`lion`] on f16 operands, a register (sixteen or eight elements) at a time.
fn lion_f16(hp: &LionUniform, scale: f32, o: Operands<'_, f16>) {
    let [exp_avg, ..] = o.state;
    f16_lanes::each(
        [o.param, exp_avg],
        o.grad,
        #[inline(always)]
        |g, [p, m]| {
            let (p, m) = lion_element(hp, p, g * scale, m);
            [p, m]
        },
    );
}

/// [`lion`] over 8-bit state, one pass per block.
fn lion_q8(hp: &LionUniform, scale: f32, job: q8::Job<'_>) {
    q8::each::<_, false>(
        job,
        #[inline(always)]
        |g, p, [m]| {
            let (p, m) = lion_element(hp, p, g * scale, m);
            (p, [m])
        },
        |o| lion::<f32>(hp, scale, o),
    );
}

fn lion_loop<E: Leaves>(_: &LionSwitches, _: &LionUniform) -> Loop<LionUniform, E> {
    E::lion()
}

/// One element of `shaders/schedule_free.wgsl`: returns `(y_new, z_new, v)`. The swap pass
/// (`SWAP`) returns `lerp(y, z, swap_weight)` and the state as it was.
#[inline(always)]
fn schedule_free_element<const SWAP: bool, const WEIGHT_DECAY: bool, const FIRST: bool>(
    hp: &ScheduleFreeUniform,
    y: f32,
    g: f32,
    mut z: f32,
    v_prev: f32,
) -> (f32, f32, f32) {
    if SWAP {
        return (y + hp.swap_weight * (z - y), z, v_prev);
    }
    if FIRST {
        z = y;
    }
    let v = v_prev * hp.beta2 + hp.one_minus_beta2 * g * g;
    let denom = (v / hp.bias_correction2).sqrt() + hp.eps;
    let mut u = g / denom;
    if WEIGHT_DECAY {
        u += hp.weight_decay * y;
    }
    let y_mid = y + hp.ckp1 * (z - y);
    let y_new = y_mid + hp.y_rate * u;
    let z_new = z - hp.lr * u;
    (y_new, z_new, v)
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn schedule_free<E: Element, const SWAP: bool, const WEIGHT_DECAY: bool, const FIRST: bool>(
    hp: &ScheduleFreeUniform,
    scale: f32,
    o: Operands<'_, E>,
) {
    let update = schedule_free_element::<SWAP, WEIGHT_DECAY, FIRST>;
    let [z, v, ..] = o.state;
    // The swap pass reads no gradient (the caller may lend any slice of the right length).
    for (((y, g), z), v) in o.param.iter_mut().zip(o.grad).zip(z.iter_mut()).zip(v.iter_mut()) {
        let (new_y, new_z, new_v) = update(hp, y.widen(), g.widen() * scale, z.widen(), v.widen());
        *y = E::narrow(new_y);
        if !SWAP {
            (*z, *v) = (E::narrow(new_z), E::narrow(new_v));
        }
    }
}

/// [`schedule_free`] on f16 operands, a register (sixteen or eight elements) at a time.
fn schedule_free_f16<const SWAP: bool, const WEIGHT_DECAY: bool, const FIRST: bool>(
    hp: &ScheduleFreeUniform,
    scale: f32,
    o: Operands<'_, f16>,
) {
    let update = schedule_free_element::<SWAP, WEIGHT_DECAY, FIRST>;
    let [z, v, ..] = o.state;
    f16_lanes::each(
        [o.param, z, v],
        o.grad,
        #[inline(always)]
        |g, [y, z, v]| {
            let (y, z, v) = update(hp, y, g * scale, z, v);
            [y, z, v]
        },
    );
}

fn schedule_free_loop<E: Leaves>(
    s: &ScheduleFreeSwitches,
    u: &ScheduleFreeUniform,
) -> Loop<ScheduleFreeUniform, E> {
    match (s.swap, u.weight_decay != 0.0, u.first != 0.0) {
        (true, _, _) => E::schedule_free::<true, false, false>(),
        (false, false, false) => E::schedule_free::<false, false, false>(),
        (false, false, true) => E::schedule_free::<false, false, true>(),
        (false, true, false) => E::schedule_free::<false, true, false>(),
        (false, true, true) => E::schedule_free::<false, true, true>(),
    }
}

// How RMSprop keeps `grad_avg` (a const generic cannot be an enum): not at all, or updated in
// one of the two forms of ATen's lerp (`RmsPropSwitches::lerp_from_grad`).
const UNCENTERED: u8 = 0;
const CENTERED_LERP_FROM_AVG: u8 = 1;
const CENTERED_LERP_FROM_GRAD: u8 = 2;

/// One element of `shaders/rmsprop.wgsl`: returns `(p_new, square_avg, momentum_buffer,
/// grad_avg)`. `RAW`: the parameter steps with the gradient as given, the state with the
/// decayed one (`RmsPropSwitches::step_with_raw_grad`).
#[inline(always)]
fn rmsprop_element<
    const MAXIMIZE: bool,
    const WEIGHT_DECAY: bool,
    const CENTER: u8,
    const MOMENTUM: bool,
    const RAW: bool,
>(
    hp: &RmsPropUniform,
    p: f32,
    mut g: f32,
    s_prev: f32,
    b_prev: f32,
    a_prev: f32,
) -> (f32, f32, f32, f32) {
    let loaded = g;
    if MAXIMIZE {
        g = -g;
    }
    if WEIGHT_DECAY {
        g += hp.weight_decay * p;
    }
    let s = s_prev * hp.alpha + hp.one_minus_alpha * g * g;
    let (a, root) = match CENTER {
        CENTERED_LERP_FROM_AVG => {
            let a = a_prev + hp.one_minus_alpha * (g - a_prev);
            (a, (s - a * a).sqrt())
        }
        CENTERED_LERP_FROM_GRAD => {
            let a = g - (g - a_prev) * (1.0 - hp.one_minus_alpha);
            (a, (s - a * a).sqrt())
        }
        _ => (a_prev, s.sqrt()),
    };
    let avg = root + hp.eps;
    if MOMENTUM {
        let b = b_prev * hp.momentum + g / avg;
        (p - hp.lr * b, s, b, a)
    } else {
        let step_grad = if RAW { loaded } else { g };
        (p - hp.lr * (step_grad / avg), s, b_prev, a)
    }
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn rmsprop<
    E: Element,
    const MAXIMIZE: bool,
    const WEIGHT_DECAY: bool,
    const CENTER: u8,
    const MOMENTUM: bool,
    const RAW: bool,
>(
    hp: &RmsPropUniform,
    scale: f32,
    o: Operands<'_, E>,
) {
    let update = rmsprop_element::<MAXIMIZE, WEIGHT_DECAY, CENTER, MOMENTUM, RAW>;
    // The slots follow `Algorithm::state_kinds`: square_avg, then momentum_buffer where it
    // is kept, then grad_avg where it is kept.
    let [square_avg, second, third] = o.state;
    let rows = o.param.iter_mut().zip(o.grad).zip(square_avg.iter_mut());
    match (MOMENTUM, CENTER != UNCENTERED) {
        (true, true) => {
            for ((((p, g), s), b), a) in rows.zip(second.iter_mut()).zip(third.iter_mut()) {
                let new = update(hp, p.widen(), g.widen() * scale, s.widen(), b.widen(), a.widen());
                (*p, *s, *b, *a) = (E::narrow(new.0), E::narrow(new.1), E::narrow(new.2), E::narrow(new.3));
            }
        }
        (true, false) => {
            for (((p, g), s), b) in rows.zip(second.iter_mut()) {
                let new = update(hp, p.widen(), g.widen() * scale, s.widen(), b.widen(), 0.0);
                (*p, *s, *b) = (E::narrow(new.0), E::narrow(new.1), E::narrow(new.2));
            }
        }
        (false, true) => {
            for (((p, g), s), a) in rows.zip(second.iter_mut()) {
                let new = update(hp, p.widen(), g.widen() * scale, s.widen(), 0.0, a.widen());
                (*p, *s, *a) = (E::narrow(new.0), E::narrow(new.1), E::narrow(new.3));
            }
        }
        (false, false) => {
            for ((p, g), s) in rows {
                let new = update(hp, p.widen(), g.widen() * scale, s.widen(), 0.0, 0.0);
                (*p, *s) = (E::narrow(new.0), E::narrow(new.1));
            }
        }
    }
}

/// [`rmsprop`] on f16 operands, a register (sixteen or eight elements) at a time.
fn rmsprop_f16<
    const MAXIMIZE: bool,
    const WEIGHT_DECAY: bool,
    const CENTER: u8,
    const MOMENTUM: bool,
    const RAW: bool,
>(
    hp: &RmsPropUniform,
    scale: f32,
    o: Operands<'_, f16>,
) {
    let update = rmsprop_element::<MAXIMIZE, WEIGHT_DECAY, CENTER, MOMENTUM, RAW>;
    let [square_avg, second, third] = o.state;
    match (MOMENTUM, CENTER != UNCENTERED) {
        (true, true) => f16_lanes::each(
            [o.param, square_avg, second, third],
            o.grad,
            #[inline(always)]
            |g, [p, s, b, a]| {
                let new = update(hp, p, g * scale, s, b, a);
                [new.0, new.1, new.2, new.3]
            },
        ),
        (true, false) => f16_lanes::each(
            [o.param, square_avg, second],
            o.grad,
            #[inline(always)]
            |g, [p, s, b]| {
                let new = update(hp, p, g * scale, s, b, 0.0);
                [new.0, new.1, new.2]
            },
        ),
        (false, true) => f16_lanes::each(
            [o.param, square_avg, second],
            o.grad,
            #[inline(always)]
            |g, [p, s, a]| {
                let new = update(hp, p, g * scale, s, 0.0, a);
                [new.0, new.1, new.3]
            },
        ),
        (false, false) => f16_lanes::each(
            [o.param, square_avg],
            o.grad,
            #[inline(always)]
            |g, [p, s]| {
                let new = update(hp, p, g * scale, s, 0.0, 0.0);
                [new.0, new.1]
            },
        ),
    }
}

/// [`rmsprop`] over 8-bit state: bitsandbytes' one 8-bit form (one state, uncentered,
/// without momentum) in one pass per block, the others block by block.
fn rmsprop_q8<
    const MAXIMIZE: bool,
    const WEIGHT_DECAY: bool,
    const CENTER: u8,
    const MOMENTUM: bool,
    const RAW: bool,
>(
    hp: &RmsPropUniform,
    scale: f32,
    job: q8::Job<'_>,
) {
    let blocked =
        |o: Operands<'_, f32>| rmsprop::<f32, MAXIMIZE, WEIGHT_DECAY, CENTER, MOMENTUM, RAW>(hp, scale, o);
    if MOMENTUM || CENTER != UNCENTERED {
        return q8::blocked(job, q8::NonFinite::Update, blocked);
    }
    let update = rmsprop_element::<MAXIMIZE, WEIGHT_DECAY, CENTER, MOMENTUM, RAW>;
    q8::each::<_, false>(
        job,
        #[inline(always)]
        |g, p, [s]| {
            let new = update(hp, p, g * scale, s, 0.0, 0.0);
            (new.0, [new.1])
        },
        blocked,
    );
}

fn rmsprop_loop<E: Leaves>(s: &RmsPropSwitches, u: &RmsPropUniform) -> Loop<RmsPropUniform, E> {
    // The shader's run-time test of a zero L2 coefficient is the same for every element:
    // here it picks the loop.
    fn momentum<E: Leaves, const M: bool, const W: bool, const C: u8>(
        s: &RmsPropSwitches,
    ) -> Loop<RmsPropUniform, E> {
        if s.momentum {
            E::rmsprop::<M, W, C, true, false>()
        } else {
            E::rmsprop::<M, W, C, false, false>()
        }
    }
    fn center<E: Leaves, const M: bool, const W: bool>(s: &RmsPropSwitches) -> Loop<RmsPropUniform, E> {
        match (s.centered, s.lerp_from_grad) {
            (false, _) => momentum::<E, M, W, UNCENTERED>(s),
            (true, false) => momentum::<E, M, W, CENTERED_LERP_FROM_AVG>(s),
            (true, true) => momentum::<E, M, W, CENTERED_LERP_FROM_GRAD>(s),
        }
    }
    // bitsandbytes' 8-bit form (`q8::kernel_step`) is plain RMSprop: its loops alone.
    if s.step_with_raw_grad {
        debug_assert!(!s.maximize && !s.centered && !s.momentum, "{s:?}");
        return if u.weight_decay != 0.0 {
            E::rmsprop::<false, true, UNCENTERED, false, true>()
        } else {
            E::rmsprop::<false, false, UNCENTERED, false, true>()
        };
    }
    match (s.maximize, u.weight_decay != 0.0) {
        (false, false) => center::<E, false, false>(s),
        (false, true) => center::<E, false, true>(s),
        (true, false) => center::<E, true, false>(s),
        (true, true) => center::<E, true, true>(s),
    }
}

/// One element of `shaders/ademamix.wgsl`: returns `[p_new, m1, m2, nu]`. `DECAY_AFTER`:
/// the decay after the update (`AdemamixSwitches::decay_after_update`).
#[inline(always)]
fn ademamix_element<const DECAY_AFTER: bool>(
    hp: &AdemamixUniform,
    p: f32,
    g: f32,
    m1_prev: f32,
    m2_prev: f32,
    nu_prev: f32,
) -> [f32; 4] {
    let m1 = hp.beta1 * m1_prev + hp.one_minus_beta1 * g;
    let m2 = hp.beta3_t * m2_prev + hp.one_minus_beta3_t * g;
    let nu = hp.beta2 * nu_prev + hp.one_minus_beta2 * g * g;
    let denom = nu.sqrt() / hp.sqrt_bias_correction2 + hp.eps;
    let u = (m1 / hp.bias_correction1 + hp.alpha_t * m2) / denom;
    let p_new = if DECAY_AFTER { (p - hp.lr * u) * hp.decay } else { p * hp.decay - hp.lr * u };
    [p_new, m1, m2, nu]
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn ademamix<E: Element, const DECAY_AFTER: bool>(hp: &AdemamixUniform, scale: f32, o: Operands<'_, E>) {
    let [exp_avg, exp_avg_slow, exp_avg_sq] = o.state;
    let rows = o.param.iter_mut().zip(o.grad).zip(exp_avg.iter_mut()).zip(exp_avg_slow.iter_mut());
    for ((((p, g), m1), m2), nu) in rows.zip(exp_avg_sq.iter_mut()) {
        let new = ademamix_element::<DECAY_AFTER>(
            hp,
            p.widen(),
            g.widen() * scale,
            m1.widen(),
            m2.widen(),
            nu.widen(),
        );
        (*p, *m1, *m2, *nu) = (E::narrow(new[0]), E::narrow(new[1]), E::narrow(new[2]), E::narrow(new[3]));
    }
}

/// [`ademamix`] on f16 operands, a register (sixteen or eight elements) at a time.
fn ademamix_f16<const DECAY_AFTER: bool>(hp: &AdemamixUniform, scale: f32, o: Operands<'_, f16>) {
    let [exp_avg, exp_avg_slow, exp_avg_sq] = o.state;
    f16_lanes::each(
        [o.param, exp_avg, exp_avg_slow, exp_avg_sq],
        o.grad,
        #[inline(always)]
        |g, [p, m1, m2, nu]| ademamix_element::<DECAY_AFTER>(hp, p, g * scale, m1, m2, nu),
    );
}

/// [`ademamix`] over 8-bit state, one pass per block; a non-finite gradient restarts its
/// element, as bitsandbytes' 2-state kernel does ([`q8::NonFinite::Restart`]).
fn ademamix_q8<const DECAY_AFTER: bool>(hp: &AdemamixUniform, scale: f32, job: q8::Job<'_>) {
    q8::each::<_, true>(
        job,
        #[inline(always)]
        |g, p, [m1, m2, nu]| {
            let [p, m1, m2, nu] = ademamix_element::<DECAY_AFTER>(hp, p, g * scale, m1, m2, nu);
            (p, [m1, m2, nu])
        },
        |o| ademamix::<f32, DECAY_AFTER>(hp, scale, o),
    );
}

fn ademamix_loop<E: Leaves>(s: &AdemamixSwitches, _: &AdemamixUniform) -> Loop<AdemamixUniform, E> {
    if s.decay_after_update {
        E::ademamix::<true>()
    } else {
        E::ademamix::<false>()
    }
}

/// `lamb_direction` of `shaders/lamb.wgsl`: `m / (sqrt(v) + eps)`, plus `weight_decay p`
/// with `WEIGHT_DECAY`.
#[inline(always)]
pub(super) fn lamb_direction<const WEIGHT_DECAY: bool>(hp: &LambUniform, p: f32, m: f32, v: f32) -> f32 {
    let s = m / (v.sqrt() + hp.eps);
    if WEIGHT_DECAY {
        s + hp.weight_decay * p
    } else {
        s
    }
}

/// The apply pass of `shaders/lamb.wgsl` on one tensor: `p -= rate s`, with `s` from the
/// stored moments and `rate` (the uniform's `step_size`) already multiplied by the tensor's
/// trust ratio (`cpu::lamb`). The moments pass, which also sums, is `cpu::lamb`'s own.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn lamb_apply<E: Element, const WEIGHT_DECAY: bool>(hp: &LambUniform, _scale: f32, o: Operands<'_, E>) {
    let [exp_avg, exp_avg_sq, ..] = o.state;
    for ((p, m), v) in o.param.iter_mut().zip(exp_avg.iter()).zip(exp_avg_sq.iter()) {
        let p_old = p.widen();
        let s = lamb_direction::<WEIGHT_DECAY>(hp, p_old, m.widen(), v.widen());
        *p = E::narrow(p_old - hp.step_size * s);
    }
}

/// [`lamb_apply`] on f16 operands, a register at a time (the moments are written back as
/// they were: an f16 value survives the round trip through f32 exactly).
fn lamb_apply_f16<const WEIGHT_DECAY: bool>(hp: &LambUniform, _scale: f32, o: Operands<'_, f16>) {
    let [exp_avg, exp_avg_sq, ..] = o.state;
    f16_lanes::each(
        [o.param, exp_avg, exp_avg_sq],
        o.grad,
        #[inline(always)]
        |_, [p, m, v]| [p - hp.step_size * lamb_direction::<WEIGHT_DECAY>(hp, p, m, v), m, v],
    );
}

fn lamb_loop<E: Leaves>(_: &LambSwitches, u: &LambUniform) -> Loop<LambUniform, E> {
    if u.weight_decay != 0.0 {
        E::lamb_apply::<true>()
    } else {
        E::lamb_apply::<false>()
    }
}

/// One element of `shaders/muon.wgsl`: the new parameter from `o`, the orthogonalized
/// update (already scaled by the shape's ratio) that Muon's pass put in the gradient slot.
#[inline(always)]
fn muon_element(hp: &MuonUniform, p: f32, o: f32) -> f32 {
    p * hp.decay - hp.lr * o
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn muon<E: Element>(hp: &MuonUniform, scale: f32, o: Operands<'_, E>) {
    for (p, g) in o.param.iter_mut().zip(o.grad) {
        *p = E::narrow(muon_element(hp, p.widen(), g.widen() * scale));
    }
}

/// [`muon`] on f16 operands, a register (sixteen or eight elements) at a time.
fn muon_f16(hp: &MuonUniform, scale: f32, o: Operands<'_, f16>) {
    f16_lanes::each(
        [o.param],
        o.grad,
        #[inline(always)]
        |g, [p]| [muon_element(hp, p, g * scale)],
    );
}

fn muon_loop<E: Leaves>(_: &MuonSwitches, _: &MuonUniform) -> Loop<MuonUniform, E> {
    E::muon()
}
