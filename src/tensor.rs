//! A tensor is a range of a buffer the caller owns: the crate never copies it.

use crate::DType;

/// A contiguous run of `len` elements of type `dtype`, starting `offset` bytes into `buffer`.
///
/// The buffer belongs to the caller (a trainer's parameter or gradient buffer); cloning a
/// `Tensor` clones the handle, not the memory. Any byte offset that is a multiple of the
/// element size works: the crate binds at the adapter's alignment below it and shifts the
/// index in the shader.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Tensor {
    /// The buffer holding the elements. It needs `BufferUsages::STORAGE`.
    pub buffer: wgpu::Buffer,
    /// Byte offset of the first element.
    pub offset: u64,
    /// Number of elements.
    pub len: u64,
    /// Storage type of each element.
    pub dtype: DType,
}

impl Tensor {
    /// A tensor of `len` elements starting `offset` bytes into `buffer`.
    pub fn new(buffer: &wgpu::Buffer, offset: u64, len: u64, dtype: DType) -> Self {
        Tensor { buffer: buffer.clone(), offset, len, dtype }
    }

    /// The whole buffer as one tensor (its size divided by the element size).
    pub fn whole(buffer: &wgpu::Buffer, dtype: DType) -> Self {
        Tensor::new(buffer, 0, buffer.size() / dtype.size(), dtype)
    }

    /// Size in bytes.
    pub fn byte_len(&self) -> u64 {
        self.len * self.dtype.size()
    }

    /// The byte range `[offset, offset + byte_len)` within the buffer.
    pub fn byte_range(&self) -> std::ops::Range<u64> {
        self.offset..self.offset + self.byte_len()
    }

    /// The sub-tensor of elements `[start, start + len)`.
    pub fn slice(&self, start: u64, len: u64) -> Tensor {
        Tensor {
            buffer: self.buffer.clone(),
            offset: self.offset + start * self.dtype.size(),
            len,
            dtype: self.dtype,
        }
    }

    /// Whether two tensors share at least one byte.
    pub fn overlaps(&self, other: &Tensor) -> bool {
        let (a, b) = (self.byte_range(), other.byte_range());
        self.buffer == other.buffer && !a.is_empty() && !b.is_empty() && a.start < b.end && b.start < a.end
    }

    /// Whether two tensors are exactly the same memory with the same element type.
    pub fn same_range(&self, other: &Tensor) -> bool {
        self == other
    }
}
