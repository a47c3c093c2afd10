//! Batched matrix products on the device (`shaders/matmul.wgsl`): tiled through workgroup
//! memory, f32 accumulation, every operand addressed by an offset and three strides in one
//! buffer and stored as f32, bfloat16 or f16 ([`MatrixView::dtype`]), so a transposed
//! operand or output is indexing, never a copy, and 16-bit operands move half the bytes; the
//! batch index is the dispatch's z. [`Matmul`] runs any sequence for a caller (and the tests
//! and the bench); a family's passes record products between kernels of their own compiled
//! over the same layout (`MatrixKernels::compile_kernel`), so that one bind group serves both.
//!
//! The per-dispatch parameters are one uniform slot each (`MatmulParams`, or a kernel's own
//! struct), written once, and selected by a dynamic offset: recording a sequence creates
//! nothing.

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use crate::gpu::GpuContext;
use crate::{DType, Error, Result, Tensor};

/// The output tile of one workgroup (rows x columns) and the depth of a step through K.
const TILE_M: u32 = 64;
const TILE_N: u32 = 64;
const TILE_K: u32 = 16;
/// Invocations per side of a product's workgroup (each computes a 4 x 4 block).
const MM_WG: u32 = 16;
/// The storage binding (all operands) and the uniform slot's binding.
const BINDING_DATA: u32 = 0;
const BINDING_PARAMS: u32 = 1;
const _: () = assert!(TILE_M == 4 * MM_WG && TILE_N == 4 * MM_WG);
const _: () = assert!((TILE_M * TILE_K).is_multiple_of(MM_WG * MM_WG) && TILE_M * TILE_K == TILE_K * TILE_N);
/// `D` is added (`beta D`).
const FLAG_ADD: u32 = 1;
/// The result is rounded to bfloat16 before `scale` (the prelude's `FLAG_ROUND_BF16`, which
/// other kernels over the layout may read from their own flags).
pub(crate) const FLAG_ROUND_BF16: u32 = 2;
/// An operand's storage type in `MatmulParams::dtypes` (the prelude's `STORAGE_*`).
const STORAGE_F32: u32 = 0;
const STORAGE_BF16: u32 = 1;
const STORAGE_F16: u32 = 2;
/// Where each operand's two storage bits lie in `MatmulParams::dtypes`.
const SHIFT_A: u32 = 0;
const SHIFT_B: u32 = 2;
const SHIFT_D: u32 = 4;
const SHIFT_C: u32 = 6;
/// Bytes per uniform slot: WebGPU's largest `min_uniform_buffer_offset_alignment`, and the
/// most a kernel's parameter struct may take.
const SLOT: u64 = 256;

/// Where a matrix lies in the data buffer and how it is stored: element `(z, r, c)` is
/// element `offset + z batch + r row + c col` of the buffer seen as an array of `dtype`
/// (for a 16-bit dtype, the low half of a 4-byte word is the even element). A transposed
/// view swaps `row` and `col`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatrixView {
    /// The first element of matrix 0.
    pub offset: u32,
    /// Elements from one matrix of the batch to the next.
    pub batch: u32,
    /// Elements from one row to the next.
    pub row: u32,
    /// Elements from one column to the next.
    pub col: u32,
    /// `F32`, `BF16` or `F16`: the products accumulate in f32 whatever the operands' storage,
    /// and a 16-bit output is rounded to nearest even.
    pub dtype: DType,
}

impl Default for MatrixView {
    fn default() -> Self {
        MatrixView { offset: 0, batch: 0, row: 0, col: 0, dtype: DType::F32 }
    }
}

impl MatrixView {
    /// A row-major `rows` x `cols` f32 matrix at `offset`, the batch's matrices back to back.
    pub fn row_major(offset: u32, rows: u32, cols: u32) -> Self {
        MatrixView { offset, batch: rows * cols, row: cols, col: 1, dtype: DType::F32 }
    }

    /// The same matrices transposed.
    pub fn transposed(self) -> Self {
        MatrixView { row: self.col, col: self.row, ..self }
    }

