//! The binding plan of one tensor's update: validation, DirectML's aliasing rule, and the
//! split into segments that each fit one storage binding.
//!
//! wgpu tracks usage per buffer and per dispatch, and rejects a buffer bound read-only and
//! read-write at once even for disjoint ranges; two read-write bindings of one buffer are
//! fine. So identical ranges share one binding, and every binding of a buffer that is
//! written anywhere in the dispatch is `read_write`.

use crate::gpu::kernel::{BindingDesc, BindingLayout, Family};
use crate::gpu::GpuContext;
use crate::{DType, Error, Result, Tensor};

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

/// The tensors of one kernel call, in the family's slot order; `None` is an absent slot.
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
    pub(crate) len: u32,
    pub(crate) ranges: Vec<BoundRange>,
}

/// The validated plan for one tensor's update.
#[derive(Clone, Debug)]
pub(crate) struct TensorPlan {
    pub(crate) layout: BindingLayout,
    pub(crate) segments: Vec<SegmentPlan>,
}

/// Checks that `arg` is a usable storage range of its buffer.
pub(crate) fn check_range(arg: &Arg) -> Result<()> {
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
        Some(end) if end <= t.buffer.size() => {}
        _ => {
            return bad(format!(
                "{} {:?} elements at byte offset {} do not fit in a buffer of {} bytes",
                t.len,
                t.dtype,
                t.offset,
                t.buffer.size()
            ))
        }
    }
    if !t.buffer.usage().contains(wgpu::BufferUsages::STORAGE) {
        return Err(Error::MissingUsage {
            argument: arg.name.clone(),
            needed: "STORAGE",
            has: format!("{:?}", t.buffer.usage()),
        });
    }
    Ok(())
}

/// Validates `args` and maps them onto bindings and segments.
pub(crate) fn plan<'a>(ctx: &GpuContext, family: Family, args: &'a KernelArgs) -> Result<TensorPlan> {
    debug_assert_eq!(args.inputs.len(), family.inputs().len());
    debug_assert_eq!(args.outputs.len(), family.outputs().len());
    let present: Vec<&Arg> = args.inputs.iter().chain(&args.outputs).flatten().collect();
    let Some(reference) = present.first().copied() else {
        return Ok(TensorPlan {
            layout: BindingLayout { inputs: vec![], outputs: vec![], bindings: vec![] },
            segments: vec![],
        });
    };
    for arg in &present {
        check_range(arg)?;
        if arg.tensor.len != reference.tensor.len {
            return Err(Error::LengthMismatch {
                argument: arg.name.clone(),
                got: arg.tensor.len,
                expected: reference.tensor.len,
                reference: reference.name.clone(),
            });
        }
        if arg.tensor.dtype != reference.tensor.dtype {
            return Err(Error::DTypeMismatch {
                argument: arg.name.clone(),
                got: arg.tensor.dtype,
                expected: format!("{:?} like `{}`", reference.tensor.dtype, reference.name),
            });
        }
    }
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
        .map(|t| BindingDesc { dtype: t.dtype, read_write: written.contains(&&t.buffer) })
        .collect();

    let limits = ctx.device().limits();
    let needed = bindings.len() as u32;
    if needed > limits.max_storage_buffers_per_shader_stage {
        return Err(Error::TooManyBindings { needed, limit: limits.max_storage_buffers_per_shader_stage });
    }

    let segments = split_segments(&distinct, &limits);
    Ok(TensorPlan { layout: BindingLayout { inputs, outputs, bindings }, segments })
}

/// DirectML's rule: an output may be exactly an input (same buffer, offset, length and
/// dtype) or share no byte with any other tensor; two outputs never share memory.
fn check_aliasing(args: &KernelArgs) -> Result<()> {
    let outputs: Vec<&Arg> = args.outputs.iter().flatten().collect();
    for (k, out) in outputs.iter().enumerate() {
        for other in &outputs[k + 1..] {
            if out.tensor.overlaps(&other.tensor) {
                return Err(if out.tensor.same_range(&other.tensor) {
                    Error::OutputsAlias { first: out.name.clone(), second: other.name.clone() }
                } else {
                    Error::PartialOverlap { output: out.name.clone(), other: other.name.clone() }
                });
            }
        }
        for input in args.inputs.iter().flatten() {
            if out.tensor.overlaps(&input.tensor) && !out.tensor.same_range(&input.tensor) {
                return Err(Error::PartialOverlap { output: out.name.clone(), other: input.name.clone() });
            }
        }
    }
    Ok(())
}

/// Splits the element range so that every binding of a segment fits
/// `max_storage_buffer_binding_size`, binding each range at the offset alignment below it.
fn split_segments(distinct: &[&Tensor], limits: &wgpu::Limits) -> Vec<SegmentPlan> {
    let len = distinct.first().map_or(0, |t| t.len);
    let align = u64::from(limits.min_storage_buffer_offset_alignment);
    let widest = distinct.iter().map(|t| t.dtype.size()).max().unwrap_or(4);
    // Room for the worst-case shift below the first element; a segment's element count
    // must also fit the u32 index of the shader.
    let max_binding = limits.max_storage_buffer_binding_size.min(u64::from(u32::MAX));
    let per_segment = ((max_binding - align) / widest).min(u64::from(u32::MAX >> 1)).max(1);
    let mut segments = Vec::new();
    let mut start = 0;
    while start < len {
        let count = per_segment.min(len - start);
        let ranges = distinct
            .iter()
            .map(|t| {
                let es = t.dtype.size();
                let first = t.offset + start * es;
                let offset = first - first % align;
                let end = first + count * es;
                let size = (end - offset).next_multiple_of(4).min(t.buffer.size() - offset);
                BoundRange { buffer: t.buffer.clone(), offset, size, base: ((first - offset) / es) as u32 }
            })
            .collect();
        segments.push(SegmentPlan { len: count as u32, ranges });
        start += count;
    }
    segments
}

/// The storage dtype every tensor of a plan shares (for the variant key).
pub(crate) fn plan_dtype(args: &KernelArgs) -> Option<DType> {
    args.inputs.iter().chain(&args.outputs).flatten().map(|a| a.tensor.dtype).next()
}
