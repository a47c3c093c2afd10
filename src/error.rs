//! The crate's one error type.
//!
//! Every refusal names the argument, what it was and what was expected, so a trainer's log
//! says what to fix without a debugger.

use crate::{DType, StateKind};

/// Everything that can go wrong in this crate.
///
/// `#[non_exhaustive]`: new refusals come with new features, so a `match` needs a `_` arm.
/// Every variant has the same shape in every build (the `burn` feature adds none), so
/// enabling a feature in one crate never breaks another crate's match.
///
/// # What is checked
///
/// - Every public entry validates before recording: lengths, counts, dtypes, buffer ranges and
///   usages (a tensor's last 4-byte word must exist in its buffer), element alignment,
///   DirectML's aliasing rule (also across the tensors of one step: a gradient may be its own
///   parameter exactly, and share no byte with anything else the step writes), parameters
///   that share memory, hyperparameter ranges, step rules
///   and adapter features; an optimizer checks its tensors when it is built, not at its first
///   step. Each refusal is a typed `Error` naming the argument, what it was and
///   what was expected, and changes nothing (tests checksum every buffer and the optimizer's
///   state around every refused call).
/// - GPU validation and out-of-memory errors come back as `Error::Gpu` with wgpu's message;
///   a lost device as `Error::DeviceLost`.
/// - NaN and infinity: without AMP a non-finite gradient propagates exactly as in PyTorch
///   (including AMSGrad's running maximum, which keeps a NaN as `torch.maximum` does); with
///   AMP (`record_unscale`) the step is skipped. With 8-bit state Adam, AdamW and AdEMAMix
///   leave that element's parameter as it was and restart its states (bitsandbytes' 2-state
///   kernel); the other families' parameter goes NaN or infinite in the same way, but the
///   element's state is stored as the code of 0 (it restarts from zero) and its block's absmax
///   leaves it out, so one bad element never spoils the other 255 of its block. Lion's sign
///   of NaN is 0, as `torch.sign`'s and bitsandbytes' `sgn`: a NaN gradient only decays its
///   parameter. With 4-bit state (torchao's) the parameter goes NaN and the element's states
///   are stored as the code of 0 (of the smallest entry for `exp_avg_sq`), out of their
///   block's scale. LAMB, Adafactor and Muon take the whole tensor into each element's step,
///   so one bad element makes its whole parameter NaN (an infinite one after Adafactor's
///   second step: its row and column). the repository's `docs/non-finite.md`
///   tabulates what NaN, +inf and -inf in one element do, per family and storage, as
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No adapter could be found; the message says how to get one.
    #[error(
        "no GPU adapter found ({reason}). On a headless Linux machine install the Vulkan software \
         driver: `apt-get install -y mesa-vulkan-drivers libvulkan1`; or select an adapter with \
         WGPU_BACKEND / WGPU_ADAPTER_NAME"
    )]
    NoAdapter {
        /// wgpu's own explanation.
        reason: String,
    },
    /// The adapter refused to open a device.
    #[error("the adapter refused to open a device: {message}")]
    RequestDevice {
        /// wgpu's message.
        message: String,
    },
    /// A call needs an adapter feature the device was not created with.
    #[error("{what} needs the adapter feature {feature}, which this device does not have")]
    MissingFeature {
        /// What asked for it.
        what: String,
        /// The `wgpu::Features` name.
        feature: &'static str,
    },
    /// A call needs an optimizer option that this optimizer was built without.
    #[error("{what} needs the optimizer option `{option}`, which this optimizer was built without")]
    NeedsOption {
        /// What asked for it.
        what: String,
        /// The [`OptimizerBuilder`](crate::OptimizerBuilder) option.
        option: &'static str,
    },
    /// Two tensors that must have the same number of elements do not.
    #[error("`{argument}` has {got} elements, expected {expected} (the length of `{reference}`)")]
    LengthMismatch {
        /// The offending argument.
        argument: String,
        /// Its element count.
        got: u64,
        /// The element count it must have.
        expected: u64,
        /// The argument the length was taken from.
        reference: String,
    },
    /// A list of tensors has the wrong number of entries.
    #[error("`{argument}` has {got} entries, expected {expected}")]
    CountMismatch {
        /// The offending argument.
        argument: String,
        /// How many were given.
        got: usize,
        /// How many were expected.
        expected: usize,
    },
    /// A tensor's storage type is not what the call expects.
    #[error("`{argument}` is {got:?}, expected {expected}")]
    DTypeMismatch {
        /// The offending argument.
        argument: String,
        /// Its dtype.
        got: DType,
        /// What the call accepts.
        expected: String,
    },
    /// A tensor's range does not fit its buffer, or its offset is misaligned.
    #[error("`{argument}`: {problem}")]
    BadRange {
        /// The offending argument.
        argument: String,
        /// What is wrong with the range.
        problem: String,
    },
    /// A value the crate would compute with is not one it can hold: an 8-bit state's
    /// `absmax` that is NaN, infinite or negative.
    #[error("`{argument}` {problem}")]
    BadValue {
        /// The offending argument, with the index of the bad element.
        argument: String,
        /// What is wrong with it and what was expected.
        problem: String,
    },
    /// A buffer lacks a usage flag that binding it requires.
    #[error("`{argument}`'s buffer lacks the usage {needed} (it has {has})")]
    MissingUsage {
        /// The offending argument.
        argument: String,
        /// The usage it needs.
        needed: &'static str,
        /// The usages it has, as wgpu prints them.
        has: String,
    },
    /// An output overlaps another tensor in a way that DirectML's aliasing rule forbids.
    #[error(
        "`{output}` overlaps `{other}` without being the same range: an output may only \
         alias an input exactly (same buffer, offset, length and dtype) or not touch it at all"
    )]
    PartialOverlap {
        /// The output.
        output: String,
        /// The tensor it overlaps.
        other: String,
    },
    /// A tensor that a step or call reads shares memory with a range the same step writes
    /// for another tensor: a gradient inside another parameter, a model copy or the
    /// optimizer's state, or an input of one `ops` update inside another's output. The
    /// tensors are updated in one pass, so it would read values already updated.
    #[error(
        "`{tensor}` shares memory with `{written}`, which the same step writes: a tensor may \
         only be its own output exactly (a gradient its own parameter) and must not touch \
         any other written range (it would read values the step already updated)"
    )]
    OverlapsWritten {
        /// The tensor read.
        tensor: String,
        /// The written tensor it overlaps.
        written: String,
    },
    /// Two outputs were given the same memory.
    #[error("outputs `{first}` and `{second}` are the same range: every output needs its own memory")]
    OutputsAlias {
        /// One output.
        first: String,
        /// The other.
        second: String,
    },
    /// Two tensors that must each have their own memory share at least one byte: two
    /// parameters of one optimizer (across all its groups), or a model copy and a parameter
    /// or another copy. Each would be updated twice per step, with separate state.
    #[error(
        "`{first}` and `{second}` share memory: every parameter and model copy of an optimizer \
         needs its own (a shared one would be updated twice per step, each time with its own state)"
    )]
    OverlappingParams {
        /// The earlier of the two, in parameter order.
        first: String,
        /// The later one.
        second: String,
    },
    /// An optimizer was given no parameters at all.
    #[error("`{argument}` is empty: an optimizer needs at least one parameter")]
    NoParameters {
        /// The empty argument.
        argument: String,
    },
    /// A parameter group index past the optimizer's groups.
    #[error("there is no parameter group {index}: the optimizer has {groups} (indices from 0)")]
    NoSuchGroup {
        /// The index given.
        index: usize,
        /// How many groups there are.
        groups: usize,
    },
    /// A new algorithm would keep other state tensors than the ones the optimizer holds
    /// (e.g. switching AMSGrad or momentum on or off).
    #[error(
        "`{argument}` keeps the state [{}], expected [{}] (the state the optimizer was built \
         with; build a new optimizer to change it)",
        state_names(.got),
        state_names(.expected)
    )]
    StateMismatch {
        /// The offending argument.
        argument: String,
        /// The state tensors it keeps.
        got: Vec<StateKind>,
        /// The state tensors the optimizer holds.
        expected: Vec<StateKind>,
    },
    /// Two options that exclude each other were both set.
    #[error("options `{first}` and `{second}` exclude each other: {reason}")]
    ConflictingOptions {
        /// One option.
        first: &'static str,
        /// The other.
        second: &'static str,
        /// Why they cannot go together.
        reason: &'static str,
    },
    /// A hyperparameter is outside the range its convention allows.
    #[error("hyperparameter `{name}` = {value} is invalid: expected {expected}")]
    BadHyperparameter {
        /// Its name, as the convention spells it.
        name: &'static str,
        /// The value given.
        value: f64,
        /// The accepted range.
        expected: &'static str,
    },
    /// A training step the convention cannot evaluate.
    #[error("{argument} {step}: {problem}")]
    BadStep {
        /// The argument: `step`, or DirectML's `TrainingStepTensor`.
        argument: &'static str,
        /// The step given (as the caller gave it; a DirectML float step may not be whole).
        step: f64,
        /// Why it cannot be evaluated.
        problem: StepProblem,
    },
    /// A kernel would need more storage bindings than the device allows.
    #[error(
        "this call needs {needed} storage buffer bindings but the device allows {limit} per \
         shader stage (max_storage_buffers_per_shader_stage); create the device with the \
         adapter's limits, or, for an out-of-place `ops` call, alias outputs onto inputs"
    )]
    TooManyBindings {
        /// Bindings the plan needs.
        needed: u32,
        /// The device limit.
        limit: u32,
    },
    /// wgpu reported an error while creating or running GPU work. `Display` is one line
    /// (what the crate was doing and wgpu's summary); the alternate form (`{:#}`) adds
    /// wgpu's full multi-line message (for a shader, with the offending WGSL).
    #[error(fmt = gpu_display)]
    Gpu {
        /// What the crate was doing.
        context: String,
        /// wgpu's full message, verbatim.
        message: String,
    },
    /// The device was lost (destroyed, reset or removed); nothing more can run on it.
    /// Create a new context (and re-upload the state, e.g. from a checkpoint).
    #[error(
        "the GPU device was lost ({reason}); create a new context and restore the state from a checkpoint"
    )]
    DeviceLost {
        /// wgpu's reason, or the caller's
        /// ([`GpuContext::mark_lost`](crate::GpuContext::mark_lost)).
        reason: String,
    },
    /// Reading a buffer back to the host failed.
    #[error("reading a buffer back failed: {cause}")]
    Readback {
        /// What failed.
        cause: ReadbackFailure,
    },
    /// A conformance-vector or checkpoint file is malformed.
    #[error("{path}: {problem}")]
    BadFile {
        /// The file.
        path: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A JSON description (a checkpoint's `param_groups` entry) lacks a field or has one of
    /// the wrong type.
    #[error("the JSON hyperparameters: {problem}")]
    BadJson {
        /// What is missing or wrong, naming the field.
        problem: String,
    },
    /// Burn's side refused (the `wgpu-optim-burn` crate constructs it): a tensor not on
    /// Burn's wgpu runtime or not on the shared device, a device that cannot be shared, a
    /// record or config that cannot be converted.
    #[error("Burn ({cause}): {detail}")]
    Burn {
        /// The kind of refusal.
        cause: BurnFailure,
        /// What exactly, naming the parameter, entry or field.
        detail: String,
    },
    /// A call needs an argument it was not given.
    #[error("`{argument}` is needed {why}")]
    MissingArgument {
        /// The argument.
        argument: &'static str,
        /// What needs it.
        why: &'static str,
    },
    /// A schedule-free optimizer in eval mode was asked to step: its parameters hold the
    /// average x, not the point y a step updates. Nothing was changed.
    #[error("`{call}` is refused in eval mode (the parameters hold x, not y): call `train()` first")]
    EvalMode {
        /// The refused call.
        call: &'static str,
    },
    /// A parameter's shape (from `param_shapes`) is one the algorithm cannot take, such as a
    /// 1-D or 3-D parameter given to Muon, which orthogonalizes matrices. Nothing was changed.
    #[error("`param_shapes[{param}]` is {shape:?}, but {algorithm} needs {expected}")]
    BadShape {
        /// The parameter's index (numbered across groups).
        param: usize,
        /// Its shape.
        shape: Vec<usize>,
        /// The algorithm that refused it.
        algorithm: &'static str,
        /// The shapes it takes, and where the others go.
        expected: &'static str,
    },
    /// A collective across ranks ([`shard::Communicator`](crate::shard::Communicator)) did
    /// not complete: another rank left the group (it panicked or ended), none answered within
    /// the transport's timeout, or the ranks passed what cannot go together (lengths,
    /// configurations). Every rank that takes part gets it, so none waits forever.
    #[error("{operation} on rank {rank} of {size}: {problem}")]
    Collective {
        /// The collective (`all_gather`, `all_reduce`, `check_same` with what it checked).
        operation: String,
        /// This rank.
        rank: usize,
        /// The number of ranks.
        size: usize,
        /// What went wrong, naming the rank or the values concerned.
        problem: String,
    },
}

/// Why a training step cannot be evaluated ([`Error::BadStep`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StepProblem {
    /// Step 0: the conventions count steps from 1 (bias corrections divide by 0 at 0).
    #[error("steps count from 1 (the bias corrections divide by 1 - beta^t, 0/0 at t = 0)")]
    Zero,
    /// A DirectML `TrainingStepTensor` that holds no whole number >= 0.
    #[error("not a whole number >= 1")]
    NotWhole,
    /// More steps than the capturable mode's u32 device counter holds.
    #[error("does not fit the device's u32 step counter")]
    TooLargeForDevice,
}

