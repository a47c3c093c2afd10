//! Host memory in the storage types the CPU backend updates: borrowed slices for the
//! caller's parameters and gradients, owned tensors for the optimizer's state.

use half::{bf16, f16};

use crate::{DType, Error, Result};

/// A borrowed run of elements in one of the storage types the CPU backend reads.
///
/// F64 has no variant: the CPU backend computes in f32, as the GPU kernels do for every
/// storage type but f64. `#[non_exhaustive]`, as are [`HostSliceMut`] and [`HostTensor`]:
/// a storage type the CPU backend learns adds a variant.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum HostSlice<'a> {
    /// IEEE binary32 elements.
    F32(&'a [f32]),
    /// IEEE binary16 elements.
    F16(&'a [f16]),
    /// bfloat16 elements.
    BF16(&'a [bf16]),
}

/// A mutably borrowed run of elements in one of the storage types the CPU backend updates.
#[derive(Debug, PartialEq)]
#[non_exhaustive]
pub enum HostSliceMut<'a> {
    /// IEEE binary32 elements.
    F32(&'a mut [f32]),
    /// IEEE binary16 elements.
    F16(&'a mut [f16]),
    /// bfloat16 elements.
    BF16(&'a mut [bf16]),
}

/// An owned tensor in one of the storage types the CPU backend updates (the optimizer's
/// state, or a caller's parameters).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum HostTensor {
    /// IEEE binary32 elements.
    F32(Vec<f32>),
    /// IEEE binary16 elements.
    F16(Vec<f16>),
    /// bfloat16 elements.
    BF16(Vec<bf16>),
}

/// Each element widened exactly to f64.
fn widen<T: Copy>(values: &[T], f: impl Fn(T) -> f64) -> Vec<f64> {
    values.iter().map(|v| f(*v)).collect()
}

impl<'a> HostSlice<'a> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            HostSlice::F32(v) => v.len(),
            HostSlice::F16(v) => v.len(),
            HostSlice::BF16(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The storage type of the elements.
    pub fn dtype(&self) -> DType {
        match self {
            HostSlice::F32(_) => DType::F32,
            HostSlice::F16(_) => DType::F16,
            HostSlice::BF16(_) => DType::BF16,
        }
    }

    /// The first element's address, for placing state at the same offset within a page.
    pub(crate) fn address(&self) -> usize {
        match self {
            HostSlice::F32(v) => v.as_ptr() as usize,
            HostSlice::F16(v) => v.as_ptr() as usize,
            HostSlice::BF16(v) => v.as_ptr() as usize,
        }
    }

    /// The elements widened exactly to f64.
    pub fn to_f64(&self) -> Vec<f64> {
        match self {
            HostSlice::F32(v) => widen(v, f64::from),
            HostSlice::F16(v) => widen(v, f16::to_f64),
            HostSlice::BF16(v) => widen(v, bf16::to_f64),
        }
    }

    /// The first `mid` elements (all of them if there are fewer) and the rest.
    pub(crate) fn split_at(self, mid: usize) -> (Self, Self) {
        let mid = mid.min(self.len());
        match self {
            HostSlice::F32(v) => {
                let (a, b) = v.split_at(mid);
                (HostSlice::F32(a), HostSlice::F32(b))
            }
            HostSlice::F16(v) => {
                let (a, b) = v.split_at(mid);
                (HostSlice::F16(a), HostSlice::F16(b))
            }
            HostSlice::BF16(v) => {
                let (a, b) = v.split_at(mid);
                (HostSlice::BF16(a), HostSlice::BF16(b))
            }
        }
    }
}

impl<'a> HostSliceMut<'a> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The storage type of the elements.
    pub fn dtype(&self) -> DType {
        self.as_slice().dtype()
    }

    /// The same elements, shared.
    pub fn as_slice(&self) -> HostSlice<'_> {
        match self {
            HostSliceMut::F32(v) => HostSlice::F32(v),
            HostSliceMut::F16(v) => HostSlice::F16(v),
            HostSliceMut::BF16(v) => HostSlice::BF16(v),
        }
    }

    /// The same elements, mutably borrowed for a shorter time (to pass on and use again).
    pub fn reborrow(&mut self) -> HostSliceMut<'_> {
        match self {
            HostSliceMut::F32(v) => HostSliceMut::F32(v),
            HostSliceMut::F16(v) => HostSliceMut::F16(v),
            HostSliceMut::BF16(v) => HostSliceMut::BF16(v),
        }
    }

    /// The elements widened exactly to f64.
    pub fn to_f64(&self) -> Vec<f64> {
        self.as_slice().to_f64()
    }

    /// The first `mid` elements (all of them if there are fewer) and the rest.
    pub(crate) fn split_at(self, mid: usize) -> (Self, Self) {
        let mid = mid.min(self.len());
        match self {
            HostSliceMut::F32(v) => {
                let (a, b) = v.split_at_mut(mid);
                (HostSliceMut::F32(a), HostSliceMut::F32(b))
            }
            HostSliceMut::F16(v) => {
                let (a, b) = v.split_at_mut(mid);
                (HostSliceMut::F16(a), HostSliceMut::F16(b))
            }
            HostSliceMut::BF16(v) => {
                let (a, b) = v.split_at_mut(mid);
                (HostSliceMut::BF16(a), HostSliceMut::BF16(b))
            }
        }
    }
}

