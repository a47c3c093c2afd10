//! The CPU backend: the same algorithms, semantics and storage types as the GPU kernels,
//! on all cores.
//!
//! [`CpuOptimizer`] runs the step that [`Algorithm`] hands the GPU kernels, with the
//! shaders' formulas transcribed in f32 operation for operation, so the CPU rounds where
//! the shaders do (a GPU compiler may still fuse a multiply and an add) and stores 16-bit
//! values the same way (once, to nearest even). All
//! tensors of a step are cut into chunks that run in one parallel iteration on rayon's
//! pool; call [`CpuOptimizer::step`] inside `ThreadPool::install` to use a pool of your own.
//!
//! ```
//! # fn main() -> wgpu_optim::Result<()> {
//! use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut};
//! use wgpu_optim::Adam;
//!
//! let mut weights = vec![0.5f32; 1000];
//! let mut bias = vec![half::bf16::from_f32(0.1); 10];
//! let params = [(&weights[..]).into(), (&bias[..]).into()];
//! let mut opt = CpuOptimizer::builder().build(Adam::default(), &params)?;
//!
//! let (dw, db) = (vec![0.01f32; 1000], vec![half::bf16::from_f32(-0.2); 10]);
//! let mut params = [HostSliceMut::from(&mut weights[..]), HostSliceMut::from(&mut bias[..])];
//! opt.step(&mut params, &[HostSlice::from(&dw[..]), HostSlice::from(&db[..])])?;
//! assert_eq!(opt.step_count(), 1);
//! assert!(weights[0] < 0.5);
//! # Ok(()) }
//! ```

#[cfg(feature = "checkpoint")]
mod checkpoint;
pub(crate) mod convert;
pub(crate) mod f16_lanes;
pub(crate) mod host;
pub(crate) mod kernels;
mod magnitude_key;
mod norm;
pub(crate) mod passes;
mod q4;
pub(crate) mod q8;
pub(crate) mod state_memory;
pub(crate) mod storage;
pub(crate) mod work;

pub use host::{HostSlice, HostSliceMut, HostTensor};

use crate::q4::{Q4State, Q4States};
use crate::q8::{Q8States, StoredState};
use crate::step::clip::clip_coefficient;
use crate::step::rounding;
use crate::{Algorithm, DType, Error, GradClip, OptimizerOptions, Result, Rounding, StateKind};
use kernels::{Kernel, MAX_STATE};
use passes::{CpuPasses, CpuStep};
use state_memory::StateTensor;
use storage::Stores;

/// A stateful optimizer over host tensors: the CPU counterpart of [`crate::Optimizer`],
/// with the same names for the same things. It holds one parameter group (group 0).
///
/// The optimizer owns the state; the caller owns the parameters and gradients and lends
/// them to each [`step`](Self::step). Every parameter keeps the dtype and length it had
/// when the optimizer was built; each step's gradients may be any of F32, F16 and BF16.
#[derive(Clone, Debug)]
pub struct CpuOptimizer {
    algorithm: Algorithm,
    /// Each parameter's dtype and length, fixed at construction.
    params: Vec<(DType, usize)>,
    /// `state[i][k]` is parameter i's `algorithm.state_kinds()[k]`.
    state: Vec<Vec<StateTensor>>,
    /// Kahan rounding: each parameter's compensation, in its dtype; empty otherwise.
    compensation: Vec<StateTensor>,
    rounding: Rounding,
    step: u64,
    grad_clip: Option<GradClip>,
    /// The last step's global gradient norm, when clipping.
    grad_norm: Option<f32>,
    /// [`CpuOptimizerBuilder::param_shapes`]: empty, or each parameter's shape (only
    /// checkpoints read them).
    #[cfg_attr(not(feature = "checkpoint"), allow(dead_code))]
    shapes: Vec<Vec<usize>>,
    /// With [`CpuOptimizerBuilder::q8_states`]: its settings and each parameter's state (then
    /// `state` is empty).
    q8: Option<(Q8States, Vec<Vec<StoredState>>)>,
    /// With [`CpuOptimizerBuilder::q4_states`]: its settings and each parameter's state (then
    /// `state` is empty).
    q4: Option<(Q4States, Vec<Vec<Q4State>>)>,
    /// The passes and per-group state of an algorithm that is not elementwise (none for
    /// the others).
    passes: Option<Box<dyn CpuPasses>>,
}

