//! Muon on the GPU optimizer: its passes between the gradient and the family's apply pass.
//!
//! Each step of a Muon group, all recorded into the trainer's encoder, nothing read back:
//!
//! 1. the momentum pass (the Muon family's kernel with `MOMENTUM_PASS`): every buffer's
//!    EMA, and `u` (Nesterov's blend or the buffer) into the f32 scratch region `U` of its
//!    matrix, in the parameter's layout;
//! 2. per batch of matrices of one shape (a [`Chunk`]): `X = U / max(‖U‖_F, eps)`, transposed
//!    when tall (`src/family/muon/muon_normalize.wgsl`, one workgroup per matrix, a deterministic
//!    tree);
//! 3. `ns_steps` times `M = X Xᵀ`, `N = b M + c M M`, `X = a X + N X`
//!    (`shaders/matmul.wgsl`, the batch in the dispatch's z), the last product writing
//!    `ratio X` back into `U` in the parameter's layout (transposing by its strides);
//! 4. the family's apply pass, `U` bound as the gradient: `p = p decay - lr U`
//!    (the ordinary update batch of the group, `optimizer::record`).
//!
//! The scratch buffers and every dispatch's parameters are made at build time; in
//! [`NsPrecision::BF16`] every Newton-Schulz result is rounded to bfloat16 and X, M and N
//! are stored as bfloat16 (in f32 where a side of the matrix is odd, so that no word of a
//! 16-bit region is shared by two matrices' rows).

use std::any::Any;

use crate::algo::matrix_shapes;
use crate::gpu::dispatch::Batch;
use crate::gpu::kernel::{Program, Scalars, VariantKey};
use crate::gpu::matmul::{slots, uniform_buffer, MatrixKernels, MatrixView, Product};
use crate::gpu::plan::{plan, slot_args, Arg, SlotArgs};
use super::normalize::{NormParams, Normalize};
use crate::optimizer::passes::{GroupPasses, PassView};
use crate::optimizer::{Group, ParamGroup, BOUND_GRADIENT_SETS};
use crate::step::{Family, Switches};
use crate::{
    Algorithm, DType, Error, GpuContext, Muon, NsPrecision, OptimizerOptions, Result, StateKind, Tensor,
};

/// Refuses, before anything is created, what a Muon group cannot run on the GPU: gradient
/// clipping and parameters without a 2-D shape (`first`: the index of its first parameter).
/// Capturable mode is its `FamilyConfig::check_options`.
pub(crate) fn check_group(group: &ParamGroup, first: usize, options: &OptimizerOptions) -> Result<()> {
    if options.grad_clip.is_some() {
        return Err(Error::ConflictingOptions {
            first: "grad_clip",
            second: "algorithm",
            reason: "Muon normalizes each momentum matrix before Newton-Schulz, so a global \
                     clipping coefficient is not implemented for Muon",
        });
    }
    matrix_shapes(&options.param_shapes, first..first + group.params.len())?;
    Ok(())
}

/// One batch of Muon matrices of one shape in one group, with its scratch and dispatches.
struct Chunk {
    group: usize,
    rows: u32,
    cols: u32,
    batch: u32,
    /// The products of every iteration, in order (3 per iteration).
    products: Vec<Product>,
    /// The configuration the uniform slots were written for.
    written: Muon,
    scratch: wgpu::Buffer,
    uniform: wgpu::Buffer,
    bind_group: wgpu::BindGroup,
}

/// Elements (f32) of scratch per matrix of `rows` x `cols`: U (its layout), two X (min x
/// max) and M, N (min x min). In bfloat16 mode X, M and N take half of their part.
fn scratch_per_matrix(rows: u32, cols: u32) -> u64 {
    let (r, k) = (u64::from(rows.min(cols)), u64::from(rows.max(cols)));
    3 * r * k + 2 * r * r
}

/// How a chunk's X, M and N are stored: bfloat16 in bfloat16 mode (torch's dtype; half the
/// bytes each product moves) where every region is whole words (both sides even), else f32.
fn ns_storage(rows: u32, cols: u32, config: &Muon) -> DType {
    let even = rows.is_multiple_of(2) && cols.is_multiple_of(2);
    if config.ns_precision == NsPrecision::BF16 && even {
        DType::BF16
    } else {
        DType::F32
    }
}

