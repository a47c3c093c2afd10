//! Saving and loading the module step's state as a Burn optimizer record.

use std::collections::BTreeMap;

use burn::module::ParamId;
use burn::tensor::{Bytes, TensorData};

#[cfg(doc)]
use super::ModuleStepBuilder;
use super::{lost, Entry, Home, ModuleStep};
use crate::record::{self, ParamRecord, ScheduleFreeRecord};
use wgpu_optim::{BurnFailure, Error, Result, ScheduleFreeMode, StateKind};

impl ModuleStep {
    /// Every parameter's state and step count as a Burn optimizer record (burnpack bytes,
    /// each state tensor in its parameter's shape and its storage dtype), read back from
    /// the device: this waits for the submitted steps. Refused with 8-bit state
    /// ([`Error::ConflictingOptions`]; save the [`Self::optimizer`]'s checkpoint instead).
    /// 4-bit states are saved under torchao's names ([`ModuleStepBuilder::state_storage`]).
    pub fn to_bytes(&self) -> Result<Bytes> {
        self.refuse_q8("ModuleStep::to_bytes")?;
        let mut states = BTreeMap::new();
        for (id, entry) in &self.params {
            let state = match &entry.home {
                Home::Loaded(state) => state.clone(),
                Home::Bound(key) => ParamRecord {
                    rank: entry.shape.len(),
                    time: self.device_time(entry)?,
                    tensors: self.read_state(*key, *id, &entry.shape)?,
                    schedule_free: entry.schedule_free.map(|s| ScheduleFreeRecord {
                        weight_sum: s.weight_sum,
                        lr_max: s.lr_max,
                        train_mode: None,
                    }),
                },
            };
            let train_mode = Some(self.mode == ScheduleFreeMode::Train);
            let state = ParamRecord {
                schedule_free: state.schedule_free.map(|s| ScheduleFreeRecord { train_mode, ..s }),
                ..state
            };
            states.insert(id.val(), state);
        }
        record::write(states)
    }

    /// Replaces every parameter's state and step count with a record's: one from
    /// [`Self::to_bytes`], from [`FusedOptimizer`](crate::FusedOptimizer)'s
    /// `ModuleOptimizer::into_bytes`, or from Burn's own Adam or AdamW (whose moments and
    /// step count are PyTorch's, under other names). Before or after the first step; each
    /// parameter's state is written into the optimizer at its next step, so the next step
    /// continues bit for bit from where the record was saved. Parameters the record does
    /// not name start afresh, as under Burn's `load_record`.
    ///
    /// Refused, with nothing changed, where the bytes are not an optimizer record, a
    /// parameter's state is another optimizer's (named in the [`Error::Burn`]), or with
    /// 8-bit state ([`Error::ConflictingOptions`]). A state whose length does not fit its
    /// parameter is refused at that parameter's step.
    pub fn load_bytes(&mut self, bytes: Bytes) -> Result<()> {
        self.refuse_q8("ModuleStep::load_bytes")?;
        let states = record::read(bytes)?;
        for (id, state) in &states {
            if self.options.state_storage.q4().is_some() {
                crate::q4::check_names(*id, state.tensors.keys().map(String::as_str), &self.algorithm)?;
                record::check_schedule_free(*id, state, &self.algorithm)?;
                continue;
            }
            let algorithm = self.algorithm_of_rank(state.rank);
            let expected = record::param_names(&algorithm, state.rank, self.options.rounding);
            record::check_names(*id, state.tensors.keys().map(String::as_str), &expected, &algorithm)?;
            record::check_schedule_free(*id, state, &algorithm)?;
        }
        let mode = record_mode(&states)?;
        self.bounds.clear();
        self.params = states
            .into_iter()
            .map(|(id, state)| {
                let entry = Entry {
                    time: state.time,
                    shape: Vec::new(),
                    schedule_free: state.scalars(),
                    home: Home::Loaded(state),
                };
                (ParamId::from(id), entry)
            })
            .collect();
        self.mode = mode;
        Ok(())
    }

    fn refuse_q8(&self, what: &'static str) -> Result<()> {
        if self.options.state_storage.q8().is_some() {
            return Err(Error::ConflictingOptions {
                first: what,
                second: "state_storage",
                reason: "a Burn record holds f32 state; save the optimizer's own checkpoint",
            });
        }
        Ok(())
    }

    /// Parameter `id`'s state tensors in the optimizer `key`, as record tensors: every
    /// state the optimizer keeps for it (its group's algorithm's, Adafactor's in their own
    /// shapes, the Kahan compensation).
    fn read_state(&self, key: u64, id: ParamId, shape: &[usize]) -> Result<BTreeMap<String, TensorData>> {
        let bound = self.bound(key)?;
        let i = bound.ids.iter().position(|p| *p == id).ok_or_else(|| lost(id))?;
        if self.options.state_storage.q4().is_some() {
            return crate::q4::read_state(&self.algorithm, &bound.optimizer, i, shape, || lost(id));
        }
        let mut tensors = BTreeMap::new();
        for &kind in StateKind::ALL {
            let Some(tensor) = bound.optimizer.tensor_state(i, kind) else { continue };
            let bytes = self.shared.context().read_bytes(tensor)?;
            let shape = record::state_shape(kind, shape);
            let data = TensorData::from_bytes_vec(bytes, shape, record::burn_dtype(tensor.dtype)?);
            tensors.insert(kind.torch_name().to_string(), data);
        }
        Ok(tensors)
    }

    /// A parameter's step count: in capturable mode its optimizer's device count (AMP skips
    /// excluded), read back.
    fn device_time(&self, entry: &Entry) -> Result<u64> {
        match (&entry.home, self.options.capturable) {
            (Home::Bound(key), true) => self.bound(*key)?.optimizer.read_device_step(),
            _ => Ok(entry.time),
        }
    }
}

/// The mode a record was saved in: train unless its Schedule-Free parameters say eval,
/// which they all must say alike.
fn record_mode(states: &BTreeMap<u64, ParamRecord>) -> Result<ScheduleFreeMode> {
    let modes: std::collections::BTreeSet<bool> =
        states.values().filter_map(|s| s.schedule_free.and_then(|sf| sf.train_mode)).collect();
    match modes.into_iter().collect::<Vec<_>>().as_slice() {
        [] | [true] => Ok(ScheduleFreeMode::Train),
        [false] => Ok(ScheduleFreeMode::Eval),
        _ => Err(Error::Burn {
            cause: BurnFailure::Record,
            detail: "the record's parameters were saved in both train and eval mode".into(),
        }),
    }
}
