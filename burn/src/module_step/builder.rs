//! The module step's builder: the options a module step honours and its checks.

use std::collections::HashMap;

use super::ModuleStep;
use crate::SharedDevice;
#[cfg(doc)]
use wgpu_optim::Error;
use wgpu_optim::{
    Algorithm, GradClip, Optimizer, OptimizerBuilder, Result, Rounding, ScheduleFreeMode, StateStorage,
};

/// How a [`ModuleStep`] is built: [`ModuleStep::builder`], the options a module step
/// honours (every one off by default), then [`Self::build`]. They are
/// [`OptimizerBuilder`]'s, less those a Burn module decides itself (its parameters' dtypes,
/// copies and shapes: master weights, model copies, parameter shapes), which have no setter
/// here:
///
/// ```compile_fail
/// let builder = wgpu_optim_burn::ModuleStep::builder().master_weights(true);
/// ```
#[derive(Clone, Debug)]
#[must_use = "a module step builder does nothing until `build`"]
pub struct ModuleStepBuilder {
    options: Options,
    fallback: Option<Algorithm>,
}

impl ModuleStepBuilder {
    /// [`OptimizerBuilder::state_storage`]. With 4-bit state, records
    /// ([`ModuleStep::to_bytes`]) hold it under torchao's names, as this crate's checkpoints
    /// do: a 4-bit state as `exp_avg.codes` (U8, two codes per byte), `exp_avg.scale` (F32,
    /// one per block) and `exp_avg.qmap` (its 16 entries); a tensor that keeps f32 state as
    /// `exp_avg`.
    pub fn state_storage(mut self, storage: wgpu_optim::StateStorage) -> Self {
        self.options.state_storage = storage;
        self
    }

    /// [`OptimizerBuilder::capturable`]: needed by [`ModuleStep::step_unscaled`].
    pub fn capturable(mut self, on: bool) -> Self {
        self.options.capturable = on;
        self
    }

    /// [`OptimizerBuilder::grad_clip`], over the parameters of one step that share a step
    /// count.
    pub fn grad_clip(mut self, clip: impl Into<Option<wgpu_optim::GradClip>>) -> Self {
        self.options.grad_clip = clip.into();
        self
    }

    /// [`OptimizerBuilder::rounding`].
    pub fn rounding(mut self, rounding: wgpu_optim::Rounding) -> Self {
        self.options.rounding = rounding;
        self
    }

    /// Under Muon, `algorithm` steps the module's parameters that are not 2-D (biases,
    /// norms), as a torch trainer puts them in an AdamW group beside the Muon group: each
    /// step's optimizer has the two groups. Both take the step's learning rate (with
    /// [`MuonLrAdjust::MatchRmsAdamW`](wgpu_optim::MuonLrAdjust) one rate fits both). Without
    /// it, a step with a parameter Muon cannot take is refused ([`Error::BadShape`]).
    /// [`Self::build`] refuses it for another algorithm than Muon, or a Muon fallback
    /// ([`Error::ConflictingOptions`]).
    ///
    /// ```no_run
    /// # fn main() -> wgpu_optim::Result<()> {
    /// use wgpu_optim_burn::{ModuleStep, SharedDevice};
    /// use wgpu_optim::{Adam, Muon};
    ///
    /// let shared = SharedDevice::headless_blocking()?;
    /// let step = ModuleStep::builder().fallback(Adam::adamw()).build(&shared, Muon::default())?;
    /// # Ok(()) }
    /// ```
    pub fn fallback(mut self, algorithm: impl Into<Algorithm>) -> Self {
        self.fallback = Some(algorithm.into());
        self
    }

    /// `algorithm` over a module's parameters on `shared`'s device. The optimizers are built
    /// at the first step, when the parameters are known; the algorithm, the fallback and the
    /// clip are checked here.
    pub fn build(self, shared: &SharedDevice, algorithm: impl Into<Algorithm>) -> Result<ModuleStep> {
        let algorithm = algorithm.into();
        algorithm.validate()?;
        crate::fallback::check_fallback(&algorithm, self.fallback.as_ref())?;
        if let Some(clip) = &self.options.grad_clip {
            clip.validate()?;
        }
        if let Some(q4) = &self.options.state_storage.q4() {
            q4.validate()?;
        }
        Ok(ModuleStep {
            shared: shared.clone(),
            algorithm,
            fallback: self.fallback,
            options: self.options,
            params: HashMap::new(),
            bounds: Vec::new(),
            next_key: 0,
            mode: ScheduleFreeMode::Train,
        })
    }
}

impl ModuleStep {
    /// The one way to build a module step: options first, then the device and the algorithm
    /// ([`ModuleStepBuilder::build`]).
    pub fn builder() -> ModuleStepBuilder {
        ModuleStepBuilder { options: Options::default(), fallback: None }
    }
}

/// The [`OptimizerBuilder`] options a module step honours, kept until its optimizer is built
/// at the first step (when the module's parameters are known).
#[derive(Clone, Debug, Default)]
pub(crate) struct Options {
    pub(crate) state_storage: StateStorage,
    pub(crate) capturable: bool,
    pub(crate) grad_clip: Option<GradClip>,
    pub(crate) rounding: Rounding,
}

impl Options {
    /// An optimizer builder with these options.
    pub(crate) fn builder(&self) -> OptimizerBuilder {
        Optimizer::builder()
            .state_storage(self.state_storage)
            .capturable(self.capturable)
            .grad_clip(self.grad_clip)
            .rounding(self.rounding)
    }
}
