//! Optimizer records in Burn's format: burnpack, one `{param_id}.{leaf}` entry per state
//! tensor and scalar, as `ModuleOptimizer::into_bytes` writes them. [`FusedOptimizer`] and
//! [`ModuleStep`] read and write the same records, and read Burn's own Adam and AdamW ones.
//!
//! [`FusedOptimizer`]: super::FusedOptimizer
//! [`ModuleStep`]: super::ModuleStep

use std::collections::BTreeMap;

use burn::tensor::{Bytes, DType as BurnDType, TensorData};
use burn_pack::{Reader, Scalar, Writer};

use wgpu_optim::{Algorithm, BurnFailure, DType, Error, Result, Rounding, ScheduleFreeScalars, StateKind};

/// Burn's name for the scalar that holds a parameter's rank.
const RANK: &str = "__rank";

/// This crate's step count, counted from 1 as PyTorch and Burn count it.
pub(crate) const TIME: &str = "time";

/// Burn's Adam and AdamW keep the same quantities as PyTorch's Adam (the first moment, the
/// uncentered second moment, AMSGrad's running maximum, the step count from 1) under these
/// names: its `AdaptiveMomentumState`.
pub(crate) const BURN_ADAM: [(&str, &str); 3] = [
    ("momentum.moment_1", "exp_avg"),
    ("momentum.moment_2", "exp_avg_sq"),
    ("momentum.max_moment_2", "max_exp_avg_sq"),
];

/// Burn's Adam and AdamW step count.
pub(crate) const BURN_ADAM_TIME: &str = "momentum.time";

/// Schedule-Free AdamW's running values (the `schedulefree` package's group values; the
/// step count is `k`), kept per parameter: every tensor a Burn optimizer steps sees the
/// same rate sequence, so its values are its group's.
pub(crate) const WEIGHT_SUM: &str = "weight_sum";
/// See [`WEIGHT_SUM`].
pub(crate) const LR_MAX: &str = "lr_max";
/// Whether the parameter held y (train mode) when the record was saved.
pub(crate) const TRAIN_MODE: &str = "train_mode";

/// One parameter's state in a record, under PyTorch's names.
#[derive(Clone, Debug)]
pub(crate) struct ParamRecord {
    pub rank: usize,
    pub time: u64,
    pub tensors: BTreeMap<String, TensorData>,
    /// Schedule-Free AdamW's values, when the record has them.
    pub schedule_free: Option<ScheduleFreeRecord>,
}

/// A parameter's Schedule-Free values in a record.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct ScheduleFreeRecord {
    pub weight_sum: f64,
    pub lr_max: f64,
    /// `None` in records that do not say (a [`FusedOptimizer`](super::FusedOptimizer)'s).
    pub train_mode: Option<bool>,
}

impl ParamRecord {
    /// Schedule-Free's group values of this parameter (`k` its step count).
    pub(crate) fn scalars(&self) -> Option<ScheduleFreeScalars> {
        self.schedule_free.map(|r| ScheduleFreeScalars {
            k: self.time,
            weight_sum: r.weight_sum,
            lr_max: r.lr_max,
        })
    }
}

