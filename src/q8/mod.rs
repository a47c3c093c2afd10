//! Blockwise 8-bit optimizer state, as bitsandbytes stores it (Dettmers et al. 2022, "8-bit
//! Optimizers via Block-wise Quantization"): a state tensor is cut into blocks of
//! [`BLOCK_SIZE`] consecutive elements, each block keeps its largest magnitude (`absmax`) as
//! an f32, and each element keeps the index of the code of a 256-entry dynamic map nearest
//! to `value / absmax`. An all-zero block has absmax 0 in the fresh state, before the first
//! step ([`StoredState::zeros`], as bitsandbytes initializes it), and 1 once a step has
//! requantized it (a step never divides by 0); either way its values dequantize to 0. A NaN
//! or infinite value is left out of its block's absmax and stored as the code of 0. Signed
//! states (Adam's first moment, SGD's momentum) use bitsandbytes' signed map (`qmap1`),
//! Adam's second moment its unsigned one (`qmap2`).
//!
//! The maps are built here the way bitsandbytes builds them (`create_dynamic_map`), float
//! operation for float operation, so they equal its `qmap1` and `qmap2` bit for bit. Codes
//! are found as bitsandbytes' CUDA kernels find them, the format its users' checkpoints hold
//! (the midpoints' rule, exact ties to the even code, and the sign rule that keeps a tiny
//! negative signed state negative), which its pure-PyTorch reference
//! (`optimizer_update_8bit_blockwise_pytorch`: the nearest code by f32 distance, the lower one
//! on a tie, no sign rule) does not follow. A block of zeros stores the code of 0 throughout,
//! -0.0 included: the kernel stores such a block under absmax 0, so every value reads back 0.
//!
//! # In an optimizer
//!
//! 8-bit blockwise state (bitsandbytes' format, Dettmers et al. 2022):
//! `OptimizerBuilder::state_storage(StateStorage::Q8(q8::Q8States { min_8bit_size }))` keeps Adam's and AdamW's
//! moments, SGD's momentum, or RMSprop's, Lion's, AdEMAMix's, ADOPT's and Adan's states
//! (bitsandbytes has no ADOPT or Adan: theirs run through the same blockwise path), as one
//! code per element and one f32 absmax per block of 256, on the GPU and the CPU backend. The codes index bitsandbytes' signed (first moment,
//! momentum) and unsigned (second moment) dynamic maps, which `wgpu_optim::q8` builds equal
//! to its `qmap1` and `qmap2` bit for bit. Each step dequantizes, runs the algorithm's own
//! f32 update (the same shader body and CPU loop as f32 state), takes each block's new absmax
//! and requantizes to the nearest code, in one pass: one dispatch per kernel variant, group
//! and set of buffers (the 8-bit states of all tensors share a few state arenas, so a model
//! whose parameters and gradients lie in one buffer each takes one dispatch per group, plus
//! one for its tensors below `min_8bit_size`), one workgroup per block on GPUs (the absmax a workgroup reduction, each invocation owning a `u32` of four
//! codes) and one invocation per block on CPU adapters, whose barriers are expensive. The
//! nearest code is bit-identical to a search over the map, found two ways: on GPUs from a
//! 23 KiB table (one load and one comparison); on CPU adapters and in the CPU backend by
//! arithmetic on the value (`q8::arith`: bitsandbytes' maps are a sign, a decade and a linear
//! fraction, so a value's code is the floor of an affine position, with the table or the
//! search only for the rare values within 1/4096 of a switch). The CPU backend does that a
//! register of 16 lanes at a time with AVX-512 permutes and dequantizes the same way, with no
//! gathers; `WGPU_OPTIM_Q8_REQUANTIZE=table|arithmetic` overrides the GPU kernels' choice
//! (for measuring on a new adapter). Tensors below `min_8bit_size` (default 4096, as bitsandbytes) keep
//! f32 state. Global clipping (`grad_clip`, bitsandbytes' `gnorm_scale`) runs as with f32
//! state: the norm pass takes every gradient of every group, those of tensors below
//! `min_8bit_size` included, and the 8-bit kernels scale each gradient by the coefficient as
//! they read it. A tensor whose 8-bit states outgrow a storage binding is cut into chunks of
//! whole blocks, each chunk's states in one arena, as f32 state is chunked. A NaN or infinite
//! gradient element never spoils its block: with Adam, AdamW and AdEMAMix (bitsandbytes'
//! 2-state kernel) its parameter is left as it was and its states restart from 0; with SGD,
//! Lion and RMSprop the update runs on it (the parameter goes non-finite as with f32 state,
//! but Lion's, whose sign of NaN is 0), the block's absmax is its largest finite magnitude (1
//! where there is none) and a non-finite state value is stored as the code of 0, so that
//! element's state restarts from zero and the block's other 255 elements and later steps
//! are unaffected (bitsandbytes' 1-state kernel lets such a value spoil its block for good:
//! a deliberate difference). Parameters and
//! gradients must be F32; AMSGrad, Adagrad, Schedule-Free AdamW, LAMB, Adafactor and Muon,
//! `capturable`, master weights, model copies and 16-bit rounding are refused by name.
//! `state` and `set_state` of either backend (and checkpoints) see a chunked tensor's state
//! whole; they hand the codes and absmax over as `q8::StoredState` (`StateView::Q8`,
//! `QuantizedState::Q8`). Checkpoints (either backend, loadable by the other) keep 8-bit
//! states under bitsandbytes' names: `state.{i}.state1`/`state2` (U8 codes in the parameter's shape, or F32 below
//! `min_8bit_size`), `state.{i}.absmax1`/`absmax2` (F32) and `qmap1`/`qmap2`, with
//! `q8_min_8bit_size` and `q8_block_size` in the metadata; a file of other settings, maps,
//! block size or lengths, or with an absmax that is NaN, infinite or negative (which
//! `set_state` refuses too), is refused with nothing changed, and
//! save, load, continue is
//! bit-identical. bitsandbytes' `Adam8bit` decays weights decoupled, so its vectors run as
//! AdamW here.
//!
//! The format and the updates follow bitsandbytes' CUDA kernels, the ones its users' states
//! come from (`kOptimizerStatic8bit2StateBlockwise`, `kOptimizerStatic8bit1StateBlockwise`,
//! `quantize_2D`; `q8::kernel_step`), not its pure-PyTorch reference, where they differ:
//! a value takes the nearer code by the codes' f32 midpoints, an exact midpoint the even
//! code (where `quantize_2D`'s search ends); a negative signed state whose nearest code is
//! the code of 0, and -0.0, is stored as the code below (the kernels' sign fix: a tiny
//! negative first moment over a second moment of 0 would otherwise lose its sign, and the
//! parameter's step with it); Adam's first moment is `beta1 m + (1 - beta1) g` and its
//! step `lr sqrt(1 - beta2^t) / (1 - beta1^t) m / (sqrt(v) + sqrt(1 - beta2^t) eps)`; AdamW
//! and AdEMAMix decay after the update (`p += step; p *= 1 - lr wd`, tensors below
//! `min_8bit_size` too, as the 32-bit kernels do); and the non-finite rules above. The
//! deliberate differences: the non-finite rule of the 1-state families; a block of zeros
//! stores absmax 1 and the code of 0 (the kernel's absmax 0 reads back the same zeros);
//! scalars such as `1 - beta` are formed in f64 and narrowed (the kernels form them in
//! f32), and a value is divided by its absmax exactly (the kernels' `__fdividef` is within
//! two ulps); AdEMAMix's absmax of a tensor whose length is not a multiple of 256 has a
//! slot per block of each EMA (the kernel's indexing of the slow EMA's absmax collides
//! there, a bitsandbytes bug). bitsandbytes 0.50.2's CPU backend does not find codes as its
//! CUDA kernels do for values
//! below about 1e-5 of their block's absmax: its `quantize_blockwise` stores the unsigned
//! map's code 7 (1.56e-5) for 1e-9, 7.5e-8 and 2e-7 alike, whose nearest codes are 0, 0
//! and 1. A second moment so raised shrinks that element's step, so where a block's gradients
//! span several decades the two differ: 20 AdamW steps on 5000 elements of
//! `0.1 cos(0.11 i)` left parameters up to 0.058 apart (mean 5e-5), on elements whose
//! gradients were below 1e-4.
//!
//! With 8-bit state AdEMAMix keeps three 8-bit states per tensor, as bitsandbytes' `AdEMAMix8bit` does: the
//! fast and the slow EMA each quantized on its own with the signed map (`state1` U8
//! `[2, *shape]` with `absmax1` `[2, blocks]`), the second moment with the unsigned one
//! (`state2`, `absmax2`). bitsandbytes' `RMSprop8bit` kernel decays the state's gradient only
//! and steps the parameter with the raw gradient, which 8-bit RMSprop here reproduces (tensors
//! below `min_8bit_size` take bitsandbytes' 32-bit kernel's step, PyTorch's); it would clip
//! the state's gradient only too, so clipping is refused with 8-bit RMSprop, as centered
//! RMSprop, momentum and `alpha = 0` are (bitsandbytes refuses or ignores them).
//!
//! The measurements (both backends, against f32 state and bitsandbytes' own CPU step) are in the
//! repository's `PERF.md`, "8-bit and 4-bit state".

