//! Adafactor (Shazeer & Stern 2018), as `torch.optim.Adafactor` runs it: factored second
//! moments (a row and a column vector per matrix, over the last two dimensions, batched over
//! the leading ones) for tensors of 2 or more dimensions, an unfactored one for vectors, a
//! relative step size and update clipping by the update's RMS.
//!
//! The step looks at whole tensors (row and column means, the parameter's and the update's
//! RMS), so it is not an elementwise family: the GPU runs its own passes
//! (`family::adafactor::gpu_passes`), the CPU backend its own loops (`cpu_passes`). What every element
//! of a step shares, the host computes here ([`Adafactor::kernel_step`]).

use crate::algo::{check, check_rate};
use super::contract::{AdafactorSwitches, AdafactorUniform64};
use crate::step::KernelStep;
use crate::{DType, Result, StateKind};

/// `torch.optim.Adafactor`. `Adafactor::default()` is its defaults.
///
/// Each step `t` (from 1), per tensor: `g = -g` if `maximize`; `w = t^beta2_decay`;
/// `rho = min(lr, 1/sqrt(t))`; `alpha = max(eps2, rms(p)) rho` (the RMS before the decay);
/// `p *= 1 - lr weight_decay`; a tensor of 2 or more dimensions keeps `row_var` (its shape
/// with the last dimension 1) and `col_var` (the second-last 1):
/// `row_var = lerp(row_var, mean(g^2, -1), w)`, `col_var = lerp(col_var, mean(g^2, -2), w)`,
/// `V = row_var col_var / max(mean(row_var, -2), eps1)`; a vector keeps `variance`:
/// `variance = lerp(variance, g^2, w)`, `V = variance`. Then `U = g / sqrt(max(V, eps1^2))`
/// and `p -= alpha / max(1, rms(U) / d) U`.
///
/// Non-finite values follow torch's IEEE arithmetic (its clamps keep a NaN, the host's Python
/// `max` of `alpha` and of the clipping denominator drops one): a NaN or infinite gradient
/// element makes its matrix (of a batch, that matrix alone) or its vector element NaN, and
/// the states of its row and column, or of its element, NaN for good (an infinity at a step
/// with `w < 1/2` leaves them +inf and its row and column NaN, the rest of the matrix a step
/// of `alpha g / eps1`, for one step), while the tensor's other elements keep stepping,
/// unclipped, with `alpha = eps2 rho` once the parameter holds a NaN.
///
/// Tensors need their shapes ([`OptimizerBuilder::param_shapes`](crate::OptimizerBuilder::param_shapes)).
/// The states are kept in f32 whatever the parameters' dtype (the factored ones are small).
///
/// # On this crate's backends
///
/// **Adafactor** (Shazeer & Stern 2018, as `torch.optim.Adafactor`): factored second
/// moments over the last two dimensions (batched over the leading ones), an unfactored one
/// for vectors, the relative step `min(lr, 1/sqrt(t))` times `max(eps2, rms(p))`, and the
/// update clipped by its RMS (`d`). Its tensors need their shapes
/// (`OptimizerBuilder::param_shapes`, refused by name without: `Error::NeedsOption`);
/// `eps1: None` is the machine epsilon of the group's first parameter's dtype, as torch's
/// (`2^-23`, f16 `2^-10`, bf16 `2^-7`). Its states are f32 and sublinear for matrices. The
/// step looks at whole tensors, so it runs passes of its own (`src/family/adafactor/adafactor.wgsl`):
/// each row's and column's sum of `g^2`, the sums of `p^2` and of the update's squares over
/// a fixed partition added in a fixed order (no atomics: the same bits every run), then the
/// update; nothing is read back. Capturable mode, AMP, global clipping, 8-bit state,
/// stochastic or Kahan rounding, master weights and a `StateStorage::Dtype` other than F32 are
/// refused by name, as is the stateless `ops::update` (Burn's front ends run it, with the
/// shapes of Burn's tensors: the `burn` module); a group cannot switch to or from it. With
/// groups, only the Adafactor groups' tensors need real shapes (an AdamW group's biases
/// beside it, see `tests/integration/adafactor.rs`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adafactor {
    /// The largest relative step size, and the weight decay's rate (`lr`, default 1e-2).
    pub lr: f64,
    /// The new value's weight in the second moments is `t^beta2_decay` (default -0.8).
    pub beta2_decay: f64,
    /// `eps[0]`: the floor of the variance estimate's denominator and of `sqrt(V)`. `None`
    /// (the default) is the machine epsilon of the dtype of the group's first parameter, as
    /// torch's `torch.finfo(param.dtype).eps` (F32 2^-23, F16 2^-10, BF16 2^-7).
    pub eps1: Option<f64>,
    /// `eps[1]`: the floor of the parameter's RMS in the step size (default 1e-3).
    pub eps2: f64,
    /// The clipping threshold of the update's RMS (`d`, default 1).
    pub d: f64,
    /// Decoupled weight decay, `p *= 1 - lr weight_decay` (default 0).
    pub weight_decay: f64,
    /// Maximize the objective: the gradient's sign is flipped (default false).
    pub maximize: bool,
}

