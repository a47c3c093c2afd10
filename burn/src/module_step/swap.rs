//! Schedule-Free's `eval()` and `train()`: the swap of the parameters between y and x.

use burn::module::{Module, ParamId};

use super::StepError;
use super::{Checked, ModuleStep, Prepared};
use crate::lease::Leased;
use crate::schedule_free::lease_params;
use wgpu_optim::ops::StepScalars;
use wgpu_optim::{BurnFailure, Error, Result, ScheduleFreeMode, Tensor};

impl ModuleStep {
    /// Schedule-Free's `eval()`: every parameter of `module` with a stepped state becomes
    /// the average `x = lerp(y, z, 1 - 1/beta1)`, on the device, in one submission (nothing is
    /// read back), and steps are refused ([`Error::EvalMode`]) until [`Self::train`]. A
    /// no-op in eval mode already, as the package's. Refused, with the module handed back
    /// unchanged ([`StepError`]), for another algorithm, for `beta1 = 0` (x cannot be
    /// recovered), or where a parameter cannot be bound.
    ///
    /// ```no_run
    /// # fn run<M: burn::module::Module>(model: M, grads: burn::optim::GradientsParams) -> wgpu_optim::Result<M> {
    /// use wgpu_optim_burn::{ModuleStep, SharedDevice};
    /// use wgpu_optim::ScheduleFreeAdamW;
    ///
    /// let shared = SharedDevice::headless_blocking()?;
    /// let mut step = ModuleStep::builder().build(&shared, ScheduleFreeAdamW::default())?;
    /// let model = step.step(0.0025, model, grads)?;
    /// let model = step.eval(model)?; // evaluate x
    /// let model = step.train(model)?; // back to y, to train on
    /// # Ok(model) }
    /// ```
    pub fn eval<M: Module>(&mut self, module: M) -> Result<M, StepError<M>> {
        self.swap(module, ScheduleFreeMode::Eval)
    }

    /// Schedule-Free's `train()`: back from x to `y = lerp(x, z, 1 - beta1)` and train mode.
    /// A no-op in train mode; otherwise as [`Self::eval`].
    pub fn train<M: Module>(&mut self, module: M) -> Result<M, StepError<M>> {
        self.swap(module, ScheduleFreeMode::Train)
    }

    fn swap<M: Module>(&mut self, module: M, to: ScheduleFreeMode) -> Result<M, StepError<M>> {
        // The optimizers record the swap; the algorithm says whether it can run.
        let checked = match StepScalars::mode_swap(&self.algorithm, to) {
            Some(swap) => swap.map(drop),
            None => Err(Error::Burn {
                cause: BurnFailure::Config,
                detail: format!(
                    "eval() and train() switch Schedule-Free AdamW's parameters between y and x; this \
                     module step runs {}",
                    self.algorithm.name()
                ),
            }),
        };
        if let Err(error) = checked {
            return Err(StepError { module, error });
        }
        if self.mode == to {
            return Ok(module);
        }
        let params = &self.params;
        let stepped = |id: ParamId| params.get(&id).is_some_and(|e| e.time > 0);
        let (module, leased) = lease_params(&self.shared, module, &stepped)?;
        match self.record_swap(&leased, to) {
            Ok(()) => Ok(module),
            Err(error) => Err(StepError { module, error }),
        }
    }

    /// Records and submits the swap of the leased parameters: each cohort's optimizer found
    /// or built (its state brought in, its mode the module step's), then its swap pass.
    fn record_swap(&mut self, leased: &[(ParamId, Leased)], to: ScheduleFreeMode) -> Result<()> {
        let ids: Vec<ParamId> = leased.iter().map(|(id, _)| *id).collect();
        let shapes = ids.iter().map(|id| self.params.get(id).map(|e| e.shape.clone()).unwrap_or_default());
        let checked = Checked { shapes: shapes.collect(), ids };
        let cohorts = self.cohorts(&checked.ids, &checked.shapes, false)?;
        let ctx = self.shared.context().clone();
        let mut encoder = ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("wgpu-optim swap") });
        let mut prepared = Vec::with_capacity(cohorts.len());
        for cohort in &cohorts {
            let ids: Vec<ParamId> = cohort.members.iter().map(|&i| checked.ids[i]).collect();
            let params: Vec<Tensor> = cohort.members.iter().map(|&i| leased[i].1.tensor.clone()).collect();
            let shapes = cohort.members.iter().map(|&i| checked.shapes[i].clone()).collect();
            prepared.push(self.prepare(&mut encoder, ids, params, shapes, cohort)?);
        }
        for prepared in &mut prepared {
            let optimizer = match prepared {
                Prepared::Reused(k) => &mut self.bounds[*k].optimizer,
                Prepared::Built(bound) => &mut bound.optimizer,
            };
            match to {
                ScheduleFreeMode::Eval => optimizer.record_eval(&mut encoder)?,
                ScheduleFreeMode::Train => optimizer.record_train(&mut encoder)?,
            }
        }
        // A refused submission comes back as an error, not to Burn's device's handler.
        ctx.catch("submitting a Burn step", || ctx.queue().submit([encoder.finish()]))?;
        self.commit(&checked, &cohorts, prepared, false);
        self.mode = to;
        Ok(())
    }
}
