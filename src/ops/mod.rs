//! Stateless operator front ends: each call updates the tensors it is given, with every
//! output either its input's range (in place) or a range of its own (DirectML's rule).
//!
//! These calls build their bind groups per call; a trainer that steps the same tensors
//! every iteration should hold an [`Optimizer`](crate::Optimizer), which builds them once.

pub mod directml;
pub mod onnx;

pub use crate::optimizer::device::check_inv_scale;

use crate::gpu::dispatch::{Batch, Uniforms};
use crate::gpu::kernel::{Program, Scalars, VariantKey};
use crate::gpu::plan::{math_dtype, plan, slot_args, Arg, KernelArgs, SlotArgs};
use crate::step::{KernelStep, UNIFORM_SLOT_BYTES};
use crate::{
    Algorithm, DType, Error, GpuContext, Result, ScheduleFreeMode, ScheduleFreeScalars, StateKind,
    StepProblem, Tensor,
};

/// The tensors of one stateless update of any algorithm: `state` holds the algorithm's
/// [`state_kinds`](Algorithm::state_kinds) in order. An output left `None` is written in
/// place over its input.
#[derive(Clone, Debug)]
pub struct Update {
    /// Parameters.
    pub param: Tensor,
    /// Gradients.
    pub grad: Tensor,
    /// State tensors, one per state kind of the algorithm.
    pub state: Vec<Tensor>,
    /// Where the new parameters go (`None`: in place).
    pub param_out: Option<Tensor>,
    /// Where each new state tensor goes, one entry per state tensor (`None`, or a missing
    /// entry: in place).
    pub state_out: Vec<Option<Tensor>>,
    /// Master-weight mode: a (usually lower-precision) copy that also receives the new
    /// parameters, in the same dispatch.
    pub param_copy: Option<Tensor>,
}

impl Update {
    /// Everything updated in place.
    pub fn in_place(param: &Tensor, grad: &Tensor, state: &[Tensor]) -> Self {
        Update {
            param: param.clone(),
            grad: grad.clone(),
            state: state.to_vec(),
            param_out: None,
            state_out: vec![None; state.len()],
            param_copy: None,
        }
    }
}

/// One PyTorch-convention update of any algorithm at step `t` (counted from 1; SGD's
/// first step sets the momentum buffer to the gradient), recorded as one compute pass.
pub fn update(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    algorithm: &Algorithm,
    t: u64,
    updates: &[Update],
) -> Result<()> {
    algorithm.validate()?;
    if t == 0 {
        return Err(Error::BadStep { argument: "step", step: 0.0, problem: StepProblem::Zero });
    }
    if let Some(reason) = algorithm.stateless_refusal() {
        return Err(Error::ConflictingOptions { first: "ops::update", second: "algorithm", reason });
    }
    record_kernel_updates(ctx, encoder, &algorithm.kernel_step(t), algorithm.state_kinds(), updates)
}

/// One step's scalars for one algorithm, computed on the host in f64: what a kernel's
/// uniform holds. [`update`] makes them from the step count; a front end that keeps an
/// algorithm's running values itself (Schedule-Free's, in a framework's per-parameter state)
/// makes them with [`Self::after`] or [`Self::mode_swap`] and records them with
/// [`record_updates`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepScalars(KernelStep);

impl StepScalars {
    /// The scalars of step `t` (counted from 1) of `algorithm`, checked as [`update`] checks
    /// them: an algorithm whose step needs what only an optimizer keeps is refused here as
    /// there (Adafactor; Schedule-Free AdamW, whose steps come from [`Self::after`]).
    pub fn at(algorithm: &Algorithm, t: u64) -> Result<Self> {
        algorithm.validate()?;
        if t == 0 {
            return Err(Error::BadStep { argument: "step", step: 0.0, problem: StepProblem::Zero });
        }
        if let Some(reason) = algorithm.stateless_refusal() {
            return Err(Error::ConflictingOptions { first: "ops::StepScalars", second: "algorithm", reason });
        }
        Ok(StepScalars(algorithm.kernel_step(t)))
    }

