//! Per-rank checkpoints of a sharded optimizer, which another number of ranks loads.
//!
//! Rank `r` of `N` writes `rank-{r}-of-{N}.safetensors` into a directory the ranks share:
//! every state kind its pieces keep over its shard, in the shard's coordinates: dense
//! values as f32 (`state.{kind}`; f32 holds f32, f16 and bf16 state exactly), and with
//! low-bit storage the codes (`state.{kind}.codes`, U8: one per element for 8-bit, two
//! per byte for 4-bit) and their blocks' scales (`state.{kind}.scales`, F32). Its metadata
//! In master-weight mode the f32 masters of its pieces are `master`. Its metadata
//! says which elements of which tensors the shard holds and where (`pieces`:
//! `tensor:start-end@at`, `;`-separated), the tensors' lengths, dtypes and state storage,
//! the step count and the groups' Schedule-Free values. A loader on any number of ranks
//! takes each of its pieces' elements from the files whose pieces hold them; low-bit
//! blocks start at piece boundaries in every layout, so blocks are copied whole.

mod state;

pub(crate) use state::{apply, collect, KindData, PieceState};

use std::collections::BTreeMap;
use std::path::Path;

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

use super::Piece;
use crate::checkpoint::checksum;
use crate::{Error, Result, ScheduleFreeScalars, StateKind};

/// The format's name, in every file's `format` metadata.
pub const SHARD_FORMAT: &str = "wgpu-optim-shard-1";

/// One rank's file.
pub(crate) struct ShardFile {
    pub ranks: usize,
    /// The rank's pieces, with their places in its shard.
    pub pieces: Vec<Piece>,
    /// The shard's length: each state tensor's.
    pub shard_len: u64,
    pub step: u64,
    /// The tensors' lengths and dtypes, as `ShardPlan::structure` writes them.
    pub structure: String,
    /// Each group's Schedule-Free values (`None`: not Schedule-Free).
    pub schedule_free: Vec<Option<ScheduleFreeScalars>>,
    /// Each state kind the rank's pieces keep, over its shard (0 where a piece keeps none).
    pub kinds: Vec<(StateKind, KindData)>,
    /// In master-weight mode, the f32 masters of its pieces over its shard (`master`);
    /// empty otherwise.
    pub masters: Vec<f32>,
    /// Adafactor's whole factors (`row_var`, `col_var`) of each matrix the rank holds a
    /// piece of, by tensor (`factored.{tensor}.{kind}`): every rank holding a piece keeps
    /// the same.
    pub factored: Vec<(usize, StateKind, Vec<f32>)>,
}

/// What a rank loads: its range of every state kind, and the values every file shares.
pub(crate) struct Loaded {
    pub step: u64,
    pub schedule_free: Vec<Option<ScheduleFreeScalars>>,
    pub kinds: Vec<(StateKind, KindData)>,
    /// The masters of its pieces, where the files hold them.
    pub masters: KindData,
    /// Adafactor's factors of every matrix some file holds them of, from the first file
    /// that does.
    pub factored: Vec<(usize, StateKind, Vec<f32>)>,
}

fn file_name(rank: usize, ranks: usize) -> String {
    format!("rank-{rank}-of-{ranks}.safetensors")
}

fn bad(path: &Path, problem: impl Into<String>) -> Error {
    Error::BadFile { path: path.display().to_string(), problem: problem.into() }
}

