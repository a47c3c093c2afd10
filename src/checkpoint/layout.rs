//! Which tensors a checkpoint of an optimizer holds (names, dtypes, shapes), its metadata,
//! and the check of a file against an optimizer: one description that both backends fill
//! in, so that a checkpoint written by either loads into the other.

use std::collections::HashMap;
use std::ops::Range;

use safetensors::tensor::TensorView;
use safetensors::Dtype;

use super::{bad, safetensors_dtype, Checkpoint, CHECKPOINT_FORMAT};
use crate::{Algorithm, DType, Result, Rounding, StateKind};

/// One parameter as a checkpoint stores it.
pub(crate) struct ParamLayout {
    /// Its number of elements.
    pub(crate) len: usize,
    /// Its state tensors' kinds and storage dtypes, in the order the backend keeps them
    /// (the algorithm's state kinds, then the Kahan compensation with [`Rounding::Kahan`]).
    pub(crate) state: Vec<(StateKind, DType)>,
    /// Master-weight mode: the masters' dtype.
    pub(crate) master: Option<DType>,
}

/// Where a checkpoint tensor's data lives in the optimizer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Slot {
    /// Parameter `param`'s state tensor `k`, in [`ParamLayout::state`]'s order.
    State {
        /// The parameter, numbered across groups.
        param: usize,
        /// The state tensor.
        k: usize,
    },
    /// Parameter `param`'s f32 master.
    Master {
        /// The parameter, numbered across groups.
        param: usize,
    },
}

/// One tensor of a checkpoint besides the step scalars.
pub(crate) struct Entry {
    /// Its name in the file (PyTorch's `state_dict` names).
    pub(crate) name: String,
    /// Where its data lives.
    pub(crate) slot: Slot,
    dtype: DType,
    len: usize,
    /// The caller's shape of the parameter, or flat.
    shape: Vec<usize>,
}

/// An optimizer as its checkpoints see it.
pub(crate) struct Layout<'a> {
    /// Each group's algorithm and its parameters' indices.
    pub(crate) groups: Vec<(Algorithm, Range<usize>)>,
    /// Every parameter, numbered across groups.
    pub(crate) params: Vec<ParamLayout>,
    /// [`OptimizerOptions::param_shapes`](crate::OptimizerOptions::param_shapes): empty, or
    /// each parameter's shape (checked against its length when the optimizer was built).
    pub(crate) shapes: &'a [Vec<usize>],
    pub(crate) rounding: Rounding,
}

/// A named view of `data`, or [`Error::BadFile`](crate::Error::BadFile) naming it.
fn view(name: String, dtype: Dtype, shape: Vec<usize>, data: &[u8]) -> Result<(String, TensorView<'_>)> {
    match TensorView::new(dtype, shape, data) {
        Ok(view) => Ok((name, view)),
        Err(e) => Err(bad(format!("`{name}`: {e}"))),
    }
}

