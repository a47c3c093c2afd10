//! The binding plan of one tensor's update: validation, DirectML's aliasing rule, and the
//! split into segments that each fit one storage binding.
//!
//! wgpu tracks usage per buffer and per dispatch, and rejects a buffer bound read-only and
//! read-write at once even for disjoint ranges; two read-write bindings of one buffer are
//! fine. So identical ranges share one binding, and every binding of a buffer that is
//! written anywhere in the dispatch is `read_write`.

use crate::gpu::kernel::{BindingDesc, BindingLayout, Program, Storage};
use crate::gpu::GpuContext;
use crate::step::{Family, Slot};
use crate::{DType, Error, Result, StateKind, Tensor};

/// A tensor with the name the caller knows it by, for error messages.
#[derive(Clone, Debug)]
pub(crate) struct Arg {
    pub(crate) name: String,
    pub(crate) tensor: Tensor,
}

impl Arg {
    pub(crate) fn new(name: impl Into<String>, tensor: &Tensor) -> Self {
        Arg { name: name.into(), tensor: tensor.clone() }
    }
}

/// The tensors of one kernel call, in the program's slot order; `None` is an absent slot.
/// An output equal to an input is updated in place.
#[derive(Clone, Debug)]
pub(crate) struct KernelArgs {
    pub(crate) inputs: Vec<Option<Arg>>,
    pub(crate) outputs: Vec<Option<Arg>>,
}

/// One storage binding of one segment.
#[derive(Clone, Debug)]
pub(crate) struct BoundRange {
    pub(crate) buffer: wgpu::Buffer,
    pub(crate) offset: u64,
    pub(crate) size: u64,
    /// Index of the segment's first element within the binding.
    pub(crate) base: u32,
}

/// A run of elements small enough for every binding to fit the device's limits.
#[derive(Clone, Debug)]
pub(crate) struct SegmentPlan {
    /// Accesses in the segment: elements, or vec4s when `width` is 4.
    pub(crate) len: u32,
    /// Elements per access.
    pub(crate) width: u32,
    pub(crate) ranges: Vec<BoundRange>,
    /// Pair mode: the parity of the packed outputs' first element (see `kernel::PAIR_ENTRY`).
    pub(crate) pair_shift: u32,
    /// Pair mode: 2 when packed outputs disagree in parity and pairs run in two phases.
    pub(crate) phases: u32,
    /// The tensor's element the segment starts at.
    pub(crate) first: u64,
}

/// The validated plan for one tensor's update.
#[derive(Clone, Debug)]
pub(crate) struct TensorPlan {
    pub(crate) layout: BindingLayout,
    pub(crate) segments: Vec<SegmentPlan>,
    /// The tensor's ordinal among the optimizer's parameters: part of stochastic rounding's
    /// counter (0 elsewhere).
    pub(crate) ordinal: u32,
}

/// Checks that `arg` is a usable storage range of its buffer: [`check_extent`] and the
/// `STORAGE` usage.
pub(crate) fn check_range(arg: &Arg) -> Result<()> {
    check_extent(arg)?;
    let t = &arg.tensor;
    if !t.buffer.usage().contains(wgpu::BufferUsages::STORAGE) {
        return Err(Error::MissingUsage {
            argument: arg.name.clone(),
            needed: "STORAGE",
            has: format!("{:?}", t.buffer.usage()),
        });
    }
    Ok(())
}