use crate::step::{KernelStep, Switches};
use crate::{Error, Result, StateKind};

#[cfg_attr(not(feature = "cpu"), allow(dead_code))]
pub(crate) mod arith;
pub(crate) mod lut;

/// Elements per block, each block with one f32 absmax.
pub const BLOCK_SIZE: usize = 256;

/// bitsandbytes' default `min_8bit_size`: smaller tensors keep f32 state.
pub const MIN_8BIT_SIZE: u64 = 4096;

/// The most states an 8-bit step keeps per parameter: the GPU kernels hold each state's
/// values in one lane of a `vec4` (`gpu::blockwise::layout`). A family that keeps more is
/// refused by both backends ([`check_algorithm`]), whatever its own rules.
pub(crate) const MAX_STATES: usize = 4;

/// Blockwise 8-bit state for an optimizer ([`StateStorage::Q8`](crate::StateStorage::Q8)): Adam's
/// (and AdamW's) two moments, or SGD's momentum buffer, kept as one code per element and one
/// absmax per block of [`BLOCK_SIZE`], as bitsandbytes' `Adam8bit`, `AdamW8bit` and
/// `SGD8bit` keep them (and RMSprop's `square_avg`, as `RMSprop8bit`, with the signed map; Lion's `exp_avg`, as
/// `Lion8bit`; AdEMAMix's two EMAs, each with its own absmax, and its second moment, as
/// `AdEMAMix8bit`): 1 byte plus 1/64 of a byte (one f32 per 256 elements) per element
/// and moment, instead of 4 bytes.
///
/// Each step dequantizes, updates in f32 with the algorithm's own formula, takes each block's
/// new absmax and requantizes, in one pass (on the GPU, one dispatch for all tensors of a
/// group that lie in the same buffers, as with f32 state). The parameters and gradients
/// stay f32. Global clipping (`grad_clip`, bitsandbytes' `gnorm_scale`) takes the norm over
/// every gradient, those of tensors below `min_8bit_size` included, and the step scales each
/// gradient by the coefficient as it reads it. A NaN or infinite state value (from a
/// non-finite gradient) is left out of its block's absmax and stored as the code of 0, so it
/// spoils its own parameter only. A tensor whose 8-bit states outgrow a storage binding is
/// cut into chunks of whole blocks on the GPU. AMSGrad and Adagrad are refused, as are
/// `capturable`, `master_weights`, `model_copies` and a rounding other than
/// nearest. The 8-bit states are read as [`StoredState`]s (`state()` of either backend,
/// f32 values below `min_8bit_size`) and replaced as [`QuantizedState::Q8`]s (`set_state()`).
///
/// [`QuantizedState::Q8`]: crate::QuantizedState::Q8
///
/// ```
/// # fn main() -> wgpu_optim::Result<()> {
/// use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut, StateView};
/// use wgpu_optim::q8::{Q8States, StoredState};
/// use wgpu_optim::{Adam, StateKind, StateStorage};
///
/// let (mut weights, grads) = (vec![0.5f32; 8192], vec![0.01f32; 8192]);
/// let options = CpuOptimizer::builder().state_storage(StateStorage::Q8(Q8States::default()));
/// let mut opt = options.build(Adam::adamw(), &[HostSlice::F32(&weights)])?;
/// opt.step(&mut [HostSliceMut::F32(&mut weights)], &[HostSlice::F32(&grads)])?;
/// let Some(StateView::Q8(StoredState::Q8 { codes, absmax })) = opt.state(0, StateKind::ExpAvg) else { unreachable!() };
/// assert_eq!((codes.len(), absmax.len()), (8192, 32));
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Q8States {
    /// Tensors with fewer elements keep f32 state, as bitsandbytes does (its default is
    /// [`MIN_8BIT_SIZE`]).
    pub min_8bit_size: u64,
}

