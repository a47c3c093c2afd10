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
//!
//! # How it runs
//!
//! `wgpu_optim::cpu::CpuOptimizer` runs the same algorithms, hyperparameters and storage
//! types on the host, with the GPU kernels' formulas in the same operation order: every core
//! (rayon, all tensors' chunks in one parallel loop), f32 math in loops the compiler
//! vectorizes, each element read once and written once. When every operand is bf16, or f16 on
//! a CPU with AVX-512 (sixteen lanes per conversion) or F16C (eight), the conversions happen in
//! registers in the same pass; mixed storage types
//! and stochastic or Kahan stores go through f32 scratch a block at a time. On Linux, state
//! tensors of 2 MiB and more are anonymous mappings advised onto transparent huge pages
//! (`madvise(MADV_HUGEPAGE)` through `memmap2`), each starting at its parameter's offset
//! within a 4 KiB page: at another offset the step's loads and stores alias every 4 KiB and a
//! 64 Mi-element f32 Adam step took 1.3x as long. Measured against heap state at 64 Mi
//! elements, alternated over 9 runs: 0.98x the step time (median), 0.89x the whole run.
//! It is the honest baseline of the benchmark, and is tested against the same oracle. Its
//! checkpoints (`CpuOptimizer::save`/`load`) are the GPU optimizer's, in both directions.

mod blockwise;
#[cfg(feature = "checkpoint")]
mod checkpoint;
pub(crate) mod convert;
pub(crate) mod f16_lanes;
pub(crate) mod host;
pub(crate) mod kernels;
mod magnitude_key;
mod mode;
mod norm;
pub(crate) mod passes;
mod q4;
pub(crate) mod q8;
mod state_access;
pub(crate) mod state_memory;
pub(crate) mod storage;
pub(crate) mod work;

pub use host::{HostSlice, HostSliceMut, HostTensor};
pub use state_access::StateView;

use crate::q4::{Q4State, Q4States};
use crate::q8::{Q8States, StoredState};
use crate::step::clip::{check_own_clip_change, fused_clip, FusedClip};
use crate::step::rounding;
use crate::{Algorithm, DType, Error, GradClip, OptimizerOptions, Result, Rounding, StateStorage};
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
    pub(crate) algorithm: Algorithm,
    /// Each parameter's dtype and length, fixed at construction.
    params: Vec<(DType, usize)>,
    /// `state[i][k]` is parameter i's `algorithm.state_kinds()[k]`.
    state: Vec<Vec<StateTensor>>,
    /// Kahan rounding: each parameter's compensation, in its dtype; empty otherwise.
    compensation: Vec<StateTensor>,
    rounding: Rounding,
    /// [`crate::OptimizerOptions::origins`]: empty, or each parameter's ordinal and first
    /// element for stochastic rounding.
    origins: std::sync::Arc<[(u32, u64)]>,
    step: u64,
    /// `grad_clip` with PyTorch's eps, or the algorithm's own clipping (Adan's).
    clip: Option<FusedClip>,
    /// The last step's global gradient norm, when clipping.
    grad_norm: Option<f32>,
    /// [`CpuOptimizerBuilder::param_shapes`]: empty, or each parameter's shape (only
    /// checkpoints read them).
    #[cfg_attr(not(feature = "checkpoint"), allow(dead_code))]
    shapes: Vec<Vec<usize>>,
    /// With 8-bit [`CpuOptimizerBuilder::state_storage`]: its settings and each parameter's state (then
    /// `state` is empty).
    q8: Option<(Q8States, Vec<Vec<StoredState>>)>,
    /// With 4-bit [`CpuOptimizerBuilder::state_storage`]: its settings and each parameter's state (then
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
    pub(crate) options: OptimizerOptions,
}

