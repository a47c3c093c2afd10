//! [`ModuleStep`](super::ModuleStep) with 4-bit state ([`Q4States`]): moving a parameter's
//! state between optimizers, and its records under torchao's names, as this crate's own
//! checkpoints hold them (`checkpoint/layout/q4.rs`): a 4-bit state as its flattened
//! `OptimState4bit`, `exp_avg.codes` (U8, two codes per byte, `[numel / 2]`),
//! `exp_avg.scale` (F32, one per block) and `exp_avg.qmap` (F32, the 16 entries, checked on
//! load); a tensor that keeps f32 state as PyTorch names it (`exp_avg`, in its parameter's
//! shape).
//!
//! [`Q4States`]: wgpu_optim::q4::Q4States

use std::collections::BTreeMap;

use burn::tensor::{DType as BurnDType, TensorData};

use wgpu_optim::q4::{map_for, Q4State};
use wgpu_optim::{Algorithm, BurnFailure, Error, Optimizer, QuantizedState, Result, StateKind, StateView};

/// The record names of the parts of a 4-bit state: `{state}.{part}`.
const PARTS: [&str; 3] = ["codes", "scale", "qmap"];

/// Every record leaf of a 4-bit Adam state, for [`super::record`]'s reading: the states
/// 4-bit mode keeps (Adam's two moments) and their parts.
const LEAVES: [&str; 6] = [
    "exp_avg.codes",
    "exp_avg.scale",
    "exp_avg.qmap",
    "exp_avg_sq.codes",
    "exp_avg_sq.scale",
    "exp_avg_sq.qmap",
];

/// `leaf` as one of [`LEAVES`], where it is one.
pub(super) fn record_leaf(leaf: &str) -> Option<&'static str> {
    LEAVES.iter().copied().find(|name| *name == leaf)
}

/// Copies parameter `j`'s 4-bit state in `from` into parameter `i`'s in `to` (the same
/// parameter, another optimizer): through the host, as 8-bit state moves.
pub(super) fn copy(
    algorithm: &Algorithm,
    from: &Optimizer,
    j: usize,
    to: &Optimizer,
    i: usize,
) -> Result<()> {
    for &kind in algorithm.state_kinds() {
        if let Some(state) = from.state(j, kind)?.and_then(StateView::quantized) {
            to.set_state(i, kind, &state)?;
        }
    }
    Ok(())
}

/// Parameter `i`'s states in `optimizer` as record tensors: a 4-bit one as its three parts,
/// an f32 one in the parameter's `shape`.
pub(super) fn read_state(
    algorithm: &Algorithm,
    optimizer: &Optimizer,
    i: usize,
    shape: &[usize],
    lost: impl Fn() -> Error,
) -> Result<BTreeMap<String, TensorData>> {
    let mut tensors = BTreeMap::new();
    for &kind in algorithm.state_kinds() {
        let name = kind.torch_name();
        let Some(StateView::Q4(state)) = optimizer.state(i, kind)? else { return Err(lost()) };
        match state {
            Q4State::F32(values) => {
                tensors.insert(name.to_string(), TensorData::new(values, shape.to_vec()));
            }
            Q4State::Q4 { codes, scale } => {
                let parts = [
                    TensorData::new(codes.clone(), [codes.len()]),
                    TensorData::new(scale.clone(), [scale.len()]),
                    TensorData::new(map_for(kind).to_vec(), [map_for(kind).len()]),
                ];
                for (part, data) in PARTS.iter().zip(parts) {
                    tensors.insert(format!("{name}.{part}"), data);
                }
            }
        }
    }
    Ok(tensors)
}

/// Refused ([`Error::Burn`]) where `names` (a parameter's record tensors) are not, for each
/// state `algorithm` keeps, either the f32 state or all three parts of a 4-bit one.
pub(super) fn check_names<'a>(
    id: u64,
    names: impl IntoIterator<Item = &'a str>,
    algorithm: &Algorithm,
) -> Result<()> {
    let mut got: Vec<&str> = names.into_iter().collect();
    got.sort_unstable();
    let fits = |kinds: &[StateKind]| {
        let mut rest = got.clone();
        for kind in kinds {
            let name = kind.torch_name();
            if let Some(k) = rest.iter().position(|n| *n == name) {
                rest.remove(k);
                continue;
            }
            for part in PARTS {
                let is_part = |n: &&str| n.strip_prefix(name).and_then(|r| r.strip_prefix('.')) == Some(part);
                match rest.iter().position(is_part) {
                    Some(k) => {
                        rest.remove(k);
                    }
                    None => return false,
                }
            }
        }
        rest.is_empty()
    };
    if fits(algorithm.state_kinds()) {
        return Ok(());
    }
    let want: Vec<String> = algorithm
        .state_kinds()
        .iter()
        .map(|k| format!("{0} or {0}.codes, {0}.scale and {0}.qmap", k.torch_name()))
        .collect();
    Err(Error::Burn {
        cause: BurnFailure::Record,
        detail: format!(
            "parameter {id}'s state holds {got:?}, but {} with 4-bit state keeps {}: it is another \
             optimizer's state",
            algorithm.name(),
            want.join("; ")
        ),
    })
}

/// A loaded record's states into `target`'s parameter `i` (whose storage, 4-bit or f32, the
/// optimizer's settings decide; [`Optimizer::set_state`] refuses the other one and a
/// wrong length). Refused ([`Error::Burn`]) where a part has the wrong dtype or a map is not
/// torchao's.
pub(super) fn write_loaded(
    algorithm: &Algorithm,
    target: &Optimizer,
    i: usize,
    id: u64,
    tensors: &BTreeMap<String, TensorData>,
) -> Result<()> {
    for &kind in algorithm.state_kinds() {
        let name = kind.torch_name();
        let part = |part: &str| {
            let key = format!("{name}.{part}");
            tensors.get(&key).ok_or_else(|| bad(id, &key, "is missing"))
        };
        let state = match tensors.get(name) {
            Some(data) => Q4State::F32(floats(id, name, data)?),
            None => {
                let codes = part("codes")?;
                let codes = match codes.dtype() {
                    BurnDType::U8 => codes.as_bytes().to_vec(),
                    other => return Err(bad(id, &format!("{name}.codes"), &format!("is {other:?}, not U8"))),
                };
                let scale = floats(id, &format!("{name}.scale"), part("scale")?)?;
                let qmap = floats(id, &format!("{name}.qmap"), part("qmap")?)?;
                let map = map_for(kind);
                if qmap.iter().map(|v| v.to_bits()).ne(map.iter().map(|v| v.to_bits())) {
                    return Err(bad(
                        id,
                        &format!("{name}.qmap"),
                        &format!("is {qmap:?}, not torchao's map for {name} {map:?}"),
                    ));
                }
                Q4State::Q4 { codes, scale }
            }
        };
        target.set_state(i, kind, &QuantizedState::Q4(state))?;
    }
    Ok(())
}

/// An F32 record tensor's values (from its bytes, which need not be aligned).
fn floats(id: u64, name: &str, data: &TensorData) -> Result<Vec<f32>> {
    if data.dtype() != BurnDType::F32 {
        return Err(bad(id, name, &format!("is {:?}, not F32", data.dtype())));
    }
    let words = data.as_bytes().chunks_exact(4);
    Ok(words.map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect())
}

fn bad(id: u64, name: &str, problem: &str) -> Error {
    Error::Burn {
        cause: BurnFailure::Record,
        detail: format!("parameter {id}'s 4-bit state `{name}` {problem}"),
    }
}
