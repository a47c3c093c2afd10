//! What a trainer reads and changes between steps: groups, hyperparameters, parameters,
//! state tensors and 8-bit state.

use super::Optimizer;
#[cfg(doc)]
use super::OptimizerBuilder;
use crate::{Algorithm, Error, Result, Rounding, StateKind, Tensor};

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
        crate::algo::check_lamb_options(
            &algorithm,
            self.device.is_some(),
            self.clip.is_some(),
            self.rounding,
        )?;
        if self.q4.is_some() {
            crate::q4::check_algorithm(&algorithm)?;
        }
        let group = self.groups.get_mut(g).ok_or(Error::NoSuchGroup { index: g, groups })?;
        crate::algo::check_adafactor_change(&group.algorithm, &algorithm)?;
        if algorithm.state_kinds() != group.algorithm.state_kinds() {
            return Err(Error::StateMismatch {
                argument: format!("algorithm (for group {g})"),
                got: algorithm.state_kinds().to_vec(),
                expected: group.algorithm.state_kinds().to_vec(),
            });
        }
        crate::algo::check_muon_change(&group.algorithm, &algorithm)?;
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

    /// Parameter `index`'s state tensor of `kind`, if its algorithm keeps one.
    ///
    /// With [`OptimizerBuilder::q8_states`] only the f32 states of tensors below
    /// `min_8bit_size` are tensors: for a state kept in 8 bits this returns `None`, though
    /// the parameter has one. Read those with [`Self::q8_state`] (codes and absmax, or
    /// the values through [`StoredState::values`](crate::q8::StoredState::values)).
    pub fn state(&self, index: usize, kind: StateKind) -> Option<&Tensor> {
        if let Some(tensor) = self.passes.iter().find_map(|p| p.state(index, kind)) {
            return Some(tensor);
        }
        let group = self.groups.iter().find(|g| (g.first..g.first + g.len).contains(&index))?;
        let k = self.state_kinds(&group.algorithm).iter().position(|s| *s == kind)?;
        self.state.get(index)?.get(k)
    }

    /// With [`OptimizerBuilder::q8_states`]: parameter `index`'s state of `kind` as stored,
    /// 8-bit codes and absmax (or f32 values below `min_8bit_size`), read back after every
    /// submitted step; `None` where the parameter keeps no such state. Refused without
    /// 8-bit state ([`Error::NeedsOption`]).
    ///
    /// The same name as [`CpuOptimizer::q8_state`](crate::cpu::CpuOptimizer::q8_state) for
    /// the same state; this one returns an owned copy in a `Result`, since the state lives on
    /// the device and is read back, where the CPU's lends its own.
    pub fn q8_state(&self, index: usize, kind: StateKind) -> Result<Option<crate::q8::StoredState>> {
        let engine = self.q8.as_ref().ok_or_else(|| needs_q8("q8_state"))?;
        engine.read(&self.ctx, index, kind)
    }

    /// [`Self::q8_state`] as a future, for callers that must not block (a browser's
    /// main thread, where the blocking form returns [`Error::Readback`]).
    pub async fn q8_state_async(
        &self,
        index: usize,
        kind: StateKind,
    ) -> Result<Option<crate::q8::StoredState>> {
        let engine = self.q8.as_ref().ok_or_else(|| needs_q8("q8_state"))?;
        engine.read_async(&self.ctx, index, kind).await
    }

    /// With [`OptimizerBuilder::q8_states`]: replaces parameter `index`'s state of `kind`
    /// (queued, so it lands before the next submitted step). Refused, with nothing written,
    /// without 8-bit state ([`Error::NeedsOption`]), for a parameter or kind the optimizer
    /// does not have, or when `state` is not stored as this tensor's is (8-bit at and above
    /// `min_8bit_size`, f32 below), has another length, lacks one absmax per block, or has
    /// an absmax that is NaN, infinite or negative ([`Error::BadValue`], naming the block).
    ///
    /// The same name as [`CpuOptimizer::set_q8_state`](crate::cpu::CpuOptimizer::set_q8_state);
    /// this one borrows `state` and takes `&self`, since it only queues a copy to the device.
    pub fn set_q8_state(&self, index: usize, kind: StateKind, state: &crate::q8::StoredState) -> Result<()> {
        let engine = self.q8.as_ref().ok_or_else(|| needs_q8("set_q8_state"))?;
        engine.write(&self.ctx, index, kind, state)
    }

    /// The 8-bit state's engine, for tests that pick its kernel.
    #[cfg(test)]
    pub(crate) fn q8_engine_mut(&mut self) -> Option<&mut crate::gpu::q8::Q8Engine> {
        self.q8.as_mut()
    }
}

/// The error of an 8-bit-state method called without [`OptimizerBuilder::q8_states`].
pub(super) fn needs_q8(what: &str) -> Error {
    Error::NeedsOption { what: format!("`{what}`"), option: "q8_states" }
}