impl Default for Q8States {
    fn default() -> Self {
        Q8States { min_8bit_size: MIN_8BIT_SIZE }
    }
}

impl Q8States {
    /// Whether a tensor of `len` elements keeps 8-bit state.
    pub fn quantizes(&self, len: u64) -> bool {
        len >= self.min_8bit_size
    }
}

/// The map a state of `kind` is quantized with: the signed one for first moments and
/// momentum, the unsigned one for Adam's second moment.
pub(crate) fn is_signed(kind: StateKind) -> bool {
    kind != StateKind::ExpAvgSq
}

/// [`signed_map`] or [`unsigned_map`] for a state of `kind`.
pub(crate) fn map_for(kind: StateKind) -> [f32; 256] {
    if is_signed(kind) {
        signed_map()
    } else {
        unsigned_map()
    }
}

/// The step of `algorithm` at `t` (from 1) as bitsandbytes' 8-bit kernels run it
/// (`kOptimizerStatic8bit2StateBlockwise` and `kOptimizerStatic8bit1StateBlockwise`,
/// `csrc/kernels.cu`, 0.50.x), where they differ from the algorithm's own form:
///
/// - Adam: the first moment as `beta1 m + (1 - beta1) g` (not PyTorch's lerp), the update
///   `p - lr sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + sqrt(1 - beta2^t) eps)`, and
///   decoupled decay after the update (`p += step; p *= 1 - lr wd`);
/// - AdEMAMix: decoupled decay after the update;
/// - RMSprop: the parameter steps with the gradient as loaded, the state with the decayed one.
///
/// The 32-bit kernels that bitsandbytes runs for tensors below `min_8bit_size` share these
/// but RMSprop's ([`f32_state_step`]). The other families run their own step. A non-finite
/// gradient in the 2-state kernel is the storage's concern ([`restarts_non_finite`]). Each
/// family gives its own (`FamilyLowBit::q8_kernel_step`, in its folder).
pub(crate) fn kernel_step(algorithm: &crate::Algorithm, t: u64) -> KernelStep {
    algorithm.q8_kernel_step(t)
}