impl Layout<'_> {
    /// Parameter `i`'s shape in checkpoints: the caller's, or flat.
    fn shape(&self, i: usize) -> Vec<usize> {
        self.shapes.get(i).cloned().unwrap_or_else(|| vec![self.params[i].len])
    }

    /// The tensors a checkpoint holds besides the step scalars, in the order the file lists
    /// them: by group, then parameter, each parameter's states before its master.
    pub(crate) fn entries(&self) -> Vec<Entry> {
        let mut entries = Vec::new();
        for (_, range) in &self.groups {
            for i in range.clone() {
                let param = &self.params[i];
                for (k, (kind, dtype)) in param.state.iter().enumerate() {
                    entries.push(Entry {
                        name: format!("state.{i}.{}", kind.torch_name()),
                        slot: Slot::State { param: i, k },
                        dtype: *dtype,
                        len: param.len,
                        shape: self.shape(i),
                    });
                }
                if let Some(dtype) = param.master {
                    entries.push(Entry {
                        name: format!("master.{i}"),
                        slot: Slot::Master { param: i },
                        dtype,
                        len: param.len,
                        shape: self.shape(i),
                    });
                }
            }
        }
        entries
    }

    /// The checkpoint bytes at `step`, with `data[j]` the little-endian bytes of
    /// `entries()[j]`.
    pub(crate) fn serialize(&self, step: u64, data: &[impl AsRef<[u8]>]) -> Result<Vec<u8>> {
        let entries = self.entries();
        debug_assert_eq!(entries.len(), data.len(), "one data per entry");
        // PyTorch keeps the step per parameter as an f32 scalar; the metadata keeps it exact.
        let step_bytes = (step as f32).to_le_bytes();
        let mut views = Vec::with_capacity(entries.len() + self.params.len());
        for (entry, data) in entries.iter().zip(data) {
            views.push(view(
                entry.name.clone(),
                safetensors_dtype(entry.dtype),
                entry.shape.clone(),
                data.as_ref(),
            )?);
        }
        for i in 0..self.params.len() {
            views.push(view(format!("state.{i}.step"), Dtype::F32, vec![], &step_bytes)?);
        }
        let groups: Vec<serde_json::Value> = self
            .groups
            .iter()
            .map(|(algorithm, range)| {
                let mut map = algorithm.to_json();
                map.insert("params".into(), range.clone().collect::<Vec<_>>().into());
                serde_json::Value::Object(map)
            })
            .collect();
        let mut metadata = HashMap::from([
            ("format".to_string(), CHECKPOINT_FORMAT.to_string()),
            ("param_groups".to_string(), serde_json::Value::Array(groups).to_string()),
            ("step".to_string(), step.to_string()),
            ("rounding".to_string(), self.rounding.name().to_string()),
        ]);
        if let Rounding::Stochastic { seed, state } = self.rounding {
            metadata.insert("rounding_seed".to_string(), seed.to_string());
            metadata.insert("rounding_state".to_string(), state.to_string());
        }
        safetensors::serialize(views, Some(metadata)).map_err(|e| bad(e.to_string()))
    }

    /// Checks a parsed file against the optimizer, all of it, and returns the data of each
    /// of [`Self::entries`], in order. The file must have the same rounding mode (for
    /// stochastic rounding the same `state` flag), the same number of groups, each with the
    /// same algorithm class and state tensors and the same parameter indices, every tensor
    /// of `entries` with its dtype, stored flat or in the parameter's shape (in any shape of
    /// its length when the optimizer was given no shapes), a step scalar per parameter
    /// equal to the metadata's step, and nothing else. Any mismatch is [`Error::BadFile`]
    /// naming it.
    ///
    /// [`Error::BadFile`]: crate::Error::BadFile
    pub(crate) fn check<'f>(&self, checkpoint: &Checkpoint<'f>) -> Result<Vec<&'f [u8]>> {
        let same_mode = match (checkpoint.rounding, self.rounding) {
            (Rounding::Stochastic { state: a, .. }, Rounding::Stochastic { state: b, .. }) => a == b,
            (a, b) => a == b,
        };
        if !same_mode {
            return Err(bad(format!(
                "was saved with rounding {:?}, the optimizer rounds {:?}",
                checkpoint.rounding, self.rounding
            )));
        }
        if checkpoint.groups.len() != self.groups.len() {
            return Err(bad(format!(
                "{} parameter groups, the optimizer has {}",
                checkpoint.groups.len(),
                self.groups.len()
            )));
        }
        for (g, ((algorithm, params), (ours, range))) in
            checkpoint.groups.iter().zip(&self.groups).enumerate()
        {
            if algorithm.name() != ours.name() || algorithm.state_kinds() != ours.state_kinds() {
                return Err(bad(format!(
                    "param_groups[{g}] is {} with state {:?}; the optimizer's group is {} with state {:?}",
                    algorithm.name(),
                    algorithm.state_kinds(),
                    ours.name(),
                    ours.state_kinds()
                )));
            }
            if *params != range.clone().collect::<Vec<_>>() {
                return Err(bad(format!(
                    "param_groups[{g}] holds other parameters than the optimizer's group"
                )));
            }
        }
        let file = &checkpoint.file;
        let tensor = |name: &str| file.tensor(name).map_err(|_| bad(format!("has no tensor `{name}`")));
        let entries = self.entries();
        let mut data = Vec::with_capacity(entries.len());
        for entry in &entries {
            let view = tensor(&entry.name)?;
            // Flat or in the parameter's shape (any shape of its length when the optimizer
            // was given none): the same elements in the same order.
            let elements = view.shape().iter().try_fold(1usize, |n, d| n.checked_mul(*d));
            let shape_fits = view.shape() == [entry.len]
                || view.shape() == entry.shape
                || (self.shapes.is_empty() && elements == Some(entry.len));
            if view.dtype() != safetensors_dtype(entry.dtype) || !shape_fits {
                return Err(bad(format!(
                    "`{}` is {:?} {:?}, the optimizer's is {:?} {:?}",
                    entry.name,
                    view.dtype(),
                    view.shape(),
                    entry.dtype,
                    entry.shape,
                )));
            }
            data.push(view.data());
        }
        let step = checkpoint.step;
        for i in 0..self.params.len() {
            let name = format!("state.{i}.step");
            let view = tensor(&name)?;
            if view.dtype() != Dtype::F32
                || !view.shape().is_empty()
                || view.data() != (step as f32).to_le_bytes()
            {
                return Err(bad(format!("`{name}` is not the f32 scalar {step}")));
            }
        }
        let expected = entries.len() + self.params.len();
        if file.len() != expected {
            // Every expected tensor is there, so some other one is too: name it (e.g. the
            // masters of a master-weight run, which an optimizer without keeps nowhere).
            let mut names = file.names();
            names.sort();
            let known = |name: &str| {
                entries.iter().any(|entry| entry.name == name)
                    || (0..self.params.len()).any(|i| name == format!("state.{i}.step"))
            };
            let other = names
                .into_iter()
                .find(|name| !known(name))
                .map_or(String::new(), |name| format!(" (`{name}` is none of the optimizer's)"));
            return Err(bad(format!("holds {} tensors, the optimizer has {expected}{other}", file.len())));
        }
        Ok(data)
    }
}