/// No elements (as f32): the slot of a state tensor an algorithm does not keep.
impl Default for HostSliceMut<'_> {
    fn default() -> Self {
        HostSliceMut::F32(Default::default())
    }
}

impl HostTensor {
    /// `len` elements of `value` rounded once to `dtype` (nearest even).
    ///
    /// F64 is refused with [`Error::DTypeMismatch`] naming `dtype`.
    pub fn filled(dtype: DType, len: usize, value: f64) -> Result<Self> {
        Ok(match Self::from_f64(dtype, &[value])? {
            HostTensor::F32(one) => HostTensor::F32(one.repeat(len)),
            HostTensor::F16(one) => HostTensor::F16(one.repeat(len)),
            HostTensor::BF16(one) => HostTensor::BF16(one.repeat(len)),
        })
    }

    /// `values`, each rounded once to `dtype` (to nearest, ties to even).
    ///
    /// F64 is refused with [`Error::DTypeMismatch`] naming `dtype`.
    pub fn from_f64(dtype: DType, values: &[f64]) -> Result<Self> {
        Ok(match dtype {
            DType::F32 => HostTensor::F32(values.iter().map(|v| *v as f32).collect()),
            DType::F16 => {
                HostTensor::F16(values.iter().map(|v| f16::from_f64(DType::F16.round(*v))).collect())
            }
            // Rounded by the crate first: `bf16::from_f64` can misround just above a tie, but
            // converts a value that already is a bfloat16 exactly.
            DType::BF16 => {
                HostTensor::BF16(values.iter().map(|v| bf16::from_f64(DType::BF16.round(*v))).collect())
            }
            DType::F64 => return Err(not_f64("dtype")),
        })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The storage type of the elements.
    pub fn dtype(&self) -> DType {
        self.as_slice().dtype()
    }

    /// The elements, shared.
    pub fn as_slice(&self) -> HostSlice<'_> {
        match self {
            HostTensor::F32(v) => HostSlice::F32(v),
            HostTensor::F16(v) => HostSlice::F16(v),
            HostTensor::BF16(v) => HostSlice::BF16(v),
        }
    }

    /// The elements, mutably borrowed.
    pub fn as_mut_slice(&mut self) -> HostSliceMut<'_> {
        match self {
            HostTensor::F32(v) => HostSliceMut::F32(v),
            HostTensor::F16(v) => HostSliceMut::F16(v),
            HostTensor::BF16(v) => HostSliceMut::BF16(v),
        }
    }

    /// The elements widened exactly to f64.
    pub fn to_f64(&self) -> Vec<f64> {
        self.as_slice().to_f64()
    }
}

/// The refusal of an f64 storage type, for the argument `argument`.
pub(crate) fn not_f64(argument: &str) -> Error {
    Error::DTypeMismatch {
        argument: argument.into(),
        got: DType::F64,
        expected: "F32, F16 or BF16 (the CPU backend computes in f32)".into(),
    }
}

/// An element type of the host slices: the slice itself, when a slice holds this type.
pub(crate) trait HostElement: Sized {
    fn of<'s>(values: HostSlice<'s>) -> Option<&'s [Self]>;
    fn of_mut<'s>(values: &'s mut HostSliceMut<'_>) -> Option<&'s mut [Self]>;
}

macro_rules! host_from {
    ($($t:ty => $variant:ident),*) => {$(
        impl HostElement for $t {
            fn of<'s>(values: HostSlice<'s>) -> Option<&'s [Self]> {
                match values {
                    HostSlice::$variant(v) => Some(v),
                    _ => None,
                }
            }

            fn of_mut<'s>(values: &'s mut HostSliceMut<'_>) -> Option<&'s mut [Self]> {
                match values {
                    HostSliceMut::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }

        impl<'a> From<&'a [$t]> for HostSlice<'a> {
            fn from(values: &'a [$t]) -> Self {
                HostSlice::$variant(values)
            }
        }

        impl<'a> From<&'a mut [$t]> for HostSliceMut<'a> {
            fn from(values: &'a mut [$t]) -> Self {
                HostSliceMut::$variant(values)
            }
        }

        impl From<Vec<$t>> for HostTensor {
            fn from(values: Vec<$t>) -> Self {
                HostTensor::$variant(values)
            }
        }
    )*};
}

host_from!(f32 => F32, f16 => F16, bf16 => BF16);

impl<'a> From<HostSliceMut<'a>> for HostSlice<'a> {
    fn from(values: HostSliceMut<'a>) -> Self {
        match values {
            HostSliceMut::F32(v) => HostSlice::F32(v),
            HostSliceMut::F16(v) => HostSlice::F16(v),
            HostSliceMut::BF16(v) => HostSlice::BF16(v),
        }
    }
}
