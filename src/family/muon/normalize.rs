//! Newton-Schulz's first pass on the GPU: `X = U / max(‖U‖_F, eps)`, transposed when tall
//! (`muon_normalize.wgsl`), a kernel over the matrix products' layout
//! ([`MatrixKernels::compile_kernel`]) so that a chunk's one bind group serves it and the
//! products that follow it.

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use crate::gpu::matmul::{self, MatrixKernels, FLAG_ROUND_BF16};
use crate::{DType, GpuContext, Result};

/// Invocations of a normalize workgroup (a power of two: its tree halves them).
const NORM_WG: u32 = 256;
const _: () = assert!(NORM_WG.is_power_of_two());

/// `muon_normalize.wgsl`'s `Norm`: one batch of `rows` x `cols` f32 matrices at `u_offset`,
/// normalized (transposed when tall) into `x_offset`, counted in elements of `x_storage` (a
/// 16-bit X needs an even offset and an even element count).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(crate) struct NormParams {
    pub(crate) rows: u32,
    pub(crate) cols: u32,
    pub(crate) u_offset: u32,
    pub(crate) x_offset: u32,
    pub(crate) flags: u32,
    pub(crate) eps: f32,
    pub(crate) x_storage: u32,
    pub(crate) reserved: u32,
}

impl NormParams {
    /// Every value rounded to bfloat16 (the products' flag of the same name).
    pub(crate) const ROUND_BF16: u32 = FLAG_ROUND_BF16;

    /// The storage code of an X stored as `dtype`.
    pub(crate) fn storage(dtype: DType) -> u32 {
        matmul::storage_code(dtype)
    }
}

/// The kernel's declarations after the products' prelude (`struct Norm`, its fields as
/// [`NormParams`] lays them out, and `NORM_WG`), then its body.
fn body() -> String {
    format!(
        "struct Norm {{\n    rows: u32,\n    cols: u32,\n    u_offset: u32,\n    x_offset: u32,\n    \
         flags: u32,\n    eps: f32,\n    x_storage: u32,\n    reserved: u32,\n}}\n\
         const NORM_WG: u32 = {NORM_WG}u;\n{}",
        super::NORMALIZE_WGSL
    )
}

/// The normalize pass's pipeline, over the products' layout.
pub(crate) struct Normalize {
    pipeline: wgpu::ComputePipeline,
}

impl Normalize {
    /// The context's normalize pipeline over `kernels`' layout (the context's own, from its
    /// pipeline registry): compiled once per context.
    pub(crate) fn new(ctx: &GpuContext, kernels: &MatrixKernels) -> Result<Arc<Self>> {
        ctx.inner.pipelines.get_pass("muon normalize", || {
            let pipeline = kernels.compile_kernel(ctx, "wgpu-optim muon normalize", &body())?;
            Ok(Normalize { pipeline })
        })
    }

    /// Records the pass over `batch` matrices (one workgroup each) of `group`, whose
    /// parameters are uniform slot `slot`.
    pub(crate) fn record(&self, pass: &mut wgpu::ComputePass<'_>, group: &wgpu::BindGroup, slot: u32, batch: u32) {
        matmul::record(pass, &self.pipeline, group, slot, (batch, 1, 1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::matmul::tests::{assert_matmul_struct, span, validated};

    #[test]
    fn the_normalize_kernel_validates_and_its_structs_are_the_rust_ones() {
        let module = validated(&(matmul::prelude() + &body()));
        assert_eq!(span(&module, "Norm") as usize, std::mem::size_of::<NormParams>());
        assert_matmul_struct(&module);
    }
}