/// [`kernel_step`] as bitsandbytes' 32-bit kernels run it, for the tensors below
/// `min_8bit_size` ([`Q8Switches::f32_state`]).
#[cfg_attr(not(feature = "cpu"), allow(dead_code))]
pub(crate) fn f32_state_step(step: KernelStep) -> KernelStep {
    step.q8_f32_state()
}

/// [`f32_state_step`]'s switches: those of `switches`' kernel for a tensor below
/// `min_8bit_size`.
pub(crate) fn f32_state_switches(switches: Switches) -> Switches {
    switches.q8_f32_state()
}

/// What a family's switches say about bitsandbytes' 8-bit kernels beyond the family's own
/// step (`FamilyLowBit`): implemented by each family's switches in its folder
/// (`low_bit.rs`); the defaults hold for most.
pub(crate) trait Q8Switches: Sized {
    /// Whether a non-finite gradient leaves its parameter and restarts its 8-bit states
    /// ([`restarts_non_finite`]): bitsandbytes' 2-state kernel.
    const RESTARTS_NON_FINITE: bool = false;

    /// The switches of the kernel bitsandbytes runs for a tensor below `min_8bit_size` (its
    /// 32-bit kernel): the family's own, unless that kernel steps otherwise.
    fn f32_state(self) -> Self {
        self
    }
}