/// How a [`CpuOptimizer`] is built: [`CpuOptimizer::builder`], the options the CPU backend
/// honours (every one off by default), then [`Self::build`]. The GPU-only options of
/// [`OptimizerBuilder`](crate::OptimizerBuilder) (master weights, model copies, capturable
/// mode) have no setter here, since the CPU backend updates the caller's host slices
/// directly and counts steps on the host:
///
/// ```compile_fail
/// let builder = wgpu_optim::cpu::CpuOptimizer::builder().master_weights(true);
/// ```
///
/// ```compile_fail
/// let builder = wgpu_optim::cpu::CpuOptimizer::builder().capturable(true);
/// ```
///
/// ```compile_fail
/// let builder = wgpu_optim::cpu::CpuOptimizer::builder().model_copies(Vec::new());
/// ```
#[derive(Clone, Debug)]
#[must_use = "an optimizer builder does nothing until `build`"]
pub struct CpuOptimizerBuilder {
    options: OptimizerOptions,
}

impl CpuOptimizerBuilder {
    /// The storage dtype of every state tensor (F32, F16 or BF16; F64 is refused with
    /// [`Error::DTypeMismatch`]); unset (the default) keeps each parameter's dtype.
    pub fn state_dtype(mut self, dtype: impl Into<Option<DType>>) -> Self {
        self.options.state_dtype = dtype.into();
        self
    }

    /// How 16-bit stores round, as on the GPU
    /// ([`OptimizerBuilder::rounding`](crate::OptimizerBuilder::rounding)): stochastic
    /// rounding stores the same bits as the GPU for the same seed; Kahan and stochastic
    /// rounding need F16 or BF16 parameters ([`Error::DTypeMismatch`] otherwise).
    pub fn rounding(mut self, rounding: Rounding) -> Self {
        self.options.rounding = rounding;
        self
    }

    /// Clip the global gradient norm before each step, as on the GPU
    /// ([`OptimizerBuilder::grad_clip`](crate::OptimizerBuilder::grad_clip));
    /// [`CpuOptimizer::grad_norm`] gives the last norm.
    pub fn grad_clip(mut self, clip: impl Into<Option<GradClip>>) -> Self {
        self.options.grad_clip = clip.into();
        self
    }

    /// Each parameter's shape, so that checkpoints hold each state in its parameter's shape
    /// ([`OptimizerBuilder::param_shapes`](crate::OptimizerBuilder::param_shapes); refused as
    /// by the GPU optimizer when the shapes do not fit the parameters).
    pub fn param_shapes(mut self, shapes: Vec<Vec<usize>>) -> Self {
        self.options.param_shapes = shapes;
        self
    }

    /// Blockwise 8-bit state, as on the GPU
    /// ([`OptimizerBuilder::q8_states`](crate::OptimizerBuilder::q8_states)).
    pub fn q8_states(mut self, q8: impl Into<Option<Q8States>>) -> Self {
        self.options.q8_states = q8.into();
        self
    }

    /// Blockwise 4-bit state for Adam and AdamW, as on the GPU
    /// ([`OptimizerBuilder::q4_states`](crate::OptimizerBuilder::q4_states)).
    pub fn q4_states(mut self, q4: impl Into<Option<crate::q4::Q4States>>) -> Self {
        self.options.q4_states = q4.into();
        self
    }