    /// Where `algorithm`'s steps come from running group values (Schedule-Free's `k`,
    /// `weight_sum`, `lr_max`): the step after `values` and the values after it; `None`
    /// for every other algorithm, whose steps come from the step count ([`Self::at`]).
    pub fn after(algorithm: &Algorithm, values: &ScheduleFreeScalars) -> Option<(Self, ScheduleFreeScalars)> {
        algorithm.step_after(values).map(|(step, next)| (StepScalars(step), next))
    }

    /// The swap of the parameters between the points `algorithm` keeps, going to `to`
    /// (Schedule-Free's `eval()` and `train()`), or why it cannot run; `None`: the algorithm
    /// has no modes. The swap is recorded as an update whose gradient is the parameter.
    pub fn mode_swap(algorithm: &Algorithm, to: ScheduleFreeMode) -> Option<Result<Self>> {
        algorithm.mode_swap(to).map(|swap| swap.map(StepScalars))
    }
}

/// The updates of [`update`] with the step's scalars given, `kinds` being the state
/// tensors' kinds in order (the algorithm's [`state_kinds`](Algorithm::state_kinds), or
/// [`param_state_kinds`](Algorithm::param_state_kinds) for a shape). Checked as [`update`]
/// checks its tensors.
pub fn record_updates(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    step: &StepScalars,
    kinds: &[StateKind],
    updates: &[Update],
) -> Result<()> {
    record_kernel_updates(ctx, encoder, &step.0, kinds, updates)
}

/// [`record_updates`] with the crate's own step.
pub(crate) fn record_kernel_updates(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    step: &KernelStep,
    kinds: &[StateKind],
    updates: &[Update],
) -> Result<()> {
    let mut calls = Vec::with_capacity(updates.len());
    for (i, u) in updates.iter().enumerate() {
        if u.state.len() != kinds.len() {
            return Err(Error::CountMismatch {
                argument: format!(
                    "updates[{i}].state ({})",
                    kinds.iter().map(|k| k.torch_name()).collect::<Vec<_>>().join(", ")
                ),
                got: u.state.len(),
                expected: kinds.len(),
            });
        }
        if u.state_out.len() > kinds.len() {
            return Err(Error::CountMismatch {
                argument: format!("updates[{i}].state_out"),
                got: u.state_out.len(),
                expected: kinds.len(),
            });
        }
        let name = |field: &str| format!("updates[{i}].{field}");
        let param = Arg::new(name("param"), &u.param);
        let param_out =
            u.param_out.as_ref().map_or_else(|| param.clone(), |t| Arg::new(name("param_out"), t));
        let state: Vec<Arg> =
            kinds.iter().zip(&u.state).map(|(kind, t)| Arg::new(name(kind.torch_name()), t)).collect();
        let state_out: Vec<Arg> = state
            .iter()
            .zip(kinds)
            .enumerate()
            .map(|(k, (input, kind))| match u.state_out.get(k) {
                Some(Some(t)) => Arg::new(name(&format!("{}_out", kind.torch_name())), t),
                _ => input.clone(),
            })
            .collect();
        let param_copy = u.param_copy.as_ref().map(|t| Arg::new(name("param_copy"), t));
        let grad = Arg::new(name("grad"), &u.grad);
        let args = SlotArgs { param, grad, state: &state, param_out, state_out: &state_out, param_copy };
        calls.push(slot_args(step.family(), kinds, args));
    }
    if let Some(record) = step.family().stateless_passes() {
        // Passes of the family's own (each tensor's norms, say), not the elementwise
        // kernel: they read one call's tensors after another's are written.
        check_across(&calls)?;
        return record(ctx, encoder, step, &calls);
    }
    record_stateless(ctx, encoder, step, &calls, step.family().name())
}