/// Writes rank `rank`'s `file` into `dir` (created if missing).
pub(crate) fn write(dir: &Path, rank: usize, file: &ShardFile) -> Result<()> {
    let path = dir.join(file_name(rank, file.ranks));
    std::fs::create_dir_all(dir).map_err(|e| bad(dir, format!("cannot create the directory: {e}")))?;
    let mut metadata = BTreeMap::new();
    metadata.insert("format".to_string(), SHARD_FORMAT.to_string());
    metadata.insert("rank".to_string(), rank.to_string());
    metadata.insert("ranks".to_string(), file.ranks.to_string());
    let pieces: Vec<String> = file
        .pieces
        .iter()
        .map(|p| format!("{}:{}-{}@{}", p.tensor, p.elements.start, p.elements.end, p.at))
        .collect();
    metadata.insert("pieces".to_string(), pieces.join(";"));
    metadata.insert("shard_len".to_string(), file.shard_len.to_string());
    metadata.insert("step".to_string(), file.step.to_string());
    metadata.insert("structure".to_string(), file.structure.clone());
    let schedule_free: Vec<String> = file
        .schedule_free
        .iter()
        .map(|s| s.map_or("-".to_string(), |s| format!("{} {:?} {:?}", s.k, s.weight_sum, s.lr_max)))
        .collect();
    metadata.insert("schedule_free".to_string(), schedule_free.join(";"));
    let mut tensors: Vec<(String, Dtype, Vec<u8>)> = Vec::new();
    for (kind, data) in &file.kinds {
        let name = format!("state.{}", kind.torch_name());
        if !data.dense.is_empty() {
            tensors.push((name.clone(), Dtype::F32, bytemuck::cast_slice(&data.dense).to_vec()));
        }
        if !data.codes.is_empty() {
            tensors.push((format!("{name}.codes"), Dtype::U8, data.codes.clone()));
            tensors.push((format!("{name}.scales"), Dtype::F32, bytemuck::cast_slice(&data.scales).to_vec()));
        }
    }
    if !file.masters.is_empty() {
        tensors.push(("master".to_string(), Dtype::F32, bytemuck::cast_slice(&file.masters).to_vec()));
    }
    for (tensor, kind, values) in &file.factored {
        let name = format!("factored.{tensor}.{}", kind.torch_name());
        tensors.push((name, Dtype::F32, bytemuck::cast_slice(values).to_vec()));
    }
    let mut views = Vec::with_capacity(tensors.len());
    for (name, dtype, data) in &tensors {
        let elements = data.len() / if *dtype == Dtype::U8 { 1 } else { 4 };
        let view = TensorView::new(*dtype, vec![elements], data)
            .map_err(|e| bad(&path, format!("`{name}`: {e}")))?;
        views.push((name.clone(), view));
    }
    let serialized = checksum::serialize(views, metadata)?;
    std::fs::write(&path, serialized).map_err(|e| bad(&path, format!("cannot write it: {e}")))
}

