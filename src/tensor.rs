//! A tensor is a range of a buffer the caller owns: the crate never copies it.

use crate::{DType, Error, Result};

/// A contiguous run of `len` elements of type `dtype`, starting `offset` bytes into `buffer`.
///
/// Offsets are in bytes, lengths in elements. The buffer belongs to the caller (a trainer's
/// parameter or gradient buffer); cloning a `Tensor` clones the handle, not the memory. Any
/// byte offset that is a multiple of the element size works: the crate binds at the
/// adapter's alignment below it and shifts the index in the shader. Bindings and copies
/// cover whole 4-byte words, so the word holding a tensor's last byte must exist in the
/// buffer (a 16-bit tensor of odd length needs 2 bytes of padding after it); every entry
/// that takes a tensor checks this and the range ([`Error::BadRange`]).
///
/// A tensor is four plain values with no invariant of its own (the range is checked against
/// the buffer and the device where the tensor is used), so the fields are public and a
/// struct literal is the one way to name a range by hand; [`Self::whole`],
/// [`Self::from_slice`] and [`Self::from_binding`] derive one from wgpu's own handles.
///
/// ```no_run
/// # fn main() -> wgpu_optim::Result<()> {
/// use wgpu_optim::{DType, GpuContext, Tensor};
/// let ctx = GpuContext::headless_blocking()?;
/// let weights = ctx.zeros("weights", 1024, DType::F16);
/// // Elements 512..1024 of the same buffer: the offset is in bytes, the length in elements.
/// let buffer = weights.buffer.clone();
/// let second_half = Tensor { buffer, offset: 1024, len: 512, dtype: DType::F16 };
/// assert_eq!(second_half, weights.slice(512, 512));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Tensor {
    /// The buffer holding the elements. It needs `BufferUsages::STORAGE`.
    pub buffer: wgpu::Buffer,
    /// Offset of the first element, in bytes (not elements).
    pub offset: u64,
    /// Number of elements (not bytes).
    pub len: u64,
    /// Storage type of each element.
    pub dtype: DType,
}

impl Tensor {
    /// A tensor of `len` elements (a count, not bytes) starting `offset_bytes` bytes into
    /// `buffer`: the crate's shorthand for the struct literal.
    pub(crate) fn new(buffer: &wgpu::Buffer, offset_bytes: u64, len: u64, dtype: DType) -> Self {
        Tensor { buffer: buffer.clone(), offset: offset_bytes, len, dtype }
    }

    /// The whole buffer as one tensor of `buffer.size() / dtype.size()` elements.
    ///
    /// A buffer does not record how many bytes its creator meant: wgpu rounds the size of
    /// `create_buffer_init` (and of `mapped_at_creation`) buffers up to 4 bytes, so a buffer
    /// made from an odd number of 16-bit values holds one more, and `whole` would count that
    /// padding as an element: give such a tensor its length in a struct literal. Refused
    /// ([`Error::BadRange`]) where the size is not a whole number of elements. A buffer of
    /// exactly an odd number of 16-bit elements is refused where the tensor is used: its last
    /// word is incomplete.
    pub fn whole(buffer: &wgpu::Buffer, dtype: DType) -> Result<Self> {
        Tensor::from_bytes(buffer, 0, buffer.size(), dtype, "buffer")
    }

    /// The bytes of a [`wgpu::BufferSlice`] (e.g. `buffer.slice(256..1024)`) as a tensor;
    /// refused ([`Error::BadRange`]) where the slice is not a whole number of elements. The
    /// range is checked against the buffer when the tensor is used.
    pub fn from_slice(slice: wgpu::BufferSlice<'_>, dtype: DType) -> Result<Self> {
        Tensor::from_bytes(slice.buffer(), slice.offset(), slice.size(), dtype, "slice")
    }

    /// The bytes of a [`wgpu::BufferBinding`] as a tensor (`size: None` is the rest of the
    /// buffer); refused ([`Error::BadRange`]) where they are not a whole number of elements.
    pub fn from_binding(binding: &wgpu::BufferBinding<'_>, dtype: DType) -> Result<Self> {
        let rest = binding.buffer.size().checked_sub(binding.offset).ok_or_else(|| Error::BadRange {
            argument: "binding".into(),
            problem: format!(
                "offset {} is past the end of a {}-byte buffer",
                binding.offset,
                binding.buffer.size()
            ),
        })?;
        let bytes = binding.size.map_or(rest, |size| size.get());
        Tensor::from_bytes(binding.buffer, binding.offset, bytes, dtype, "binding")
    }

    /// `bytes` bytes from `offset_bytes` as elements of `dtype`.
    fn from_bytes(
        buffer: &wgpu::Buffer,
        offset_bytes: u64,
        bytes: u64,
        dtype: DType,
        argument: &str,
    ) -> Result<Self> {
        if !bytes.is_multiple_of(dtype.size()) {
            return Err(Error::BadRange {
                argument: argument.into(),
                problem: format!("{bytes} bytes are not a whole number of {dtype:?} elements"),
            });
        }
        Ok(Tensor::new(buffer, offset_bytes, bytes / dtype.size(), dtype))
    }

    /// Size in bytes.
    pub fn byte_len(&self) -> u64 {
        self.len * self.dtype.size()
    }

    /// The byte range `[offset, offset + byte_len)` within the buffer.
    pub(crate) fn byte_range(&self) -> std::ops::Range<u64> {
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
    pub(crate) fn overlaps(&self, other: &Tensor) -> bool {
        let (a, b) = (self.byte_range(), other.byte_range());
        self.buffer == other.buffer && !a.is_empty() && !b.is_empty() && a.start < b.end && b.start < a.end
    }
}