/// Whether a non-finite gradient leaves its parameter as it was (no decay either) and
/// restarts its element's 8-bit states from 0: bitsandbytes' 2-state kernel (Adam and
/// AdEMAMix) tests every gradient (`!isnan && !isinf`) before its update. Its 1-state kernel
/// (SGD with momentum, Lion, RMSprop) has no such test and lets a NaN or infinite state
/// spoil its whole block for good; there the update runs on the gradient, and a non-finite
/// state it makes is stored as the code of 0 ([`nearest_code`]), which confines it to its
/// element. Neither applies to f32 state below `min_8bit_size` (bitsandbytes' 32-bit
/// kernels have no test either).
pub(crate) fn restarts_non_finite(switches: &Switches) -> bool {
    switches.q8_restarts_non_finite()
}

/// Refuses an algorithm that has no 8-bit form here, or one of whose settings 8-bit state
/// does not reproduce (each family says which: `FamilyLowBit::q8_refusal`, in its folder).
/// Building checks every group's; a schedule's change of a group
/// ([`crate::Optimizer::set_group_algorithm`], and the CPU backend's) checks the new one
/// (RMSprop's weight decay or `maximize` switched on). `clipped`: the optimizer clips.
pub(crate) fn check_algorithm(algorithm: &crate::Algorithm, clipped: bool) -> Result<()> {
    match algorithm.q8_refusal(clipped) {
        Some(reason) => {
            Err(Error::ConflictingOptions { first: "state_storage", second: "algorithm", reason })
        }
        None => check_state_count(algorithm.state_kinds().len()),
    }
}

/// Refuses a family of more than [`MAX_STATES`] states.
fn check_state_count(states: usize) -> Result<()> {
    if states > MAX_STATES {
        return Err(Error::ConflictingOptions {
            first: "state_storage",
            second: "algorithm",
            reason: "8-bit state keeps at most four states per parameter (a lane each of the GPU \
                     kernels' vectors); keep f32, f16 or bf16 state for it",
        });
    }
    Ok(())
}

/// Refuses what [`Q8States`] cannot run: an algorithm without blockwise 8-bit state
/// (AMSGrad's running maximum, Adagrad, Schedule-Free), an option that conflicts with it, or a parameter
/// other than F32 (`dtypes` names them `params[i]`). Both backends call it before creating
/// anything.
pub(crate) fn check_options(
    algorithms: &[crate::Algorithm],
    options: &crate::OptimizerOptions,
    dtypes: impl Iterator<Item = crate::DType>,
) -> Result<()> {
    for algorithm in algorithms {
        check_algorithm(algorithm, options.grad_clip.is_some())?;
    }
    crate::state_storage::check_low_bit_options(crate::state_storage::LowBit::Q8, options, dtypes)
}

/// Refuses, naming it `argument`, a `state` that cannot replace the state of a tensor of
/// `len` elements under `config`: another storage (8-bit at and above `min_8bit_size`, f32
/// below), another length, codes without one absmax per block, or an absmax that is not a
/// finite number >= 0.
pub(crate) fn check_replacement(
    state: &StoredState,
    config: Q8States,
    len: usize,
    argument: &str,
) -> Result<()> {
    let quantized = config.quantizes(len as u64);
    if quantized != matches!(state, StoredState::Q8 { .. }) {
        let (got, expected) =
            if quantized { ("f32", "8-bit codes and absmax") } else { ("8-bit", "f32 values") };
        return Err(Error::BadRange {
            argument: argument.into(),
            problem: format!(
                "{got} state for a tensor of {len} elements, expected {expected} (min_8bit_size {})",
                config.min_8bit_size
            ),
        });
    }
    state.check(argument, len)
}