/// A family's recording of a stateless update whose step is more than the elementwise
/// kernel (`FamilyConfig::STATELESS_PASSES`): the calls' tensors, checked and planned.
pub(crate) type RecordStateless =
    fn(&GpuContext, &mut wgpu::CommandEncoder, &KernelStep, &[KernelArgs]) -> Result<()>;

/// Plans every call, then records them as one compute pass with a uniform of its own.
/// Nothing is recorded unless every call is valid.
pub(crate) fn record_stateless(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    step: &KernelStep,
    calls: &[KernelArgs],
    label: &str,
) -> Result<()> {
    ctx.check_alive()?;
    check_across(calls)?;
    let program = Program::Update(step.switches());
    let mut items = Vec::with_capacity(calls.len());
    let mut math = None;
    for args in calls {
        let tensor_plan = plan(ctx, program, args)?;
        let dtype = math_dtype(args);
        match math {
            None => math = Some(dtype),
            Some(m) if m != dtype => {
                return Err(Error::DTypeMismatch {
                    argument: format!("{label} tensor {}", items.len()),
                    got: dtype,
                    expected: format!("{m:?} like the first tensor of the call"),
                })
            }
            Some(_) => {}
        }
        let key = VariantKey::new(Scalars::Host, program, dtype, tensor_plan.layout.clone());
        items.push((key, tensor_plan));
    }
    let math = math.unwrap_or(DType::F32);
    let batch = Batch::build(ctx, &items, label)?;
    // A buffer of its own per call, initialized at creation: no write waits for a submit.
    let mut bytes = [0u8; UNIFORM_SLOT_BYTES as usize];
    step.write_uniform(math, &mut bytes);
    let uniforms = Uniforms::new(ctx, &bytes, label, None, None)?;
    let mut pass = encoder
        .begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(label), timestamp_writes: None });
    batch.record(&mut pass, &uniforms.bind_groups[0]);
    Ok(())
}

/// DirectML's rule across the calls of one operator, which run in one pass (`plan` checks
/// each call's own tensors): an output shares no byte with any tensor of another call, or
/// that call would read values already updated (or two calls write one element). Inputs may
/// be shared by any number of calls.
fn check_across(calls: &[KernelArgs]) -> Result<()> {
    // Every tensor with its call and whether it is written, by buffer and offset.
    let mut tensors: Vec<(usize, bool, &Arg)> = calls
        .iter()
        .enumerate()
        .flat_map(|(c, args)| {
            let inputs = args.inputs.iter().flatten().map(move |a| (c, false, a));
            inputs.chain(args.outputs.iter().flatten().map(move |a| (c, true, a)))
        })
        .filter(|(_, _, a)| a.tensor.len > 0)
        .collect();
    tensors.sort_by(|(_, _, a), (_, _, b)| {
        a.tensor.buffer.cmp(&b.tensor.buffer).then(a.tensor.offset.cmp(&b.tensor.offset))
    });
    // The tensors that reach past the current one's start: few, unless many calls share an
    // input.
    let mut open: Vec<(usize, bool, &Arg)> = Vec::new();
    for &(call, written, arg) in &tensors {
        open.retain(|(_, _, o)| arg.tensor.overlaps(&o.tensor));
        let clash = open.iter().find(|(c, w, _)| *c != call && (*w || written));
        if let Some(&(_, other_written, other)) = clash {
            return Err(cross_overlap((written, arg), (other_written, other)));
        }
        open.push((call, written, arg));
    }
    Ok(())
}

/// The refusal of two tensors of different calls that overlap, at least one written.
fn cross_overlap(a: (bool, &Arg), b: (bool, &Arg)) -> Error {
    match (a, b) {
        ((true, a), (true, b)) if a.tensor == b.tensor => {
            Error::OutputsAlias { first: b.name.clone(), second: a.name.clone() }
        }
        ((true, a), (true, b)) => Error::PartialOverlap { output: b.name.clone(), other: a.name.clone() },
        ((false, read), (_, written)) | ((_, written), (false, read)) => {
            Error::OverlapsWritten { tensor: read.name.clone(), written: written.name.clone() }
        }
    }
}