/// The normalize pass's and the products' uniform slots for `nb` matrices of `rows` x
/// `cols` under `config`, and the products in order.
fn dispatches(rows: u32, cols: u32, nb: u32, config: &Muon) -> (Vec<u8>, Vec<Product>) {
    {
        let (r, k) = (rows.min(cols), rows.max(cols));
        // Regions: U (f32), then X0, X1, M, N in `storage`'s elements.
        let u = 0;
        let storage = ns_storage(rows, cols, config);
        let start = nb * rows * cols * (4 / storage.size() as u32);
        let x = [start, start + nb * r * k];
        let m = x[1] + nb * r * k;
        let n = m + nb * r * r;
        let round_bf16 = config.ns_precision == NsPrecision::BF16;
        let norm = NormParams {
            rows,
            cols,
            u_offset: u,
            x_offset: x[0],
            flags: if round_bf16 { NormParams::ROUND_BF16 } else { 0 },
            eps: config.eps as f32,
            x_storage: NormParams::storage(storage),
            reserved: 0,
        };
        let (ca, cb, cc) = config.ns_coefficients;
        let ratio = config.adjust_lr.ratio(rows as usize, cols as usize) as f32;
        let mut products = Vec::with_capacity(3 * config.ns_steps as usize);
        let xv = |i: usize| MatrixView::row_major(x[i], r, k).stored_as(storage);
        let mv = MatrixView::row_major(m, r, r).stored_as(storage);
        let nv = MatrixView::row_major(n, r, r).stored_as(storage);
        let base = Product { batch: nb, round_bf16, ..Product::plain(r, r, k, xv(0), xv(0), mv) };
        for t in 0..config.ns_steps as usize {
            let (cur, next) = (t % 2, 1 - t % 2);
            let last = t + 1 == config.ns_steps as usize;
            // M = X Xᵀ: the transpose is the strides of the same matrix.
            products.push(Product { a: xv(cur), b: xv(cur).transposed(), c: mv, ..base });
            // N = b M + c M M.
            products.push(Product {
                m: r,
                n: r,
                k: r,
                a: mv,
                b: mv,
                c: nv,
                add: Some((cb as f32, mv)),
                alpha: cc as f32,
                ..base
            });
            // X = a X + N X; the last one scaled by the ratio into U, in the parameter's
            // layout (a tall matrix's X is its transpose).
            let (c, scale) = if last {
                let u_view = MatrixView::row_major(u, rows, cols);
                (if rows > cols { u_view.transposed() } else { u_view }, ratio)
            } else {
                (xv(next), 1.0)
            };
            products.push(Product {
                m: r,
                n: k,
                k: r,
                a: nv,
                b: xv(cur),
                c,
                add: Some((ca as f32, xv(cur))),
                alpha: 1.0,
                scale,
                ..base
            });
        }
        let mut bytes = slots(&[norm]);
        bytes.extend(slots(&products.iter().map(Product::params).collect::<Vec<_>>()));
        (bytes, products)
    }
}

/// A Muon group's momentum pass for one gradient set: the group, the switches it was
/// built for, the dispatch.
type MomentumPass = (usize, Switches, Batch);

/// The Muon part of a GPU optimizer: the kernels, every chunk's scratch, each parameter's
/// `U` (the apply pass's gradient), and the momentum passes of recent gradient sets.
#[derive(Default)]
pub(crate) struct MuonGpu {
    /// The Muon groups.
    groups: Vec<usize>,
    kernels: Option<std::sync::Arc<MatrixKernels>>,
    /// The normalize pass, over `kernels`' layout.
    normalize: Option<std::sync::Arc<Normalize>>,
    chunks: Vec<Chunk>,
    /// Parameter i's `U` region (`None` outside Muon groups).
    updates: Vec<Option<Tensor>>,
    /// The momentum pass of each Muon group for a gradient set, most recent first.
    bound: Vec<(Vec<Tensor>, Vec<MomentumPass>)>,
}