    /// The same layout stored as `dtype` (its offset and strides counted in `dtype`'s
    /// elements).
    pub fn stored_as(self, dtype: DType) -> Self {
        MatrixView { dtype, ..self }
    }

    /// The largest element index a `rows` x `cols` view of `batch` matrices touches.
    fn last(&self, batch: u32, rows: u32, cols: u32) -> u64 {
        let extent = |n: u32, stride: u32| u64::from(n.saturating_sub(1)) * u64::from(stride);
        u64::from(self.offset) + extent(batch, self.batch) + extent(rows, self.row) + extent(cols, self.col)
    }

    /// The kernels' storage code of this view's dtype.
    fn storage(&self) -> u32 {
        storage_code(self.dtype)
    }
}

/// One batched product `C = scale round(alpha A B + beta D)`: `A` is `m` x `k`, `B` is
/// `k` x `n`, `C` and `D` are `m` x `n`, for `batch` matrices each.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Product {
    /// Rows of `A` and `C`.
    pub m: u32,
    /// Columns of `B` and `C`.
    pub n: u32,
    /// Columns of `A`, rows of `B`.
    pub k: u32,
    /// Matrices in the batch (at most 65535, the dispatch's z).
    pub batch: u32,
    /// The left operand.
    pub a: MatrixView,
    /// The right operand.
    pub b: MatrixView,
    /// The output, which must not overlap `a`, `b` or `d`.
    pub c: MatrixView,
    /// `beta` and `D`, or nothing added.
    pub add: Option<(f32, MatrixView)>,
    /// The product's coefficient.
    pub alpha: f32,
    /// Round the result to bfloat16 (nearest even) before `scale`.
    pub round_bf16: bool,
    /// The factor of the (rounded) result.
    pub scale: f32,
}

impl Product {
    /// `C = A B` for one matrix of each, row-major, not rounded.
    pub fn plain(m: u32, n: u32, k: u32, a: MatrixView, b: MatrixView, c: MatrixView) -> Self {
        Product { m, n, k, batch: 1, a, b, c, add: None, alpha: 1.0, round_bf16: false, scale: 1.0 }
    }

    /// Multiply-adds of the product: `2 m n k` per matrix.
    pub fn flops(&self) -> f64 {
        2.0 * f64::from(self.m) * f64::from(self.n) * f64::from(self.k) * f64::from(self.batch)
    }

    pub(crate) fn params(&self) -> MatmulParams {
        let (beta, d) = self.add.unwrap_or((0.0, MatrixView::default()));
        let flags =
            if self.add.is_some() { FLAG_ADD } else { 0 } | if self.round_bf16 { FLAG_ROUND_BF16 } else { 0 };
        let dtypes = self.a.storage() << SHIFT_A
            | self.b.storage() << SHIFT_B
            | d.storage() << SHIFT_D
            | self.c.storage() << SHIFT_C;
        let [a, b, c, d] = [self.a, self.b, self.c, d].map(|v| [v.offset, v.batch, v.row, v.col]);
        MatmulParams {
            m: self.m,
            n: self.n,
            k: self.k,
            flags,
            a,
            b,
            d,
            c,
            alpha: self.alpha,
            beta,
            scale: self.scale,
            dtypes,
        }
    }

