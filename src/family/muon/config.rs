//! Muon (Keller Jordan's), as `torch.optim.Muon` runs it.
//!
//! Each step of a 2-D parameter `p` (A x B) with gradient `g`:
//!
//! ```text
//! momentum_buffer = lerp(momentum_buffer, g, 1 - momentum)        an EMA
//! u = lerp(g, momentum_buffer, momentum) if nesterov else momentum_buffer
//! O = NS(u)                                                       Newton-Schulz
//! p *= 1 - lr weight_decay
//! p -= lr ratio(A, B) O
//! ```
//!
//! `NS`: `X = u` (cast to the Newton-Schulz precision, transposed when A > B),
//! `X /= max(‖X‖_F, eps)`, then `ns_steps` times `M = X Xᵀ`, `N = b M + c M M`,
//! `X = a X + N X`, transposed back. The orthogonalization is a pass of its own (the GPU's
//! matrix-product kernels, the CPU backend's `faer` products); the last line, with the
//! ratio folded into `O`, is the elementwise kernel of the Muon family ([`Muon::kernel_step`]),
//! so parameters of every storage type, rounding modes and model copies work as for the
//! other families.

use crate::algo::{check, check_beta, check_finite, check_rate};
use super::contract::{MuonSwitches, MuonUniform64};
use crate::step::KernelStep;
use crate::StateKind;
use crate::{Error, Result};

/// How the learning rate is scaled by the matrix's shape (torch's `adjust_lr_fn`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MuonLrAdjust {
    /// `sqrt(max(1, A / B))` (Keller Jordan's; torch's `None` and `"original"`).
    #[default]
    Original,
    /// `0.2 sqrt(max(A, B))`: the update's RMS matches AdamW's (Moonlight's,
    /// `"match_rms_adamw"`).
    MatchRmsAdamW,
    /// `sqrt(A / B)` (`"spectral_unclamped"`).
    SpectralUnclamped,
}

impl MuonLrAdjust {
    /// The factor for a matrix of `rows` x `cols`.
    pub fn ratio(self, rows: usize, cols: usize) -> f64 {
        let (a, b) = (rows as f64, cols as f64);
        match self {
            MuonLrAdjust::Original => (a / b).max(1.0).sqrt(),
            MuonLrAdjust::MatchRmsAdamW => 0.2 * a.max(b).sqrt(),
            MuonLrAdjust::SpectralUnclamped => (a / b).sqrt(),
        }
    }

    /// torch's name for it.
    pub fn torch_name(self) -> &'static str {
        match self {
            MuonLrAdjust::Original => "original",
            MuonLrAdjust::MatchRmsAdamW => "match_rms_adamw",
            MuonLrAdjust::SpectralUnclamped => "spectral_unclamped",
        }
    }

    /// The choice torch names `name` (`None`: not one of torch's).
    pub fn from_torch_name(name: &str) -> Option<Self> {
        [MuonLrAdjust::Original, MuonLrAdjust::MatchRmsAdamW, MuonLrAdjust::SpectralUnclamped]
            .into_iter()
            .find(|c| c.torch_name() == name)
    }
}

/// The precision of the Newton-Schulz iterations. Products always accumulate in f32.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum NsPrecision {
    /// Every Newton-Schulz result (the normalized input, each product, each sum) rounded to
    /// bfloat16, as torch runs it.
    #[default]
    BF16,
    /// Everything in f32 (torch's code with the cast to float32).
    F32,
}

impl NsPrecision {
    /// The vectors' `ns_dtype` name.
    pub fn torch_name(self) -> &'static str {
        match self {
            NsPrecision::BF16 => "bfloat16",
            NsPrecision::F32 => "float32",
        }
    }
}