/// Checks that `arg`'s elements lie in its buffer at an offset that is a multiple of the
/// element size, and that the 4-byte word holding its last byte exists: storage bindings,
/// copies and queue writes all cover whole words, so a 16-bit tensor that ends mid-word in
/// an exactly sized buffer can be neither bound nor read back.
pub(crate) fn check_extent(arg: &Arg) -> Result<()> {
    let t = &arg.tensor;
    let bad = |problem: String| Err(Error::BadRange { argument: arg.name.clone(), problem });
    if !t.offset.is_multiple_of(t.dtype.size()) {
        return bad(format!(
            "byte offset {} is not a multiple of the {:?} element size {}",
            t.offset,
            t.dtype,
            t.dtype.size()
        ));
    }
    let end = t.len.checked_mul(t.dtype.size()).and_then(|bytes| bytes.checked_add(t.offset));
    match end {
        Some(end) if end <= t.buffer.size() => {
            let word_end = end.next_multiple_of(4);
            if word_end > t.buffer.size() {
                return bad(format!(
                    "ends at byte {end} of a {}-byte buffer; bindings and copies cover whole 4-byte \
                     words, so the buffer must extend to byte {word_end} (pad it, or leave out the \
                     last element)",
                    t.buffer.size()
                ));
            }
            Ok(())
        }
        _ => bad(format!(
            "{} {:?} elements at byte offset {} do not fit in a buffer of {} bytes",
            t.len,
            t.dtype,
            t.offset,
            t.buffer.size()
        )),
    }
}

/// Checks that `arg` is a usable range ([`check_range`]) of `reference`'s length, and f64
/// exactly where `reference` is.
pub(crate) fn check_like(arg: &Arg, reference: &Arg) -> Result<()> {
    check_range(arg)?;
    if arg.tensor.len != reference.tensor.len {
        return Err(Error::LengthMismatch {
            argument: arg.name.clone(),
            got: arg.tensor.len,
            expected: reference.tensor.len,
            reference: reference.name.clone(),
        });
    }
    let f64_call = reference.tensor.dtype == DType::F64;
    if (arg.tensor.dtype == DType::F64) != f64_call {
        return Err(Error::DTypeMismatch {
            argument: arg.name.clone(),
            got: arg.tensor.dtype,
            expected: if f64_call {
                format!("F64 like `{}` (double math needs double tensors)", reference.name)
            } else {
                format!("F32, F16 or BF16 (`{}` is {:?})", reference.name, reference.tensor.dtype)
            },
        });
    }
    Ok(())
}

/// Validates `args` and maps them onto bindings and segments.
pub(crate) fn plan<'a>(ctx: &GpuContext, program: Program, args: &'a KernelArgs) -> Result<TensorPlan> {
    debug_assert_eq!(args.inputs.len(), program.inputs().len());
    debug_assert_eq!(args.outputs.len(), program.outputs().len());
    let present: Vec<&Arg> = args.inputs.iter().chain(&args.outputs).flatten().collect();
    let Some(reference) = present.first().copied() else {
        return Ok(TensorPlan {
            layout: BindingLayout { inputs: vec![], outputs: vec![], bindings: vec![] },
            segments: vec![],
            ordinal: 0,
        });
    };
    for arg in &present {
        check_like(arg, reference)?;
    }
    check_output_dtypes(program, args)?;
    check_aliasing(args)?;

    // One binding per distinct range; read_write wherever its buffer is written.
    let mut distinct: Vec<&Tensor> = Vec::new();
    let mut index_of = |t: &'a Tensor| match distinct.iter().position(|d| *d == t) {
        Some(i) => i,
        None => {
            distinct.push(t);
            distinct.len() - 1
        }
    };
    let inputs: Vec<Option<usize>> =
        args.inputs.iter().map(|a| a.as_ref().map(|a| index_of(&a.tensor))).collect();
    let outputs: Vec<Option<usize>> =
        args.outputs.iter().map(|a| a.as_ref().map(|a| index_of(&a.tensor))).collect();
    let written: Vec<&wgpu::Buffer> = args.outputs.iter().flatten().map(|a| &a.tensor.buffer).collect();
    let bindings: Vec<BindingDesc> = distinct
        .iter()
        .map(|t| BindingDesc { storage: storage(ctx, t.dtype), read_write: written.contains(&&t.buffer) })
        .collect();

    let limits = ctx.device().limits();
    let needed = bindings.len() as u32;
    if needed > limits.max_storage_buffers_per_shader_stage {
        return Err(Error::TooManyBindings { needed, limit: limits.max_storage_buffers_per_shader_stage });
    }

    let layout = BindingLayout { inputs, outputs, bindings };
    // Packed outputs are updated a word at a time; their element parities decide the pairs.
    let parities: Vec<u64> = args
        .outputs
        .iter()
        .zip(&layout.outputs)
        .filter_map(|(arg, b)| Some((arg.as_ref()?, (*b)?)))
        .filter(|(_, b)| matches!(layout.bindings[*b].storage, Storage::Packed(_)))
        .map(|(arg, _)| (arg.tensor.offset / 2) % 2)
        .collect();
    let pair_shift = parities.first().copied().unwrap_or(0) as u32;
    let phases = if parities.iter().all(|&p| p == u64::from(pair_shift)) { 1 } else { 2 };
    for arg in args.inputs.iter().chain(&args.outputs).flatten() {
        check_binding_end(arg)?;
    }
    // The unscale passes check each element for infinities one at a time.
    let vectorizable = !matches!(program, Program::Unscale | Program::UnscaleNorm(_))
        && math_dtype(args) == DType::F32
        && layout.bindings.iter().all(|b| b.storage.dtype() != DType::F64);
    let segments = split_segments(&distinct, &limits, &Split { pair_shift, phases, vectorizable });
    Ok(TensorPlan { layout, segments, ordinal: 0 })
}