impl Default for Adafactor {
    fn default() -> Self {
        Adafactor {
            lr: 1e-2,
            beta2_decay: -0.8,
            eps1: None,
            eps2: 1e-3,
            d: 1.0,
            weight_decay: 0.0,
            maximize: false,
        }
    }
}

impl Adafactor {
    /// Checks the hyperparameters as torch's constructor does (and every value finite).
    /// ([`Algorithm::validate`](crate::Algorithm::validate) says when a trainer calls it.)
    pub fn validate(&self) -> Result<()> {
        check_rate("lr", self.lr)?;
        let decay = self.beta2_decay;
        check("beta2_decay", decay, decay.is_finite() && decay <= 0.0, "a finite number <= 0")?;
        if let Some(eps1) = self.eps1 {
            check_rate("eps1", eps1)?;
        }
        check_rate("eps2", self.eps2)?;
        check("d", self.d, self.d.is_finite() && self.d >= 1.0, "a finite number >= 1")?;
        check_rate("weight_decay", self.weight_decay)
    }

    /// `eps1` for a group whose first parameter is stored as `dtype`.
    pub fn eps1_for(&self, dtype: DType) -> f64 {
        self.eps1.unwrap_or(machine_epsilon(dtype))
    }

    /// The values every element of step `t` shares. `eps1` is the given one; with `None`
    /// the kernels take the first parameter's machine epsilon ([`Self::eps1_for`]), which
    /// the uniform flags.
    pub(crate) fn kernel_step(&self, t: u64) -> KernelStep {
        KernelStep::Adafactor(AdafactorSwitches, self.uniform(t))
    }

    /// The values every element of step `t` shares, in f64 ([`Self::kernel_step`]'s).
    pub(crate) fn uniform(&self, t: u64) -> AdafactorUniform64 {
        let t = t.max(1) as f64;
        AdafactorUniform64 {
            weight: t.powf(self.beta2_decay),
            rho: self.lr.min(1.0 / t.sqrt()),
            eps1: self.eps1.unwrap_or(0.0),
            eps2: self.eps2,
            d: self.d,
            decay: 1.0 - self.lr * self.weight_decay,
            sign: if self.maximize { -1.0 } else { 1.0 },
            eps1_from_dtype: if self.eps1.is_none() { 1.0 } else { 0.0 },
        }
    }
}

/// `torch.finfo(dtype).eps`: the distance from 1 to the next value.
pub fn machine_epsilon(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2f64.powi(-10),
        DType::BF16 => 2f64.powi(-7),
        DType::F64 => f64::EPSILON,
        _ => 2f64.powi(-23),
    }
}

/// Where a tensor of `shape` keeps its factored states: `(batches, rows, cols)` over its last
/// two dimensions; `None` for a vector (or a scalar), which keeps `variance`.
pub(crate) fn factored_dims(shape: &[usize]) -> Option<(usize, usize, usize)> {
    match shape {
        [.., rows, cols] if shape.len() >= 2 => {
            let batches = shape[..shape.len() - 2].iter().product();
            Some((batches, *rows, *cols))
        }
        _ => None,
    }
}

/// Adafactor's state shapes for a parameter of `shape`, as torch keeps them, in the order
/// of [`state_kinds_for`]: `row_var` (the last dimension 1) and `col_var` (the second-last 1)
/// for 2 or more dimensions, `variance` (the shape itself) otherwise.
pub fn state_shapes(shape: &[usize]) -> Vec<Vec<usize>> {
    match factored_dims(shape) {
        Some(_) => {
            let n = shape.len();
            let mut row = shape.to_vec();
            row[n - 1] = 1;
            let mut col = shape.to_vec();
            col[n - 2] = 1;
            vec![row, col]
        }
        None => vec![shape.to_vec()],
    }
}

/// The state kinds of a parameter of `shape`: `[RowVar, ColVar]` or `[Variance]`.
pub fn state_kinds_for(shape: &[usize]) -> &'static [crate::StateKind] {
    use crate::StateKind;
    match factored_dims(shape) {
        Some(_) => &[StateKind::RowVar, StateKind::ColVar],
        None => &[StateKind::Variance],
    }
}