    /// Refuses a product that reads or writes past `bytes`, has an empty or too large batch,
    /// an operand of another dtype than F32, BF16 and F16, or a 16-bit output whose words
    /// two invocations would share.
    fn check(&self, index: usize, bytes: u64) -> Result<()> {
        let bad = |problem: String| Error::BadRange { argument: format!("products[{index}]"), problem };
        if self.batch == 0 || self.batch > 65535 {
            return Err(bad(format!("batch {} is not 1 to 65535", self.batch)));
        }
        let mut views =
            vec![("a", self.a, self.m, self.k), ("b", self.b, self.k, self.n), ("c", self.c, self.m, self.n)];
        if let Some((_, d)) = self.add {
            views.push(("d", d, self.m, self.n));
        }
        for (name, view, rows, cols) in views {
            if !matches!(view.dtype, DType::F32 | DType::BF16 | DType::F16) {
                return Err(Error::DTypeMismatch {
                    argument: format!("products[{index}].{name}"),
                    got: view.dtype,
                    expected: "F32, BF16 or F16".into(),
                });
            }
            let last = view.last(self.batch, rows, cols);
            let len = bytes / view.dtype.size();
            if rows > 0 && cols > 0 && last >= len {
                return Err(bad(format!(
                    "`{name}` reaches {:?} element {last}, past the data's {len}",
                    view.dtype
                )));
            }
        }
        // A 16-bit output is stored a word (two adjacent columns) at a time.
        let c = self.c;
        let even = |x: u32| x.is_multiple_of(2);
        let words_whole = c.col == 1 && even(c.offset) && even(c.row) && (self.batch == 1 || even(c.batch));
        if c.dtype != DType::F32 && !(words_whole && even(self.n)) {
            return Err(bad(format!(
                "a {:?} output needs adjacent columns (col stride 1), an even offset, row stride \
                 and batch stride, and an even column count; got offset {}, strides {}/{}/{}, n {}",
                c.dtype, c.offset, c.batch, c.row, c.col, self.n
            )));
        }
        Ok(())
    }

    fn workgroups(&self) -> (u32, u32, u32) {
        (self.n.div_ceil(TILE_N), self.m.div_ceil(TILE_M), self.batch)
    }
}

/// `shaders/matmul.wgsl`'s `Mm`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(crate) struct MatmulParams {
    m: u32,
    n: u32,
    k: u32,
    flags: u32,
    /// offset, batch, row, col of each operand.
    a: [u32; 4],
    b: [u32; 4],
    d: [u32; 4],
    c: [u32; 4],
    alpha: f32,
    beta: f32,
    scale: f32,
    /// Each operand's `STORAGE_*`, two bits at its `SHIFT_*`.
    dtypes: u32,
}

/// The kernels' storage code (the prelude's `STORAGE_*`) of a matrix stored as `dtype`: F32,
/// BF16 or F16 (any other is refused before it reaches a kernel).
pub(crate) fn storage_code(dtype: DType) -> u32 {
    match dtype {
        DType::BF16 => STORAGE_BF16,
        DType::F16 => STORAGE_F16,
        _ => STORAGE_F32,
    }
}

/// The WGSL declarations every kernel over the layout starts with: the product's parameter
/// struct (its fields as `MatmulParams` lays them out), the tile sizes, bindings, flags and
/// storage codes, the conversions, `round_bf16` and `half_bits`.
pub(crate) fn prelude() -> String {
    let mut s = String::new();
    s.push_str("struct Mm {\n    m: u32,\n    n: u32,\n    k: u32,\n    flags: u32,\n");
    for op in ["a", "b", "d", "c"] {
        for field in ["offset", "batch", "row", "col"] {
            s.push_str(&format!("    {op}_{field}: u32,\n"));
        }
    }
    s.push_str("    alpha: f32,\n    beta: f32,\n    scale: f32,\n    dtypes: u32,\n}\n");
    s.push_str(&format!(
        "const TILE_M: u32 = {TILE_M}u;\nconst TILE_N: u32 = {TILE_N}u;\nconst TILE_K: u32 = {TILE_K}u;\n\
         const MM_WG: u32 = {MM_WG}u;\n\
         const BINDING_DATA: u32 = {BINDING_DATA}u;\nconst BINDING_PARAMS: u32 = {BINDING_PARAMS}u;\n\
         const FLAG_ADD: u32 = {FLAG_ADD}u;\nconst FLAG_ROUND_BF16: u32 = {FLAG_ROUND_BF16}u;\n\
         const STORAGE_F32: u32 = {STORAGE_F32}u;\nconst STORAGE_BF16: u32 = {STORAGE_BF16}u;\n\
         const STORAGE_F16: u32 = {STORAGE_F16}u;\nconst SHIFT_A: u32 = {SHIFT_A}u;\n\
         const SHIFT_B: u32 = {SHIFT_B}u;\nconst SHIFT_D: u32 = {SHIFT_D}u;\nconst SHIFT_C: u32 = {SHIFT_C}u;\n"
    ));
    s.push_str(include_str!("../../shaders/convert.wgsl"));
    s.push_str(include_str!("../../shaders/matrix_common.wgsl"));
    s
}