/// Reads the checkpoint in `dir` (every rank's file of one save) and assembles each state
/// kind over a shard of `shard_len` elements holding the pieces `want`, its codes packed as
/// `codes` says; refuses files of other tensors or storage than `structure`.
fn read(dir: &Path, structure: &str, codes: state::Codes, want: &[Piece], shard_len: u64) -> Result<Loaded> {
    let ranks = saved_ranks(dir)?;
    let mut loaded = Loaded {
        step: 0,
        schedule_free: Vec::new(),
        kinds: Vec::new(),
        masters: KindData::default(),
        factored: Vec::new(),
    };
    for rank in 0..ranks {
        let path = dir.join(file_name(rank, ranks));
        let bytes = std::fs::read(&path).map_err(|e| bad(&path, format!("cannot read it: {e}")))?;
        let (_, metadata) = SafeTensors::read_metadata(&bytes)
            .map_err(|e| bad(&path, format!("not a safetensors file: {e}")))?;
        let file =
            SafeTensors::deserialize(&bytes).map_err(|e| bad(&path, format!("corrupt tensor table: {e}")))?;
        let meta = metadata.metadata().clone().unwrap_or_default();
        let field = |key: &str| meta.get(key).ok_or_else(|| bad(&path, format!("metadata has no `{key}`")));
        let number = |key: &str| -> Result<u64> {
            field(key)?.parse().map_err(|e| bad(&path, format!("`{key}` is not a whole number: {e}")))
        };
        if field("format")? != SHARD_FORMAT {
            return Err(bad(&path, format!("format is `{}`, expected `{SHARD_FORMAT}`", field("format")?)));
        }
        if number("rank")? != rank as u64 || number("ranks")? != ranks as u64 {
            return Err(bad(&path, "its `rank` and `ranks` are not those of its name"));
        }
        if field("structure")? != structure {
            return Err(bad(
                &path,
                format!(
                    "it holds the state of other tensors ({}), not of these ({structure})",
                    field("structure")?
                ),
            ));
        }
        let checksums = checksum::parse(meta.get(checksum::CHECKSUMS))
            .and_then(|c| c.ok_or_else(|| bad(&path, "metadata has no checksums")))
            .map_err(|e| bad(&path, e.to_string()))?;
        checksum::verify(&checksums, &file).map_err(|e| bad(&path, e.to_string()))?;
        let (step, schedule_free) = (number("step")?, parse_schedule_free(&path, field("schedule_free")?)?);
        if rank == 0 {
            (loaded.step, loaded.schedule_free) = (step, schedule_free);
        } else if step != loaded.step || schedule_free.len() != loaded.schedule_free.len() {
            return Err(bad(&path, "its step or its groups differ from rank 0's file: not one save"));
        } else {
            // A rank keeps the Schedule-Free values of the groups it holds pieces of.
            for (have, saved) in loaded.schedule_free.iter_mut().zip(schedule_free) {
                match (*have, saved) {
                    (None, saved) => *have = saved,
                    (Some(a), Some(b)) if a != b => {
                        return Err(bad(
                            &path,
                            "its Schedule-Free values differ from another rank's: not one save",
                        ))
                    }
                    _ => {}
                }
            }
        }
        let file_len = number("shard_len")?;
        let pieces = parse_pieces(&path, field("pieces")?, file_len)?;
        for (name, view) in file.iter() {
            if name == "master" {
                if view.dtype() != Dtype::F32 || view.data().len() as u64 != 4 * file_len {
                    return Err(bad(&path, "`master` is not F32 over the file's shard_len"));
                }
                for saved in &pieces {
                    for piece in want.iter().filter(|p| p.tensor == saved.tensor) {
                        loaded.masters.copy_overlap("", codes, shard_len, view.data(), saved, piece);
                    }
                }
                continue;
            }
            if let Some(factored) = name.strip_prefix("factored.") {
                let parsed = factored
                    .split_once('.')
                    .and_then(|(t, k)| Some((t.parse::<usize>().ok()?, kind_named(k)?)));
                let Some((tensor, kind)) = parsed.filter(|_| view.dtype() == Dtype::F32) else {
                    return Err(bad(&path, format!("`{name}` is not F32 `factored.{{tensor}}.{{kind}}`")));
                };
                if !loaded.factored.iter().any(|(t, k, _)| (*t, *k) == (tensor, kind)) {
                    let values =
                        view.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                    loaded.factored.push((tensor, kind, values.collect()));
                }
                continue;
            }
            let (kind, part) = match name.strip_prefix("state.").map(|n| n.split_once('.').unwrap_or((n, "")))
            {
                Some((kind, part)) if matches!(part, "" | "codes" | "scales") => match kind_named(kind) {
                    Some(kind) => (kind, part),
                    None => return Err(bad(&path, format!("unknown tensor `{name}`"))),
                },
                _ => return Err(bad(&path, format!("unknown tensor `{name}`"))),
            };
            let (dtype, bytes) = match part {
                "" => (Dtype::F32, 4 * file_len),
                "codes" => (Dtype::U8, codes.bytes(file_len)),
                _ => (Dtype::F32, 4 * codes.blocks(file_len)),
            };
            if view.dtype() != dtype || view.data().len() as u64 != bytes {
                return Err(bad(&path, format!("`{name}` is not {dtype:?} over the file's shard_len")));
            }
            let slot = match loaded.kinds.iter().position(|(k, _)| *k == kind) {
                Some(k) => k,
                None => {
                    loaded.kinds.push((kind, KindData::default()));
                    loaded.kinds.len() - 1
                }
            };
            let data = &mut loaded.kinds[slot].1;
            for saved in &pieces {
                for piece in want.iter().filter(|p| p.tensor == saved.tensor) {
                    data.copy_overlap(part, codes, shard_len, view.data(), saved, piece);
                }
            }
        }
    }
    Ok(loaded)
}

