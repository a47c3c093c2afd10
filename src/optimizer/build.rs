//! Construction: options checked, master weights read, state laid out in shared buffers and
//! initialized, uniforms written for step 1.

use super::clip::ClipPass;
use super::device::DeviceState;
use super::record::write_rounding;
use super::validate::{check_disjoint, check_params, check_rounding_options};
use super::written::WrittenRanges;
use super::{arena, Group, Optimizer, ParamGroup};
use crate::gpu::dispatch::{DeviceScalars, Uniforms};
use crate::gpu::plan::{check_range, Arg};
use crate::gpu::q4::Q4Engine;
use crate::gpu::q8::Q8Engine;
use crate::gpu::transfer::check_readable;
use crate::step::UNIFORM_SLOT_BYTES;
use crate::validate::{check_rounding_dtypes, check_shapes};
use crate::{Algorithm, DType, Error, GpuContext, OptimizerOptions, Result, Rounding, StateStorage, Tensor};

impl Optimizer {
    /// [`OptimizerBuilder::build_groups_async`](super::OptimizerBuilder::build_groups_async):
    /// in master-weight mode the model's tensors are read with awaited readbacks first.
    pub(super) async fn with_groups_async(
        ctx: &GpuContext,
        groups: Vec<ParamGroup>,
        options: OptimizerOptions,
    ) -> Result<Self> {
        let mut read = None;
        if options.master_weights {
            let mut values = Vec::new();
            for p in groups.iter().flat_map(|g| &g.params) {
                // A tensor that cannot be read is refused below, by name, before any reading.
                match ctx.read_async(p).await {
                    Ok(v) => values.push(v),
                    Err(_) => break,
                }
            }
            if values.len() == groups.iter().map(|g| g.params.len()).sum::<usize>() {
                read = Some(values);
            }
        }
        Self::with_groups_read(ctx, groups, options, read)
    }

