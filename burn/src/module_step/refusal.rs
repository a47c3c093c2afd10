//! A refused step: its reason, and the module handed back.

#[cfg(doc)]
use super::ModuleStep;
use wgpu_optim::Error;

/// A refused [`ModuleStep`] step: the reason, and the module handed back with its
/// parameters' values as they were (a parameter may sit in a new buffer, never with new
/// values) and the optimizer's state unchanged.
///
/// `?` converts it into [`Error`] (dropping the module); to keep training after a refusal,
/// match on it:
///
/// ```no_run
/// # fn train<M: burn::module::Module>(step: &mut wgpu_optim_burn::ModuleStep, model: M, grads: burn::optim::GradientsParams) -> M {
/// let model = match step.step(1e-3, model, grads) {
///     Ok(model) => model,
///     Err(refused) => {
///         eprintln!("step skipped: {}", refused.error);
///         refused.module
///     }
/// };
/// # model }
/// ```
pub struct StepError<M> {
    /// The module, as it was passed in.
    pub module: M,
    /// Why the step was refused.
    pub error: Error,
}

impl<M> StepError<M> {
    /// The module and the error.
    pub fn into_inner(self) -> (M, Error) {
        (self.module, self.error)
    }
}

impl<M> std::fmt::Debug for StepError<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepError").field("error", &self.error).finish_non_exhaustive()
    }
}

impl<M> std::fmt::Display for StepError<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the step was refused: {}", self.error)
    }
}

impl<M> std::error::Error for StepError<M> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<M> From<StepError<M>> for Error {
    fn from(refused: StepError<M>) -> Self {
        refused.error
    }
}