/// Every parameter's state in `bytes`, Burn's Adam and AdamW names translated. Refused
/// ([`Error::Burn`], naming the entry) where an entry is neither this crate's state nor
/// Burn's Adam or AdamW state, or a parameter has state but no step count.
pub(crate) fn read(bytes: Bytes) -> Result<BTreeMap<u64, ParamRecord>> {
    let reader = Reader::from_bytes(bytes).map_err(|e| Error::Burn {
        cause: BurnFailure::Record,
        detail: format!("not a Burn optimizer record: {e}"),
    })?;
    let mut ranks = BTreeMap::new();
    let mut times = BTreeMap::new();
    let mut floats: BTreeMap<(u64, &str), f64> = BTreeMap::new();
    let mut modes = BTreeMap::new();
    for (name, value) in reader.scalars() {
        let (id, leaf) = split(name)?;
        let counts = match leaf {
            RANK => &mut ranks,
            TIME | BURN_ADAM_TIME => &mut times,
            WEIGHT_SUM | LR_MAX => {
                let value = f64::try_from(*value).map_err(|_| Error::Burn {
                    cause: BurnFailure::Record,
                    detail: format!("the record's `{name}` is {value:?}, not a number"),
                })?;
                floats.insert((id, if leaf == WEIGHT_SUM { WEIGHT_SUM } else { LR_MAX }), value);
                continue;
            }
            TRAIN_MODE => {
                let value = bool::try_from(*value).map_err(|_| Error::Burn {
                    cause: BurnFailure::Record,
                    detail: format!("the record's `{name}` is {value:?}, not a boolean"),
                })?;
                modes.insert(id, value);
                continue;
            }
            other => return Err(foreign(id, other)),
        };
        let value = u64::try_from(*value).map_err(|_| Error::Burn {
            cause: BurnFailure::Record,
            detail: format!("the record's `{name}` is {value:?}, not a count"),
        })?;
        counts.insert(id, value);
    }
    let tensors = reader.into_tensors().map_err(|e| Error::Burn {
        cause: BurnFailure::Record,
        detail: format!("reading the record: {e}"),
    })?;
    let mut states: BTreeMap<u64, ParamRecord> = BTreeMap::new();
    for tensor in tensors {
        let (name, dtype, shape, _, bytes) = tensor.into_parts().map_err(|e| Error::Burn {
            cause: BurnFailure::Record,
            detail: format!("reading the record: {e}"),
        })?;
        let (id, leaf) = split(&name)?;
        let ours = translate(leaf).ok_or_else(|| foreign(id, leaf))?;
        let state = states.entry(id).or_insert_with(|| ParamRecord {
            rank: shape.num_dims(),
            time: 0,
            tensors: BTreeMap::new(),
            schedule_free: None,
        });
        state.tensors.insert(ours.to_string(), TensorData::from_bytes(bytes, shape, dtype));
    }
    for (id, rank) in ranks {
        let rank = usize::try_from(rank).map_err(|_| Error::Burn {
            cause: BurnFailure::Record,
            detail: format!("parameter {id}'s rank {rank}"),
        })?;
        states
            .entry(id)
            .or_insert_with(|| ParamRecord { rank, time: 0, tensors: BTreeMap::new(), schedule_free: None })
            .rank = rank;
    }
    for (id, state) in &mut states {
        state.time = *times.get(id).ok_or_else(|| Error::Burn {
            cause: BurnFailure::Record,
            detail: format!("parameter {id}'s state in the record has no step count"),
        })?;
        let (weight_sum, lr_max) = (floats.remove(&(*id, WEIGHT_SUM)), floats.remove(&(*id, LR_MAX)));
        state.schedule_free = match (weight_sum, lr_max) {
            (Some(weight_sum), Some(lr_max)) => {
                Some(ScheduleFreeRecord { weight_sum, lr_max, train_mode: modes.remove(id) })
            }
            (None, None) => None,
            _ => {
                return Err(Error::Burn {
                    cause: BurnFailure::Record,
                    detail: format!("parameter {id}'s state in the record has one of weight_sum and lr_max"),
                })
            }
        };
    }
    if let Some(((id, leaf), _)) = floats.into_iter().next() {
        return Err(Error::Burn {
            cause: BurnFailure::Record,
            detail: format!("the record's `{id}.{leaf}` belongs to no parameter's state"),
        });
    }
    Ok(states)
}

/// The record of `states` (rank, step count, tensors by PyTorch's name), as Burn's
/// `ModuleOptimizer::into_bytes` writes a [`FusedOptimizer`](super::FusedOptimizer)'s.
pub(crate) fn write(states: BTreeMap<u64, ParamRecord>) -> Result<Bytes> {
    let mut tensors = Vec::new();
    let mut scalars = Vec::new();
    for (id, state) in states {
        scalars.push((format!("{id}.{RANK}"), Scalar::from(state.rank)));
        scalars.push((format!("{id}.{TIME}"), Scalar::from(state.time)));
        if let Some(sf) = state.schedule_free {
            scalars.push((format!("{id}.{WEIGHT_SUM}"), Scalar::from(sf.weight_sum)));
            scalars.push((format!("{id}.{LR_MAX}"), Scalar::from(sf.lr_max)));
            if let Some(train_mode) = sf.train_mode {
                scalars.push((format!("{id}.{TRAIN_MODE}"), Scalar::from(train_mode)));
            }
        }
        for (name, data) in state.tensors {
            let (bytes, shape, dtype) = data.into_parts();
            tensors.push(burn_pack::Tensor::new(format!("{id}.{name}"), dtype, shape, Some(id), bytes));
        }
    }
    let mut writer = Writer::new(tensors);
    for (key, value) in scalars {
        writer = writer.with_scalar(&key, value);
    }
    writer
        .into_bytes()
        .map_err(|e| Error::Burn { cause: BurnFailure::Record, detail: format!("writing the record: {e}") })
}