/// The full WGSL of the product kernel.
pub(crate) fn matmul_wgsl() -> String {
    prelude() + include_str!("../../shaders/matmul.wgsl")
}

/// The product's pipeline and the layout every kernel over the matrices shares: one storage
/// binding (all operands) and one uniform slot selected by a dynamic offset.
pub(crate) struct MatrixKernels {
    layout: wgpu::BindGroupLayout,
    pipeline_layout: wgpu::PipelineLayout,
    matmul: wgpu::ComputePipeline,
}

impl MatrixKernels {
    /// The context's kernels, from its pipeline registry (compiled once per context).
    pub(crate) fn new(ctx: &GpuContext) -> Result<Arc<Self>> {
        ctx.inner.pipelines.get_pass("matrix kernels", || Self::compile(ctx))
    }

    /// [`Self::new`], compiled.
    fn compile(ctx: &GpuContext) -> Result<Self> {
        let device = ctx.device();
        ctx.catch("creating the matrix-product kernels", || {
            let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some("wgpu-optim matmul"),
                entries: &[
                    wgpu::BindGroupLayoutEntry {
                        binding: BINDING_DATA,
                        visibility: wgpu::ShaderStages::COMPUTE,
                        ty: wgpu::BindingType::Buffer {
                            ty: wgpu::BufferBindingType::Storage { read_only: false },
                            has_dynamic_offset: false,
                            min_binding_size: wgpu::BufferSize::new(4),
                        },
                        count: None,
                    },
                    wgpu::BindGroupLayoutEntry {
                        binding: BINDING_PARAMS,
                        visibility: wgpu::ShaderStages::COMPUTE,
                        ty: wgpu::BindingType::Buffer {
                            ty: wgpu::BufferBindingType::Uniform,
                            has_dynamic_offset: true,
                            // A whole slot: every kernel's struct fits one (`slots`).
                            min_binding_size: wgpu::BufferSize::new(SLOT),
                        },
                        count: None,
                    },
                ],
            });
            let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some("wgpu-optim matmul"),
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
            let matmul = pipeline(device, &pipeline_layout, "wgpu-optim matmul", matmul_wgsl());
            MatrixKernels { layout, pipeline_layout, matmul }
        })
    }

    /// Compiles another kernel over the same layout, so that the bind groups of
    /// [`Self::bind`] serve it too: [`prelude`] followed by `body`, whose entry point is
    /// `main` and whose parameter struct (at most a slot) is `BINDING_PARAMS`. The caller
    /// keeps the pipeline (a family's passes, through the context's pipeline registry).
    pub(crate) fn compile_kernel(
        &self,
        ctx: &GpuContext,
        label: &'static str,
        body: &str,
    ) -> Result<wgpu::ComputePipeline> {
        ctx.catch("compiling a matrix kernel", || {
            pipeline(ctx.device(), &self.pipeline_layout, label, prelude() + body)
        })
    }

    /// The bind group of `data` (the whole buffer) with the uniform slots in `uniform`.
    pub(crate) fn bind(
        &self,
        ctx: &GpuContext,
        data: &wgpu::Buffer,
        uniform: &wgpu::Buffer,
    ) -> wgpu::BindGroup {
        ctx.device().create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("wgpu-optim matmul"),
            layout: &self.layout,
            entries: &[
                wgpu::BindGroupEntry { binding: BINDING_DATA, resource: data.as_entire_binding() },
                wgpu::BindGroupEntry {
                    binding: BINDING_PARAMS,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: uniform,
                        offset: 0,
                        size: wgpu::BufferSize::new(SLOT),
                    }),
                },
            ],
        })
    }

    /// Records `product`, whose parameters are uniform slot `slot`.
    pub(crate) fn record_product(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        group: &wgpu::BindGroup,
        slot: u32,
        product: &Product,
    ) {
        record(pass, &self.matmul, group, slot, product.workgroups());
    }
}

