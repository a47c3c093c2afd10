//! The options both backends' builders collect, apart from either front end.

use crate::step::clip::FusedClip;
use crate::{Algorithm, GradClip, Rounding, StateStorage, Tensor};

/// The options an optimizer was built with, as the builders collect them
/// ([`OptimizerBuilder`](crate::OptimizerBuilder), whose setters document each field, and
/// [`CpuOptimizerBuilder`](crate::cpu::CpuOptimizerBuilder), which sets the ones the CPU
/// backend honours); every check of them both backends make reads this.
#[derive(Clone, Debug, Default)]
pub(crate) struct OptimizerOptions {
    pub state_storage: StateStorage,
    pub model_copies: Vec<Tensor>,
    pub master_weights: bool,
    pub capturable: bool,
    pub grad_clip: Option<GradClip>,
    pub rounding: Rounding,
    pub param_shapes: Vec<Vec<usize>>,
    /// Where each parameter's elements come from, for stochastic rounding's hash: the
    /// ordinal and first element of the tensor a sharded optimizer's piece is part of
    /// (`crate::shard`), so that a piece rounds as its whole tensor would. Empty: each
    /// parameter is itself (its index, from element 0). No builder sets it.
    pub origins: Vec<(u32, u64)>,
}

impl OptimizerOptions {
    /// The options an optimizer already built runs `algorithm` under, where a group changes
    /// to it: capturable mode, the optimizer's clipping (`clip`, as the builder's
    /// `grad_clip` unless it is the algorithm's own, Adan's) and rounding. The others stay at
    /// their defaults: only Adafactor refuses them, and no group changes to or from it
    /// (`Algorithm::check_change`); a caller that needs the parameters' shapes sets them.
    pub(crate) fn kept(
        capturable: bool,
        clip: Option<FusedClip>,
        rounding: Rounding,
        algorithm: &Algorithm,
    ) -> Self {
        OptimizerOptions {
            capturable,
            grad_clip: clip.filter(|_| algorithm.own_grad_clip().is_none()).map(|c| c.clip),
            rounding,
            ..OptimizerOptions::default()
        }
    }
}