/// How a tensor of `dtype` is bound on this context.
pub(crate) fn storage(ctx: &GpuContext, dtype: DType) -> Storage {
    match dtype {
        DType::BF16 => Storage::Packed(DType::BF16),
        DType::F16 if !ctx.native_f16() => Storage::Packed(DType::F16),
        other => Storage::Native(other),
    }
}

/// An output replaces its input, so it keeps the input's dtype; the model copy of
/// master-weight mode is the one output without an input.
fn check_output_dtypes(program: Program, args: &KernelArgs) -> Result<()> {
    for (slot, output) in program.outputs().iter().zip(&args.outputs) {
        let Some(output) = output else { continue };
        let input = program.inputs().iter().position(|s| s == slot).and_then(|k| args.inputs[k].as_ref());
        if let Some(input) = input {
            if input.tensor.dtype != output.tensor.dtype {
                return Err(Error::DTypeMismatch {
                    argument: output.name.clone(),
                    got: output.tensor.dtype,
                    expected: format!("{:?}, the dtype of `{}` it replaces", input.tensor.dtype, input.name),
                });
            }
        }
    }
    Ok(())
}

/// Storage bindings cover whole 4-byte words, so a 16-bit tensor that ends in the middle
/// of a word needs that word to exist.
fn check_binding_end(arg: &Arg) -> Result<()> {
    let end = arg.tensor.byte_range().end;
    if end.next_multiple_of(4) > arg.tensor.buffer.size() {
        return Err(Error::BadRange {
            argument: arg.name.clone(),
            problem: format!(
                "ends at byte {end} of a {}-byte buffer; storage bindings cover whole 4-byte words, \
                 so the buffer must extend to byte {}",
                arg.tensor.buffer.size(),
                end.next_multiple_of(4)
            ),
        });
    }
    Ok(())
}

/// DirectML's rule: an output may be exactly an input (same buffer, offset, length and
/// dtype) or share no byte with any other tensor; two outputs never share memory.
fn check_aliasing(args: &KernelArgs) -> Result<()> {
    let outputs: Vec<&Arg> = args.outputs.iter().flatten().collect();
    for (k, out) in outputs.iter().enumerate() {
        for other in &outputs[k + 1..] {
            if out.tensor.overlaps(&other.tensor) {
                return Err(if out.tensor == other.tensor {
                    Error::OutputsAlias { first: out.name.clone(), second: other.name.clone() }
                } else {
                    Error::PartialOverlap { output: out.name.clone(), other: other.name.clone() }
                });
            }
        }
        for input in args.inputs.iter().flatten() {
            if out.tensor.overlaps(&input.tensor) && out.tensor != input.tensor {
                return Err(Error::PartialOverlap { output: out.name.clone(), other: input.name.clone() });
            }
        }
    }
    Ok(())
}