impl MuonGpu {
    /// The scratch and dispatches of the Muon groups among `groups` (parameter i's shape is
    /// `shapes[i]`, checked by [`check_group`]).
    fn new(
        ctx: &GpuContext,
        groups: &[(Algorithm, std::ops::Range<usize>)],
        shapes: &[Vec<usize>],
        params: usize,
    ) -> Result<Self> {
        let mut muon = MuonGpu { updates: vec![None; params], ..MuonGpu::default() };
        muon.groups = (0..groups.len()).filter(|&g| matches!(groups[g].0, Algorithm::Muon(_))).collect();
        if muon.groups.is_empty() {
            return Ok(muon);
        }
        let kernels = MatrixKernels::new(ctx)?;
        muon.normalize = Some(Normalize::new(ctx, &kernels)?);
        let limits = ctx.device().limits();
        let max_elements = limits.max_storage_buffer_binding_size.min(limits.max_buffer_size) / 4;
        for (g, (algorithm, range)) in groups.iter().enumerate() {
            let Algorithm::Muon(config) = algorithm else { continue };
            let matrices = matrix_shapes(shapes, range.clone())?;
            // Matrices of one shape together, in parameter order. An empty matrix is not
            // updated (as an empty tensor of any family): it gets no scratch, whose empty
            // binding a bind group refuses, and no `U`, so its apply pass binds its own empty
            // gradient and dispatches nothing.
            let mut by_shape: Vec<((usize, usize), Vec<usize>)> = Vec::new();
            for (i, shape) in range.clone().zip(matrices).filter(|(_, (rows, cols))| rows * cols > 0) {
                match by_shape.iter_mut().find(|(s, _)| *s == shape) {
                    Some((_, list)) => list.push(i),
                    None => by_shape.push((shape, vec![i])),
                }
            }
            for ((rows, cols), list) in by_shape {
                let too_large = || Error::BadShape {
                    param: list[0],
                    shape: vec![rows, cols],
                    algorithm: "Muon",
                    expected: "a matrix whose Newton-Schulz scratch (3 A B + 2 min(A, B)^2 f32) fits the \
                               device's max_storage_buffer_binding_size",
                };
                let (rows, cols) = (
                    u32::try_from(rows).map_err(|_| too_large())?,
                    u32::try_from(cols).map_err(|_| too_large())?,
                );
                let per = scratch_per_matrix(rows, cols);
                let fit = (max_elements / per.max(1)).min(65535) as usize;
                if fit == 0 {
                    return Err(too_large());
                }
                for part in list.chunks(fit) {
                    let batch = part.len() as u32;
                    let scratch = ctx.catch("creating Muon's scratch", || {
                        ctx.zeros("muon scratch", per * u64::from(batch), DType::F32)
                    })?;
                    for (z, &i) in part.iter().enumerate() {
                        let len = u64::from(rows) * u64::from(cols);
                        muon.updates[i] = Some(Tensor {
                            buffer: scratch.buffer.clone(),
                            offset: z as u64 * len * 4,
                            len,
                            dtype: DType::F32,
                        });
                    }
                    let (bytes, products) = dispatches(rows, cols, batch, config);
                    let (uniform, bind_group) = ctx.catch("creating Muon's bind groups", || {
                        let uniform = uniform_buffer(ctx, "wgpu-optim muon params", &bytes);
                        let bind_group = kernels.bind(ctx, &scratch.buffer, &uniform);
                        (uniform, bind_group)
                    })?;
                    muon.chunks.push(Chunk {
                        group: g,
                        rows,
                        cols,
                        batch,
                        products,
                        written: *config,
                        scratch: scratch.buffer.clone(),
                        uniform,
                        bind_group,
                    });
                }
            }
        }
        muon.kernels = Some(kernels);
        Ok(muon)
    }

    /// Parameter i's orthogonalized update, which the apply pass binds as its gradient.
    fn update(&self, i: usize) -> Option<&Tensor> {
        self.updates.get(i).and_then(Option::as_ref)
    }

    /// Records the momentum passes (of `bound[0]`) and every chunk's Newton-Schulz passes.
    fn record(&self, pass: &mut wgpu::ComputePass<'_>, scalars: &[wgpu::BindGroup]) {
        let (Some(kernels), Some(normalize)) = (&self.kernels, &self.normalize) else { return };
        if let Some((_, batches)) = self.bound.first() {
            for (g, _, batch) in batches {
                batch.record(pass, &scalars[*g]);
            }
        }
        for chunk in &self.chunks {
            normalize.record(pass, &chunk.bind_group, 0, chunk.batch);
            for (slot, product) in chunk.products.iter().enumerate() {
                kernels.record_product(pass, &chunk.bind_group, slot as u32 + 1, product);
            }
        }
    }
}

