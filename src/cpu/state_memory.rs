//! The CPU optimizer's own state tensors. Large ones live in anonymous mappings advised
//! onto transparent huge pages (Linux, `madvise(MADV_HUGEPAGE)` through `memmap2`, where
//! the system's THP mode is `madvise` or `always`): a step streams every state byte once,
//! and 2 MiB pages spare it a TLB miss and a prefetcher restart every 4 KiB. Small tensors
//! and other systems keep ordinary heap memory.

use super::host::{HostSlice, HostSliceMut, HostTensor};
use crate::{DType, Result};

/// Tensors of at least this many bytes are mapped: one huge page. Below it a mapping would
/// hold no whole huge page and cost a system call and a VMA per tensor for nothing.
#[cfg(target_os = "linux")]
const MAPPED_BYTES: usize = 2 << 20;

/// The small page, the span within which 4 KiB aliasing compares addresses.
#[cfg(target_os = "linux")]
const PAGE: usize = 4096;

enum Memory {
    /// Whole words, so that any element type's slice is aligned.
    Heap(Vec<u32>),
    /// Zero-filled when created; the elements start `phase` bytes in.
    #[cfg(target_os = "linux")]
    Mapped { map: memmap2::MmapMut, phase: usize },
}

/// One state tensor: `len` elements of `dtype` (F32, F16 or BF16).
pub(crate) struct StateTensor {
    dtype: DType,
    len: usize,
    memory: Memory,
}

impl StateTensor {
    /// `len` elements of `value` rounded once to `dtype`; F64 is refused as
    /// [`HostTensor::filled`] refuses it. A mapped tensor starts at `phase`'s offset within
    /// a 4 KiB page: give the parameter's, so that the step's streams share one page offset.
    /// (Streams a few bytes apart within a page make the core take loads of one for
    /// stores of another, 4 KiB aliasing, which cost a large step much of its time:
    /// PERF.md.)
    pub(crate) fn filled(dtype: DType, len: usize, value: f64, phase: usize) -> Result<Self> {
        let one = HostTensor::from_f64(dtype, &[value])?;
        let pattern: &[u8] = match &one {
            HostTensor::F32(v) => bytemuck::cast_slice(v),
            HostTensor::F16(v) => bytemuck::cast_slice(v),
            HostTensor::BF16(v) => bytemuck::cast_slice(v),
        };
        let bytes = len * pattern.len();
        let mut tensor = StateTensor { dtype, len, memory: Self::zeroed(bytes, phase) };
        if pattern.iter().any(|b| *b != 0) {
            for element in tensor.bytes_mut().chunks_exact_mut(pattern.len()) {
                element.copy_from_slice(pattern);
            }
        }
        Ok(tensor)
    }

    #[cfg(target_os = "linux")]
    fn zeroed(bytes: usize, phase: usize) -> Memory {
        // Whole words, as the heap's.
        let phase = (phase % PAGE) & !3;
        if bytes >= MAPPED_BYTES {
            if let Ok(map) = memmap2::MmapMut::map_anon(phase + bytes) {
                // Advice only: where THP is off the mapping still works, on small pages.
                if let Err(e) = map.advise(memmap2::Advice::HugePage) {
                    log::debug!("state memory stays on small pages: madvise(MADV_HUGEPAGE): {e}");
                }
                return Memory::Mapped { map, phase };
            }
        }
        Memory::Heap(vec![0; bytes.div_ceil(4)])
    }

    #[cfg(not(target_os = "linux"))]
    fn zeroed(bytes: usize, _phase: usize) -> Memory {
        Memory::Heap(vec![0; bytes.div_ceil(4)])
    }

    /// The storage type of the elements.
    #[cfg_attr(not(feature = "checkpoint"), allow(dead_code))]
    pub(crate) fn dtype(&self) -> DType {
        self.dtype
    }

    /// The elements' bytes, in the host's byte order.
    pub(crate) fn bytes(&self) -> &[u8] {
        let all: &[u8] = match &self.memory {
            Memory::Heap(words) => bytemuck::cast_slice(words),
            #[cfg(target_os = "linux")]
            Memory::Mapped { map, phase } => &map[*phase..],
        };
        &all[..self.len * self.dtype.size() as usize]
    }