/// Refuses the optimizer options Adafactor's passes do not implement, by name, with the
/// reason (its `FamilyConfig::check_options`).
fn check_options(options: &crate::OptimizerOptions) -> Result<()> {
    use crate::{Error, Rounding};
    let conflicts: [(&'static str, bool, &'static str); 6] = [
        (
            "capturable",
            options.capturable,
            "Adafactor's relative step and decay weight come from the host's step count each step \
             (no capturable form), so AMP's skipped steps cannot be followed either",
        ),
        (
            "master_weights",
            options.master_weights,
            "Adafactor's passes update the parameters themselves and write no model copy",
        ),
        ("model_copies", !options.model_copies.is_empty(), "Adafactor's passes write no model copy"),
        (
            "rounding",
            options.rounding != Rounding::NearestEven,
            "Adafactor's passes store parameters rounded to nearest even only",
        ),
        (
            "grad_clip",
            options.grad_clip.is_some(),
            "Adafactor clips its own update by its RMS (`d`); global gradient clipping is not \
             applied by its passes",
        ),
        (
            "state_storage",
            options.state_storage.dtype().is_some_and(|d| d != DType::F32),
            "Adafactor keeps its states in f32 (the factored ones are sublinear in size)",
        ),
    ];
    if let Some((first, _, reason)) = conflicts.iter().find(|(_, set, _)| *set) {
        return Err(Error::ConflictingOptions { first, second: "algorithm", reason });
    }
    Ok(())
}

/// Adafactor needs each of its tensors' shapes: `param_shapes` is refused when empty
/// ([`crate::Error::NeedsOption`]); the shapes themselves were checked against the lengths.
pub(crate) fn check_shapes_given(shapes: &[Vec<usize>]) -> Result<()> {
    if shapes.is_empty() {
        return Err(crate::Error::NeedsOption { what: "Adafactor".into(), option: "param_shapes" });
    }
    Ok(())
}

/// The registry's view of the configuration (`crate::algo::FamilyConfig`).
impl crate::algo::FamilyConfig for Adafactor {
    /// Its row and column sums are each matrix's: a sharded optimizer's pieces of its
    /// tensors take `family::adafactor::shard`'s step, which adds them across the ranks.
    fn shard_own_step(&self) -> bool {
        true
    }

    const FAMILY: crate::step::Family = crate::step::Family::Adafactor;
    const GPU_PASSES: Option<crate::optimizer::passes::Build> = Some(super::gpu_passes::build);

    fn torch_class(&self) -> &'static str {
        "Adafactor"
    }

    fn validate(&self) -> crate::Result<()> {
        Adafactor::validate(self)
    }

    fn kernel_step(&self, t: u64) -> KernelStep {
        Adafactor::kernel_step(self, t)
    }

    fn lr(&self) -> f64 {
        self.lr
    }

    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    fn state_kinds(&self) -> &'static [StateKind] {
        // Its states depend on each tensor's shape (`row_var` and `col_var`, or `variance`:
        // `adafactor_state_kinds`) and are kept apart from the elementwise ones.
        &[]
    }

    fn stateless_refusal(&self) -> Option<&'static str> {
        Some(
            "Adafactor's step reduces whole tensors by their shapes (rows, columns, RMS) \
             into factored states, which a stateless elementwise update does not take: \
             step it with an Optimizer given param_shapes",
        )
    }

    #[cfg(feature = "cpu")]
    fn cpu_passes(
        &self,
        options: &crate::OptimizerOptions,
        lens: &[usize],
    ) -> crate::Result<Option<Box<dyn crate::cpu::passes::CpuPasses>>> {
        Ok(Some(Box::new(super::cpu_passes::AdafactorPasses::new(options, lens)?)))
    }

    fn check_options(&self, options: &crate::OptimizerOptions) -> crate::Result<()> {
        check_options(options)
    }

    fn check_gpu_group(
        &self,
        group: &crate::ParamGroup,
        first: usize,
        options: &crate::OptimizerOptions,
    ) -> crate::Result<()> {
        super::gpu_passes::check_group(group, first, options)
    }

    /// Its states are not the elementwise ones (an SGD group without momentum has none
    /// either, so the state check would let such a change through).
    fn change_refusal(&self) -> Option<&'static str> {
        Some(
            "a group cannot change to or from Adafactor: its factored states are not another \
             algorithm's; build a new optimizer",
        )
    }

    /// `row_var` and `col_var` from 2 dimensions on, `variance` below.
    fn param_state_kinds(&self, shape: &[usize]) -> &'static [StateKind] {
        state_kinds_for(shape)
    }

    /// Its factored states are row and column means of each parameter by its shape.
    fn needs_shapes(&self) -> bool {
        true
    }
}

/// The oracle's copy (`Adafactor` of `wgpu-optim-oracle`), field by field: a field added here
/// fails to compile until the oracle has it.
#[cfg(test)]
impl crate::oracle::ToOracle for Adafactor {
    type Oracle = wgpu_optim_oracle::Adafactor;

    fn to_oracle(&self) -> Self::Oracle {
        let Adafactor { lr, beta2_decay, eps1, eps2, d, weight_decay, maximize } = *self;
        wgpu_optim_oracle::Adafactor { lr, beta2_decay, eps1, eps2, d, weight_decay, maximize }
    }
}
