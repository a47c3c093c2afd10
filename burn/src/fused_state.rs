//! One parameter's state under [`FusedOptimizer`](super::FusedOptimizer), and its form in
//! Burn's records.

use burn::optim::{RecordState, StateSink, StateSource};
use burn::tensor::{Device, Tensor as BurnTensor};
use burn_pack::Scalar;

use super::record::{state_kind, BURN_ADAM, BURN_ADAM_TIME, LR_MAX, TIME, WEIGHT_SUM};
use wgpu_optim::{Algorithm, BurnFailure, Error, Result, ScheduleFreeScalars, StateKind};

/// One parameter's state under [`FusedOptimizer`](super::FusedOptimizer): the step count and
/// the algorithm's state tensors by [`StateKind`] ([`Self::state`]), under PyTorch's names
/// in Burn's records: `{param}.time` and `{param}.exp_avg`, ...
///
/// A record of Burn's own Adam or AdamW loads as this state: its `moment_1`, `moment_2`,
/// `max_moment_2` and `time` are PyTorch's `exp_avg`, `exp_avg_sq`, `max_exp_avg_sq` and
/// `step` (the same updates, the step counted from 1), so the next step continues Burn's
/// trajectory. Any other state in a record ([`Self::foreign`]) is refused at the
/// parameter's next step rather than restarted from zero.
///
/// [`Default`] is the state before a parameter's first step: no tensors, `time` 0.
#[derive(Clone, Debug, Default)]
pub struct FusedState<const D: usize> {
    /// Steps taken, counted from 1 as PyTorch counts them.
    pub time: usize,
    /// The state tensors, at most one per kind, in the order they were first set.
    tensors: Vec<(StateKind, BurnTensor<D>)>,
    /// Schedule-Free AdamW's running values after the last step (`k` is [`Self::time`]):
    /// the package keeps them per group, and every tensor a Burn optimizer steps sees the
    /// same rate sequence, so each tensor's are its group's. Burn's records hold them as
    /// `{param}.weight_sum` and `{param}.lr_max`.
    pub schedule_free: Option<ScheduleFreeScalars>,
    /// Set when a loaded record held another optimizer's state for this parameter (neither
    /// this crate's nor Burn's Adam or AdamW's): the step on it is refused with this reason.
    pub foreign: Option<String>,
}

/// Whether a state of `kind` goes in and out of Burn's records: every state an algorithm
/// keeps. The Kahan compensation is the rounding's, which the drop-in optimizer does not
/// run (it rounds to nearest even), so a record's `kahan_comp` is not read into this state.
fn recorded(kind: StateKind) -> bool {
    kind != StateKind::KahanCompensation
}

impl<const D: usize> FusedState<D> {
    /// The state tensor of `kind`, where the parameter has one (the algorithm keeps it, and
    /// a step or a record set it).
    pub fn state(&self, kind: StateKind) -> Option<&BurnTensor<D>> {
        self.tensors.iter().find(|(k, _)| *k == kind).map(|(_, t)| t)
    }

    /// Every state tensor the parameter has, with its kind.
    pub fn states(&self) -> impl Iterator<Item = (StateKind, &BurnTensor<D>)> {
        self.tensors.iter().map(|(k, t)| (*k, t))
    }

    /// Sets the state tensor of `kind`, returning the one it replaces.
    pub fn set_state(&mut self, kind: StateKind, tensor: BurnTensor<D>) -> Option<BurnTensor<D>> {
        match self.tensors.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, held)) => Some(std::mem::replace(held, tensor)),
            None => {
                self.tensors.push((kind, tensor));
                None
            }
        }
    }

    /// Removes the state tensor of `kind` and returns it.
    pub fn take_state(&mut self, kind: StateKind) -> Option<BurnTensor<D>> {
        let at = self.tensors.iter().position(|(k, _)| *k == kind)?;
        Some(self.tensors.remove(at).1)
    }

    pub(super) fn moved_to(self, device: &Device) -> Self {
        let tensors = self.tensors.into_iter().map(|(k, t)| (k, t.to_device(device))).collect();
        FusedState { tensors, ..self }
    }

    /// Refused ([`Error::Burn`]) where this state cannot be continued by `algorithm`, which
    /// keeps `kinds` for this parameter: a foreign record's, or one whose tensors are not
    /// those (another algorithm's record would otherwise lose its state, or restart missing
    /// moments from zero).
    pub(super) fn check(&self, algorithm: &Algorithm, kinds: &[StateKind]) -> Result<()> {
        if let Some(foreign) = &self.foreign {
            return Err(Error::Burn { cause: BurnFailure::Record, detail: foreign.clone() });
        }
        if self.time == 0 {
            return Ok(());
        }
        // In the kinds' declaration order, as the names have always been listed.
        let held: Vec<&str> =
            StateKind::ALL.iter().filter(|k| self.state(**k).is_some()).map(|k| k.torch_name()).collect();
        let expected: Vec<&str> = kinds.iter().map(|k| k.torch_name()).collect();
        if held.iter().all(|n| expected.contains(n)) && expected.iter().all(|n| held.contains(n)) {
            if !algorithm.keeps_group_values() {
                return Ok(());
            }
            return match self.schedule_free {
                None => Err(Error::Burn {
                    cause: BurnFailure::Record,
                    detail: "the parameter's Schedule-Free state has no weight_sum and lr_max, which \
                             its next step's averaging weight needs"
                        .into(),
                }),
                Some(scalars) => ScheduleFreeScalars { k: self.time as u64, ..scalars }.check_fits(algorithm),
            };
        }
        Err(Error::Burn {
            cause: BurnFailure::Record,
            detail: format!(
                "the parameter's state holds {held:?}, but {} keeps {expected:?}: it is another \
             algorithm's state",
                algorithm.name()
            ),
        })
    }
}

