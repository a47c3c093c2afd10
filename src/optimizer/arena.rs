//! The optimizer's state tensors, packed into a few shared buffers instead of one buffer
//! each, so that the updates of many tensors bind the same buffers and run as one
//! multi-tensor dispatch (see `gpu::table`).

use crate::{DType, GpuContext, Tensor};

/// Zeroed tensors of `len` elements of each request's dtype, in request order. Tensors are
/// packed into buffers no larger than one storage binding, each at a storage-binding offset
/// boundary (256 bytes by default) plus its parameter's element position modulo 4: the state and its parameter then line
/// up for `vec4` access, and 16-bit ones pair up on the same words (one phase, not two).
/// No two tensors share a 4-byte word, nor the bound range of another's binding: a binding
/// starts at the boundary below its tensor, and WebGPU refuses two writable bindings of one
/// dispatch whose ranges overlap (Dawn checks it; wgpu's native backends do not). A tensor
/// larger than a binding gets a buffer of its own (its updates are split into segments anyway).
pub(super) fn allocate(ctx: &GpuContext, label: &str, requests: &[(&Tensor, DType)]) -> Vec<Tensor> {
    let limits = ctx.device().limits();
    let capacity = limits.max_storage_buffer_binding_size.min(limits.max_buffer_size) & !255;
    let align = u64::from(limits.min_storage_buffer_offset_alignment).max(16);
    // (buffer index, byte offset) of each request, then each buffer's size.
    let mut places = Vec::with_capacity(requests.len());
    let mut sizes: Vec<u64> = Vec::new();
    let mut open: Option<usize> = None;
    for (param, dtype) in requests {
        let phase = (param.offset / param.dtype.size()) % 4;
        let lead = phase * dtype.size();
        let bytes = lead + param.len * dtype.size();
        let fits = |end: u64| end.next_multiple_of(align) + bytes <= capacity;
        match open {
            Some(b) if fits(sizes[b]) => {
                let start = sizes[b].next_multiple_of(align);
                places.push((b, start + lead));
                sizes[b] = (start + bytes).next_multiple_of(4);
            }
            _ => {
                places.push((sizes.len(), lead));
                sizes.push(bytes.next_multiple_of(4));
                if bytes <= capacity {
                    open = Some(sizes.len() - 1);
                }
            }
        }
    }
    let buffers: Vec<wgpu::Buffer> = sizes
        .iter()
        .enumerate()
        .map(|(b, size)| {
            ctx.device().create_buffer(&wgpu::BufferDescriptor {
                label: Some(&format!("{label} {b}")),
                size: (*size).max(4),
                usage: crate::TENSOR_USAGES,
                mapped_at_creation: false,
            })
        })
        .collect();
    requests
        .iter()
        .zip(places)
        .map(|((param, dtype), (b, offset))| Tensor::new(&buffers[b], offset, param.len, *dtype))
        .collect()
}
