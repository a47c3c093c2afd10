//! The step: the module's parameters checked, grouped into cohorts by step count, each
//! cohort's optimizer found or built (Muon's fallback group included), recorded and submitted.

use std::collections::{BTreeMap, HashMap};

use burn::module::{Module, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::Tensor as BurnTensor;

use super::visit::{Check, Take};
use super::StepError;
use super::{Bound, Checked, Cohort, Entry, Home, ModuleStep, Prepared, StepTensors};
use crate::fallback::{algorithm_for, in_main_group, FrontEnd};
use crate::lease::{lease, Access, Leased};
use wgpu_optim::ops::check_inv_scale;
use wgpu_optim::ParamGroup;
use wgpu_optim::{
    Algorithm, BurnFailure, Error, Optimizer, Result, ScheduleFreeMode, ScheduleFreeScalars, Tensor,
};

impl ModuleStep {
    /// One step with learning rate `lr` of every parameter of `module` that has a gradient
    /// in `grads`, recorded and submitted before it returns; parameters without one keep
    /// their values and state. Refused, with the module handed back and nothing written
    /// ([`StepError`]), where `lr` is invalid, a parameter or gradient is not on the shared
    /// device or not F32, F16 or BF16, a gradient's shape or dtype is not its parameter's,
    /// a loaded state does not fit its parameter, or the optimizer refuses the parameters.
    pub fn step<M: Module>(&mut self, lr: f64, module: M, grads: GradientsParams) -> Result<M, StepError<M>> {
        self.step_inner(lr, module, grads, None)
    }

    /// AMP: the step of [`Self::step`] after unscaling the gradients by the device scalar
    /// `inv_scale` (one f32 element), skipped on the device when any gradient is NaN or
    /// infinite ([`Optimizer::record_unscale`]). Needs [`OptimizerBuilder::capturable`](wgpu_optim::OptimizerBuilder::capturable).
    pub fn step_unscaled<M: Module>(
        &mut self,
        lr: f64,
        module: M,
        grads: GradientsParams,
        inv_scale: &BurnTensor<1>,
    ) -> Result<M, StepError<M>> {
        if !self.options.capturable {
            let error = Error::NeedsOption { what: "ModuleStep::step_unscaled".into(), option: "capturable" };
            return Err(StepError { module, error });
        }
        self.step_inner(lr, module, grads, Some(inv_scale.clone()))
    }

    fn step_inner<M: Module>(
        &mut self,
        lr: f64,
        module: M,
        grads: GradientsParams,
        inv_scale: Option<BurnTensor<1>>,
    ) -> Result<M, StepError<M>> {
        // Everything that can be refused before the module is taken apart is.
        if self.mode == ScheduleFreeMode::Eval {
            return Err(StepError { module, error: Error::EvalMode { call: "ModuleStep::step" } });
        }
        let checked = match self.check(lr, &module, &grads) {
            Ok(checked) => checked,
            Err(error) => return Err(StepError { module, error }),
        };
        if checked.ids.is_empty() {
            return Ok(module);
        }
        let cohorts = match self.cohorts(&checked.ids, &checked.shapes, true) {
            Ok(cohorts) => cohorts,
            Err(error) => return Err(StepError { module, error }),
        };
        let inv_scale = match inv_scale.map(|t| self.lease_inv_scale(t)).transpose() {
            Ok(inv_scale) => inv_scale,
            Err(error) => return Err(StepError { module, error }),
        };
        let mut grads = grads;
        let mut take = Take {
            shared: &self.shared,
            grads: &mut grads,
            params: vec![],
            grads_leased: vec![],
            error: None,
        };
        let module = module.map(&mut take);
        let (params, grads_leased, error) = (take.params, take.grads_leased, take.error);
        if let Some(error) = error {
            return Err(StepError { module, error });
        }
        let leased = StepTensors { params: &params, grads: &grads_leased };
        match self.record(lr, &checked, &cohorts, leased, inv_scale.as_ref()) {
            Ok(()) => Ok(module),
            Err(error) => Err(StepError { module, error }),
        }
    }

    /// The first pass, borrowing the module: the parameters with gradients, in module
    /// order, their shapes, and whether each of them (and its gradient) can be stepped.
    fn check<M: Module>(&self, lr: f64, module: &M, grads: &GradientsParams) -> Result<Checked> {
        self.algorithm.with_lr(lr).validate()?;
        if let Some(fallback) = &self.fallback {
            fallback.with_lr(lr).validate()?;
        }
        let mut check =
            Check { shared: &self.shared, grads, ids: Vec::new(), shapes: Vec::new(), error: None };
        module.visit(&mut check);
        if let Some(error) = check.error {
            return Err(error);
        }
        // Muon without a fallback: a parameter it cannot take, by its place among the step's
        // parameters (module order) and its shape.
        let fallback = self.fallback.as_ref();
        for (i, shape) in check.shapes.iter().enumerate() {
            algorithm_for(&self.algorithm, fallback, shape, i, FrontEnd::ModuleStep)?;
        }
        Ok(Checked { ids: check.ids, shapes: check.shapes })
    }

    /// The step's parameters grouped by step count (and Schedule-Free's values), lowest
    /// first; in each, the main algorithm's parameters (of `shapes`) before the fallback's.
    /// Refused, for a step, where the counts differ and an option needs one optimizer over
    /// all of them.
    pub(super) fn cohorts(
        &mut self,
        ids: &[ParamId],
        shapes: &[Vec<usize>],
        for_step: bool,
    ) -> Result<Vec<Cohort>> {
        let same_as_last = self.bounds.len() == 1 && self.bounds[0].ids == ids;
        if self.options.capturable && !same_as_last {
            self.settle_device_counts()?;
        }
        // Keyed by the values' bits: parameters share an optimizer only where they are equal.
        type Key = (u64, Option<(u64, u64)>);
        let mut by_time: BTreeMap<Key, (Option<ScheduleFreeScalars>, Vec<usize>)> = BTreeMap::new();
        for (i, id) in ids.iter().enumerate() {
            let (time, scalars) = self.params.get(id).map_or((0, None), |e| (e.time, e.schedule_free));
            let key = (time, scalars.map(|s| (s.weight_sum.to_bits(), s.lr_max.to_bits())));
            by_time.entry(key).or_insert_with(|| (scalars, Vec::new())).1.push(i);
        }
        let counts: std::collections::BTreeSet<u64> = by_time.keys().map(|(t, _)| *t).collect();
        // Adan's own clipping is a global norm too.
        let clipped = self.options.grad_clip.is_some() || self.algorithm.own_grad_clip().is_some();
        if for_step && counts.len() > 1 && (clipped || self.options.capturable) {
            let option = if self.options.capturable {
                "capturable (AMP)"
            } else if self.options.grad_clip.is_some() {
                "grad_clip"
            } else {
                "max_grad_norm"
            };
            return Err(Error::Burn {
                cause: BurnFailure::Step,
                detail: format!(
                    "the parameters with gradients have different step counts ({:?}) (some had no \
                 gradient in an earlier step); {option} covers one optimizer, one count, so \
                 they cannot be stepped together under it",
                    counts
                ),
            });
        }
        let (algorithm, fallback) = (self.algorithm, self.fallback);
        let main = |i: &usize| in_main_group(&algorithm, fallback.as_ref(), &shapes[*i]);
        let cohorts = by_time.into_iter().map(|((time, _), (schedule_free, mut members))| {
            // Stable: module order within each group.
            members.sort_by_key(|i| !main(i));
            Cohort { time, schedule_free, members }
        });
        Ok(cohorts.collect())
    }

    /// Capturable mode: each parameter's count from its optimizer's device counter (AMP
    /// skips are counted on the device only).
    fn settle_device_counts(&mut self) -> Result<()> {
        let counts: HashMap<u64, u64> = self
            .bounds
            .iter()
            .map(|b| Ok((b.key, b.optimizer.read_device_step()?)))
            .collect::<Result<_>>()?;
        for entry in self.params.values_mut() {
            if let Home::Bound(key) = entry.home {
                if let Some(count) = counts.get(&key) {
                    entry.time = *count;
                }
            }
        }
        Ok(())
    }

    fn lease_inv_scale(&self, inv_scale: BurnTensor<1>) -> Result<Leased> {
        let leased = lease(&self.shared, inv_scale, Access::Read, "inv_scale")?.1;
        check_inv_scale(&leased.tensor)?;
        Ok(leased)
    }

    /// Records and submits the step: each cohort's optimizer found or built (bringing its
    /// parameters' state from wherever it is), then each one's step. `self` changes only
    /// once everything is recorded.
    fn record(
        &mut self,
        lr: f64,
        checked: &Checked,
        cohorts: &[Cohort],
        leased: StepTensors<'_>,
        inv_scale: Option<&Leased>,
    ) -> Result<()> {
        let ctx = self.shared.context().clone();
        let mut encoder = ctx.device().create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("wgpu-optim Burn module step"),
        });
        let mut prepared = Vec::with_capacity(cohorts.len());
        for cohort in cohorts {
            let ids: Vec<ParamId> = cohort.members.iter().map(|&i| checked.ids[i]).collect();
            let params: Vec<Tensor> =
                cohort.members.iter().map(|&i| leased.params[i].tensor.clone()).collect();
            let shapes = cohort.members.iter().map(|&i| checked.shapes[i].clone()).collect();
            prepared.push(self.prepare(&mut encoder, ids, params, shapes, cohort)?);
        }
        for (cohort, prepared) in cohorts.iter().zip(&mut prepared) {
            let grads: Vec<Tensor> = cohort.members.iter().map(|&i| leased.grads[i].tensor.clone()).collect();
            let optimizer = match prepared {
                Prepared::Reused(k) => &mut self.bounds[*k].optimizer,
                Prepared::Built(bound) => &mut bound.optimizer,
            };
            optimizer.set_lr(lr)?;
            if let Some(inv_scale) = inv_scale {
                optimizer.record_unscale(&mut encoder, &grads, &inv_scale.tensor)?;
            }
            optimizer.record_step(&mut encoder, &grads)?;
        }
        // A refused submission comes back as an error, not to Burn's device's handler.
        ctx.catch("submitting a Burn step", || ctx.queue().submit([encoder.finish()]))?;
        self.commit(checked, cohorts, prepared, true);
        Ok(())
    }

    /// The optimizer for one cohort: the one that stepped exactly these parameters in these
    /// buffers before, or a new one; either way with every parameter's state brought in
    /// (copies recorded into `encoder`) and the cohort's step count. `shapes` are the
    /// parameters', for the algorithms that need them.
    pub(super) fn prepare(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        ids: Vec<ParamId>,
        params: Vec<Tensor>,
        shapes: Vec<Vec<usize>>,
        cohort: &Cohort,
    ) -> Result<Prepared> {
        let time = cohort.time;
        if let Some(k) = self.bounds.iter().position(|b| b.ids == ids && b.params == params) {
            let bound = &self.bounds[k];
            self.bring_in(encoder, &bound.optimizer, Some(bound.key), &ids)?;
            // Host mode only: a capturable optimizer's device count is its parameters' own.
            let optimizer = &mut self.bounds[k].optimizer;
            if !self.options.capturable && optimizer.step_count() != time {
                optimizer.set_step_count(time)?;
            }
            continue_schedule_free(optimizer, cohort, self.mode)?;
            return Ok(Prepared::Reused(k));
        }
        let mut optimizer = self.build_optimizer(&params, shapes)?;
        self.bring_in(encoder, &optimizer, None, &ids)?;
        if time != 0 {
            optimizer.set_step_count(time)?;
        }
        continue_schedule_free(&mut optimizer, cohort, self.mode)?;
        let key = self.next_key;
        self.next_key += 1;
        Ok(Prepared::Built(Box::new(Bound { key, ids, params, optimizer })))
    }

    /// A new optimizer over one cohort's `params` (of `shapes`, the main algorithm's first:
    /// [`Self::cohorts`] orders them so): one group, or under Muon with a fallback, the
    /// 2-D parameters' Muon group and the others' fallback group (either may be empty).
    fn build_optimizer(&self, params: &[Tensor], shapes: Vec<Vec<usize>>) -> Result<Optimizer> {
        let fallback = self.fallback.as_ref();
        let main = shapes.iter().take_while(|s| in_main_group(&self.algorithm, fallback, s)).count();
        let mut groups = vec![ParamGroup::new(self.algorithm, &params[..main])];
        if let Some(fallback) = fallback {
            groups.push(ParamGroup::new(*fallback, &params[main..]));
        }
        let mut builder = self.options.builder();
        if self.algorithm.needs_shapes() || fallback.is_some_and(Algorithm::needs_shapes) {
            builder = builder.param_shapes(shapes);
        }
        builder.build_groups(self.shared.context(), groups)
    }

    /// The algorithm that steps a parameter of rank `rank` (of a record, whose shape it does
    /// not keep): under Muon, the fallback below or above 2. Where Muon would refuse it, Muon,
    /// whose step refuses it.
    pub(super) fn algorithm_of_rank(&self, rank: usize) -> Algorithm {
        let shape = vec![2; rank];
        algorithm_for(&self.algorithm, self.fallback.as_ref(), &shape, 0, FrontEnd::ModuleStep)
            .unwrap_or(self.algorithm)
    }

    /// After a submitted step (or, `stepped` false, a Schedule-Free swap): each parameter
    /// counts it and lives in its cohort's optimizer; this call's optimizers come first, and
    /// those holding no one's state go.
    pub(super) fn commit(
        &mut self,
        checked: &Checked,
        cohorts: &[Cohort],
        prepared: Vec<Prepared>,
        stepped: bool,
    ) {
        let mut keys = Vec::with_capacity(cohorts.len());
        let mut built = Vec::new();
        for (cohort, prepared) in cohorts.iter().zip(prepared) {
            let (key, optimizer) = match prepared {
                Prepared::Reused(k) => (self.bounds[k].key, &self.bounds[k].optimizer),
                Prepared::Built(bound) => {
                    built.push(*bound);
                    let bound = &built[built.len() - 1];
                    (bound.key, &bound.optimizer)
                }
            };
            keys.push(key);
            let schedule_free = optimizer.schedule_free_scalars(0);
            for &i in &cohort.members {
                let entry = Entry {
                    time: cohort.time + u64::from(stepped),
                    shape: checked.shapes[i].clone(),
                    schedule_free,
                    home: Home::Bound(key),
                };
                self.params.insert(checked.ids[i], entry);
            }
        }
        self.bounds.extend(built);
        let homes: Vec<u64> = self
            .params
            .values()
            .filter_map(|e| if let Home::Bound(k) = e.home { Some(k) } else { None })
            .collect();
        self.bounds.retain(|b| homes.contains(&b.key));
        self.bounds.sort_by_key(|b| keys.iter().position(|k| *k == b.key).unwrap_or(usize::MAX));
    }
}

/// A cohort's optimizer set to continue Schedule-Free where its parameters left off: the
/// cohort's values, and the module step's mode (a new optimizer starts in train mode).
fn continue_schedule_free(optimizer: &mut Optimizer, cohort: &Cohort, mode: ScheduleFreeMode) -> Result<()> {
    if optimizer.schedule_free_scalars(0).is_none() {
        return Ok(());
    }
    optimizer.set_schedule_free_scalars(0, cohort.schedule_free.unwrap_or_default())?;
    optimizer.set_mode_unchanged(mode);
    Ok(())
}
