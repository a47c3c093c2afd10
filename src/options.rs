//! The options both backends' builders collect, apart from either front end.

use crate::{GradClip, Rounding, StateStorage, Tensor};

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
}
