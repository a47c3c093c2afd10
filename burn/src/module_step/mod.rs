//! Every parameter of a Burn module in one fused, multi-tensor step.

mod builder;
mod records;
mod refusal;
mod state;
mod step;
mod swap;
mod visit;

use std::collections::HashMap;

use burn::module::ParamId;

use super::lease::Leased;
use super::record::ParamRecord;
use super::SharedDevice;
#[cfg(doc)]
use wgpu_optim::OptimizerBuilder;
use wgpu_optim::{
    Algorithm, BurnFailure, Error, Optimizer, Result, ScheduleFreeMode, ScheduleFreeScalars, Tensor,
};

pub use builder::ModuleStepBuilder;
pub use refusal::StepError;
pub(super) use visit::ParamContext;

/// A fused step over a whole Burn module: every parameter that has a gradient is updated by
/// one [`Optimizer`], whose multi-tensor dispatches cover all of them (one per kernel
/// variant, not one per parameter), with the [`OptimizerBuilder`] options of this crate: global
/// gradient clipping ([`OptimizerBuilder::grad_clip`]), AMP skipping
/// ([`Self::step_unscaled`], with [`OptimizerBuilder::capturable`]), 16-bit, 8-bit or 4-bit state.
///
/// Parameters are updated in their own buffers; one whose storage is shared with another
/// tensor is copied first (see [`crate`]).
///
/// # Parameters without a gradient
///
/// As in Burn and PyTorch, a parameter with no gradient in a step (an unused branch, a
/// frozen layer) is left as it is, parameter and state, and each parameter counts its own
/// steps: Adam's bias correction of a parameter uses the number of steps *that parameter*
/// took, so a layer unfrozen after `k` steps continues from its own count, and one first
/// stepped late starts at step 1. Parameters with equal counts share one optimizer and its
/// dispatches; parameters whose counts differ are stepped by one optimizer per count, in
/// the same submission. Global gradient clipping and AMP's all-or-nothing skip cover one
/// optimizer, so with [`OptimizerBuilder::grad_clip`] or [`OptimizerBuilder::capturable`] a
/// step whose parameters have different counts is refused ([`Error::Burn`]). In capturable
/// mode the counts are the device's (AMP skips excluded), read back when the set of
/// parameters with gradients changes.
///
/// # Muon and Adafactor
///
/// Their optimizers are built with the parameters' shapes, which Burn's tensors carry.
/// Muon takes 2-D parameters only: [`ModuleStepBuilder::fallback`] names the algorithm of
/// the others (AdamW typically), and each optimizer then has two groups, Muon's matrices and
/// the fallback's other parameters, as a torch trainer builds them. Without a fallback a
/// step over a parameter that is not 2-D is refused ([`Error::BadShape`], its place among
/// the step's parameters in module order and its shape).
///
/// # Checkpoints
///
/// [`Self::to_bytes`] saves every parameter's state and step count, and
/// [`Self::load_bytes`] restores it, before or after the first step; training resumed
/// from it continues bit for bit. The bytes are a Burn optimizer record, the one
/// [`FusedOptimizer`](super::FusedOptimizer)'s `ModuleOptimizer` reads and writes, so a
/// trainer may switch between the two (and load Burn's own Adam and AdamW records).
///
/// # Refusals
///
/// A refused step hands the module back ([`StepError`]), its parameters' values as they
/// were, and changes no state.
///
/// ```no_run
/// # fn train<M: burn::module::Module>(model: M, grads: burn::optim::GradientsParams) -> wgpu_optim::Result<M> {
/// use wgpu_optim_burn::{ModuleStep, SharedDevice};
/// use wgpu_optim::Adam;
///
/// let shared = SharedDevice::headless_blocking()?;
/// let mut step = ModuleStep::builder().build(&shared, Adam::adamw())?;
/// let model = step.step(1e-3, model, grads)?; // `?` keeps the error, dropping the model
/// # Ok(model) }
/// ```
pub struct ModuleStep {
    shared: SharedDevice,
    algorithm: Algorithm,
    /// Under Muon, the algorithm of the parameters that are not 2-D.
    fallback: Option<Algorithm>,
    options: builder::Options,
    /// Every parameter stepped or loaded so far.
    params: HashMap<ParamId, Entry>,
    /// The optimizers holding the state; the last step's come first.
    bounds: Vec<Bound>,
    /// The key of the next optimizer built.
    next_key: u64,
    /// Schedule-Free's mode: whether the parameters with state hold y or x.
    mode: ScheduleFreeMode,
}