    /// [`OptimizerBuilder::build_groups`](super::OptimizerBuilder::build_groups), in
    /// master-weight mode with the model's values already `read`
    /// (in parameter order) when given.
    pub(super) fn with_groups_read(
        ctx: &GpuContext,
        groups: Vec<ParamGroup>,
        options: OptimizerOptions,
        read: Option<Vec<Vec<f64>>>,
    ) -> Result<Self> {
        for group in &groups {
            group.algorithm.validate()?;
        }
        for group in &groups {
            group.algorithm.check_options(&options)?;
        }
        let mut first = 0;
        for group in &groups {
            group.algorithm.check_gpu_group(group, first, &options)?;
            first += group.params.len();
        }
        let algorithms: Vec<Algorithm> = groups.iter().map(|g| g.algorithm).collect();
        let fused_clip = crate::step::clip::fused_clip(options.grad_clip, &algorithms)?;
        check_rounding_options(&options)?;
        if options.state_storage.q8().is_some() {
            let dtypes = groups.iter().flat_map(|g| g.params.iter().map(|p| p.dtype));
            crate::q8::check_options(&algorithms, &options, dtypes)?;
        }
        if let Some(config) = &options.state_storage.q4() {
            let algorithms: Vec<Algorithm> = groups.iter().map(|g| g.algorithm).collect();
            let dtypes = groups.iter().flat_map(|g| g.params.iter().map(|p| p.dtype));
            crate::q4::check_options(config, &algorithms, &options, dtypes)?;
        }
        let (groups, options) = master_copies(ctx, groups, options, read)?;
        let params: Vec<Tensor> = groups.iter().flat_map(|g| g.params.iter().cloned()).collect();
        let math = check_params(&params, &options)?;
        check_shapes(&options.param_shapes, &params.iter().map(|p| p.len).collect::<Vec<_>>())?;
        check_rounding_dtypes(options.rounding, params.iter().map(|p| p.dtype), "params")?;
        if options.capturable && math == DType::F64 {
            return Err(Error::DTypeMismatch {
                argument: "params".into(),
                got: DType::F64,
                expected:
                    "F32, F16 or BF16 in capturable mode (the device computes the step's scalars in f32)"
                        .into(),
            });
        }
        let device = if options.capturable {
            Some(DeviceState::new(ctx, &groups.iter().map(|g| g.algorithm.lr()).collect::<Vec<_>>())?)
        } else {
            None
        };
        // Every parameter's state tensors, kind by kind, so that each kind's tensors sit
        // together in the shared buffers.
        let kinds = groups.iter().map(|g| g.algorithm.state_kinds().len()).max().unwrap_or(0);
        let mut requests = Vec::new();
        let q8 = match options.state_storage.q8() {
            Some(config) => {
                let algorithms: Vec<Algorithm> = groups.iter().map(|g| g.algorithm).collect();
                let owners: Vec<usize> = groups
                    .iter()
                    .enumerate()
                    .flat_map(|(g, group)| group.params.iter().map(move |_| g))
                    .collect();
                let clip = fused_clip.is_some();
                Some(Q8Engine::new(ctx, config, &params, &owners, &algorithms, clip)?)
            }
            None => None,
        };
        let q4 = match options.state_storage.q4() {
            Some(config) => {
                let algorithms: Vec<Algorithm> = groups.iter().map(|g| g.algorithm).collect();
                let owners: Vec<usize> = groups
                    .iter()
                    .enumerate()
                    .flat_map(|(g, group)| group.params.iter().map(move |_| g))
                    .collect();
                let clip = fused_clip.is_some();
                Some(Q4Engine::new(ctx, config, &params, &owners, &algorithms, clip)?)
            }
            None => None,
        };
        // 8-bit state lives in the engine.
        let kinds = if q8.is_some() { 0 } else { kinds };
        // So does 4-bit state.
        let kinds = if q4.is_some() { 0 } else { kinds };
        for k in 0..kinds {
            for group in &groups {
                let kinds = group.algorithm.state_kinds();
                for p in group.params.iter().filter(|_| k < kinds.len()) {
                    requests.push((p, options.state_storage.dtype().unwrap_or(p.dtype)));
                }
            }
        }
        // Kahan compensations last, each in its parameter's dtype.
        let kahan = options.rounding == Rounding::Kahan;
        for group in groups.iter().filter(|_| kahan) {
            requests.extend(group.params.iter().map(|p| (p, p.dtype)));
        }
        // In error scopes: a state buffer the device cannot make (out of memory) is this
        // build's error, not one for the device's uncaptured-error handler.
        let mut allocated = ctx
            .catch("creating the optimizer state", || arena::allocate(ctx, "optimizer state", &requests))?
            .into_iter();
        let mut state: Vec<Vec<Tensor>> = groups
            .iter()
            .flat_map(|g| g.params.iter().map(|_| Vec::with_capacity(g.algorithm.state_kinds().len())))
            .collect();
        for k in 0..kinds {
            let mut i = 0;
            for group in &groups {
                for _ in &group.params {
                    if k < group.algorithm.state_kinds().len() {
                        state[i].extend(allocated.next());
                    }
                    i += 1;
                }
            }
        }
        for tensors in state.iter_mut().filter(|_| kahan) {
            tensors.extend(allocated.next());
        }
        if let Some(engine) = &q8 {
            for (i, (tensors, group)) in
                state.iter_mut().zip(groups.iter().flat_map(|g| g.params.iter().map(move |_| g))).enumerate()
            {
                for kind in group.algorithm.state_kinds() {
                    tensors.extend(engine.f32_state(i, *kind));
                }
            }
        }
        if let Some(engine) = &q4 {
            for (i, (tensors, group)) in
                state.iter_mut().zip(groups.iter().flat_map(|g| g.params.iter().map(move |_| g))).enumerate()
            {
                for kind in group.algorithm.state_kinds() {
                    tensors.extend(engine.f32_state(i, *kind));
                }
            }
        }
        let mut kept = Vec::with_capacity(groups.len());
        let mut uniform_bytes = vec![0u8; groups.len() * UNIFORM_SLOT_BYTES as usize];
        let mut first = 0;
        for (group, bytes) in
            groups.into_iter().zip(uniform_bytes.chunks_exact_mut(UNIFORM_SLOT_BYTES as usize))
        {
            let initial = group.algorithm.initial_state();
            if initial != 0.0 {
                for (p, tensors) in group.params.iter().zip(&state[first..]) {
                    for tensor in tensors.iter().take(group.algorithm.state_kinds().len()) {
                        ctx.write(tensor, &vec![initial; p.len as usize])?;
                    }
                }
            }
            // Capturable kernels derive the step's values on the device from step 1's.
            group.algorithm.kernel_step(1).write_uniform(math, bytes);
            write_rounding(options.rounding, 1, bytes);
            kept.push(Group { algorithm: group.algorithm, first, len: group.params.len(), dirty: false });
            first += group.params.len();
        }
        let scalars = device.as_ref().map(|d| DeviceScalars {
            state: d.buffer(),
            lr_offsets: (0..kept.len()).map(|g| d.lr_offset(g)).collect(),
        });
        let clip = fused_clip
            .map(|c| ClipPass::new(ctx, c, device.as_ref().map(DeviceState::buffer)))
            .transpose()?;
        let uniforms =
            Uniforms::new(ctx, &uniform_bytes, "optimizer", scalars, clip.as_ref().map(ClipPass::buffer))?;
        let passes = super::passes::build(ctx, &kept, &params, &options.param_shapes)?;
        let mut optimizer = Optimizer {
            ctx: ctx.clone(),
            groups: kept,
            params,
            model_copies: options.model_copies,
            shapes: options.param_shapes,
            state,
            step: 0,
            math,
            uniforms,
            uniform_bytes,
            bound: Vec::new(),
            device,
            clip,
            norm_taken_by_unscale: false,
            rounding: options.rounding,
            origins: options.origins,
            q8,
            q4,
            written: WrittenRanges::default(),
            disjoint_grads: Vec::new(),
            passes,
        };
        optimizer.written = WrittenRanges::new(&optimizer);
        Ok(optimizer)
    }
}