    /// The elements' bytes, in the host's byte order, mutably borrowed.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        let end = self.len * self.dtype.size() as usize;
        let all: &mut [u8] = match &mut self.memory {
            Memory::Heap(words) => bytemuck::cast_slice_mut(words),
            #[cfg(target_os = "linux")]
            Memory::Mapped { map, phase } => &mut map[*phase..],
        };
        &mut all[..end]
    }

    /// The elements, shared.
    pub(crate) fn as_slice(&self) -> HostSlice<'_> {
        let bytes = self.bytes();
        match self.dtype {
            DType::F16 => HostSlice::F16(bytemuck::cast_slice(bytes)),
            DType::BF16 => HostSlice::BF16(bytemuck::cast_slice(bytes)),
            _ => HostSlice::F32(bytemuck::cast_slice(bytes)),
        }
    }

    /// The elements, mutably borrowed.
    pub(crate) fn as_mut_slice(&mut self) -> HostSliceMut<'_> {
        let dtype = self.dtype;
        let bytes = self.bytes_mut();
        match dtype {
            DType::F16 => HostSliceMut::F16(bytemuck::cast_slice_mut(bytes)),
            DType::BF16 => HostSliceMut::BF16(bytemuck::cast_slice_mut(bytes)),
            _ => HostSliceMut::F32(bytemuck::cast_slice_mut(bytes)),
        }
    }
}

impl Clone for StateTensor {
    /// A copy in memory of its own, mapped as the original would be.
    fn clone(&self) -> Self {
        let phase = self.bytes().as_ptr() as usize;
        let memory = Self::zeroed(self.bytes().len(), phase);
        let mut copy = StateTensor { dtype: self.dtype, len: self.len, memory };
        copy.bytes_mut().copy_from_slice(self.bytes());
        copy
    }
}

impl std::fmt::Debug for StateTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let memory = match self.memory {
            Memory::Heap(_) => "heap",
            #[cfg(target_os = "linux")]
            Memory::Mapped { .. } => "mapped",
        };
        f.debug_struct("StateTensor")
            .field("dtype", &self.dtype)
            .field("len", &self.len)
            .field("memory", &memory)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn a_large_tensor_is_mapped_at_the_parameters_page_offset_and_holds_its_values() {
        let len = (3 << 20) / 4 + 5;
        let tensor = StateTensor::filled(DType::F32, len, 0.1, 0x1234_5678_9a10).unwrap();
        assert!(matches!(tensor.memory, Memory::Mapped { .. }), "{tensor:?}");
        let HostSlice::F32(values) = tensor.as_slice() else { panic!("{tensor:?}") };
        assert_eq!(values.as_ptr() as usize % PAGE, 0xa10);
        assert_eq!(values.len(), len);
        assert!(values.iter().all(|v| *v == 0.1f32));
        let copy = tensor.clone();
        assert_eq!(copy.bytes(), tensor.bytes());
        assert_eq!(copy.bytes().as_ptr() as usize % PAGE, 0xa10);
    }

    #[test]
    fn small_tensors_stay_on_the_heap_in_every_dtype() {
        for (dtype, bits) in [(DType::F32, 0x3f80_0000u32), (DType::F16, 0x3c00), (DType::BF16, 0x3f80)] {
            let mut tensor = StateTensor::filled(dtype, 7, 1.0, 2).unwrap();
            assert!(matches!(tensor.memory, Memory::Heap(_)), "{tensor:?}");
            assert_eq!(tensor.as_slice().to_f64(), vec![1.0; 7], "{dtype:?}");
            assert_eq!(tensor.as_mut_slice().len(), 7);
            let size = dtype.size() as usize;
            assert_eq!(tensor.bytes()[..size], bits.to_le_bytes()[..size], "{dtype:?}");
        }
        assert!(StateTensor::filled(DType::F64, 7, 1.0, 0).is_err());
    }
}