/// Refuses an absmax that cannot scale a block: NaN, infinite or negative, which a step
/// would spread over the block's 256 elements (a NaN) or turn the wrong way (a negative
/// scale flips every sign). `argument` names the absmax; the error names its first bad block.
pub(crate) fn check_absmax(absmax: &[f32], argument: &str) -> Result<()> {
    match absmax.iter().position(|a| !a.is_finite() || *a < 0.0) {
        None => Ok(()),
        Some(j) => Err(Error::BadValue {
            argument: format!("{argument}[{j}]"),
            problem: format!(
                "is {}; a block's absmax is its largest magnitude, a finite number >= 0",
                absmax[j]
            ),
        }),
    }
}

/// One state tensor under [`Q8States`], as either backend hands it back: blockwise 8-bit for
/// a tensor of at least `min_8bit_size` elements, f32 below (bitsandbytes' `state1`/`state2`
/// with `absmax1`/`absmax2`, or its f32 state).
///
/// Exhaustive: these are the two forms bitsandbytes' 8-bit optimizers store; a state format
/// of fewer bits will be a type of its own, with its own blocks and maps.
#[derive(Clone, Debug, PartialEq)]
pub enum StoredState {
    /// One code per element, one absmax per block of [`BLOCK_SIZE`].
    Q8 {
        /// The codes (`state1` / `state2`): indices into a 256-entry map, so every `u8` is a
        /// valid code (there is nothing to check).
        codes: Vec<u8>,
        /// Each block's largest magnitude (`absmax1` / `absmax2`): a finite number >= 0
        /// (0 only before the first step). Any other value is refused where a state is
        /// written or loaded ([`Error::BadValue`]).
        absmax: Vec<f32>,
    },
    /// A tensor below `min_8bit_size`.
    F32(Vec<f32>),
}

impl StoredState {
    /// The zero state bitsandbytes starts from for `len` elements: codes 0 under absmax 0 (so
    /// every value dequantizes to 0) where `quantized`, f32 zeros otherwise. A block that a
    /// step requantizes to all zeros gets absmax 1 instead (see the [module](self) docs).
    pub fn zeros(len: usize, quantized: bool) -> Self {
        if quantized {
            StoredState::Q8 { codes: vec![0; len], absmax: vec![0.0; blocks(len)] }
        } else {
            StoredState::F32(vec![0.0; len])
        }
    }