/// `torch.optim.Muon`. `Muon::default()` is its defaults, with Newton-Schulz in bfloat16
/// as torch runs it.
///
/// # On this crate's backends
///
/// **Muon** (Keller Jordan's, as `torch.optim.Muon`): `momentum_buffer = lerp(buffer, g,
/// 1 - momentum)`; `u = lerp(g, buffer, momentum)` (Nesterov) or the buffer; `O =
/// NewtonSchulz(u)` (`ns_steps` iterations of `X = a X + (b X Xᵀ + c (X Xᵀ)²) X` on the
/// normalized, transposed-if-tall matrix, `ns_coefficients`, `eps`); `p *= 1 - lr wd;
/// p -= lr ratio O` with `adjust_lr` `Original`, `MatchRmsAdamW` or `SpectralUnclamped`.
/// `ns_precision` is `NsPrecision::BF16` (every Newton-Schulz result rounded to bfloat16,
/// as torch runs it; the default) or `F32`. Only 2-D parameters: give the builder
/// `param_shapes`, and put biases and other tensors in an AdamW group of the same optimizer
/// (`ParamGroup`s of different algorithms; a 1-D or 3-D tensor in a Muon group is refused
/// with `Error::BadShape`, no shapes with `Error::NeedsOption`). On the GPU the products are
/// this crate's WGSL kernel (`wgpu_optim::matmul`: 64x64 tiles in workgroup memory, f32
/// accumulation, transposes by strides, the matrices of one shape batched in one dispatch's
/// z, each operand stored as f32, bfloat16 or f16 by its `MatrixView::dtype`), with scratch
/// made at build time (per matrix `3 A B + 2 min(A, B)²` f32). In the bfloat16 mode the
/// Newton-Schulz matrices X, M and N are stored as bfloat16, as torch keeps them, so each
/// product reads and writes half the bytes (a matrix with an odd side keeps them as
/// bfloat16-rounded f32, since a 16-bit word would straddle two rows); the update `U` that
/// the apply pass reads stays f32. On the CPU backend the products are faer's (`gemm`'s
/// kernels), a small matrix's on one thread. Refused with Muon: gradient clipping, capturable mode (so AMP), 8-bit
/// state, and moving a group between Muon and another algorithm. Burn's front ends run it
/// with a fallback algorithm for the parameters that are not 2-D (the `burn` module).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Muon {
    /// Learning rate (default 1e-3).
    pub lr: f64,
    /// Decoupled weight decay: `p *= 1 - lr weight_decay` (default 0.1).
    pub weight_decay: f64,
    /// The momentum buffer's EMA coefficient (default 0.95).
    pub momentum: f64,
    /// Orthogonalize `lerp(g, buffer, momentum)` rather than the buffer (default true).
    pub nesterov: bool,
    /// Newton-Schulz's `(a, b, c)` (default (3.4445, -4.775, 2.0315)).
    pub ns_coefficients: (f64, f64, f64),
    /// The floor of the Frobenius norm the input is divided by (default 1e-7).
    pub eps: f64,
    /// Newton-Schulz iterations (default 5; at least 1).
    pub ns_steps: u32,
    /// The learning rate's scaling by shape (default [`MuonLrAdjust::Original`]).
    pub adjust_lr: MuonLrAdjust,
    /// The iterations' precision (default [`NsPrecision::BF16`], torch's).
    pub ns_precision: NsPrecision,
}

impl Default for Muon {
    fn default() -> Self {
        Muon {
            lr: 1e-3,
            weight_decay: 0.1,
            momentum: 0.95,
            nesterov: true,
            ns_coefficients: (3.4445, -4.775, 2.0315),
            eps: 1e-7,
            ns_steps: 5,
            adjust_lr: MuonLrAdjust::Original,
            ns_precision: NsPrecision::BF16,
        }
    }
}

/// The largest Newton-Schulz step count taken: torch takes any, but more than this many
/// iterations of a converged map only cost time (and would make a step unbounded).
pub const MAX_NS_STEPS: u32 = 100;

impl Muon {
    /// Checks the hyperparameters as torch's constructor does (`lr`, `weight_decay`,
    /// `momentum` >= 0), plus what its formula needs: `momentum < 1`, `eps > 0`, finite
    /// coefficients and 1 to [`MAX_NS_STEPS`] iterations.
    /// ([`Algorithm::validate`](crate::Algorithm::validate) says when a trainer calls it.)
    pub fn validate(&self) -> Result<()> {
        check_rate("lr", self.lr)?;
        check_rate("weight_decay", self.weight_decay)?;
        check_beta("momentum", self.momentum)?;
        check("eps", self.eps, self.eps.is_finite() && self.eps > 0.0, "a finite number > 0")?;
        let (a, b, c) = self.ns_coefficients;
        check_finite("ns_coefficients.0", a)?;
        check_finite("ns_coefficients.1", b)?;
        check_finite("ns_coefficients.2", c)?;
        check(
            "ns_steps",
            f64::from(self.ns_steps),
            (1..=MAX_NS_STEPS).contains(&self.ns_steps),
            "1 to 100 Newton-Schulz iterations",
        )
    }

    /// The apply pass of a step: `p = p decay - lr O`, `O` already scaled by the shape's
    /// ratio. Its uniform serves the momentum pass too ([`Self::momentum_step`]).
    pub(crate) fn kernel_step(&self) -> KernelStep {
        self.pass(false)
    }

    /// The momentum pass: the buffer's EMA and the matrix to orthogonalize.
    #[allow(dead_code)] // The GPU optimizer's Muon passes use it.
    pub(crate) fn momentum_step(&self) -> KernelStep {
        self.pass(true)
    }

    fn pass(&self, momentum_pass: bool) -> KernelStep {
        let uniform = MuonUniform64 {
            lr: self.lr,
            decay: 1.0 - self.lr * self.weight_decay,
            one_minus_momentum: 1.0 - self.momentum,
            momentum: self.momentum,
        };
        KernelStep::Muon(MuonSwitches { momentum_pass, nesterov: self.nesterov }, uniform)
    }
}

