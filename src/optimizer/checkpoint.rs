//! Saving and loading an optimizer's state as safetensors. What a checkpoint holds is
//! documented on [`Optimizer::save_to_bytes`], what loading replaces on
//! [`Optimizer::load_from_bytes`].

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use safetensors::{Dtype, SafeTensors};

use super::Optimizer;
use crate::gpu::plan::Arg;
use crate::gpu::transfer::check_writable;
use crate::{Adagrad, Adam, Algorithm, DType, Error, Result, Rounding, Sgd, Tensor};

/// The `format` metadata value of checkpoints this crate writes.
pub const CHECKPOINT_FORMAT: &str = "wgpu-optim-checkpoint/1";

fn safetensors_dtype(dtype: DType) -> Dtype {
    match dtype {
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
    }
}

impl Optimizer {
    /// The checkpoint as safetensors bytes. Waits for submitted work, then reads every state
    /// tensor back.
    ///
    /// It holds, under PyTorch's `state_dict` names (parameters numbered across groups):
    /// - each parameter's state, in its storage dtype, and in the parameter's shape from
    ///   [`OptimizerOptions::param_shapes`](crate::OptimizerOptions::param_shapes) (flat,
    ///   `[len]`, without them): `state.{i}.exp_avg`,
    ///   `state.{i}.exp_avg_sq`, `state.{i}.max_exp_avg_sq` (AMSGrad),
    ///   `state.{i}.momentum_buffer` (SGD with momentum), `state.{i}.sum` (Adagrad);
    /// - the step count: `state.{i}.step`, an f32 scalar as PyTorch keeps it, and the exact
    ///   count in the `step` metadata (in capturable mode, the device's count: AMP skips
    ///   excluded);
    /// - every group's hyperparameters and parameter indices in the `param_groups` metadata
    ///   (JSON with PyTorch's keys: `optimizer` the class, `lr`, `betas`, `eps`,
    ///   `weight_decay`, `amsgrad`, `momentum`, ..., `params`). In capturable mode `lr` is the
    ///   group's rate as the optimizer knows it ([`Optimizer::group_algorithm`]), not a value
    ///   a trainer wrote into [`Optimizer::lr_tensor`] on the device;
    /// - in master-weight mode, the f32 masters: `master.{i}`;
    /// - with [`Rounding::Kahan`], each parameter's compensation in its dtype:
    ///   `state.{i}.kahan_comp`;
    /// - the rounding in the metadata: `rounding` ([`Rounding::name`]), and with stochastic
    ///   rounding `rounding_seed` (decimal) and `rounding_state` (`true` or `false`);
    /// - `format` = [`CHECKPOINT_FORMAT`] in the metadata.
    ///
    /// It does not hold the model's parameters (outside master-weight mode the parameters are
    /// the model's, which the trainer saves with its model), the model copies (rounded from
    /// the masters on load), or the AMP flag and unscale factor.
    pub fn save_to_bytes(&self) -> Result<Vec<u8>> {
        let step = match &self.device {
            Some(_) => self.read_device_step()?,
            None => self.step,
        };
        let mut owned: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
        for group in &self.groups {
            for i in group.first..group.first + group.len {
                for (kind, tensor) in self.state_kinds(&group.algorithm).iter().zip(&self.state[i]) {
                    let bytes = self.ctx.read_bytes(tensor)?;
                    owned.push((
                        format!("state.{i}.{}", kind.torch_name()),
                        safetensors_dtype(tensor.dtype),
                        self.shape(i),
                        bytes,
                    ));
                }
                owned.push((
                    format!("state.{i}.step"),
                    Dtype::F32,
                    vec![],
                    (step as f32).to_le_bytes().to_vec(),
                ));
                if !self.model_copies.is_empty() {
                    let master = &self.params[i];
                    let bytes = self.ctx.read_bytes(master)?;
                    owned.push((
                        format!("master.{i}"),
                        safetensors_dtype(master.dtype),
                        self.shape(i),
                        bytes,
                    ));
                }
            }
        }
        let groups: Vec<serde_json::Value> = self
            .groups
            .iter()
            .map(|group| {
                let mut map = group.algorithm.to_json();
                map.insert(
                    "params".into(),
                    (group.first..group.first + group.len).collect::<Vec<_>>().into(),
                );
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
        let views = owned
            .iter()
            .map(|(name, dtype, shape, bytes)| {
                safetensors::tensor::TensorView::new(*dtype, shape.clone(), bytes)
                    .map(|view| (name.clone(), view))
                    .map_err(|e| Error::BadFile {
                        path: "checkpoint".into(),
                        problem: format!("`{name}`: {e}"),
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        safetensors::serialize(views, Some(metadata))
            .map_err(|e| Error::BadFile { path: "checkpoint".into(), problem: e.to_string() })
    }

    /// Parameter `i`'s shape in checkpoints: the caller's, or flat.
    fn shape(&self, i: usize) -> Vec<usize> {
        self.shapes.get(i).cloned().unwrap_or_else(|| vec![self.params[i].len as usize])
    }

    /// Saves the checkpoint ([`Self::save_to_bytes`] says what it holds) to `path`
    /// atomically: a temporary file beside it is written, flushed to disk and renamed over
    /// `path`, so a crash never leaves a half-written checkpoint in its place.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bytes = self.save_to_bytes()?;
        let io =
            |e: std::io::Error| Error::BadFile { path: path.display().to_string(), problem: e.to_string() };
        let file_name =
            path.file_name().ok_or_else(|| io(std::io::Error::other("the path names no file")))?;
        let mut temporary_name = file_name.to_os_string();
        temporary_name.push(format!(".tmp-{}", std::process::id()));
        let temporary = path.with_file_name(temporary_name);
        let written = (|| {
            let mut file = std::fs::File::create(&temporary)?;
            file.write_all(&bytes)?;
            file.sync_all()?;
            std::fs::rename(&temporary, path)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&temporary);
        }
        written.map_err(io)
    }

    /// Loads a checkpoint file written by [`Optimizer::save`]; see [`Self::load_from_bytes`]
    /// for what it replaces.
    pub fn load(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bytes = std::fs::read(path)
            .map_err(|e| Error::BadFile { path: path.display().to_string(), problem: e.to_string() })?;
        self.load_from_bytes(&bytes).map_err(|e| match e {
            Error::BadFile { problem, .. } => Error::BadFile { path: path.display().to_string(), problem },
            other => other,
        })
    }

    /// Loads checkpoint bytes ([`Self::save_to_bytes`] says what they hold).
    ///
    /// Replaces every state tensor, the step count and **every group's hyperparameters**
    /// (learning rate included) with the file's: a schedule that wants other values sets them
    /// after loading. In master-weight mode it also replaces the masters and writes the model
    /// copies (the masters rounded once), which needs `COPY_DST` on the model's buffers.
    /// Outside master-weight mode the parameters are not touched: load the model yourself.
    ///
    /// With stochastic rounding it also replaces the seed (so a resumed run draws the bits
    /// the uninterrupted run would have), and with Kahan rounding the compensations.
    ///
    /// The file must match the optimizer: the same rounding mode ([`Rounding::name`], and for
    /// stochastic rounding the same `state` flag), the same number of groups, each with the same
    /// algorithm class and state tensors and the same parameter indices, and every tensor
    /// with the dtype of the optimizer's, stored flat or in the parameter's shape (in any
    /// shape of its length when the optimizer was given no shapes). All of it, and whether every target
    /// buffer takes its write, is checked before anything is written; on a mismatch
    /// ([`Error::BadFile`]), a target that cannot be written ([`Error::MissingUsage`]), or a
    /// truncated or corrupt file, the optimizer and the model are left as they were.
    pub fn load_from_bytes(&mut self, bytes: &[u8]) -> Result<()> {
        let checkpoint = Checkpoint::parse(bytes)?;
        let bad = |problem: String| Error::BadFile { path: "checkpoint".into(), problem };
        let (step, file) = (checkpoint.step, &checkpoint.file);
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
        let mut algorithms = Vec::with_capacity(self.groups.len());
        for (g, ((algorithm, params), ours)) in checkpoint.groups.iter().zip(&self.groups).enumerate() {
            if algorithm.name() != ours.algorithm.name()
                || algorithm.state_kinds() != ours.algorithm.state_kinds()
            {
                return Err(bad(format!(
                    "param_groups[{g}] is {} with state {:?}; the optimizer's group is {} with state {:?}",
                    algorithm.name(),
                    algorithm.state_kinds(),
                    ours.algorithm.name(),
                    ours.algorithm.state_kinds()
                )));
            }
            if *params != (ours.first..ours.first + ours.len).collect::<Vec<_>>() {
                return Err(bad(format!(
                    "param_groups[{g}] holds other parameters than the optimizer's group"
                )));
            }
            algorithms.push(*algorithm);
        }
        // Every tensor the optimizer needs, checked before anything is written.
        let mut writes: Vec<(String, Tensor, std::borrow::Cow<'_, [u8]>)> = Vec::new();
        let mut expected_names = 0;
        let shapes_free = self.shapes.is_empty();
        let mut take = |name: String, target: &Tensor, shape: Vec<usize>, argument: String| -> Result<()> {
            let view = file.tensor(&name).map_err(|_| bad(format!("has no tensor `{name}`")))?;
            // Flat or in the parameter's shape (any shape of its length when the optimizer
            // was given none): the same elements in the same order.
            let flat = [target.len as usize];
            let elements = view.shape().iter().try_fold(1usize, |n, d| n.checked_mul(*d));
            let shape_fits = view.shape() == flat
                || view.shape() == shape
                || (shapes_free && elements == Some(target.len as usize));
            if view.dtype() != safetensors_dtype(target.dtype) || !shape_fits {
                return Err(bad(format!(
                    "`{name}` is {:?} {:?}, the optimizer's is {:?} {shape:?}",
                    view.dtype(),
                    view.shape(),
                    target.dtype,
                )));
            }
            writes.push((argument, target.clone(), view.data().into()));
            expected_names += 1;
            Ok(())
        };
        for group in &self.groups {
            for i in group.first..group.first + group.len {
                for (kind, tensor) in self.state_kinds(&group.algorithm).iter().zip(&self.state[i]) {
                    let name = kind.torch_name();
                    take(format!("state.{i}.{name}"), tensor, self.shape(i), format!("{name}[{i}]"))?;
                }
                if !self.model_copies.is_empty() {
                    take(format!("master.{i}"), &self.params[i], self.shape(i), format!("params[{i}]"))?;
                }
            }
        }
        // In master-weight mode the model's copies are the masters rounded once, so they are
        // restored with them and the first forward pass after loading sees the right values.
        for (i, (master, copy)) in self.params.iter().zip(&self.model_copies).enumerate() {
            let Some(data) = writes.iter().find(|(_, t, _)| t == master).map(|(_, _, d)| d) else { continue };
            let rounded = copy.dtype.encode(&master.dtype.decode(data));
            writes.push((format!("model_copies[{i}]"), copy.clone(), rounded.into()));
        }
        for i in 0..self.params.len() {
            let name = format!("state.{i}.step");
            let view = file.tensor(&name).map_err(|_| bad(format!("has no tensor `{name}`")))?;
            if view.dtype() != Dtype::F32
                || !view.shape().is_empty()
                || view.data() != (step as f32).to_le_bytes()
            {
                return Err(bad(format!("`{name}` is not the f32 scalar {step}")));
            }
            expected_names += 1;
        }
        if file.len() != expected_names {
            return Err(bad(format!("holds {} tensors, the optimizer has {expected_names}", file.len())));
        }
        if self.device.is_some() && u32::try_from(step).is_err() {
            return Err(bad(format!("step {step} does not fit the device's u32 step counter")));
        }
        // Every target must take its write (the caller's buffers may lack a copy usage), or
        // a refusal would come after some tensors were already overwritten.
        for (argument, tensor, _) in &writes {
            check_writable(&Arg::new(argument.clone(), tensor))?;
        }
        // Everything matches: write.
        for (_, tensor, data) in writes {
            self.ctx.write_bytes(&tensor, &data)?;
        }
        for (g, algorithm) in algorithms.into_iter().enumerate() {
            self.set_group_algorithm(g, algorithm)?;
        }
        // The seed travels in the uniforms, which the next step rewrites (every group is dirty).
        self.rounding = checkpoint.rounding;
        self.set_step_count(step)
    }
}

/// An optimizer's `param_groups` entry in JSON. Kept with the checkpoints (not with the
/// algorithms) so that the `checkpoint` feature alone brings in serde_json.
impl Algorithm {
    /// The hyperparameters under PyTorch's names, as in an optimizer's `param_groups`, with
    /// `"optimizer"` naming the class (`Adam`, `AdamW`, `SGD`, `Adagrad`).
    pub fn to_json(&self) -> serde_json::Map<String, serde_json::Value> {
        use serde_json::json;
        let value = match self {
            Algorithm::Adam(c) => json!({
                "optimizer": if c.decoupled_weight_decay { "AdamW" } else { "Adam" },
                "lr": c.lr, "betas": [c.beta1, c.beta2], "eps": c.eps, "weight_decay": c.weight_decay,
                "amsgrad": c.amsgrad, "maximize": c.maximize,
            }),
            Algorithm::Sgd(c) => json!({
                "optimizer": "SGD", "lr": c.lr, "momentum": c.momentum, "dampening": c.dampening,
                "weight_decay": c.weight_decay, "nesterov": c.nesterov, "maximize": c.maximize,
            }),
            Algorithm::Adagrad(c) => json!({
                "optimizer": "Adagrad", "lr": c.lr, "lr_decay": c.lr_decay, "weight_decay": c.weight_decay,
                "initial_accumulator_value": c.initial_accumulator_value, "eps": c.eps, "maximize": c.maximize,
            }),
        };
        match value {
            serde_json::Value::Object(map) => map,
            _ => serde_json::Map::new(),
        }
    }

    /// The inverse of [`Algorithm::to_json`]; [`Error::BadJson`] names the field that is
    /// missing or wrong.
    pub fn from_json(map: &serde_json::Map<String, serde_json::Value>) -> Result<Self> {
        let bad = |problem: String| Error::BadJson { problem };
        let number = |key: &str| {
            map.get(key)
                .and_then(|v| v.as_f64())
                .ok_or_else(|| bad(format!("`{key}` is missing or not a number")))
        };
        let flag = |key: &str| {
            map.get(key)
                .and_then(|v| v.as_bool())
                .ok_or_else(|| bad(format!("`{key}` is missing or not a boolean")))
        };
        let name = map
            .get("optimizer")
            .and_then(|v| v.as_str())
            .ok_or_else(|| bad("`optimizer` is missing".into()))?;
        Ok(match name {
            "Adam" | "AdamW" => {
                let betas = map
                    .get("betas")
                    .and_then(|v| v.as_array())
                    .ok_or_else(|| bad("`betas` is missing".into()))?;
                let beta = |k: usize| {
                    betas
                        .get(k)
                        .and_then(|v| v.as_f64())
                        .ok_or_else(|| bad("`betas` is not two numbers".into()))
                };
                Algorithm::Adam(Adam {
                    lr: number("lr")?,
                    beta1: beta(0)?,
                    beta2: beta(1)?,
                    eps: number("eps")?,
                    weight_decay: number("weight_decay")?,
                    decoupled_weight_decay: name == "AdamW",
                    amsgrad: flag("amsgrad")?,
                    maximize: flag("maximize")?,
                })
            }
            "SGD" => Algorithm::Sgd(Sgd {
                lr: number("lr")?,
                momentum: number("momentum")?,
                dampening: number("dampening")?,
                weight_decay: number("weight_decay")?,
                nesterov: flag("nesterov")?,
                maximize: flag("maximize")?,
            }),
            "Adagrad" => Algorithm::Adagrad(Adagrad {
                lr: number("lr")?,
                lr_decay: number("lr_decay")?,
                weight_decay: number("weight_decay")?,
                initial_accumulator_value: number("initial_accumulator_value")?,
                eps: number("eps")?,
                maximize: flag("maximize")?,
            }),
            other => return Err(bad(format!("unknown optimizer `{other}`"))),
        })
    }
}

/// A parsed checkpoint file, checked for internal consistency but not yet against an
/// optimizer. Parsing reads the header and tensor table defensively and copies no tensor
/// data, so arbitrary bytes cost at most the file's size.
pub struct Checkpoint<'a> {
    /// Steps taken when it was saved.
    pub step: u64,
    /// Each parameter group's algorithm and parameter indices.
    pub groups: Vec<(Algorithm, Vec<usize>)>,
    /// The rounding of 16-bit stores, with stochastic rounding's seed; checkpoints written
    /// before rounding modes existed read as [`Rounding::NearestEven`].
    pub rounding: Rounding,
    file: SafeTensors<'a>,
}

impl<'a> Checkpoint<'a> {
    /// Parses checkpoint bytes; every malformed field is an [`Error::BadFile`] naming it.
    pub fn parse(bytes: &'a [u8]) -> Result<Self> {
        let bad = |problem: String| Error::BadFile { path: "checkpoint".into(), problem };
        let (_, metadata) =
            SafeTensors::read_metadata(bytes).map_err(|e| bad(format!("not a safetensors file: {e}")))?;
        let file = SafeTensors::deserialize(bytes).map_err(|e| bad(format!("corrupt tensor table: {e}")))?;
        let meta = metadata.metadata().clone().unwrap_or_default();
        let field = |key: &str| meta.get(key).ok_or_else(|| bad(format!("metadata has no `{key}`")));
        if field("format")? != CHECKPOINT_FORMAT {
            return Err(bad(format!("format is `{}`, expected `{CHECKPOINT_FORMAT}`", field("format")?)));
        }
        let step: u64 =
            field("step")?.parse().map_err(|e| bad(format!("`step` is not a whole number: {e}")))?;
        let saved: Vec<serde_json::Value> = serde_json::from_str(field("param_groups")?)
            .map_err(|e| bad(format!("`param_groups` is not JSON: {e}")))?;
        let mut groups = Vec::with_capacity(saved.len().min(1024));
        for (g, saved) in saved.iter().enumerate() {
            let map = saved.as_object().ok_or_else(|| bad(format!("param_groups[{g}] is not an object")))?;
            let algorithm = Algorithm::from_json(map).map_err(|e| bad(format!("param_groups[{g}]: {e}")))?;
            algorithm.validate().map_err(|e| bad(format!("param_groups[{g}]: {e}")))?;
            let params = map
                .get("params")
                .and_then(|p| p.as_array())
                .and_then(|p| {
                    p.iter()
                        .map(|i| i.as_u64().and_then(|i| usize::try_from(i).ok()))
                        .collect::<Option<Vec<_>>>()
                })
                .ok_or_else(|| bad(format!("param_groups[{g}].params is not a list of indices")))?;
            groups.push((algorithm, params));
        }
        let rounding = match meta.get("rounding").map(String::as_str) {
            None | Some("nearest_even") => Rounding::NearestEven,
            Some("kahan") => Rounding::Kahan,
            Some("stochastic") => Rounding::Stochastic {
                seed: field("rounding_seed")?
                    .parse()
                    .map_err(|e| bad(format!("`rounding_seed` is not a whole number: {e}")))?,
                state: field("rounding_state")?
                    .parse()
                    .map_err(|e| bad(format!("`rounding_state` is not true or false: {e}")))?,
            },
            Some(other) => return Err(bad(format!("unknown rounding `{other}`"))),
        };
        Ok(Checkpoint { step, groups, rounding, file })
    }
}