    /// Elements held.
    pub fn len(&self) -> usize {
        match self {
            StoredState::Q8 { codes, .. } => codes.len(),
            StoredState::F32(values) => values.len(),
        }
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values it stands for as a state of `kind`, in f32: `map[code] * absmax` with the
    /// map of `kind` (bitsandbytes' `qmap2` for Adam's second moment, `qmap1` otherwise), or
    /// the f32 values. Codes without one absmax per block are refused
    /// ([`Error::CountMismatch`]).
    pub fn values(&self, kind: StateKind) -> Result<Vec<f32>> {
        match self {
            StoredState::Q8 { codes, absmax } => {
                let mut values = vec![0.0f32; codes.len()];
                dequantize(codes, absmax, &map_for(kind), &mut values)?;
                Ok(values)
            }
            StoredState::F32(values) => Ok(values.clone()),
        }
    }

    /// Refuses a state of another length than `len`, codes without one absmax per block, or
    /// an absmax that is NaN, infinite or negative ([`check_absmax`]), naming it `argument`.
    /// Every code is valid: the maps have 256 entries, one per `u8`.
    pub(crate) fn check(&self, argument: &str, len: usize) -> Result<()> {
        if self.len() != len {
            return Err(Error::LengthMismatch {
                argument: argument.into(),
                got: self.len() as u64,
                expected: len as u64,
                reference: "param".into(),
            });
        }
        match self {
            StoredState::Q8 { codes, absmax } if absmax.len() != blocks(codes.len()) => {
                Err(Error::CountMismatch {
                    argument: format!("{argument} absmax"),
                    got: absmax.len(),
                    expected: blocks(codes.len()),
                })
            }
            StoredState::Q8 { absmax, .. } => check_absmax(absmax, &format!("{argument} absmax")),
            StoredState::F32(_) => Ok(()),
        }
    }
}

/// The map of signed states: bitsandbytes' `create_dynamic_map(signed=True)`.
pub(crate) fn signed_map() -> [f32; 256] {
    dynamic_map(true)
}

/// The map of non-negative states: bitsandbytes' `create_dynamic_map(signed=False)`.
pub(crate) fn unsigned_map() -> [f32; 256] {
    dynamic_map(false)
}

/// bitsandbytes' `create_dynamic_map(signed, max_exponent_bits=7, total_bits=8)`: for each
/// decimal exponent 10^-6 ... 10^0, the midpoints of an evenly spaced grid over [0.1, 1]
/// (2^e + 1 points signed, 2^(e+1) + 1 unsigned), scaled by the exponent (and negated too
/// when signed); then 0 and 1, sorted.
fn dynamic_map(signed: bool) -> [f32; 256] {
    // Python's `10 ** k` as a double, which PyTorch rounds to f32 to scale an f32 tensor.
    const SCALES: [f64; 7] = [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0];
    let mut data: Vec<f32> = Vec::with_capacity(256);
    for (exponent, scale) in SCALES.iter().enumerate() {
        let points = if signed { (1 << exponent) + 1 } else { (1 << (exponent + 1)) + 1 };
        let grid = linspace(0.1, 1.0, points);
        for pair in grid.windows(2) {
            let mean = (pair[0] + pair[1]) / 2.0;
            data.push(*scale as f32 * mean);
            if signed {
                data.push(-*scale as f32 * mean);
            }
        }
    }
    data.extend([0.0, 1.0]);
    data.sort_by(f32::total_cmp);
    let mut map = [0.0; 256];
    map.copy_from_slice(&data);
    map
}

/// `torch.linspace(start, end, steps, dtype=torch.float32)` as PyTorch's CPU kernel computes
/// it: the first half up from `start`, the second half down from `end`, each point one fused
/// multiply-add (its compiler contracts `start + step * i`).
fn linspace(start: f32, end: f32, steps: usize) -> Vec<f32> {
    let step = (end - start) / (steps - 1) as f32;
    (0..steps)
        .map(|i| {
            if i < steps / 2 {
                step.mul_add(i as f32, start)
            } else {
                (-step).mul_add((steps - 1 - i) as f32, end)
            }
        })
        .collect()
}

/// The code bitsandbytes' CUDA kernels store for `x`, a value already divided by its block's
/// absmax (`quantize_2D` and the sign fix after it in `kOptimizerStatic8bit1StateBlockwise`
/// and `kOptimizerStatic8bit2StateBlockwise`, `csrc/kernels.cu`, 0.50.x):
///
/// - **the nearest code by the midpoints**: `x` takes the upper of its two neighbouring codes
///   `a < b` above their f32 midpoint `(a + b) * 0.5` and the lower one below it, an end code
///   beyond the map's ends;
/// - **ties**: a value exactly at a midpoint takes the even code of the two (the kernel's
///   binary search ends on an even pivot, and keeps it on a tie);
/// - **the sign rule**, in the signed map only: a value whose sign differs from its code's
///   (a negative value whose nearest code is the code of 0, and -0.0) moves one code toward
///   its sign, so it is stored as the code below the code of 0 ("make sure state1 term has
///   still the same sign after quantization").
///
/// NaN and the infinities take the code of 0 ([`zero_code`]): a non-finite state value is not
/// kept, and its element's state restarts from zero (the kernels' own result there depends on
/// the NaN's sign bit, or spoils the block).
pub(crate) fn nearest_code(map: &[f32; 256], x: f32) -> u8 {
    if !x.is_finite() {
        return zero_code(map);
    }
    // Beyond the map's ends the end code is nearest. (A quantized x = value / absmax lies in
    // [-1, 1] anyway.)
    let x = x.clamp(map[0], map[255]);
    // The first code not below x, and its lower neighbour.
    let above = map.partition_point(|&c| c < x).min(255);
    let code = match above.checked_sub(1) {
        // x is the lowest code itself.
        None => 0,
        Some(below) => {
            let midpoint = (map[below] + map[above]) * 0.5;
            if x > midpoint {
                above
            } else if x < midpoint || below % 2 == 0 {
                below
            } else {
                above
            }
        }
    };
    let signed = map[0] < 0.0;
    if signed && map[code].is_sign_negative() != x.is_sign_negative() {
        // Only a negative value (or -0.0) can reach the code of 0 (+0.0) from the other side:
        // a positive value's nearest code is never negative.
        // (The kernel's own `c += 1` / `c -= 1` on an unsigned char.)
        let code = code as u8;
        return if x > 0.0 { code.wrapping_add(1) } else { code.wrapping_sub(1) };
    }
    code as u8
}

/// The index of the code of 0 in `map` (the unsigned map's first code, the signed map's
/// middle one); 0 for a map without 0.
pub(crate) fn zero_code(map: &[f32; 256]) -> u8 {
    map.iter().position(|&c| c == 0.0).unwrap_or(0) as u8
}

/// Quantizes `values` block by block into `codes` (one per value) and `absmax` (one per block,
/// the last block possibly partial). Refuses, changing nothing, slices of other lengths.
///
/// A block's absmax is the largest finite magnitude (1 when there is none, or it is 0):
/// a NaN or infinite value would make every value of its block NaN once dequantized, so
/// it takes the code of 0 instead ([`nearest_code`]) and leaves the other values alone.
///
/// The kernels (`cpu/q8.rs`, the GPU's) requantize through [`lut::CodeTable`] inside their
/// update loops; this plain form states the rule they follow, for the unit tests.
#[cfg(test)]
pub(crate) fn quantize(values: &[f32], map: &[f32; 256], codes: &mut [u8], absmax: &mut [f32]) -> Result<()> {
    check_lengths(values.len(), codes.len(), absmax.len())?;
    let blocks = values.chunks(BLOCK_SIZE).zip(codes.chunks_mut(BLOCK_SIZE));
    for ((block, block_codes), block_absmax) in blocks.zip(absmax.iter_mut()) {
        let largest = block.iter().filter(|v| v.is_finite()).fold(0.0f32, |m, v| m.max(v.abs()));
        *block_absmax = if largest == 0.0 { 1.0 } else { largest };
        for (code, v) in block_codes.iter_mut().zip(block) {
            // A block of zeros reads back 0 everywhere: its -0.0 keeps the code of 0 too.
            *code = if largest == 0.0 { zero_code(map) } else { nearest_code(map, v / *block_absmax) };
        }
    }
    Ok(())
}

/// The values of `codes` under their blocks' `absmax`: `map[code] * absmax`. Refuses,
/// changing nothing, slices of other lengths.
pub(crate) fn dequantize(codes: &[u8], absmax: &[f32], map: &[f32; 256], values: &mut [f32]) -> Result<()> {
    check_lengths(values.len(), codes.len(), absmax.len())?;
    let blocks = codes.chunks(BLOCK_SIZE).zip(values.chunks_mut(BLOCK_SIZE));
    for ((block_codes, block_values), scale) in blocks.zip(absmax) {
        for (value, code) in block_values.iter_mut().zip(block_codes) {
            *value = map[usize::from(*code)] * scale;
        }
    }
    Ok(())
}

/// One code per value and one absmax per block of them.
fn check_lengths(values: usize, codes: usize, absmax: usize) -> Result<()> {
    if codes != values {
        return Err(Error::LengthMismatch {
            argument: "codes".into(),
            got: codes as u64,
            expected: values as u64,
            reference: "values".into(),
        });
    }
    if absmax != blocks(values) {
        // One per block of 256 values: a count of blocks, not a length to match.
        return Err(Error::CountMismatch {
            argument: "absmax".into(),
            got: absmax,
            expected: blocks(values),
        });
    }
    Ok(())
}

/// Blocks of a tensor of `len` elements.
pub(crate) fn blocks(len: usize) -> usize {
    len.div_ceil(BLOCK_SIZE)
}

#[cfg(test)]
mod tests;