/// The `(rows, cols)` of each parameter of a Muon group (`params` are their global
/// indices), from the builder's `shapes`: refused without shapes
/// ([`Error::NeedsOption`]) or for a shape that is not 2-D ([`Error::BadShape`]).
pub(crate) fn matrix_shapes(
    shapes: &[Vec<usize>],
    params: std::ops::Range<usize>,
) -> Result<Vec<(usize, usize)>> {
    if params.is_empty() {
        return Ok(Vec::new());
    }
    if shapes.is_empty() {
        return Err(Error::NeedsOption { what: "Muon".into(), option: "param_shapes" });
    }
    params
        .map(|i| match shapes.get(i).map(Vec::as_slice) {
            Some(&[rows, cols]) => Ok((rows, cols)),
            other => Err(Error::BadShape {
                param: i,
                shape: other.map(<[usize]>::to_vec).unwrap_or_default(),
                algorithm: "Muon",
                expected: "a 2-D parameter (put 1-D and 3-D ones in an AdamW group)",
            }),
        })
        .collect()
}

/// Why a group changes between Muon and another algorithm only in a new optimizer: the
/// scratch and shapes are made at build time for the Muon groups only.
const CHANGE_REFUSAL: &str = "a group changes between Muon and another algorithm only in a new optimizer \
                              (Muon's scratch and shapes are made at build time)";

/// The registry's view of the configuration (`crate::algo::FamilyConfig`).
impl crate::algo::FamilyConfig for Muon {
    const FAMILY: crate::step::Family = crate::step::Family::Muon;
    const GPU_PASSES: Option<crate::optimizer::passes::Build> = Some(super::gpu_passes::build);

    fn torch_class(&self) -> &'static str {
        "Muon"
    }

    fn validate(&self) -> crate::Result<()> {
        Muon::validate(self)
    }

    fn kernel_step(&self, t: u64) -> KernelStep {
        // Muon's update does not depend on the step count.
        let _ = t;
        Muon::kernel_step(self)
    }

    fn lr(&self) -> f64 {
        self.lr
    }

    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    fn state_kinds(&self) -> &'static [StateKind] {
        &[StateKind::MomentumBuffer]
    }

    #[cfg(feature = "cpu")]
    fn cpu_passes(
        &self,
        options: &crate::OptimizerOptions,
        lens: &[usize],
    ) -> crate::Result<Option<Box<dyn crate::cpu::passes::CpuPasses>>> {
        Ok(Some(Box::new(super::cpu_passes::MuonPasses::new(&(*self).into(), options, lens.len())?)))
    }

    /// Capturable mode (and so AMP): the Newton-Schulz coefficients come from the host.
    /// Global gradient clipping is refused by each backend's passes, with its own account.
    fn check_options(&self, options: &crate::OptimizerOptions) -> crate::Result<()> {
        if options.capturable {
            return Err(Error::ConflictingOptions {
                first: "capturable",
                second: "algorithm",
                reason: "Muon's Newton-Schulz passes take their coefficients from the host; a \
                         captured Muon step is not implemented",
            });
        }
        Ok(())
    }

    fn check_gpu_group(
        &self,
        group: &crate::ParamGroup,
        first: usize,
        options: &crate::OptimizerOptions,
    ) -> crate::Result<()> {
        super::gpu_passes::check_group(group, first, options)
    }

    fn change_refusal(&self) -> Option<&'static str> {
        Some(CHANGE_REFUSAL)
    }

    /// Newton-Schulz orthogonalizes each parameter as a matrix.
    fn needs_shapes(&self) -> bool {
        true
    }

    /// 2-D parameters only: the others go to a fallback algorithm.
    fn needs_matrix(&self) -> bool {
        true
    }

    /// Newton-Schulz needs each matrix whole: a sharded optimizer steps each on one owner
    /// rank.
    fn shard_whole(&self) -> bool {
        true
    }
}

/// The oracle's copy (`Muon` of `wgpu-optim-oracle`, with torch's `adjust_lr_fn`), field by
/// field: a field added here fails to compile until the oracle has it.
#[cfg(test)]
impl crate::oracle::ToOracle for Muon {
    type Oracle = wgpu_optim_oracle::Muon;

    fn to_oracle(&self) -> Self::Oracle {
        use wgpu_optim_oracle::{AdjustLrFn, NsPrecision as Precision};
        let Muon { lr, weight_decay, momentum, nesterov, ns_coefficients, eps, ns_steps, adjust_lr, ns_precision } =
            *self;
        wgpu_optim_oracle::Muon {
            lr,
            weight_decay,
            momentum,
            nesterov,
            ns_coefficients,
            eps,
            ns_steps,
            adjust_lr_fn: match adjust_lr {
                MuonLrAdjust::Original => AdjustLrFn::Original,
                MuonLrAdjust::MatchRmsAdamW => AdjustLrFn::MatchRmsAdamW,
                MuonLrAdjust::SpectralUnclamped => AdjustLrFn::SpectralUnclamped,
            },
            ns_precision: match ns_precision {
                NsPrecision::BF16 => Precision::BF16,
                NsPrecision::F32 => Precision::F32,
            },
        }
    }
}