/// The state tensors a parameter of rank `rank` keeps under `algorithm` (the one that steps
/// it: [`super::fallback::algorithm_for`]), by PyTorch's name: the algorithm's for a
/// parameter of that rank (Adafactor's factored `row_var` and `col_var` from rank 2 on, its
/// `variance` below), and the Kahan compensation where `rounding` keeps one.
pub(crate) fn param_names(algorithm: &Algorithm, rank: usize, rounding: Rounding) -> Vec<&'static str> {
    // Only the rank decides which states a shape keeps; the lengths are checked at the
    // parameter's step.
    let shape = vec![1; rank];
    let mut names: Vec<&str> = algorithm.param_state_kinds(&shape).iter().map(|k| k.torch_name()).collect();
    if rounding == Rounding::Kahan {
        names.push(StateKind::KahanCompensation.torch_name());
    }
    names
}

/// The shape a state tensor of `kind` has in the record for a parameter of `shape`:
/// Adafactor's factored states have their own ([`wgpu_optim::adafactor_state_shapes`]), every other
/// state the parameter's.
pub(crate) fn state_shape(kind: StateKind, shape: &[usize]) -> Vec<usize> {
    let shapes = wgpu_optim::adafactor_state_shapes(shape);
    match kind {
        StateKind::RowVar if shapes.len() == 2 => shapes[0].clone(),
        StateKind::ColVar if shapes.len() == 2 => shapes[1].clone(),
        _ => shape.to_vec(),
    }
}

/// Refused ([`Error::Burn`]) where `state` does not hold exactly the tensors `expected`
/// names: another algorithm's state would otherwise be dropped, or missing moments
/// restarted from zero, without a word.
pub(crate) fn check_names<'a>(
    id: u64,
    names: impl IntoIterator<Item = &'a str>,
    expected: &[&str],
    algorithm: &Algorithm,
) -> Result<()> {
    let mut got: Vec<&str> = names.into_iter().collect();
    got.sort_unstable();
    let mut want = expected.to_vec();
    want.sort_unstable();
    if got == want {
        return Ok(());
    }
    Err(Error::Burn {
        cause: BurnFailure::Record,
        detail: format!(
            "parameter {id}'s state holds {got:?}, but {} keeps {want:?}: it is another optimizer's state",
            algorithm.name()
        ),
    })
}

/// Refused ([`Error::Burn`]) where a parameter's Schedule-Free values do not fit
/// `algorithm`: a schedule-free state stepped at least once needs them (its next step's
/// averaging weight depends on them), and no other algorithm keeps them.
pub(crate) fn check_schedule_free(id: u64, state: &ParamRecord, algorithm: &Algorithm) -> Result<()> {
    let schedule_free = algorithm.keeps_group_values();
    match (&state.schedule_free, schedule_free) {
        (None, true) if state.time > 0 => Err(Error::Burn {
            cause: BurnFailure::Record,
            detail: format!(
                "parameter {id}'s state has no weight_sum and lr_max, which Schedule-Free AdamW needs                  to continue"
            ),
        }),
        (Some(_), false) => Err(Error::Burn {
            cause: BurnFailure::Record,
            detail: format!(
                "parameter {id}'s state has Schedule-Free's weight_sum and lr_max, but the optimizer runs {}",
                algorithm.name()
            ),
        }),
        (Some(sf), true) => ScheduleFreeScalars { k: state.time, weight_sum: sf.weight_sum, lr_max: sf.lr_max }.check_fits(algorithm),
        _ => Ok(()),
    }
}

/// This crate's dtype of a record tensor.
pub(crate) fn dtype_of(data: &TensorData) -> Result<DType> {
    match data.dtype() {
        BurnDType::F64 => Ok(DType::F64),
        BurnDType::F32 => Ok(DType::F32),
        BurnDType::F16 => Ok(DType::F16),
        BurnDType::BF16 => Ok(DType::BF16),
        other => Err(Error::Burn {
            cause: BurnFailure::Record,
            detail: format!("a state tensor in the record is {other:?}, not a float"),
        }),
    }
}

/// Burn's dtype of one of the library's; a dtype Burn has no float for is refused.
pub(crate) fn burn_dtype(dtype: DType) -> Result<BurnDType> {
    Ok(match dtype {
        DType::F64 => BurnDType::F64,
        DType::F32 => BurnDType::F32,
        DType::F16 => BurnDType::F16,
        DType::BF16 => BurnDType::BF16,
        other => {
            return Err(Error::Burn {
                cause: BurnFailure::Record,
                detail: format!("a state tensor of {other:?}, which Burn's records do not hold"),
            })
        }
    })
}

