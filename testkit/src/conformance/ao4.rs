//! Running a `torchao.AdamW4bit` trajectory: `steps` steps from torchao's zero state, then
//! the parameters (`param_out`), each tensor's states (4-bit: unpacked codes and scales
//! under torchao's names, `exp_avg_codes`, `exp_avg_scale`, ...; f32 below `min_size` or
//! off whole blocks: `exp_avg`, `exp_avg_sq`) and the two maps (`qmap1`, `qmap2`), on the
//! oracle, the CPU backend or the GPU (each tensor in a buffer of its own, or all packed at
//! odd offsets: 4-bit state has no stateless operator).

#[cfg(feature = "cpu")]
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostTensor};
use wgpu_optim::q4::{self, Q4State, Q4States};
use wgpu_optim::{Adam, Error, GpuContext, Optimizer, Result, StateKind, StateStorage, StateView};

use super::case::{Case, Kind, Op};
use super::inputs::Inputs;
use super::run::Backend;
use crate::oracle::{ao4, ToLibrary, ToOracle};

/// The op this module runs: its name, kind and every attribute it reads.
pub(super) const OP: Op = Op { name: "torchao.AdamW4bit", kind: Kind::Trajectory, attributes: &["lr", "betas", "eps", "weight_decay", "amsgrad", "block_size"] };

type Outputs = Vec<(String, Vec<f64>)>;

/// The case's AdamW and 4-bit settings, with torchao's defaults; AMSGrad is refused.
fn config(case: &Case) -> Result<(Adam, Q4States)> {
    let (beta1, beta2) = case.attr_pair("betas", (0.9, 0.999))?;
    if case.attr_bool("amsgrad", false)? {
        return Err(case.bad("refused: amsgrad with 4-bit state is not implemented".into()));
    }
    let block_size = case.attr_f64("block_size", q4::BLOCK_SIZE as f64)?;
    if block_size.fract() != 0.0 || !(1.0..=1e6).contains(&block_size) {
        return Err(case.bad(format!("attribute `block_size` = {block_size} is not a block size")));
    }
    let adam = Adam {
        lr: case.attr_f64("lr", 1e-3)?,
        beta1,
        beta2,
        eps: case.attr_f64("eps", 1e-8)?,
        weight_decay: case.attr_f64("weight_decay", 0.01)?,
        decoupled_weight_decay: true,
        amsgrad: false,
        maximize: false,
    };
    Ok((adam, Q4States { block_size: block_size as usize, min_size: q4::MIN_SIZE }))
}

/// Runs the case on `backend` and names its outputs as the file does.
pub(super) async fn trajectory(case: &Case, backend: Backend, ctx: Option<&GpuContext>) -> Result<Outputs> {
    let (adam, config) = config(case)?;
    let kinds = [StateKind::ExpAvg, StateKind::ExpAvgSq];
    let (n, steps) = (case.count, case.steps);
    let inputs = Inputs::read(case)?;
    let mut finals: Vec<(Vec<f64>, Vec<Q4State>)> = Vec::with_capacity(n);
    match (backend, ctx) {
        (Backend::Oracle, _) => {
            for (i, mut values) in inputs.initial().into_iter().enumerate() {
                let zeros = || ao4::zeros(values.len(), config.block_size, config.min_size as usize);
                let (mut m, mut v) = (zeros(), zeros());
                for k in 0..steps {
                    ao4::ao4_adam_step(
                        &adam.to_oracle(),
                        k as u64 + 1,
                        config.block_size,
                        &mut values,
                        inputs.grad(i, k),
                        &mut m,
                        &mut v,
                    )
                    .map_err(|e| e.to_library())?;
                }
                finals.push((values, vec![m.to_library(), v.to_library()]));
            }
        }
        #[cfg(feature = "cpu")]
        (Backend::Cpu, _) => {
            let mut tensors = inputs.host_params()?;
            let views: Vec<HostSlice<'_>> = tensors.iter().map(HostTensor::as_slice).collect();
            let mut optimizer =
                CpuOptimizer::builder().state_storage(StateStorage::Q4(config)).build(adam, &views)?;
            for k in 0..steps {
                inputs.cpu_step(&mut optimizer, &mut tensors, k)?;
            }
            for (i, t) in tensors.iter().enumerate() {
                let states = kinds
                    .iter()
                    .map(|kind| {
                        optimizer
                            .state(i, *kind)
                            .and_then(|s| s.q4())
                            .cloned()
                            .ok_or_else(|| case.bad("missing state".into()))
                    })
                    .collect::<Result<_>>()?;
                finals.push((t.to_f64(), states));
            }
        }
        (_, None) => return Err(Error::MissingArgument { argument: "ctx", why: "by the GPU backends" }),
        (_, Some(ctx)) => {
            let (param_tensors, grad_tensors) = inputs.gpu_tensors(ctx, backend.in_place()).await?;
            let mut optimizer = Optimizer::builder().state_storage(StateStorage::Q4(config)).build(
                ctx,
                adam,
                &param_tensors,
            )?;
            for k in 0..steps {
                inputs.write_grads(ctx, &grad_tensors, k).await?;
                optimizer.step(&grad_tensors)?;
            }
            for (i, param) in param_tensors.iter().enumerate() {
                let mut states = Vec::with_capacity(kinds.len());
                for kind in kinds {
                    let state = optimizer.state_async(i, kind).await?.and_then(StateView::q4);
                    states.push(state.ok_or_else(|| case.bad("missing state".into()))?);
                }
                finals.push((ctx.read_async(param).await?, states));
            }
        }
    }
    let mut outputs: Outputs = Vec::new();
    for (i, (param, states)) in finals.into_iter().enumerate() {
        outputs.push((format!("param_out.{i}"), param));
        for (kind, state) in kinds.iter().zip(states) {
            let name = kind.torch_name();
            match state {
                Q4State::Q4 { codes, scale } => {
                    let codes = ao4::unpack(&codes);
                    outputs.push((format!("{name}_codes.{i}"), codes.into_iter().map(f64::from).collect()));
                    outputs.push((format!("{name}_scale.{i}"), scale.into_iter().map(f64::from).collect()));
                }
                Q4State::F32(values) => {
                    outputs.push((format!("{name}.{i}"), values.into_iter().map(f64::from).collect()));
                }
            }
        }
    }
    // The maps: the oracle's own, or the crate's.
    let maps = match backend {
        Backend::Oracle => [ao4::signed_map(), ao4::unsigned_map()],
        _ => [q4::signed_map(), q4::unsigned_map()],
    };
    for (k, map) in maps.iter().enumerate() {
        outputs.push((format!("qmap{}", k + 1), map.iter().map(|&x| f64::from(x)).collect()));
    }
    Ok(outputs)
}