/// Records `pipeline` (the product's, or one of [`MatrixKernels::compile_kernel`]) over
/// `group` with its parameters in uniform slot `slot`, `workgroups` of it.
pub(crate) fn record(
    pass: &mut wgpu::ComputePass<'_>,
    pipeline: &wgpu::ComputePipeline,
    group: &wgpu::BindGroup,
    slot: u32,
    (x, y, z): (u32, u32, u32),
) {
    pass.set_pipeline(pipeline);
    pass.set_bind_group(0, group, &[slot * SLOT as u32]);
    pass.dispatch_workgroups(x, y, z);
}

/// A compute pipeline of `source` over `layout`, entry point `main`.
fn pipeline(
    device: &wgpu::Device,
    layout: &wgpu::PipelineLayout,
    label: &str,
    source: String,
) -> wgpu::ComputePipeline {
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(label),
        source: wgpu::ShaderSource::Wgsl(source.into()),
    });
    device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(label),
        layout: Some(layout),
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    })
}

/// Uniform slots of 256 bytes, each holding one `T` (zero-padded).
pub(crate) fn slots<T: Pod>(params: &[T]) -> Vec<u8> {
    const { assert!(std::mem::size_of::<T>() <= SLOT as usize, "a parameter struct fits a slot") };
    let mut bytes = vec![0u8; params.len().max(1) * SLOT as usize];
    for (chunk, p) in bytes.chunks_exact_mut(SLOT as usize).zip(params) {
        chunk[..std::mem::size_of::<T>()].copy_from_slice(bytemuck::bytes_of(p));
    }
    bytes
}

/// A uniform buffer holding `bytes`.
pub(crate) fn uniform_buffer(ctx: &GpuContext, label: &str, bytes: &[u8]) -> wgpu::Buffer {
    use wgpu::util::DeviceExt;
    ctx.device().create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some(label),
        contents: bytes,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
    })
}

/// A sequence of batched products over one buffer, built once and recorded any number
/// of times into a caller's encoder (nothing is read back).
///
/// ```no_run
/// # fn main() -> wgpu_optim::Result<()> {
/// use wgpu_optim::matmul::{Matmul, MatrixView, Product};
/// use wgpu_optim::GpuContext;
/// let ctx = GpuContext::headless_blocking()?;
/// // A (2 x 3), B (3 x 2) and C (2 x 2) back to back.
/// let data = ctx.upload_f32("data", &[1., 2., 3., 4., 5., 6., 1., 0., 0., 1., 1., 1., 0., 0., 0., 0.]);
/// let a = MatrixView::row_major(0, 2, 3);
/// let b = MatrixView::row_major(6, 3, 2);
/// let c = MatrixView::row_major(12, 2, 2);
/// let matmul = Matmul::new(&ctx, &data, &[Product::plain(2, 2, 3, a, b, c)])?;
/// ctx.submit("matmul", |encoder| {
///     matmul.record(encoder);
///     Ok(())
/// })?;
/// # Ok(()) }
/// ```
pub struct Matmul {
    kernels: Arc<MatrixKernels>,
    group: wgpu::BindGroup,
    products: Vec<Product>,
}

impl Matmul {
    /// The products, in order, over `data` (its whole buffer, from offset 0; each operand's
    /// [`MatrixView::dtype`] says how it is stored there, whatever `data`'s dtype). Refused:
    /// another offset, or a product that reaches past `data`, has no or too many matrices,
    /// or a 16-bit output that is not laid out in whole words ([`Error::BadRange`]); an
    /// operand of another dtype than F32, BF16 and F16 ([`Error::DTypeMismatch`]).
    pub fn new(ctx: &GpuContext, data: &Tensor, products: &[Product]) -> Result<Self> {
        if data.offset != 0 {
            return Err(Error::BadRange {
                argument: "data".into(),
                problem: format!(
                    "starts at byte {}, expected 0 (the kernel binds the whole buffer)",
                    data.offset
                ),
            });
        }
        for (i, p) in products.iter().enumerate() {
            p.check(i, data.len * data.dtype.size())?;
        }
        let kernels = MatrixKernels::new(ctx)?;
        let params: Vec<MatmulParams> = products.iter().map(Product::params).collect();
        let uniform = uniform_buffer(ctx, "wgpu-optim matmul params", &slots(&params));
        let group = kernels.bind(ctx, &data.buffer, &uniform);
        Ok(Matmul { kernels, group, products: products.to_vec() })
    }