/// What this rank of `plan` loads from the checkpoint in `dir`, once every rank has read
/// its part: an error on every rank if one rank's read failed.
pub(crate) fn read_for<C: crate::shard::Communicator + ?Sized>(
    plan: &crate::shard::plan::ShardPlan,
    comm: &C,
    dir: &Path,
) -> Result<Loaded> {
    let codes = state::Codes::of(plan.storage);
    let loaded = read(dir, &plan.structure(), codes, plan.mine(), plan.shard_len);
    crate::shard::plan::agree(comm, "load", loaded)
}

/// The number of ranks whose files `dir` holds: one save's, every rank's file present.
fn saved_ranks(dir: &Path) -> Result<usize> {
    let entries = std::fs::read_dir(dir).map_err(|e| bad(dir, format!("cannot list the directory: {e}")))?;
    let mut counts = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(ranks) = name
            .strip_suffix(".safetensors")
            .and_then(|n| n.strip_prefix("rank-"))
            .and_then(|n| n.split_once("-of-"))
            .and_then(|(_, ranks)| ranks.parse::<usize>().ok())
        {
            counts.push(ranks);
        }
    }
    counts.sort_unstable();
    counts.dedup();
    match counts[..] {
        [ranks] if ranks > 0 => Ok(ranks),
        [] => Err(bad(dir, "it holds no `rank-R-of-N.safetensors` file")),
        _ => Err(bad(dir, format!("it holds the files of several saves (of {counts:?} ranks)"))),
    }
}

/// The `pieces` metadata of a file whose shard holds `shard_len` elements.
fn parse_pieces(path: &Path, text: &str, shard_len: u64) -> Result<Vec<Piece>> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    text.split(';')
        .map(|entry| {
            let malformed = || {
                bad(path, format!("`pieces` entry `{entry}` is not `tensor:start-end@at` within the shard"))
            };
            let (tensor, rest) = entry.split_once(':').ok_or_else(malformed)?;
            let (range, at) = rest.split_once('@').ok_or_else(malformed)?;
            let (start, end) = range.split_once('-').ok_or_else(malformed)?;
            let number = |s: &str| s.parse::<u64>().map_err(|_| malformed());
            let (start, end, at) = (number(start)?, number(end)?, number(at)?);
            if start > end || at + (end - start) > shard_len {
                return Err(malformed());
            }
            Ok(Piece { tensor: number(tensor)? as usize, elements: start..end, at })
        })
        .collect()
}

fn kind_named(name: &str) -> Option<StateKind> {
    StateKind::ALL.iter().copied().find(|k| k.torch_name() == name)
}

fn parse_schedule_free(path: &Path, text: &str) -> Result<Vec<Option<ScheduleFreeScalars>>> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    text.split(';')
        .map(|group| {
            if group == "-" {
                return Ok(None);
            }
            let parts: Vec<&str> = group.split(' ').collect();
            let malformed =
                || bad(path, format!("`schedule_free` entry `{group}` is not `k weight_sum lr_max`"));
            match parts[..] {
                [k, weight_sum, lr_max] => Ok(Some(ScheduleFreeScalars {
                    k: k.parse().map_err(|_| malformed())?,
                    weight_sum: weight_sum.parse().map_err(|_| malformed())?,
                    lr_max: lr_max.parse().map_err(|_| malformed())?,
                })),
                _ => Err(malformed()),
            }
        })
        .collect()
}