impl MuonGpu {
    /// Before recording a step with `grads`: the momentum passes for them (built on first
    /// use, kept for the last few sets), and every chunk's dispatches rewritten if its
    /// group's hyperparameters changed.
    fn bind_grads(&mut self, view: &PassView<'_>, grads: &[Tensor]) -> Result<()> {
        let Some(kernels) = &self.kernels else { return Ok(()) };
        let configs: Vec<Option<Muon>> = view
            .groups
            .iter()
            .map(|g| match g.algorithm {
                Algorithm::Muon(c) => Some(c),
                _ => None,
            })
            .collect();
        for chunk in &mut self.chunks {
            if let Some(config) = configs[chunk.group] {
                if config != chunk.written {
                    // The slots grow only with ns_steps; a larger count needs a larger buffer.
                    let (bytes, products) = dispatches(chunk.rows, chunk.cols, chunk.batch, &config);
                    if bytes.len() as u64 > chunk.uniform.size() {
                        let ctx = view.ctx;
                        let (uniform, bind_group) = ctx.catch("creating Muon's bind groups", || {
                            let uniform = uniform_buffer(ctx, "wgpu-optim muon params", &bytes);
                            let bind_group = kernels.bind(ctx, &chunk.scratch, &uniform);
                            (uniform, bind_group)
                        })?;
                        chunk.uniform = uniform;
                        chunk.bind_group = bind_group;
                    } else {
                        view.ctx.queue().write_buffer(&chunk.uniform, 0, &bytes);
                    }
                    chunk.products = products;
                    chunk.written = config;
                }
            }
        }
        let switches = |g: usize| configs[g].map(|c| c.momentum_step().switches());
        if let Some(k) = self.bound.iter().position(|(set, batches)| {
            set == grads && batches.iter().all(|(g, s, _)| switches(*g) == Some(*s))
        }) {
            let hit = self.bound.remove(k);
            self.bound.insert(0, hit);
            return Ok(());
        }
        let mut batches = Vec::new();
        for (g, group) in view.groups.iter().enumerate() {
            let Algorithm::Muon(config) = &group.algorithm else { continue };
            let step = config.momentum_step();
            let program = Program::Update(step.switches());
            let mut items = Vec::with_capacity(group.len);
            for (i, grad) in grads.iter().enumerate().skip(group.first).take(group.len) {
                let Some(u) = self.update(i) else { continue };
                let u = Arg::new(format!("muon scratch[{i}]"), u);
                let buffer = [Arg::new(format!("momentum_buffer[{i}]"), &view.state[i][0])];
                let args = slot_args(
                    Family::Muon,
                    &[StateKind::MomentumBuffer],
                    SlotArgs {
                        param: u.clone(),
                        grad: Arg::new(format!("grads[{i}]"), grad),
                        state: &buffer,
                        param_out: u,
                        state_out: &buffer,
                        param_copy: None,
                    },
                );
                let mut tensor_plan = plan(view.ctx, program, &args)?;
                tensor_plan.ordinal = i as u32;
                let key = VariantKey::new(Scalars::Host, program, view.math, tensor_plan.layout.clone())
                    .with_stochastic(view.rounding.stochastic());
                items.push((key, tensor_plan));
            }
            batches.push((g, step.switches(), Batch::build(view.ctx, &items, "muon momentum")?));
        }
        self.bound.truncate(BOUND_GRADIENT_SETS - 1);
        self.bound.insert(0, (grads.to_vec(), batches));
        Ok(())
    }
}

/// The passes of the Muon groups among `groups` (parameter i's shape is `shapes[i]`,
/// checked by [`check_group`]); `None` without such a group.
pub(crate) fn build(
    ctx: &GpuContext,
    groups: &[Group],
    params: &[Tensor],
    shapes: &[Vec<usize>],
) -> Result<Option<Box<dyn GroupPasses>>> {
    if !groups.iter().any(|g| matches!(g.algorithm, Algorithm::Muon(_))) {
        return Ok(None);
    }
    let ranges: Vec<_> = groups.iter().map(|g| (g.algorithm, g.first..g.first + g.len)).collect();
    Ok(Some(Box::new(MuonGpu::new(ctx, &ranges, shapes, params.len())?)))
}

impl GroupPasses for MuonGpu {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn family(&self) -> Family {
        Family::Muon
    }

    fn bind(&mut self, view: &PassView<'_>, grads: &[Tensor]) -> Result<()> {
        self.bind_grads(view, grads)
    }

    /// The momentum and Newton-Schulz passes, before the apply pass.
    fn record_before(&self, pass: &mut wgpu::ComputePass<'_>, scalars: &[wgpu::BindGroup]) {
        self.record(pass, scalars);
    }

    fn checks_gradients(&self, g: usize) -> bool {
        self.groups.contains(&g)
    }

    /// The apply pass binds the orthogonalized update.
    fn gradient(&self, i: usize) -> Option<&Tensor> {
        self.update(i)
    }
}