    /// Records every product, in order, in one compute pass.
    pub fn record(&self, encoder: &mut wgpu::CommandEncoder) {
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("wgpu-optim matmul"),
            timestamp_writes: None,
        });
        for (slot, product) in self.products.iter().enumerate() {
            self.kernels.record_product(&mut pass, &self.group, slot as u32, product);
        }
    }

    /// The floating-point operations of one [`Self::record`].
    pub fn flops(&self) -> f64 {
        self.products.iter().map(Product::flops).sum()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The span of struct `name` in `module`.
    pub(crate) fn span(module: &naga::Module, name: &str) -> u32 {
        module
            .types
            .iter()
            .find(|(_, t)| t.name.as_deref() == Some(name))
            .map(|(_, t)| match &t.inner {
                naga::TypeInner::Struct { span, .. } => *span,
                other => panic!("{name} is {other:?}"),
            })
            .unwrap_or_else(|| panic!("no struct {name}"))
    }

    /// `source` parsed and validated by naga, every check on.
    pub(crate) fn validated(source: &str) -> naga::Module {
        let module = naga::front::wgsl::parse_str(source)
            .unwrap_or_else(|e| panic!("{}\n{source}", e.emit_to_string(source)));
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
            .validate(&module)
            .unwrap_or_else(|e| panic!("{e:?}\n{source}"));
        module
    }

    /// The span of the prelude's `Mm` in a kernel's `module`, as the Rust struct lays it out.
    pub(crate) fn assert_matmul_struct(module: &naga::Module) {
        assert_eq!(span(module, "Mm") as usize, std::mem::size_of::<MatmulParams>());
    }

    #[test]
    fn the_product_kernel_validates_and_its_struct_is_the_rust_one() {
        assert_matmul_struct(&validated(&matmul_wgsl()));
    }

    #[test]
    fn a_product_past_the_data_is_refused() {
        let view = MatrixView::row_major(0, 4, 4);
        let product = Product::plain(4, 4, 4, view, view, MatrixView::row_major(16, 4, 4));
        assert!(product.check(0, 32 * 4).is_ok());
        assert!(matches!(product.check(0, 31 * 4), Err(Error::BadRange { .. })));
        assert!(matches!(Product { batch: 0, ..product }.check(0, 32 * 4), Err(Error::BadRange { .. })));
        // The same views in bfloat16 need half the bytes.
        let half = |v: MatrixView| v.stored_as(DType::BF16);
        let product = Product { a: half(view), b: half(view), c: half(product.c), ..product };
        assert!(product.check(0, 32 * 2).is_ok());
        assert!(matches!(product.check(0, 31 * 2), Err(Error::BadRange { .. })));
    }

    #[test]
    fn a_16_bit_output_that_would_share_words_between_invocations_is_refused() {
        let a = MatrixView::row_major(0, 4, 4);
        let c = MatrixView::row_major(16, 4, 4).stored_as(DType::F16);
        let product = Product::plain(4, 4, 4, a, a, c);
        assert!(product.check(0, 1024).is_ok());
        for bad in [
            Product { c: c.transposed(), ..product },
            Product { c: MatrixView { offset: 17, ..c }, ..product },
            Product { c: MatrixView::row_major(16, 4, 3).stored_as(DType::F16), n: 3, ..product },
            Product { c: MatrixView { batch: 17, ..c }, batch: 2, ..product },
        ] {
            assert!(matches!(bad.check(0, 1024), Err(Error::BadRange { .. })), "{bad:?}");
        }
        let f64_view = Product { a: a.stored_as(DType::F64), ..product };
        assert!(matches!(f64_view.check(0, 1024), Err(Error::DTypeMismatch { .. })));
    }
}
