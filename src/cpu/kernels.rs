//! The update formulas of `shaders/adam.wgsl`, `momentum.wgsl` and `adagrad.wgsl` in f32,
//! operation for operation, so the CPU rounds where the GPU does.
//!
//! Every switch is a const generic: each combination is its own loop with no branch per
//! element, which the compiler vectorizes. [`Kernel::new`] picks the loop once per step.

use super::hyper::{self, AdagradHyper, AdamHyper, Decay, MomentumHyper};
use crate::gpu::kernel::Family;
use crate::gpu::step::KernelStep;

/// The most state tensors any family keeps (AMSGrad's three).
pub(super) const MAX_STATE: usize = 3;

/// One run of f32 elements of each operand, all the same length.
pub(super) struct Operands<'a> {
    pub(super) param: &'a mut [f32],
    pub(super) grad: &'a [f32],
    /// The family's state slots in the order of `Algorithm::state_kinds` (which is the
    /// kernels' slot order); slots the family does not have are empty.
    pub(super) state: [&'a mut [f32]; MAX_STATE],
}

type Loop<H> = fn(&H, Operands<'_>);

/// One step of one family: its uniform and the loop compiled for its switches.
pub(super) enum Kernel {
    Adam(AdamHyper, Loop<AdamHyper>),
    Momentum(MomentumHyper, Loop<MomentumHyper>),
    Adagrad(AdagradHyper, Loop<AdagradHyper>),
}

impl Kernel {
    /// The loop and uniform for `step`; `None` for a family with no optimizer update.
    pub(super) fn new(step: &KernelStep) -> Option<Self> {
        Some(match step.family {
            Family::Adam => {
                let (hyper, switches) = hyper::adam(step);
                Kernel::Adam(hyper, adam_loop(switches))
            }
            Family::Momentum => {
                let (hyper, switches) = hyper::momentum(step);
                Kernel::Momentum(hyper, momentum_loop(switches))
            }
            Family::Adagrad => {
                let (hyper, switches) = hyper::adagrad(step);
                Kernel::Adagrad(hyper, adagrad_loop(switches))
            }
            Family::Unscale => return None,
        })
    }

    /// Updates every element of `operands`.
    pub(super) fn run(&self, operands: Operands<'_>) {
        match self {
            Kernel::Adam(hyper, update) => update(hyper, operands),
            Kernel::Momentum(hyper, update) => update(hyper, operands),
            Kernel::Adagrad(hyper, update) => update(hyper, operands),
        }
    }
}

// The shaders' WEIGHT_DECAY values (a const generic cannot be an enum).
const NO_DECAY: u8 = 0;
const L2: u8 = 1;
const DECOUPLED: u8 = 2;

/// One element of `shaders/adam.wgsl`: returns `(p_new, m, v, v_hat)`.
#[inline(always)]
fn adam_element<
    const AMSGRAD: bool,
    const EPS_AFTER_CORRECTION: bool,
    const MAXIMIZE: bool,
    const DECAY: u8,
    const LERP: bool,
>(
    hp: &AdamHyper,
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
    let m = if !LERP {
        hp.beta1 * m_prev + hp.one_minus_beta1 * g
    } else if hp.one_minus_beta1 < 0.5 {
        m_prev + hp.one_minus_beta1 * (g - m_prev)
    } else {
        g - (g - m_prev) * (1.0 - hp.one_minus_beta1)
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
    (p_new, m, v, v_hat)
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma", "aarch64+neon"))]
fn adam<
    const AMSGRAD: bool,
    const EPS_AFTER_CORRECTION: bool,
    const MAXIMIZE: bool,
    const DECAY: u8,
    const LERP: bool,
>(
    hp: &AdamHyper,
    o: Operands<'_>,
) {
    let update = adam_element::<AMSGRAD, EPS_AFTER_CORRECTION, MAXIMIZE, DECAY, LERP>;
    let [exp_avg, exp_avg_sq, max_exp_avg_sq] = o.state;
    let rows = o.param.iter_mut().zip(o.grad).zip(exp_avg.iter_mut()).zip(exp_avg_sq.iter_mut());
    if AMSGRAD {
        for ((((p, g), m), v), v_max) in rows.zip(max_exp_avg_sq.iter_mut()) {
            (*p, *m, *v, *v_max) = update(hp, *p, *g, *m, *v, *v_max);
        }
    } else {
        // No maximum is kept: the slot is empty and the shader's absent load reads 0.
        for (((p, g), m), v) in rows {
            (*p, *m, *v, _) = update(hp, *p, *g, *m, *v, 0.0);
        }
    }
}

fn adam_loop(s: hyper::AdamSwitches) -> Loop<AdamHyper> {
    fn lerp<const A: bool, const E: bool, const M: bool, const D: u8>(lerp: bool) -> Loop<AdamHyper> {
        if lerp {
            adam::<A, E, M, D, true>
        } else {
            adam::<A, E, M, D, false>
        }
    }
    fn decay<const A: bool, const E: bool, const M: bool>(s: hyper::AdamSwitches) -> Loop<AdamHyper> {
        match s.weight_decay {
            Decay::None => lerp::<A, E, M, NO_DECAY>(s.first_moment_lerp),
            Decay::L2 => lerp::<A, E, M, L2>(s.first_moment_lerp),
            Decay::Decoupled => lerp::<A, E, M, DECOUPLED>(s.first_moment_lerp),
        }
    }
    fn maximize<const A: bool, const E: bool>(s: hyper::AdamSwitches) -> Loop<AdamHyper> {
        if s.maximize {
            decay::<A, E, true>(s)
        } else {
            decay::<A, E, false>(s)
        }
    }
    fn eps<const A: bool>(s: hyper::AdamSwitches) -> Loop<AdamHyper> {
        if s.eps_after_correction {
            maximize::<A, true>(s)
        } else {
            maximize::<A, false>(s)
        }
    }
    if s.amsgrad {
        eps::<true>(s)
    } else {
        eps::<false>(s)
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
    hp: &MomentumHyper,
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
    const MAXIMIZE: bool,
    const WEIGHT_DECAY: bool,
    const VELOCITY: bool,
    const NESTEROV: bool,
    const RESTART: bool,
>(
    hp: &MomentumHyper,
    o: Operands<'_>,
) {
    let update = momentum_element::<MAXIMIZE, WEIGHT_DECAY, VELOCITY, NESTEROV, RESTART>;
    let [buffer, ..] = o.state;
    if VELOCITY {
        for ((p, g), v) in o.param.iter_mut().zip(o.grad).zip(buffer.iter_mut()) {
            (*p, *v) = update(hp, *p, *g, *v);
        }
    } else {
        // Plain SGD keeps no buffer (PyTorch's momentum = 0).
        for (p, g) in o.param.iter_mut().zip(o.grad) {
            (*p, _) = update(hp, *p, *g, 0.0);
        }
    }
}

fn momentum_loop(s: hyper::MomentumSwitches) -> Loop<MomentumHyper> {
    fn restart<const M: bool, const W: bool, const V: bool, const N: bool>(
        restart: bool,
    ) -> Loop<MomentumHyper> {
        if restart {
            momentum::<M, W, V, N, true>
        } else {
            momentum::<M, W, V, N, false>
        }
    }
    fn nesterov<const M: bool, const W: bool, const V: bool>(
        s: hyper::MomentumSwitches,
    ) -> Loop<MomentumHyper> {
        if s.nesterov {
            restart::<M, W, V, true>(s.restart)
        } else {
            restart::<M, W, V, false>(s.restart)
        }
    }
    fn velocity<const M: bool, const W: bool>(s: hyper::MomentumSwitches) -> Loop<MomentumHyper> {
        if s.velocity {
            nesterov::<M, W, true>(s)
        } else {
            // `hyper::momentum` clears nesterov and restart without a buffer.
            momentum::<M, W, false, false, false>
        }
    }
    fn weight_decay<const M: bool>(s: hyper::MomentumSwitches) -> Loop<MomentumHyper> {
        if s.weight_decay {
            velocity::<M, true>(s)
        } else {
            velocity::<M, false>(s)
        }
    }
    if s.maximize {
        weight_decay::<true>(s)
    } else {
        weight_decay::<false>(s)
    }
}

/// One element of `shaders/adagrad.wgsl`: returns `(p_new, h)`.
#[inline(always)]
fn adagrad_element<const MAXIMIZE: bool, const WEIGHT_DECAY: bool>(
    hp: &AdagradHyper,
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
fn adagrad<const MAXIMIZE: bool, const WEIGHT_DECAY: bool>(hp: &AdagradHyper, o: Operands<'_>) {
    let update = adagrad_element::<MAXIMIZE, WEIGHT_DECAY>;
    let [sum, ..] = o.state;
    for ((p, g), h) in o.param.iter_mut().zip(o.grad).zip(sum.iter_mut()) {
        (*p, *h) = update(hp, *p, *g, *h);
    }
}

fn adagrad_loop(s: hyper::AdagradSwitches) -> Loop<AdagradHyper> {
    match (s.maximize, s.weight_decay) {
        (false, false) => adagrad::<false, false>,
        (false, true) => adagrad::<false, true>,
        (true, false) => adagrad::<true, false>,
        (true, true) => adagrad::<true, true>,
    }
}