/// What failed in a readback ([`Error::Readback`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReadbackFailure {
    /// A blocking call would have to wait for the device where a thread cannot wait (a
    /// browser's main thread); the `_async` form named does not block.
    #[error("`{call}` would block, which a browser cannot; use `{instead}`")]
    WouldBlock {
        /// What blocks, e.g. `read_bytes` or `params[3]`'s partial-word write.
        call: String,
        /// The form to call instead.
        instead: &'static str,
    },
    /// Waiting for the device failed.
    #[error("waiting for the device: {message}")]
    Poll {
        /// wgpu's message.
        message: String,
    },
    /// Mapping the staging buffer failed.
    #[error("mapping the staging buffer: {message}")]
    Map {
        /// wgpu's message.
        message: String,
    },
    /// The map callback never ran (the device was dropped first).
    #[error("the map callback never ran")]
    CallbackNeverRan,
}

/// The kind of a refusal from Burn's side ([`Error::Burn`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BurnFailure {
    /// Burn's wgpu runtime could not start or refused the device, or the device cannot be
    /// shared with it.
    #[error("device")]
    Device,
    /// A tensor is not on Burn's wgpu runtime, not on the shared device, or of a dtype the
    /// kernels do not take.
    #[error("tensor")]
    Tensor,
    /// A Burn optimizer config has a setting these kernels do not implement.
    #[error("config")]
    Config,
    /// A Burn optimizer record could not be read, written or converted.
    #[error("record")]
    Record,
    /// A step the fused module step cannot take as asked (e.g. parameters at different step
    /// counts with a global option).
    #[error("step")]
    Step,
    /// The crate's own bookkeeping is inconsistent: a bug to report.
    #[error("internal")]
    Internal,
}

/// PyTorch's names of `kinds`, comma-separated.
fn state_names(kinds: &[StateKind]) -> String {
    kinds.iter().map(|k| k.torch_name()).collect::<Vec<_>>().join(", ")
}

/// `Error::Gpu` on one line, or with wgpu's whole message under `{:#}`.
fn gpu_display(context: &str, message: &str, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
    if f.alternate() {
        return write!(f, "wgpu error while {context}:\n{message}");
    }
    write!(f, "wgpu error while {context}: {}", gpu_summary(message))
}

/// wgpu's message on one line: its error chain (`Validation Error`, `Caused by:`, `In
/// Device::create_buffer`, the cause) joined with ": ", up to the first source snippet or
/// blank line after the cause.
fn gpu_summary(message: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for line in message.lines().map(str::trim) {
        if line.is_empty() || line == "Caused by:" {
            continue;
        }
        // A codespan snippet of the WGSL starts here; `{:#}` shows it.
        if line.starts_with('┌') || line.starts_with('│') || line.starts_with('=') {
            break;
        }
        parts.push(line.trim_end_matches(':'));
    }
    parts.dedup();
    parts.join(": ")
}

/// Shorthand for `Result<T, wgpu_optim::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