/// `{id}.{leaf}` split at its first dot.
fn split(name: &str) -> Result<(u64, &str)> {
    name.split_once('.').and_then(|(id, leaf)| Some((id.parse().ok()?, leaf))).ok_or_else(|| Error::Burn {
        cause: BurnFailure::Record,
        detail: format!("the record's entry `{name}` is not `{{param_id}}.{{name}}`"),
    })
}

/// PyTorch's name of a record's state tensor, for this crate's names and Burn's Adam's.
fn translate(leaf: &str) -> Option<&'static str> {
    state_kind(leaf)
        .map(StateKind::torch_name)
        .or_else(|| BURN_ADAM.iter().find(|(burn, _)| *burn == leaf).map(|(_, ours)| *ours))
        .or_else(|| super::q4::record_leaf(leaf))
}

fn foreign(id: u64, leaf: &str) -> Error {
    Error::Burn {
        cause: BurnFailure::Record,
        detail: format!(
            "parameter {id}'s state in the record has `{leaf}`, which is neither wgpu-optim's state \
         (`time`, `exp_avg`, `exp_avg_sq`, ...) nor Burn's Adam or AdamW state \
         (`momentum.moment_1`, `momentum.moment_2`, `momentum.time`): another optimizer's state \
         cannot be continued"
        ),
    }
}

/// The state kind PyTorch names `name`.
pub(crate) fn state_kind(name: &str) -> Option<StateKind> {
    StateKind::ALL.iter().copied().find(|k| k.torch_name() == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(tensors: &[&str], scalars: &[(&str, u64)]) -> Bytes {
        let tensors = tensors
            .iter()
            .map(|name| {
                let (bytes, shape, dtype) = TensorData::new(vec![1.0f32, 2.0, 3.0], [3]).into_parts();
                burn_pack::Tensor::new(name.to_string(), dtype, shape, Some(7), bytes)
            })
            .collect();
        let mut writer = Writer::new(tensors);
        for (key, value) in scalars {
            writer = writer.with_scalar(key, Scalar::from(*value));
        }
        writer.into_bytes().unwrap()
    }

    #[test]
    fn burns_adam_state_reads_as_pytorchs_names_with_its_step_count() {
        let bytes = record(
            &["7.momentum.moment_1", "7.momentum.moment_2"],
            &[("7.momentum.time", 5), ("7.__rank", 1)],
        );
        let states = read(bytes).unwrap();
        let state = &states[&7];
        assert_eq!((state.rank, state.time), (1, 5));
        assert_eq!(state.tensors.keys().collect::<Vec<_>>(), ["exp_avg", "exp_avg_sq"]);
        assert_eq!(state.tensors["exp_avg"].try_to_vec::<f32>().unwrap(), [1.0, 2.0, 3.0]);
    }

    #[test]
    fn another_optimizers_state_is_refused_by_name() {
        let err = read(record(&["7.momentum.velocity"], &[("7.__rank", 1)])).unwrap_err();
        assert!(
            matches!(&err, Error::Burn { cause: BurnFailure::Record, detail: m } if m.contains("`momentum.velocity`")),
            "{err}"
        );
        let err = read(record(&["7.exp_avg"], &[("7.__rank", 1)])).unwrap_err();
        assert!(
            matches!(&err, Error::Burn { cause: BurnFailure::Record, detail: m } if m.contains("no step count")),
            "{err}"
        );
        let err = read(record(&[], &[("7.lr_decay.time", 1)])).unwrap_err();
        assert!(
            matches!(&err, Error::Burn { cause: BurnFailure::Record, detail: m } if m.contains("`lr_decay.time`")),
            "{err}"
        );
    }

    #[test]
    fn every_state_kind_is_read_back_from_its_own_name() {
        for &kind in StateKind::ALL {
            assert_eq!(state_kind(kind.torch_name()), Some(kind), "{kind:?}");
            assert_eq!(translate(kind.torch_name()), Some(kind.torch_name()), "{kind:?}");
        }
    }

    #[test]
    fn a_written_record_reads_back() {
        let mut tensors = BTreeMap::new();
        tensors.insert("exp_avg".to_string(), TensorData::new(vec![0.5f32; 6], [2, 3]));
        let schedule_free =
            Some(ScheduleFreeRecord { weight_sum: 0.25, lr_max: 1e-3, train_mode: Some(false) });
        let state = ParamRecord { rank: 2, time: 9, tensors, schedule_free };
        let back = read(write(BTreeMap::from([(3, state)])).unwrap()).unwrap();
        assert_eq!((back[&3].rank, back[&3].time), (2, 9));
        assert_eq!(back[&3].schedule_free, schedule_free);
        assert_eq!(back[&3].tensors["exp_avg"].shape().to_vec(), [2, 3]);
    }
}