/// How a tensor's elements are cut into segments.
struct Split {
    pair_shift: u32,
    phases: u32,
    /// Whether the layout allows four elements per access: f32 math over f32, f16 or bf16.
    vectorizable: bool,
}

/// Splits the element range into segments whose bindings fit
/// `max_storage_buffer_binding_size`, each bound at the offset alignment below it. Where
/// every tensor's elements sit at the same position modulo 4 in their buffers, the middle
/// runs four elements per access (`vec4`), with a scalar head and tail of at most three.
fn split_segments(distinct: &[&Tensor], limits: &wgpu::Limits, split: &Split) -> Vec<SegmentPlan> {
    let len = distinct.first().map_or(0, |t| t.len);
    let phase = |t: &Tensor| (t.offset / t.dtype.size()) % 4;
    let congruent = distinct.iter().all(|t| phase(t) == phase(distinct[0]));
    let mut segments = Vec::new();
    if split.vectorizable && congruent && len >= 4 {
        let head = ((4 - phase(distinct[0])) % 4).min(len);
        let main = (len - head) / 4 * 4;
        push_segments(&mut segments, distinct, limits, split, 0, head, 1);
        push_segments(&mut segments, distinct, limits, split, head, main, 4);
        push_segments(&mut segments, distinct, limits, split, head + main, len - head - main, 1);
    } else {
        push_segments(&mut segments, distinct, limits, split, 0, len, 1);
    }
    segments
}

/// Appends segments covering elements `[start, start + count)`, `width` elements per access.
fn push_segments(
    segments: &mut Vec<SegmentPlan>,
    distinct: &[&Tensor],
    limits: &wgpu::Limits,
    split: &Split,
    start: u64,
    count: u64,
    width: u64,
) {
    // vec4 arrays need their binding to start on a 16-byte boundary as well.
    let align = u64::from(limits.min_storage_buffer_offset_alignment).max(if width == 4 { 16 } else { 4 });
    let widest = distinct.iter().map(|t| t.dtype.size()).max().unwrap_or(4);
    // Room for the worst-case shift below the first element; a segment's element count
    // must also fit the u32 index of the shader. A multiple of 4, so that pairs never
    // straddle two segments and vec4 segments hold whole vectors.
    let max_binding = limits.max_storage_buffer_binding_size.min(u64::from(u32::MAX));
    let per_segment = (((max_binding - align) / widest).min(u64::from(u32::MAX >> 1)) & !3).max(4);
    let end = start + count;
    let mut first_element = start;
    while first_element < end {
        let n = per_segment.min(end - first_element);
        let ranges = distinct
            .iter()
            .map(|t| {
                let es = t.dtype.size();
                let first = t.offset + first_element * es;
                let offset = first - first % align;
                let size = (first + n * es - offset).next_multiple_of(4);
                BoundRange {
                    buffer: t.buffer.clone(),
                    offset,
                    size,
                    base: ((first - offset) / (es * width)) as u32,
                }
            })
            .collect();
        segments.push(SegmentPlan {
            len: (n / width) as u32,
            width: width as u32,
            ranges,
            // The parity of this segment's first element in the packed outputs.
            pair_shift: (split.pair_shift + first_element as u32) % 2,
            phases: split.phases,
            first: first_element,
        });
        first_element += n;
    }
}

