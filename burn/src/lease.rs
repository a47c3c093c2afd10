//! A Burn tensor's wgpu buffer as this crate's [`Tensor`], held in place while it is used.

use std::any::Any;

use burn::backend::wgpu::CubeTensor;
use burn::backend::{BackendTypes, Cube};
use burn::cubecl::wgpu::{AutoCompiler, WgpuServer};
use burn::tensor::{DType as BurnDType, Tensor as BurnTensor};
use burn_cubecl::kernel::into_contiguous;

use super::SharedDevice;
use wgpu_optim::{BurnFailure, DType, Error, Result, Tensor};

/// Burn's float primitive, which is a [`CubeTensor`] unless Burn's `fusion` feature wraps it.
type FloatPrimitive = <Cube as BackendTypes>::FloatTensorPrimitive;

/// Burn's cubecl backend type without `fusion`: Burn's `fusion` feature (on in Burn's and
/// burn-wgpu's default features) makes [`Cube`] `Fusion<CubeBackend>`, whose float tensors
/// are lazy handles with no buffer to bind. A cargo feature of another crate is no `cfg`
/// here, but the type it selects is, so that build fails to compile with this message.
#[diagnostic::on_unimplemented(
    message = "wgpu-optim's `burn` feature needs Burn without its `fusion` feature",
    label = "Burn's `fusion` feature is on: it makes this `Fusion<CubeBackend>`",
    note = "Burn's default features (and burn-wgpu's) turn `fusion` on; depend on `burn` with \
            `default-features = false` and name the features you use, e.g. \
            `features = [\"std\", \"wgpu\", \"autodiff\", \"autotune\"]`",
    note = "wgpu-optim binds Burn's tensors' wgpu buffers, which fusion's lazy tensors do not have yet"
)]
trait WithoutFusion {}

impl WithoutFusion for burn_cubecl::CubeBackend {}

const fn without_fusion<B: WithoutFusion>() {}

/// The check itself, at compile time.
const _: () = without_fusion::<Cube>();

/// A buffer range this crate may bind, and the claim that keeps Burn from moving or reusing
/// it until the work that binds it is submitted.
pub(crate) struct Leased {
    /// The range, as the kernels take it.
    pub tensor: Tensor,
    /// Burn's `ManagedResource`: dropping it releases the claim.
    _claim: Box<dyn Any>,
}

/// What a leased tensor is for: a tensor the kernel writes must be contiguous and held by
/// no one else; one it only reads must be contiguous.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    Read,
    Write,
}

/// A Burn float tensor as its cubecl primitive, with what a kernel needs: contiguous, and
/// for [`Access::Write`] its own storage (a copy otherwise). Returns the tensor to give back
/// to Burn (without autodiff: the caller restores a parameter's), and the leased range.
pub(crate) fn lease<const D: usize>(
    shared: &SharedDevice,
    tensor: BurnTensor<D>,
    access: Access,
    what: &str,
) -> Result<(BurnTensor<D>, Leased)> {
    let dtype = bindable(shared, &tensor, what)?;
    // The kernels see values, not a graph: an autodiff tensor is stepped as its inner one.
    let primitive = tensor.inner().try_into_primitive::<Cube>().map_err(|e| Error::Burn {
        cause: BurnFailure::Tensor,
        detail: format!("{what} is not a tensor of Burn's cubecl backend ({e:?})"),
    })?;
    let mut cube = to_cube(primitive)?;
    let owned = access == Access::Read || cube.can_mut();
    if !owned {
        // Someone else holds this storage: they keep the old values.
        log::debug!("wgpu-optim: {what}'s storage is shared with another tensor; stepping a copy");
        cube = cube.copy();
    }
    if !cube.is_contiguous() {
        cube = into_contiguous(cube);
    }
    let len = cube.meta.shape().num_elements() as u64;
    let resource =
        cube.client.get_resource::<WgpuServer<AutoCompiler>>(cube.handle.clone()).map_err(|e| {
            Error::Burn {
                cause: BurnFailure::Tensor,
                detail: format!("{what} is not on Burn's wgpu runtime: {e}"),
            }
        })?;
    let range = resource.resource();
    let leased = Tensor { buffer: range.buffer.clone(), offset: range.offset, len, dtype };
    if leased.byte_len() > range.size {
        return Err(Error::Burn {
            cause: BurnFailure::Tensor,
            detail: format!(
                "{what}'s storage holds {} bytes, fewer than its {len} {dtype:?} elements",
                range.size
            ),
        });
    }
    let tensor = BurnTensor::from_primitive::<Cube>(from_cube(cube));
    Ok((tensor, Leased { tensor: leased, _claim: Box::new(resource) }))
}

/// This crate's dtype of `tensor`, refused ([`Error::Burn`], naming it `what`) where it is not
/// on the shared device or not F32, F16 or BF16.
pub(crate) fn bindable<const D: usize>(
    shared: &SharedDevice,
    tensor: &BurnTensor<D>,
    what: &str,
) -> Result<DType> {
    if tensor.device() != *shared.device() {
        return Err(Error::Burn {
            cause: BurnFailure::Tensor,
            detail: format!(
                "{what} is on {:?}, not on the shared device {:?}",
                tensor.device(),
                shared.device()
            ),
        });
    }
    match tensor.dtype() {
        BurnDType::F32 => Ok(DType::F32),
        BurnDType::F16 => Ok(DType::F16),
        BurnDType::BF16 => Ok(DType::BF16),
        other => Err(Error::Burn {
            cause: BurnFailure::Tensor,
            detail: format!("{what} is {other:?}; expected F32, F16 or BF16"),
        }),
    }
}

fn to_cube(primitive: FloatPrimitive) -> Result<CubeTensor> {
    let boxed: Box<dyn Any> = Box::new(primitive);
    boxed
        .downcast::<CubeTensor>()
        .map(|b| *b)
        // `WithoutFusion` makes the two one type; this is for the compiler, which cannot see it.
        .map_err(|_| Error::Burn {
            cause: BurnFailure::Tensor,
            detail: "Burn's float primitive is not a CubeTensor".into(),
        })
}

fn from_cube(cube: CubeTensor) -> FloatPrimitive {
    let boxed: Box<dyn Any> = Box::new(cube);
    match boxed.downcast::<FloatPrimitive>() {
        Ok(primitive) => *primitive,
        // `to_cube` succeeded, so the two types are one.
        Err(_) => unreachable!("Burn's float primitive is a CubeTensor"),
    }
}
