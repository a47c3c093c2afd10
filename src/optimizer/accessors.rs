//! What a trainer reads and changes between steps: groups, hyperparameters, parameters,
//! and parameter state, whatever its storage.

use super::Optimizer;
#[cfg(doc)]
use super::OptimizerBuilder;
use crate::{
    Algorithm, Error, OptimizerOptions, QuantizedState, Result, Rounding, StateKind, StateView, Tensor,
};

impl Optimizer {
    /// How the optimizer's 16-bit stores round ([`OptimizerBuilder::rounding`]).
    pub fn rounding(&self) -> Rounding {
        self.rounding
    }

    /// The state kinds parameter tensors of `algorithm` keep here: the algorithm's, then the
    /// Kahan compensation where the rounding keeps one.
    pub(super) fn state_kinds(&self, algorithm: &Algorithm) -> Vec<StateKind> {
        let mut kinds = algorithm.state_kinds().to_vec();
        if self.rounding == Rounding::Kahan {
            kinds.push(StateKind::KahanCompensation);
        }
        kinds
    }

    /// How many parameter groups there are.
    pub fn group_count(&self) -> usize {
        self.groups.len()
    }

    /// Group `g`'s algorithm and hyperparameters.
    pub fn group_algorithm(&self, g: usize) -> Option<&Algorithm> {
        self.groups.get(g).map(|group| &group.algorithm)
    }

    /// Group `g`'s parameters.
    pub fn group_params(&self, g: usize) -> Option<&[Tensor]> {
        self.groups.get(g).map(|group| &self.params[group.first..group.first + group.len])
    }

    /// Sets every group's learning rate to `lr` from the next step on; no pipeline is
    /// rebuilt. All groups get the same value, so ratios between groups (a head trained at
    /// 10x the base rate) are not kept: to scale a schedule per group, call
    /// [`Self::set_group_lr`] for each with its own rate. A refused `lr` changes no group.
    pub fn set_lr(&mut self, lr: f64) -> Result<()> {
        for g in 0..self.groups.len() {
            let next = self.groups[g].algorithm.with_lr(lr);
            self.set_group_algorithm(g, next)?;
        }
        Ok(())
    }

    /// Sets group `g`'s learning rate from the next step on, leaving its other
    /// hyperparameters and every other group as they are ([`Error::NoSuchGroup`] for a `g`
    /// past the groups).
    pub fn set_group_lr(&mut self, g: usize, lr: f64) -> Result<()> {
        let groups = self.groups.len();
        let algorithm = self.group_algorithm(g).ok_or(Error::NoSuchGroup { index: g, groups })?.with_lr(lr);
        self.set_group_algorithm(g, algorithm)
    }

    /// Changes group `g`'s hyperparameters from the next step on (a schedule). Learning
    /// rate, betas, eps, momentum, dampening and weight decay are uniforms and change no
    /// pipeline. The new algorithm must keep the same state tensors (no switching AMSGrad
    /// or momentum on or off). In capturable mode the new learning rate is written to the
    /// device (at the next submit).
    pub fn set_group_algorithm(&mut self, g: usize, algorithm: impl Into<Algorithm>) -> Result<()> {
        let algorithm = algorithm.into();
        algorithm.validate()?;
        let groups = self.groups.len();
        if self.q8.is_some() {
            crate::q8::check_algorithm(&algorithm, self.clip.is_some())?;
        }
        let clip = self.clip.as_ref().map(|c| c.clip());
        algorithm.check_options(&OptimizerOptions::kept(
            self.device.is_some(),
            clip,
            self.rounding,
            &algorithm,
        ))?;
        if self.q4.is_some() {
            crate::q4::check_algorithm(&algorithm)?;
        }
        let group = self.groups.get_mut(g).ok_or(Error::NoSuchGroup { index: g, groups })?;
        group.algorithm.check_change(&algorithm)?;
        if algorithm.state_kinds() != group.algorithm.state_kinds() {
            return Err(Error::StateMismatch {
                argument: format!("algorithm (for group {g})"),
                got: algorithm.state_kinds().to_vec(),
                expected: group.algorithm.state_kinds().to_vec(),
            });
        }
        crate::step::clip::check_own_clip_change(&group.algorithm, &algorithm)?;
        let variant_changed =
            algorithm.kernel_step(1).switches() != group.algorithm.kernel_step(1).switches();
        let family_changed = algorithm.family() != group.algorithm.family();
        if let Some(device) = &self.device {
            if algorithm.lr() != group.algorithm.lr() {
                device.write_lr(&self.ctx, g, algorithm.lr());
            }
        }
        if let Some(engine) = &mut self.q8 {
            engine.set_algorithm(g, &algorithm);
        }
        if let Some(engine) = &mut self.q4 {
            engine.set_algorithm(g, &algorithm);
        }
        group.algorithm = algorithm;
        group.dirty = true;
        if variant_changed {
            self.bound.clear();
        }
        if family_changed {
            self.add_family_passes(g)?;
        }
        Ok(())
    }