// By hand: Burn's `#[derive(RecordState)]` names paths inside `burn-optim` only.
impl<const D: usize> RecordState for FusedState<D> {
    fn state_flatten(&self, prefix: &str, out: &mut StateSink) {
        out.push_scalar(prefix, TIME, Scalar::from(self.time));
        if let Some(scalars) = self.schedule_free {
            out.push_scalar(prefix, WEIGHT_SUM, Scalar::from(scalars.weight_sum));
            out.push_scalar(prefix, LR_MAX, Scalar::from(scalars.lr_max));
        }
        // In the kinds' declaration order, whatever order the step set them in.
        for &kind in StateKind::ALL.iter().filter(|k| recorded(**k)) {
            if let Some(tensor) = self.state(kind) {
                out.push_tensor(prefix, kind.torch_name(), tensor.clone().into_data());
            }
        }
    }

    fn state_unflatten(prefix: &str, src: &mut StateSource, device: &Device) -> Option<Self> {
        if src.take_scalar(prefix, TIME).is_none() && src.take_scalar(prefix, BURN_ADAM_TIME).is_some() {
            return Some(burn_adam_state(prefix, src, device));
        }
        let Some(time) = src.take_scalar(prefix, TIME).and_then(|t| usize::try_from(t).ok()) else {
            // Burn's `load_record` would drop a `None` without a word and start afresh.
            let foreign = format!(
                "parameter {prefix}'s state in the loaded record is neither wgpu-optim's \
                 (`time`, `exp_avg`, ...) nor Burn's Adam or AdamW's (`momentum.time`, \
                 `momentum.moment_1`, ...): another optimizer's state cannot be continued; \
                 `FusedOptimizer::load_bytes` names the entries"
            );
            return Some(FusedState { foreign: Some(foreign), ..FusedState::default() });
        };
        let weight_sum = src.take_scalar(prefix, WEIGHT_SUM).and_then(|v| f64::try_from(v).ok());
        let lr_max = src.take_scalar(prefix, LR_MAX).and_then(|v| f64::try_from(v).ok());
        let schedule_free = weight_sum.zip(lr_max).map(|(weight_sum, lr_max)| ScheduleFreeScalars {
            k: time as u64,
            weight_sum,
            lr_max,
        });
        let tensors = (StateKind::ALL.iter().filter(|k| recorded(**k)))
            .filter_map(|&kind| {
                let data = src.take_tensor(prefix, kind.torch_name())?;
                Some((kind, BurnTensor::from_data(data, device)))
            })
            .collect();
        Some(FusedState { time, tensors, schedule_free, foreign: None })
    }
}

/// Burn's Adam or AdamW state (`AdaptiveMomentumState`) as PyTorch's, which it is under
/// other names.
fn burn_adam_state<const D: usize>(prefix: &str, src: &mut StateSource, device: &Device) -> FusedState<D> {
    let time = src.take_scalar(prefix, BURN_ADAM_TIME).and_then(|t| usize::try_from(t).ok());
    let tensors = (BURN_ADAM.iter())
        .filter_map(|(burn, ours)| {
            let kind = state_kind(ours)?;
            let data = src.take_tensor(prefix, burn)?;
            Some((kind, BurnTensor::from_data(data, device)))
        })
        .collect();
    FusedState { time: time.unwrap_or(0), tensors, ..FusedState::default() }
}
