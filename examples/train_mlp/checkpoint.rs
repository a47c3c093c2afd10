//! A checkpoint directory: the optimizer's state, written by the crate's
//! [`Optimizer::save`], and the model's parameters with what the run needs to continue, as
//! safetensors under `torch.nn.Linear`'s names (`fc1.weight` `[64, 2]`, `fc1.bias`, ...).
//!
//! Each file is written atomically (a temporary file, flushed, renamed over the old one), so
//! an interrupted save leaves the previous file of that name intact. The two files are
//! renamed one after the other; both record the step, and [`check_step`] refuses a pair whose
//! steps differ (a save interrupted between the two renames).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};
use wgpu_optim::{DType, GpuContext, Optimizer};

use crate::model::{param_count, BoxError, Mlp};

/// The optimizer's file in a checkpoint directory.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";

/// The model's file in a checkpoint directory.
pub const MODEL_FILE: &str = "model.safetensors";

/// The `format` metadata of model files this trainer writes.
const MODEL_FORMAT: &str = "train_mlp/1";

/// What a resumed run must reproduce: the data set (seed), the model's dtype, the optimizer,
/// and where the step count stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunState {
    /// Optimizer steps taken so far.
    pub step: u64,
    /// The data set's and the initial weights' seed.
    pub seed: u64,
    /// The parameters' dtype.
    pub dtype: DType,
    /// The `--optimizer` name.
    pub optimizer: String,
}

/// A loaded model file: the run's state and the packed parameter bytes.
pub struct ModelFile {
    pub state: RunState,
    pub params: Vec<u8>,
}

/// Writes the optimizer's checkpoint, then the model's, into `dir` (created if missing).
pub fn save(
    dir: &Path,
    ctx: &GpuContext,
    model: &Mlp,
    optimizer: &Optimizer,
    state: &RunState,
) -> Result<(), BoxError> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    optimizer.save(dir.join(OPTIMIZER_FILE))?;
    let bytes = model_bytes(ctx, model, state)?;
    write_atomically(&dir.join(MODEL_FILE), &bytes)
}

/// Reads `dir`'s model file, checking it against the model's layout.
pub fn load_model(dir: &Path, model_layout: &[crate::model::ParamSpec]) -> Result<ModelFile, BoxError> {
    let path = dir.join(MODEL_FILE);
    let bytes = std::fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    parse_model(&bytes, model_layout).map_err(|e| format!("{}: {e}", path.display()).into())
}

/// Refuses an optimizer checkpoint whose step is not the model file's.
pub fn check_step(optimizer: &Optimizer, state: &RunState) -> Result<(), BoxError> {
    if optimizer.step_count() == state.step {
        Ok(())
    } else {
        Err(format!(
            "the optimizer checkpoint is at step {} but the model file at step {}: \
             a save was interrupted between its two files",
            optimizer.step_count(),
            state.step
        )
        .into())
    }
}

/// The `--dtype` spelling of a dtype.
pub fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::F64 => "f64",
        DType::F32 => "f32",
        _ => "other",
    }
}

fn model_bytes(ctx: &GpuContext, model: &Mlp, state: &RunState) -> Result<Vec<u8>, BoxError> {
    let dtype = match model.dtype() {
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        _ => Dtype::F32,
    };
    let mut tensors = Vec::new();
    for (spec, tensor) in model.layout().iter().zip(model.param_tensors()) {
        // Waits for the submitted steps, then copies the tensor back.
        tensors.push((spec.name.clone(), spec.shape.clone(), ctx.read_bytes(&tensor)?));
    }
    let metadata = HashMap::from([
        ("format".to_string(), MODEL_FORMAT.to_string()),
        ("step".to_string(), state.step.to_string()),
        ("seed".to_string(), state.seed.to_string()),
        ("dtype".to_string(), dtype_name(state.dtype).to_string()),
        ("optimizer".to_string(), state.optimizer.clone()),
    ]);
    let views = tensors
        .iter()
        .map(|(name, shape, bytes)| {
            Ok((name.clone(), safetensors::tensor::TensorView::new(dtype, shape.clone(), bytes)?))
        })
        .collect::<Result<Vec<_>, BoxError>>()?;
    Ok(safetensors::serialize(views, Some(metadata))?)
}

fn parse_model(bytes: &[u8], layout: &[crate::model::ParamSpec]) -> Result<ModelFile, BoxError> {
    let (_, metadata) = SafeTensors::read_metadata(bytes)?;
    let meta = metadata.metadata().clone().unwrap_or_default();
    let field = |key: &str| meta.get(key).cloned().ok_or_else(|| format!("metadata has no `{key}`"));
    if field("format")? != MODEL_FORMAT {
        return Err(format!("format is `{}`, expected `{MODEL_FORMAT}`", field("format")?).into());
    }
    let (dtype, file_dtype) = match field("dtype")?.as_str() {
        "f32" => (DType::F32, Dtype::F32),
        "f16" => (DType::F16, Dtype::F16),
        "bf16" => (DType::BF16, Dtype::BF16),
        other => return Err(format!("dtype `{other}` is not f32, f16 or bf16").into()),
    };
    let state = RunState {
        step: field("step")?.parse().map_err(|e| format!("`step`: {e}"))?,
        seed: field("seed")?.parse().map_err(|e| format!("`seed`: {e}"))?,
        dtype,
        optimizer: field("optimizer")?,
    };
    let file = SafeTensors::deserialize(bytes)?;
    let mut params = Vec::with_capacity(param_count() * dtype.size() as usize);
    for spec in layout {
        let view = file.tensor(&spec.name).map_err(|_| format!("has no tensor `{}`", spec.name))?;
        if view.dtype() != file_dtype || view.shape() != spec.shape.as_slice() {
            return Err(format!(
                "`{}` is {:?} {:?}, expected {file_dtype:?} {:?}",
                spec.name,
                view.dtype(),
                view.shape(),
                spec.shape
            )
            .into());
        }
        params.extend_from_slice(view.data());
    }
    Ok(ModelFile { state, params })
}

/// Writes `bytes` to a temporary file beside `path`, flushes it to disk and renames it
/// over `path`: readers see the old file or the new one, never a partial one.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), BoxError> {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp-{}", std::process::id()));
    let temporary: PathBuf = path.with_file_name(name);
    let written = (|| {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written.map_err(|e| format!("writing {}: {e}", path.display()).into())
}