impl CpuOptimizerBuilder {
    /// How every state tensor is stored, as on the GPU
    /// ([`OptimizerBuilder::state_storage`](crate::OptimizerBuilder::state_storage)): each
    /// parameter's dtype (the default), one dtype (F32, F16 or BF16; F64 is refused with
    /// [`Error::DTypeMismatch`]), or blockwise 8-bit or 4-bit state.
    pub fn state_storage(mut self, storage: StateStorage) -> Self {
        self.options.state_storage = storage;
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
        let clip = fused_clip(options.grad_clip, &[algorithm])?;
        algorithm.check_options(&options)?;
        if params.is_empty() {
            return Err(Error::NoParameters { argument: "params".into() });
        }
        if options.state_storage.dtype() == Some(DType::F64) {
            return Err(host::not_f64("options.state_storage"));
        }
        crate::validate::check_shapes(
            &options.param_shapes,
            &params.iter().map(|p| p.len() as u64).collect::<Vec<_>>(),
        )?;
        let passes = algorithm.cpu_passes(&options, &params.iter().map(|p| p.len()).collect::<Vec<_>>())?;
        crate::validate::check_rounding_dtypes(options.rounding, params.iter().map(|p| p.dtype()), "params")?;
        // Low-bit storage keeps each parameter's states in its format, zeroed, and no dense
        // state.
        let dtypes = || params.iter().map(|p| p.dtype());
        let lens = || params.iter().map(|p| p.len());
        let kinds = algorithm.state_kinds();
        let (q8, q4) = match options.state_storage {
            StateStorage::Q8(config) => {
                crate::q8::check_options(&[algorithm], &options, dtypes())?;
                let zeros = |len: usize| StoredState::zeros(len, config.quantizes(len as u64));
                let states = lens().map(|len| kinds.iter().map(|_| zeros(len)).collect()).collect();
                (Some((config, states)), None)
            }
            StateStorage::Q4(config) => {
                crate::q4::check_options(&config, &[algorithm], &options, dtypes())?;
                let zeros = |len: usize| Q4State::zeros(len, config.quantizes(len as u64), config.block_size);
                let states = lens().map(|len| kinds.iter().map(|_| zeros(len)).collect()).collect();
                (None, Some((config, states)))
            }
            StateStorage::ParamDtype | StateStorage::Dtype(_) => (None, None),
        };
        let initial = algorithm.initial_state();
        let dense = |p: &HostSlice<'_>| {
            let dtype = options.state_storage.dtype().unwrap_or(p.dtype());
            let phase = p.address();
            kinds
                .iter()
                .map(|_| StateTensor::filled(dtype, p.len(), initial, phase))
                .collect::<Result<Vec<_>>>()
        };
        let state = match q8.is_some() || q4.is_some() {
            true => Vec::new(),
            false => params.iter().map(dense).collect::<Result<Vec<_>>>()?,
        };
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
            origins: options.origins.into(),
            step: 0,
            clip,
            grad_norm: None,
            shapes: options.param_shapes,
            q8,
            q4,
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
        self.algorithm.check_change(&algorithm)?;
        check_own_clip_change(&self.algorithm, &algorithm)?;
        if self.q8.is_some() {
            crate::q8::check_algorithm(&algorithm, self.clip.is_some())?;
        }
        algorithm.check_options(&OptimizerOptions::kept(false, self.clip, self.rounding, &algorithm))?;
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
        if algorithm.family() != self.algorithm.family() {
            // Another family with the same state tensors (Adam's and LAMB's): its own passes,
            // fresh. The families whose passes need the options refuse such changes above.
            let options = OptimizerOptions {
                param_shapes: self.shapes.clone(),
                ..OptimizerOptions::kept(false, self.clip, self.rounding, &algorithm)
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

    /// With [`CpuOptimizerBuilder::grad_clip`] or Adan's own clipping (`max_grad_norm`): the
    /// global gradient norm of the last step (before clipping), `None` before the first step
    /// or without clipping.
    pub fn grad_norm(&self) -> Option<f64> {
        self.grad_norm.map(f64::from)
    }

    /// Sets the step count, e.g. to resume a schedule or a checkpoint.
    pub fn set_step_count(&mut self, step: u64) -> Result<()> {
        self.step = step;
        Ok(())
    }

    /// One step: updates `params` in place from `grads` (one per parameter, in order) and
    /// the optimizer's state.
    ///
    /// Refused with a typed error, before anything is written, when the counts differ from
    /// the optimizer's parameter count ([`Error::CountMismatch`]), when a parameter's dtype
    /// ([`Error::DTypeMismatch`]) or length ([`Error::LengthMismatch`]) differs from the
    /// one it was built for, or when a gradient's length differs from its parameter's.
    pub fn step(&mut self, params: &mut [HostSliceMut<'_>], grads: &[HostSlice<'_>]) -> Result<()> {
        self.step_with_norm(params, grads, None, None)
    }

    /// [`Self::step`], clipping (when the optimizer clips) by `total_norm` where it is
    /// given, the norm of every rank's gradients, instead of the norm of `grads` alone.
    /// `sums`: a sharded step's [`passes::CpuStep::sums`].
    pub(crate) fn step_with_norm(
        &mut self,
        params: &mut [HostSliceMut<'_>],
        grads: &[HostSlice<'_>],
        total_norm: Option<f32>,
        sums: Option<&mut passes::TensorSums<'_>>,
    ) -> Result<()> {
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
        if let Some(clip) = &self.clip {
            let total_norm = total_norm.unwrap_or_else(|| norm::global_norm(grads, clip.clip.norm_type));
            grad_scale = clip.coefficient(total_norm);
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
                origins: self.origins.clone(),
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
                // A shorter-lived view of the caller's closure, as the step's borrows are.
                sums: sums.map(|s| s as &mut passes::TensorSums<'_>),
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
            let low_bit = match (&self.q8, &self.q4) {
                (Some(_), _) => Some("8-bit"),
                (None, Some(_)) => Some("4-bit"),
                (None, None) => None,
            };
            if let Some(format) = low_bit.filter(|_| grad.dtype() != DType::F32) {
                return Err(Error::DTypeMismatch {
                    argument: format!("grads[{i}]"),
                    got: grad.dtype(),
                    expected: format!("F32 with {format} state_storage"),
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

#[cfg(test)]
mod tests;