    /// The parameters, numbered across groups (in master-weight mode, the f32 masters).
    pub fn params(&self) -> &[Tensor] {
        &self.params
    }

    /// The model copies (in master-weight mode, the model's own tensors); empty otherwise.
    pub fn model_copies(&self) -> &[Tensor] {
        &self.model_copies
    }

    /// Steps recorded so far. In capturable mode, steps that AMP skipped are counted here
    /// but not by the device ([`Self::read_device_step`]).
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// Parameter `index`'s state of `kind` as it is stored, if its algorithm keeps one:
    /// dense state as its tensor on the device, 8-bit and 4-bit state
    /// ([`StateStorage::Q8`], [`StateStorage::Q4`]) read back after every submitted step, as
    /// codes and scales (or f32 values where a tensor keeps f32 state). `None` for an index
    /// past the parameters or a kind the parameter does not keep. Reading low-bit state
    /// blocks: in wasm32 builds that returns [`Error::Readback`]; use [`Self::state_async`].
    ///
    /// The same name as [`CpuOptimizer::state`](crate::cpu::CpuOptimizer::state) for the
    /// same state; this one returns a `Result`, since low-bit state is read from the device.
    ///
    /// [`StateStorage::Q8`]: crate::StateStorage::Q8
    /// [`StateStorage::Q4`]: crate::StateStorage::Q4
    pub fn state(&self, index: usize, kind: StateKind) -> Result<Option<StateView<'_>>> {
        if let Some(engine) = &self.q8 {
            return Ok(engine.read(&self.ctx, index, kind)?.map(StateView::Q8));
        }
        if let Some(engine) = &self.q4 {
            return Ok(engine.read(&self.ctx, index, kind)?.map(StateView::Q4));
        }
        Ok(self.tensor_state(index, kind).map(StateView::Tensor))
    }

    /// [`Self::state`] as a future, for callers that must not block (a browser's main
    /// thread).
    pub async fn state_async(&self, index: usize, kind: StateKind) -> Result<Option<StateView<'_>>> {
        if let Some(engine) = &self.q8 {
            return Ok(engine.read_async(&self.ctx, index, kind).await?.map(StateView::Q8));
        }
        if let Some(engine) = &self.q4 {
            return Ok(engine.read_async(&self.ctx, index, kind).await?.map(StateView::Q4));
        }
        Ok(self.tensor_state(index, kind).map(StateView::Tensor))
    }

    /// Parameter `index`'s dense state tensor of `kind`; `None` with low-bit storage.
    pub fn tensor_state(&self, index: usize, kind: StateKind) -> Option<&Tensor> {
        if let Some(tensor) = self.passes.iter().find_map(|p| p.state(index, kind)) {
            return Some(tensor);
        }
        let group = self.groups.iter().find(|g| (g.first..g.first + g.len).contains(&index))?;
        let k = self.state_kinds(&group.algorithm).iter().position(|s| *s == kind)?;
        self.state.get(index)?.get(k)
    }

    /// Replaces parameter `index`'s low-bit state of `kind` (queued, so it lands before the
    /// next submitted step). Refused, with nothing written, when `state` is not of the
    /// optimizer's storage ([`Error::NeedsOption`], naming `state_storage`), for a parameter
    /// or kind the optimizer does not have, or when `state` is not stored as this tensor's
    /// is (low-bit at and above the storage's minimum size, f32 below), has another length,
    /// lacks one scale per block, or has a scale that is NaN, infinite or negative
    /// ([`Error::BadValue`], naming the block). Dense state is written through its tensor.
    ///
    /// The same name as [`CpuOptimizer::set_state`](crate::cpu::CpuOptimizer::set_state);
    /// this one borrows `state` and takes `&self`, since it only queues a copy to the device.
    pub fn set_state(&self, index: usize, kind: StateKind, state: &QuantizedState) -> Result<()> {
        match (state, &self.q8, &self.q4) {
            (QuantizedState::Q8(state), Some(engine), _) => engine.write(&self.ctx, index, kind, state),
            (QuantizedState::Q4(state), _, Some(engine)) => engine.write(&self.ctx, index, kind, state),
            (state, _, _) => Err(state.wrong_storage()),
        }
    }

    /// The 8-bit state's engine, for tests that pick its kernel.
    #[cfg(test)]
    pub(crate) fn q8_engine_mut(&mut self) -> Option<&mut crate::gpu::q8::Q8Engine> {
        self.q8.as_mut()
    }
}