/// The named tensors of one PyTorch-convention update, before they are put into slots.
pub(crate) struct SlotArgs<'a> {
    pub(crate) param: Arg,
    pub(crate) grad: Arg,
    /// State tensors, one per kind of `kinds`, in that order.
    pub(crate) state: &'a [Arg],
    pub(crate) param_out: Arg,
    pub(crate) state_out: &'a [Arg],
    pub(crate) param_copy: Option<Arg>,
}

/// Places a PyTorch-convention update's tensors into `family`'s slots: state `k` (of kind
/// `kinds[k]`) goes to the slot of that kind; a slot the algorithm keeps no state for is absent.
pub(crate) fn slot_args(family: Family, kinds: &[StateKind], args: SlotArgs<'_>) -> KernelArgs {
    let find =
        |kind: StateKind, state: &[Arg]| kinds.iter().position(|k| *k == kind).map(|k| state[k].clone());
    KernelArgs {
        inputs: family
            .inputs()
            .iter()
            .map(|slot| match *slot {
                Slot::Param => Some(args.param.clone()),
                Slot::Grad => Some(args.grad.clone()),
                Slot::State(kind) => find(kind, args.state),
                Slot::ParamCopy => None,
            })
            .collect(),
        outputs: family
            .outputs()
            .iter()
            .map(|slot| match *slot {
                Slot::Param => Some(args.param_out.clone()),
                Slot::ParamCopy => args.param_copy.clone(),
                Slot::State(kind) => find(kind, args.state_out),
                Slot::Grad => None,
            })
            .collect(),
    }
}

/// The type a call's arithmetic runs in: f64 for double tensors, f32 for every other dtype.
pub(crate) fn math_dtype(args: &KernelArgs) -> DType {
    match args.inputs.iter().chain(&args.outputs).flatten().map(|a| a.tensor.dtype).next() {
        Some(DType::F64) => DType::F64,
        _ => DType::F32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Sgd;

    fn args(tensors: [&Tensor; 4]) -> KernelArgs {
        let [param, grad, buf, param_out] = tensors;
        KernelArgs {
            inputs: vec![
                Some(Arg::new("param", param)),
                Some(Arg::new("grad", grad)),
                Some(Arg::new("buf", buf)),
                None,
            ],
            outputs: vec![Some(Arg::new("param_out", param_out)), Some(Arg::new("buf", buf)), None, None],
        }
    }

    #[test]
    fn packed_outputs_of_different_parity_need_two_phases() {
        // lavapipe runs the lanes of a workgroup one after another, so a lost update from two
        // invocations writing one word cannot be observed there: check the plan instead.
        let ctx = GpuContext::headless_blocking().unwrap_or_else(|e| panic!("{e}")).with_packed_f16(true);
        let buffer = ctx.zeros("b", 64, DType::F16);
        let at = |element: u64| Tensor::new(&buffer.buffer, 2 * element, 8, DType::F16);
        let momentum = Program::Update(Sgd { momentum: 0.9, ..Sgd::default() }.kernel_step(2).switches());
        let same = plan(&ctx, momentum, &args([&at(0), &at(10), &at(20), &at(30)])).unwrap();
        assert!(same.layout.pairs());
        assert_eq!((same.segments[0].pair_shift, same.segments[0].phases), (0, 1));
        let odd = plan(&ctx, momentum, &args([&at(1), &at(11), &at(21), &at(31)])).unwrap();
        assert_eq!((odd.segments[0].pair_shift, odd.segments[0].phases), (1, 1));
        let mixed = plan(&ctx, momentum, &args([&at(0), &at(10), &at(20), &at(31)])).unwrap();
        assert_eq!(mixed.segments[0].phases, 2);
        // Native f16 stores single elements; no pairing is needed. Without SHADER_F16 (GL)
        // f16 stays packed and paired.
        let native = plan(&ctx.with_packed_f16(false), momentum, &args([&at(0), &at(10), &at(20), &at(31)]));
        assert_eq!(native.unwrap().layout.pairs(), !ctx.has_feature(wgpu::Features::SHADER_F16));
    }
}
