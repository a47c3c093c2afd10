//! Typed views of a [`KernelStep`]: the shaders' `Hyper` fields by name, in the f32 the
//! uniform holds them in, and the override constants as the switches that pick a loop.
//!
//! This is the only place that knows the order of `KernelStep::hyper` and
//! `KernelStep::overrides`; it follows the `Hyper` structs of `shaders/*.wgsl` and
//! `Family::override_names()`.

use crate::gpu::step::KernelStep;

/// How weight decay enters an Adam update (the shader's `WEIGHT_DECAY` constant).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Decay {
    /// None, also for L2 with a coefficient that is 0 in f32 (the shader skips it then).
    None,
    /// `g += weight_decay * p`.
    L2,
    /// `p *= decay` before the update.
    Decoupled,
}

/// `Hyper` of `shaders/adam.wgsl`, less `ln_beta1` and `ln_beta2`, which only the
/// capturable kernels read.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct AdamHyper {
    pub(super) beta1: f32,
    pub(super) one_minus_beta1: f32,
    pub(super) beta2: f32,
    pub(super) one_minus_beta2: f32,
    pub(super) weight_decay: f32,
    pub(super) decay: f32,
    pub(super) step_size: f32,
    pub(super) sqrt_bias_correction2: f32,
    pub(super) eps: f32,
    pub(super) post_scale: f32,
}

/// The override constants of `shaders/adam.wgsl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct AdamSwitches {
    pub(super) amsgrad: bool,
    pub(super) eps_after_correction: bool,
    pub(super) maximize: bool,
    pub(super) weight_decay: Decay,
    pub(super) first_moment_lerp: bool,
}

/// `Hyper` of `shaders/momentum.wgsl`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct MomentumHyper {
    pub(super) velocity_decay: f32,
    pub(super) grad_scale: f32,
    pub(super) weight_decay: f32,
    pub(super) lr: f32,
    pub(super) restart: f32,
    pub(super) nesterov_scale: f32,
}

/// The override constants of `shaders/momentum.wgsl`, with the run-time tests of the
/// uniform (`restart`, a zero L2 coefficient) folded in: they are the same for every element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct MomentumSwitches {
    pub(super) maximize: bool,
    pub(super) weight_decay: bool,
    pub(super) velocity: bool,
    pub(super) nesterov: bool,
    pub(super) restart: bool,
}

/// `Hyper` of `shaders/adagrad.wgsl`, less `lr_decay`, which only the capturable kernel reads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct AdagradHyper {
    pub(super) lr: f32,
    pub(super) weight_decay: f32,
    pub(super) eps: f32,
}

/// The override constants of `shaders/adagrad.wgsl`, with a zero L2 coefficient folded in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct AdagradSwitches {
    pub(super) maximize: bool,
    pub(super) weight_decay: bool,
}

/// The shaders' `WEIGHT_DECAY == 1u && hp.weight_decay != 0`, decided once per step.
fn l2(mode: u32, weight_decay: f32) -> bool {
    mode == 1 && weight_decay != 0.0
}

/// The uniform's values: the host computes them in f64 and uploads f32.
fn uniform(step: &KernelStep) -> [f32; crate::gpu::step::MAX_HYPER] {
    step.hyper.map(|v| v as f32)
}

pub(super) fn adam(step: &KernelStep) -> (AdamHyper, AdamSwitches) {
    let [beta1, one_minus_beta1, beta2, one_minus_beta2, weight_decay, decay, step_size, sqrt_bias_correction2, eps, post_scale, _ln_beta1, _ln_beta2] =
        uniform(step);
    let [amsgrad, eps_after_correction, maximize, mode, first_moment_lerp] = step.overrides;
    let hyper = AdamHyper {
        beta1,
        one_minus_beta1,
        beta2,
        one_minus_beta2,
        weight_decay,
        decay,
        step_size,
        sqrt_bias_correction2,
        eps,
        post_scale,
    };
    let weight_decay = match mode {
        2 => Decay::Decoupled,
        _ if l2(mode, weight_decay) => Decay::L2,
        _ => Decay::None,
    };
    let switches = AdamSwitches {
        amsgrad: amsgrad != 0,
        eps_after_correction: eps_after_correction != 0,
        maximize: maximize != 0,
        weight_decay,
        first_moment_lerp: first_moment_lerp != 0,
        // 1 and 2 are the two forms of ATen's lerp; the CPU loop picks between them from
        // the weight itself.
    };
    (hyper, switches)
}

pub(super) fn momentum(step: &KernelStep) -> (MomentumHyper, MomentumSwitches) {
    let [velocity_decay, grad_scale, weight_decay, lr, restart, nesterov_scale, ..] = uniform(step);
    let [maximize, nesterov, velocity, mode, ..] = step.overrides;
    let hyper = MomentumHyper { velocity_decay, grad_scale, weight_decay, lr, restart, nesterov_scale };
    let velocity = velocity != 0;
    let switches = MomentumSwitches {
        maximize: maximize != 0,
        weight_decay: l2(mode, weight_decay),
        velocity,
        // Without a buffer neither has any effect; clearing them halves the loops compiled.
        nesterov: velocity && nesterov != 0,
        restart: velocity && restart != 0.0,
    };
    (hyper, switches)
}

pub(super) fn adagrad(step: &KernelStep) -> (AdagradHyper, AdagradSwitches) {
    let [lr, weight_decay, eps, _lr_decay, ..] = uniform(step);
    let [maximize, mode, ..] = step.overrides;
    let hyper = AdagradHyper { lr, weight_decay, eps };
    (hyper, AdagradSwitches { maximize: maximize != 0, weight_decay: l2(mode, weight_decay) })
}