    /// An optimizer for parameters of the dtypes and lengths of `params`, updated by
    /// `algorithm`, with zeroed state (Adagrad: its initial accumulator value), at step 0.
    /// An empty `params` is refused ([`Error::NoParameters`]).
    pub fn build(self, algorithm: impl Into<Algorithm>, params: &[HostSlice<'_>]) -> Result<CpuOptimizer> {
        CpuOptimizer::with_options(algorithm, params, self.options)
    }
}

impl CpuOptimizer {
    /// The one way to build a CPU optimizer: options first, then the parameters
    /// ([`CpuOptimizerBuilder::build`]).
    pub fn builder() -> CpuOptimizerBuilder {
        CpuOptimizerBuilder { options: OptimizerOptions::default() }
    }

    /// [`CpuOptimizerBuilder::build`].
    fn with_options(
        algorithm: impl Into<Algorithm>,
        params: &[HostSlice<'_>],
        options: OptimizerOptions,
    ) -> Result<Self> {
        let algorithm = algorithm.into();
        algorithm.validate()?;
        if let Some(clip) = &options.grad_clip {
            clip.validate()?;
        }
        crate::algo::check_lamb_options(&algorithm, false, options.grad_clip.is_some(), options.rounding)?;
        if params.is_empty() {
            return Err(Error::NoParameters { argument: "params".into() });
        }
        if options.state_dtype == Some(DType::F64) {
            return Err(host::not_f64("options.state_dtype"));
        }
        crate::validate::check_shapes(
            &options.param_shapes,
            &params.iter().map(|p| p.len() as u64).collect::<Vec<_>>(),
        )?;
        let passes = algorithm.cpu_passes(&options, &params.iter().map(|p| p.len()).collect::<Vec<_>>())?;
        crate::validate::check_rounding_dtypes(options.rounding, params.iter().map(|p| p.dtype()), "params")?;
        if let Some(config) = options.q4_states {
            crate::q4::check_options(&config, &[algorithm], &options, params.iter().map(|p| p.dtype()))?;
            let states = params
                .iter()
                .map(|p| {
                    let quantized = config.quantizes(p.len() as u64);
                    let zeros = || Q4State::zeros(p.len(), quantized, config.block_size);
                    algorithm.state_kinds().iter().map(|_| zeros()).collect()
                })
                .collect();
            return Ok(CpuOptimizer {
                algorithm,
                params: params.iter().map(|p| (p.dtype(), p.len())).collect(),
                state: Vec::new(),
                compensation: Vec::new(),
                rounding: options.rounding,
                step: 0,
                grad_clip: options.grad_clip,
                grad_norm: None,
                shapes: options.param_shapes,
                q8: None,
                q4: Some((config, states)),
                passes,
            });
        }
        if let Some(config) = options.q8_states {
            crate::q8::check_options(&[algorithm], &options, params.iter().map(|p| p.dtype()))?;
            let states = params
                .iter()
                .map(|p| {
                    let quantized = config.quantizes(p.len() as u64);
                    algorithm.state_kinds().iter().map(|_| StoredState::zeros(p.len(), quantized)).collect()
                })
                .collect();
            return Ok(CpuOptimizer {
                algorithm,
                params: params.iter().map(|p| (p.dtype(), p.len())).collect(),
                state: Vec::new(),
                compensation: Vec::new(),
                rounding: options.rounding,
                step: 0,
                grad_clip: options.grad_clip,
                grad_norm: None,
                shapes: options.param_shapes,
                q8: Some((config, states)),
                q4: None,
                passes,
            });
        }
        let initial = algorithm.initial_state();
        let state = params
            .iter()
            .map(|p| {
                let dtype = options.state_dtype.unwrap_or(p.dtype());
                let kinds = algorithm.state_kinds();
                let phase = p.address();
                kinds
                    .iter()
                    .map(|_| StateTensor::filled(dtype, p.len(), initial, phase))
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        let compensation = match options.rounding {
            Rounding::Kahan => params
                .iter()
                .map(|p| StateTensor::filled(p.dtype(), p.len(), 0.0, p.address()))
                .collect::<Result<Vec<_>>>()?,
            _ => Vec::new(),
        };
        let params = params.iter().map(|p| (p.dtype(), p.len())).collect();
        Ok(CpuOptimizer {
            algorithm,
            params,
            state,
            compensation,
            rounding: options.rounding,
            step: 0,
            grad_clip: options.grad_clip,
            grad_norm: None,
            shapes: options.param_shapes,
            q8: None,
            q4: None,
            passes,
        })
    }

    /// How the optimizer's 16-bit stores round ([`CpuOptimizerBuilder::rounding`]).
    pub fn rounding(&self) -> Rounding {
        self.rounding
    }

    /// How many parameter groups there are: one.
    pub fn group_count(&self) -> usize {
        1
    }

    /// Group `g`'s algorithm and hyperparameters (`None` past the last group).
    pub fn group_algorithm(&self, g: usize) -> Option<&Algorithm> {
        (g == 0).then_some(&self.algorithm)
    }

    /// Changes group `g`'s hyperparameters from the next step on (a schedule). The new
    /// algorithm must keep the same state tensors (no switching AMSGrad or momentum on or
    /// off); a refused change leaves the optimizer as it was.
    pub fn set_group_algorithm(&mut self, g: usize, algorithm: impl Into<Algorithm>) -> Result<()> {
        let algorithm = algorithm.into();
        algorithm.validate()?;
        if g != 0 {
            return Err(Error::NoSuchGroup { index: g, groups: 1 });
        }
        crate::algo::check_adafactor_change(&self.algorithm, &algorithm)?;
        if self.q8.is_some() {
            crate::q8::check_algorithm(&algorithm, self.grad_clip.is_some())?;
        }
        crate::algo::check_lamb_options(&algorithm, false, self.grad_clip.is_some(), self.rounding)?;
        if self.q4.is_some() {
            crate::q4::check_algorithm(&algorithm)?;
        }
        if algorithm.state_kinds() != self.algorithm.state_kinds() {
            return Err(Error::StateMismatch {
                argument: "algorithm".into(),
                got: algorithm.state_kinds().to_vec(),
                expected: self.algorithm.state_kinds().to_vec(),
            });
        }
        crate::algo::check_muon_change(&self.algorithm, &algorithm)?;
        if algorithm.family() != self.algorithm.family() {
            // Another family with the same state tensors (Adam's and LAMB's): its own passes,
            // fresh. The families whose passes need the options refuse such changes above.
            let options = OptimizerOptions {
                param_shapes: self.shapes.clone(),
                grad_clip: self.grad_clip,
                rounding: self.rounding,
                ..OptimizerOptions::default()
            };
            let lens: Vec<usize> = self.params.iter().map(|&(_, len)| len).collect();
            self.passes = algorithm.cpu_passes(&options, &lens)?;
        }
        self.algorithm = algorithm;
        Ok(())
    }

    /// Changes group `g`'s learning rate from the next step on.
    pub fn set_group_lr(&mut self, g: usize, lr: f64) -> Result<()> {
        self.set_group_algorithm(g, self.algorithm.with_lr(lr))
    }

    /// Changes every group's learning rate from the next step on.
    pub fn set_lr(&mut self, lr: f64) -> Result<()> {
        self.set_group_lr(0, lr)
    }

    /// How many parameters there are.
    pub fn param_count(&self) -> usize {
        self.params.len()
    }

    /// Steps taken so far.
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// With [`CpuOptimizerBuilder::grad_clip`]: the global gradient norm of the last step
    /// (before clipping), `None` before the first step or without clipping.
    pub fn grad_norm(&self) -> Option<f64> {
        self.grad_norm.map(f64::from)
    }

    /// Sets the step count, e.g. to resume a schedule or a checkpoint.
    pub fn set_step_count(&mut self, step: u64) -> Result<()> {
        self.step = step;
        Ok(())
    }

    /// Parameter `index`'s state tensor of `kind`, if its algorithm keeps one.
    ///
    /// With [`CpuOptimizerBuilder::q8_states`] only the f32 states of tensors below
    /// `min_8bit_size` are tensors: for a state kept in 8 bits this returns `None`, though
    /// the parameter has one. Read those with [`Self::q8_state`].
    pub fn state(&self, index: usize, kind: StateKind) -> Option<HostSlice<'_>> {
        if let Some(passes) = self.passes.as_deref().filter(|p| p.keeps_states()) {
            return passes.state(index, kind);
        }
        if kind == StateKind::KahanCompensation {
            return self.compensation.get(index).map(StateTensor::as_slice);
        }
        let k = self.algorithm.state_kinds().iter().position(|s| *s == kind)?;
        if let Some((_, states)) = &self.q8 {
            return match states.get(index)?.get(k)? {
                StoredState::F32(values) => Some(HostSlice::F32(values)),
                StoredState::Q8 { .. } => None,
            };
        }
        if let Some((_, states)) = &self.q4 {
            return match states.get(index)?.get(k)? {
                Q4State::F32(values) => Some(HostSlice::F32(values)),
                Q4State::Q4 { .. } => None,
            };
        }
        Some(self.state.get(index)?.get(k)?.as_slice())
    }

    /// With [`CpuOptimizerBuilder::q8_states`]: parameter `index`'s state of `kind` as it is
    /// stored, 8-bit codes and absmax, or f32 for a tensor below `min_8bit_size`.
    pub fn q8_state(&self, index: usize, kind: StateKind) -> Option<&StoredState> {
        let k = self.algorithm.state_kinds().iter().position(|s| *s == kind)?;
        self.q8.as_ref()?.1.get(index)?.get(k)
    }

    /// With [`CpuOptimizerBuilder::q8_states`]: replaces parameter `index`'s state of `kind`
    /// (e.g. from a checkpoint). Refused, with nothing changed, without 8-bit state or such
    /// a state ([`Error::NeedsOption`], [`Error::StateMismatch`]), or when `state` is not
    /// stored as this tensor's is (8-bit at and above `min_8bit_size`, f32 below), has
    /// another length than the parameter, codes without one absmax per block, or an absmax
    /// that is NaN, infinite or negative ([`Error::BadValue`], naming the block).
    pub fn set_q8_state(&mut self, index: usize, kind: StateKind, state: StoredState) -> Result<()> {
        let kinds = self.algorithm.state_kinds();
        let (config, states) = self
            .q8
            .as_mut()
            .ok_or(Error::NeedsOption { what: "set_q8_state".into(), option: "q8_states" })?;
        let slot = state_slot(kinds, states, index, kind)?;
        crate::q8::check_replacement(&state, *config, slot.len(), &format!("q8 state {index} {kind:?}"))?;
        *slot = state;
        Ok(())
    }

    /// With [`CpuOptimizerBuilder::q4_states`]: parameter `index`'s state of `kind` as it is
    /// stored, packed 4-bit codes and scales, or f32 for a tensor that keeps f32 state.
    pub fn q4_state(&self, index: usize, kind: StateKind) -> Option<&Q4State> {
        let k = self.algorithm.state_kinds().iter().position(|s| *s == kind)?;
        self.q4.as_ref()?.1.get(index)?.get(k)
    }

    /// With [`CpuOptimizerBuilder::q4_states`]: replaces parameter `index`'s state of `kind`
    /// (e.g. from a checkpoint). Refused, with nothing changed, without 4-bit state or such
    /// a state ([`Error::NeedsOption`], [`Error::StateMismatch`]), or when `state` is not
    /// stored as this tensor's is, has another length, or a scale that is NaN, infinite or
    /// negative ([`Error::BadValue`], naming the block).
    pub fn set_q4_state(&mut self, index: usize, kind: StateKind, state: Q4State) -> Result<()> {
        let kinds = self.algorithm.state_kinds();
        let (config, states) = self
            .q4
            .as_mut()
            .ok_or(Error::NeedsOption { what: "set_q4_state".into(), option: "q4_states" })?;
        let slot = state_slot(kinds, states, index, kind)?;
        let len = self.params[index].1;
        crate::q4::check_replacement(&state, *config, len, &format!("q4 state {index} {kind:?}"))?;
        *slot = state;
        Ok(())
    }

    /// Parameter `index`'s state tensor of `kind`, writable (e.g. to load a checkpoint).
    pub fn state_mut(&mut self, index: usize, kind: StateKind) -> Option<HostSliceMut<'_>> {
        if let Some(passes) = self.passes.as_deref_mut().filter(|p| p.keeps_states()) {
            return passes.state_mut(index, kind);
        }
        if kind == StateKind::KahanCompensation {
            return self.compensation.get_mut(index).map(StateTensor::as_mut_slice);
        }
        let k = self.algorithm.state_kinds().iter().position(|s| *s == kind)?;
        if let Some((_, states)) = &mut self.q8 {
            return match states.get_mut(index)?.get_mut(k)? {
                StoredState::F32(values) => Some(HostSliceMut::F32(values)),
                StoredState::Q8 { .. } => None,
            };
        }
        if let Some((_, states)) = &mut self.q4 {
            return match states.get_mut(index)?.get_mut(k)? {
                Q4State::F32(values) => Some(HostSliceMut::F32(values)),
                Q4State::Q4 { .. } => None,
            };
        }
        Some(self.state.get_mut(index)?.get_mut(k)?.as_mut_slice())
    }

    /// One step: updates `params` in place from `grads` (one per parameter, in order) and
    /// the optimizer's state.
    ///
    /// Refused with a typed error, before anything is written, when the counts differ from
    /// the optimizer's parameter count ([`Error::CountMismatch`]), when a parameter's dtype
    /// ([`Error::DTypeMismatch`]) or length ([`Error::LengthMismatch`]) differs from the
    /// one it was built for, or when a gradient's length differs from its parameter's.
    pub fn step(&mut self, params: &mut [HostSliceMut<'_>], grads: &[HostSlice<'_>]) -> Result<()> {
        self.check(params, grads)?;
        self.check_train_mode("step")?;
        let t = self.step + 1;
        let mut kernel_step = match self.passes.as_mut().and_then(|p| p.kernel_step(&self.algorithm, t)) {
            Some(step) => step,
            None => self.algorithm.kernel_step(t),
        };
        if self.q8.is_some() {
            // bitsandbytes' 8-bit kernels' form of the step.
            kernel_step = crate::q8::kernel_step(&self.algorithm, t);
        }
        if self.q4.is_some() {
            // torchao's form of the step.
            kernel_step = crate::q4::kernel_step(&self.algorithm, t);
        }
        let mut kernel = Kernel::new(&kernel_step);
        let mut grad_scale = 1.0;
        if let Some(clip) = &self.grad_clip {
            let total_norm = norm::global_norm(grads, clip.norm_type);
            grad_scale = clip_coefficient(total_norm, clip.max_norm as f32);
            kernel = kernel.with_grad_scale(grad_scale);
            self.grad_norm = Some(total_norm);
        }
        let mut streams = [0; MAX_STATE];
        for (stream, kind) in streams.iter_mut().zip(self.algorithm.state_kinds()) {
            *stream = rounding::stream(Some(*kind));
        }
        if let Some((_, states)) = &mut self.q8 {
            let params = params.iter_mut().map(|p| match p {
                HostSliceMut::F32(values) => &mut values[..],
                // Refused by `check`; an empty slice makes the job a no-op.
                _ => &mut [],
            });
            let grads = grads.iter().map(|g| match g {
                HostSlice::F32(values) => *values,
                _ => &[],
            });
            let f32_kernel = Kernel::new(&crate::q8::f32_state_step(kernel_step)).with_grad_scale(grad_scale);
            q8::run(&kernel, &f32_kernel, self.algorithm.state_kinds(), params, grads, states);
        } else if let Some((config, states)) = &mut self.q4 {
            let params = params.iter_mut().map(|p| match p {
                HostSliceMut::F32(values) => &mut values[..],
                // Refused by `check`; an empty slice makes the job a no-op.
                _ => &mut [],
            });
            let grads = grads.iter().map(|g| match g {
                HostSlice::F32(values) => *values,
                _ => &[],
            });
            q4::run(&kernel, self.algorithm.state_kinds(), config.block_size, params, grads, states);
        } else {
            let stochastic = self.rounding.stochastic();
            let stores = Stores {
                stochastic: self.rounding.seed().map(|seed| (seed, t)),
                state: stochastic.state,
                streams,
            };
            let (state, compensation) = (&mut self.state, &mut self.compensation);
            let step = CpuStep {
                algorithm: &self.algorithm,
                t,
                kernel: &kernel,
                stores: &stores,
                params: &mut *params,
                grads,
                state: &mut *state,
                compensation: &mut *compensation,
            };
            if !self.passes.as_mut().is_some_and(|p| p.step(step)) {
                work::run(&kernel, &stores, params, grads, state, compensation);
            }
        }
        self.step = t;
        if let Some(passes) = &mut self.passes {
            passes.stepped();
        }
        Ok(())
    }

    fn check(&self, params: &[HostSliceMut<'_>], grads: &[HostSlice<'_>]) -> Result<()> {
        self.check_params(params)?;
        if grads.len() != self.params.len() {
            return Err(Error::CountMismatch {
                argument: "grads".into(),
                got: grads.len(),
                expected: self.params.len(),
            });
        }
        for (i, (grad, &(_, len))) in grads.iter().zip(&self.params).enumerate() {
            if self.q8.is_some() && grad.dtype() != DType::F32 {
                return Err(Error::DTypeMismatch {
                    argument: format!("grads[{i}]"),
                    got: grad.dtype(),
                    expected: "F32 with q8_states".into(),
                });
            }
            if self.q4.is_some() && grad.dtype() != DType::F32 {
                return Err(Error::DTypeMismatch {
                    argument: format!("grads[{i}]"),
                    got: grad.dtype(),
                    expected: "F32 with q4_states".into(),
                });
            }
            if grad.len() != len {
                return Err(Error::LengthMismatch {
                    argument: format!("grads[{i}]"),
                    got: grad.len() as u64,
                    expected: len as u64,
                    reference: format!("params[{i}]"),
                });
            }
        }
        Ok(())
    }

    /// The parameters' count, dtypes and lengths against those the optimizer was built for.
    fn check_params(&self, params: &[HostSliceMut<'_>]) -> Result<()> {
        let count = |argument: &str, got: usize| {
            if got == self.params.len() {
                Ok(())
            } else {
                Err(Error::CountMismatch { argument: argument.into(), got, expected: self.params.len() })
            }
        };
        count("params", params.len())?;
        for (i, (param, &(dtype, len))) in params.iter().zip(&self.params).enumerate() {
            if param.dtype() != dtype {
                return Err(Error::DTypeMismatch {
                    argument: format!("params[{i}]"),
                    got: param.dtype(),
                    expected: format!("{dtype:?} (its dtype when the optimizer was built)"),
                });
            }
            if param.len() != len {
                return Err(Error::LengthMismatch {
                    argument: format!("params[{i}]"),
                    got: param.len() as u64,
                    expected: len as u64,
                    reference: format!("params[{i}] when the optimizer was built"),
                });
            }
        }
        Ok(())
    }
}

/// Parameter `index`'s state of `kind` among per-parameter state lists in `kinds`' order, or
/// the error that names which of the two the optimizer does not have.
fn state_slot<'a, S>(
    kinds: &[StateKind],
    states: &'a mut [Vec<S>],
    index: usize,
    kind: StateKind,
) -> Result<&'a mut S> {
    let k = kinds.iter().position(|s| *s == kind).ok_or_else(|| Error::StateMismatch {
        argument: format!("state kind {kind:?}"),
        got: vec![kind],
        expected: kinds.to_vec(),
    })?;
    let count = states.len();
    let slots = states.get_mut(index).ok_or_else(|| Error::BadRange {
        argument: format!("index {index}"),
        problem: format!("the optimizer has {count} parameters (indices from 0)"),
    })?;
    Ok(&mut slots[k])
}

#[cfg(test)]
mod tests;