/// Master-weight mode ([`OptimizerBuilder::master_weights`]): checks the model's tensors
/// and replaces them in their groups by f32 masters read from them, the model's tensors
/// becoming the model copies. Other modes pass through unchanged.
pub(super) fn master_copies(
    ctx: &GpuContext,
    groups: Vec<ParamGroup>,
    mut options: OptimizerOptions,
    read: Option<Vec<Vec<f64>>>,
) -> Result<(Vec<ParamGroup>, OptimizerOptions)> {
    if !options.master_weights {
        return Ok((groups, options));
    }
    if !options.model_copies.is_empty() {
        return Err(Error::ConflictingOptions {
            first: "master_weights",
            second: "model_copies",
            reason: "master-weight mode makes the f32 masters itself and writes the parameters given \
                     as the model copies; give one or the other",
        });
    }
    let model: Vec<Arg> = groups
        .iter()
        .flat_map(|g| &g.params)
        .enumerate()
        .map(|(i, p)| Arg::new(format!("model_params[{i}]"), p))
        .collect();
    if model.is_empty() {
        return Err(Error::NoParameters { argument: "model_params".into() });
    }
    for arg in &model {
        check_range(arg)?;
        check_readable(arg)?;
        if arg.tensor.dtype == DType::F64 {
            return Err(Error::DTypeMismatch {
                argument: arg.name.clone(),
                got: DType::F64,
                expected: "F32, F16 or BF16 (the masters are f32)".into(),
            });
        }
    }
    check_disjoint(&model)?;
    let mut next = 0;
    let mut masters = Vec::with_capacity(groups.len());
    for group in groups {
        let mut params = Vec::with_capacity(group.params.len());
        for p in &group.params {
            let values = match read.as_ref().and_then(|read| read.get(next)) {
                Some(values) => values.clone(),
                None => ctx.read(p)?,
            };
            params.push(ctx.upload(&format!("master[{next}]"), &values, DType::F32));
            next += 1;
        }
        masters.push(ParamGroup { algorithm: group.algorithm, params });
    }
    options.model_copies = model.into_iter().map(|arg| arg.tensor).collect();
    if options.state_storage == StateStorage::ParamDtype {
        options.state_storage = StateStorage::Dtype(DType::F32);
    }
    options.master_weights = false;
    Ok((masters, options))
}