/// One parameter's step count and where its state is.
struct Entry {
    /// Steps this parameter took (in capturable mode, recorded ones: the device's count,
    /// AMP skips excluded, is its home optimizer's).
    time: u64,
    /// Its shape, for the records (empty until a step saw the parameter).
    shape: Vec<usize>,
    /// Schedule-Free's running values after its last step (`k` is `time`): per parameter,
    /// since parameters stepped together share an optimizer (and its group's values) only
    /// while their histories agree.
    schedule_free: Option<ScheduleFreeScalars>,
    home: Home,
}

enum Home {
    /// In the optimizer of [`Bound::key`] this.
    Bound(u64),
    /// Loaded from a record, written into an optimizer at the parameter's next step.
    Loaded(ParamRecord),
}

/// An optimizer over parameters stepped with one step count.
struct Bound {
    key: u64,
    ids: Vec<ParamId>,
    params: Vec<Tensor>,
    optimizer: Optimizer,
}

/// The parameters of one step with the same step count: indices into the step's lists.
struct Cohort {
    time: u64,
    schedule_free: Option<ScheduleFreeScalars>,
    members: Vec<usize>,
}

impl ModuleStep {
    /// The optimizer that stepped the last step's parameters (the one over those with the
    /// lowest step count, where their counts differed), once a step has built it: its step
    /// count, last gradient norm, AMP flag, state tensors. Save and restore the whole
    /// module's state with [`Self::to_bytes`] and [`Self::load_bytes`].
    pub fn optimizer(&self) -> Option<&Optimizer> {
        self.bounds.first().map(|b| &b.optimizer)
    }

    /// How many steps parameter `id` took (recorded ones, in capturable mode), counting
    /// the loaded record's; `None` for a parameter never stepped nor loaded.
    pub fn param_step_count(&self, id: ParamId) -> Option<u64> {
        self.params.get(&id).map(|e| e.time)
    }

    /// Schedule-Free's mode: whether the parameters hold y ([`ScheduleFreeMode::Train`],
    /// where a module step starts) or the average x ([`Self::eval`]).
    pub fn mode(&self) -> ScheduleFreeMode {
        self.mode
    }

    fn bound(&self, key: u64) -> Result<&Bound> {
        self.bounds.iter().find(|b| b.key == key).ok_or_else(|| Error::Burn {
            cause: BurnFailure::Internal,
            detail: format!("internal: optimizer {key} of a parameter's state is gone"),
        })
    }
}

/// What [`ModuleStep::record`] steps each cohort with.
enum Prepared {
    /// `bounds[k]`.
    Reused(usize),
    // Boxed: an `Optimizer` is large.
    Built(Box<Bound>),
}

/// The step's leased parameters and gradients, in the order of [`Checked::ids`].
struct StepTensors<'a> {
    params: &'a [Leased],
    grads: &'a [Leased],
}

/// The parameters with gradients, in module order, and their shapes.
struct Checked {
    ids: Vec<ParamId>,
    shapes: Vec<Vec<usize>>,
}

/// The error of a parameter whose state should be somewhere and is not (a bug, not input).
fn lost(id: ParamId) -> Error {
    Error::Burn {
        cause: BurnFailure::Internal,
        detail: format!("internal: parameter {id}'s state is missing"),
    }
}
