//! Per-rank checkpoints of a sharded optimizer, which another number of ranks loads.
//!
//! Rank `r` of `N` writes `rank-{r}-of-{N}.safetensors` into a directory the ranks share:
//! every state kind its pieces keep as one f32 tensor over its shard (`state.{kind}`; f32
//! holds f32, f16 and bf16 state exactly), and in its metadata which elements of which
//! tensors the shard holds and where (`pieces`: `tensor:start-end@at`, `;`-separated), the
//! tensors' lengths and dtypes, the step count and the groups' Schedule-Free values. A
//! loader on any number of ranks takes each of its pieces' elements from the files whose
//! pieces hold them.

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
    pub kinds: Vec<(StateKind, Vec<f32>)>,
}

/// What a rank loads: its range of every state kind, and the values every file shares.
pub(crate) struct Loaded {
    pub step: u64,
    pub schedule_free: Vec<Option<ScheduleFreeScalars>>,
    pub kinds: Vec<(StateKind, Vec<f32>)>,
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
    let bytes: Vec<(String, Vec<u8>)> = file
        .kinds
        .iter()
        .map(|(kind, values)| (format!("state.{}", kind.torch_name()), bytemuck::cast_slice(values).to_vec()))
        .collect();
    let mut views = Vec::with_capacity(bytes.len());
    for (name, data) in &bytes {
        let view = TensorView::new(Dtype::F32, vec![data.len() / 4], data)
            .map_err(|e| bad(&path, format!("`{name}`: {e}")))?;
        views.push((name.clone(), view));
    }
    let serialized = checksum::serialize(views, metadata)?;
    std::fs::write(&path, serialized).map_err(|e| bad(&path, format!("cannot write it: {e}")))
}

/// Reads the checkpoint in `dir` (every rank's file of one save) and assembles each state
/// kind over a shard of `shard_len` elements holding the pieces `want`; refuses files of
/// other tensors than `structure`.
pub(crate) fn read(dir: &Path, structure: &str, want: &[Piece], shard_len: u64) -> Result<Loaded> {
    let ranks = saved_ranks(dir)?;
    let mut loaded = Loaded { step: 0, schedule_free: Vec::new(), kinds: Vec::new() };
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
            let Some(kind) = name.strip_prefix("state.").and_then(kind_named) else {
                return Err(bad(&path, format!("unknown tensor `{name}`")));
            };
            if view.dtype() != Dtype::F32 || view.data().len() as u64 != 4 * file_len {
                return Err(bad(&path, format!("`{name}` is not F32 over the file's shard_len")));
            }
            let values: &[u8] = view.data();
            let slot = match loaded.kinds.iter().position(|(k, _)| *k == kind) {
                Some(k) => k,
                None => {
                    loaded.kinds.push((kind, vec![0.0; shard_len as usize]));
                    loaded.kinds.len() - 1
                }
            };
            for saved in &pieces {
                for piece in want.iter().filter(|p| p.tensor == saved.tensor) {
                    let from = saved.elements.start.max(piece.elements.start);
                    let to = saved.elements.end.min(piece.elements.end);
                    for element in from..to {
                        let byte = (4 * (saved.at + element - saved.elements.start)) as usize;
                        let value = f32::from_le_bytes([
                            values[byte],
                            values[byte + 1],
                            values[byte + 2],
                            values[byte + 3],
                        ]);
                        loaded.kinds[slot].1[(piece.at + element - piece.elements.start) as usize] = value;
                    }
                }
            }
        }
    }
    Ok(loaded)
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

/// This rank's file over `plan`'s shard: `state(j, kind)` reads its piece `j`'s state of
/// `kind` as f32, `None` where the piece keeps none.
pub(crate) fn collect(
    plan: &super::plan::ShardPlan,
    step: u64,
    schedule_free: Vec<Option<ScheduleFreeScalars>>,
    mut state: impl FnMut(usize, StateKind) -> Result<Option<Vec<f32>>>,
) -> Result<ShardFile> {
    let shard_len = plan.shard_len as usize;
    let mut kinds: Vec<(StateKind, Vec<f32>)> = Vec::new();
    for (j, piece) in plan.mine().iter().enumerate() {
        for &kind in StateKind::ALL {
            let Some(values) = state(j, kind)? else { continue };
            let slot = match kinds.iter().position(|(k, _)| *k == kind) {
                Some(slot) => slot,
                None => {
                    kinds.push((kind, vec![0.0; shard_len]));
                    kinds.len() - 1
                }
            };
            kinds[slot].1[piece.at as usize..piece.at as usize + values.len()].copy_from_slice(&values);
        }
    }
    let pieces = plan.mine().to_vec();
    Ok(ShardFile {
        ranks: plan.size,
        pieces,
        shard_len: plan.shard_len,
        step,
        structure: plan.structure(),
        schedule_free,
        kinds,
    })
}

/// Checks that `loaded` has every state kind this rank's pieces keep (`keeps(j, kind)`),
/// then hands each piece its values: `write(j, kind, values)`. Nothing is written when a
/// kind is missing.
pub(crate) fn apply(
    plan: &super::plan::ShardPlan,
    loaded: &Loaded,
    dir: &Path,
    keeps: impl Fn(usize, StateKind) -> bool,
    mut write: impl FnMut(usize, StateKind, &[f32]) -> Result<()>,
) -> Result<()> {
    let pieces = plan.mine();
    let mut writes = Vec::new();
    for (j, piece) in pieces.iter().enumerate() {
        for &kind in StateKind::ALL.iter().filter(|&&k| keeps(j, k)) {
            let Some((_, values)) = loaded.kinds.iter().find(|(k, _)| *k == kind) else {
                return Err(bad(dir, format!("the checkpoint holds no `{}` state", kind.torch_name())));
            };
            let at = piece.at as usize;
            writes.push((j, kind, &values[at..at + (piece.elements.end - piece.elements.start) as usize]));
        }
    }
    for (j, kind, values) in writes {
        write(j, kind, values)?;
    }
    Ok(())
}

/// Refuses a sharded checkpoint of low-bit state (`call`: "save" or "load"), which the
/// format does not hold yet.
pub(crate) fn check_storage(plan: &super::plan::ShardPlan, call: &'static str) -> Result<()> {
    match plan.storage {
        crate::StateStorage::Q8(_) | crate::StateStorage::Q4(_) => Err(Error::ConflictingOptions {
            first: call,
            second: "state_storage",
            reason: "a sharded checkpoint holds f32, f16 and bf16 state; 8-bit and 4-bit state is not in its format yet",
        }),
        _ => Ok(()),
    }
}
