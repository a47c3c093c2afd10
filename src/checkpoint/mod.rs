//! Optimizer checkpoints as safetensors files, one format for both backends: a checkpoint
//! saved by [`Optimizer`](crate::Optimizer) loads into `cpu::CpuOptimizer` and the other
//! way round. What a checkpoint holds is documented on
//! [`Optimizer::save_to_bytes`](crate::Optimizer::save_to_bytes).
//!
//! [`layout`] says which tensors an optimizer of given groups saves and expects, under which
//! names, dtypes and shapes, and checks a parsed file against it; each backend only reads
//! and writes its own memory.

pub(crate) mod checksum;
mod family;
mod json;
pub(crate) mod layout;
mod parse;

use std::io::Write;
use std::path::Path;

use safetensors::Dtype;

pub(crate) use family::{bad_json, FamilyCheckpoint, JsonFields, JsonMap};
pub use parse::Checkpoint;

use crate::{DType, Error, Result};

/// The `format` metadata value of checkpoints this crate writes. Version 2 added the
/// tensors' CRC-32 checksums (the `crc32` metadata); files of version 1, which have none,
/// still load.
pub const CHECKPOINT_FORMAT: &str = "wgpu-optim-checkpoint/2";

/// Every `format` this crate reads: version 1 (no checksums; `tools/torch_checkpoint.py`
/// writes it) and [`CHECKPOINT_FORMAT`].
pub(crate) const READABLE_FORMATS: [&str; 2] = ["wgpu-optim-checkpoint/1", CHECKPOINT_FORMAT];

/// A storage type as safetensors names it.
pub(crate) fn safetensors_dtype(dtype: DType) -> Dtype {
    match dtype {
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
    }
}

/// The refusal of checkpoint bytes that came from no file.
pub(crate) fn bad(problem: String) -> Error {
    Error::BadFile { path: "checkpoint".into(), problem }
}

/// Writes `bytes` to `path` atomically: a temporary file beside it is written, flushed to
/// disk and renamed over `path`, so a crash never leaves a half-written checkpoint there.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |e: std::io::Error| Error::BadFile { path: path.display().to_string(), problem: e.to_string() };
    let file_name = path.file_name().ok_or_else(|| io(std::io::Error::other("the path names no file")))?;
    let mut temporary_name = file_name.to_os_string();
    temporary_name.push(format!(".tmp-{}", std::process::id()));
    let temporary = path.with_file_name(temporary_name);
    let written = (|| {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written.map_err(io)
}

/// Reads the checkpoint file at `path` and hands its bytes to `load`; a refusal of the
/// bytes names the file.
pub(crate) fn load_file(path: &Path, load: impl FnOnce(&[u8]) -> Result<()>) -> Result<()> {
    let named = |problem: String| Error::BadFile { path: path.display().to_string(), problem };
    let bytes = std::fs::read(path).map_err(|e| named(e.to_string()))?;
    load(&bytes).map_err(|e| match e {
        Error::BadFile { problem, .. } => named(problem),
        other => other,
    })
}
