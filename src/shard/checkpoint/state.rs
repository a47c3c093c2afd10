//! A shard's state in a checkpoint: each state kind in the shard's coordinates (dense
//! values, low-bit codes and their blocks' scales), built from the pieces' states and cut
//! back into them.

use std::path::Path;

use super::{bad, Loaded, ShardFile};
use crate::family::adafactor::shard::ShardedAdafactor;
use crate::q4::Q4State;
use crate::q8::StoredState;
use crate::shard::plan::ShardPlan;
use crate::shard::Piece;
use crate::{Result, ScheduleFreeScalars, StateKind, StateStorage};

/// How a shard's low-bit codes are packed: none, one byte per element (8-bit), or two
/// elements per byte (4-bit), with one scale per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Codes {
    None,
    Q8,
    Q4 { block: u64 },
}

impl Codes {
    /// The packing of `storage`'s codes.
    pub(crate) fn of(storage: StateStorage) -> Self {
        match storage {
            StateStorage::Q8(_) => Codes::Q8,
            StateStorage::Q4(q4) => Codes::Q4 { block: q4.block_size as u64 },
            _ => Codes::None,
        }
    }

    /// Elements per block (1 without codes).
    fn block(self) -> u64 {
        match self {
            Codes::None => 1,
            Codes::Q8 => crate::q8::BLOCK_SIZE as u64,
            Codes::Q4 { block } => block,
        }
    }

    /// The bytes of the codes of `elements` elements starting at a block boundary.
    pub(crate) fn bytes(self, elements: u64) -> u64 {
        match self {
            Codes::None => 0,
            Codes::Q8 => elements,
            Codes::Q4 { .. } => elements.div_ceil(2),
        }
    }

    /// The blocks of `elements` elements starting at a block boundary.
    pub(crate) fn blocks(self, elements: u64) -> u64 {
        match self {
            Codes::None => 0,
            _ => elements.div_ceil(self.block()),
        }
    }
}

/// One state kind over a shard: `dense` (f32 per element: dense state, and the f32 state
/// low-bit storage keeps for small tensors), `codes` and `scales` (the low-bit state);
/// empty where no piece keeps that form.
#[derive(Clone, Debug, Default)]
pub(crate) struct KindData {
    pub dense: Vec<f32>,
    pub codes: Vec<u8>,
    pub scales: Vec<f32>,
}

/// One piece's state of one kind, as the sharded optimizers' inner optimizers give and
/// take it.
pub(crate) enum PieceState {
    Dense(Vec<f32>),
    Q8(StoredState),
    Q4(Q4State),
}

impl KindData {
    /// Places `state`, the state of a piece at `at` in a shard of `shard_len` elements.
    fn place(&mut self, codes: Codes, shard_len: u64, at: u64, state: PieceState) {
        let at_code = codes.bytes(at) as usize;
        let at_block = codes.blocks(at) as usize;
        let dense = |data: &mut Self, values: &[f32]| {
            data.dense.resize(shard_len as usize, 0.0);
            data.dense[at as usize..at as usize + values.len()].copy_from_slice(values);
        };
        let low_bit = |data: &mut Self, bytes: &[u8], scales: &[f32]| {
            data.codes.resize(codes.bytes(shard_len) as usize, 0);
            data.scales.resize(codes.blocks(shard_len) as usize, 0.0);
            data.codes[at_code..at_code + bytes.len()].copy_from_slice(bytes);
            data.scales[at_block..at_block + scales.len()].copy_from_slice(scales);
        };
        match state {
            PieceState::Dense(values)
            | PieceState::Q8(StoredState::F32(values))
            | PieceState::Q4(Q4State::F32(values)) => dense(self, &values),
            PieceState::Q8(StoredState::Q8 { codes, absmax }) => low_bit(self, &codes, &absmax),
            PieceState::Q4(Q4State::Q4 { codes, scale }) => low_bit(self, &codes, &scale),
        }
    }

    /// Copies the elements that `saved` (a piece of a file, whose `part` of this kind is
    /// `bytes`) and `piece` (of the shard being loaded, `shard_len` elements) share: dense
    /// values element by element, codes and scales block by block (both pieces start at
    /// block boundaries of their tensor).
    pub(crate) fn copy_overlap(
        &mut self,
        part: &str,
        codes: Codes,
        shard_len: u64,
        bytes: &[u8],
        saved: &Piece,
        piece: &Piece,
    ) {
        let from = saved.elements.start.max(piece.elements.start);
        let to = saved.elements.end.min(piece.elements.end);
        if from >= to {
            return;
        }
        // Where the shared elements start in the file's shard and in the one loaded.
        let (src, dst) = (saved.at + from - saved.elements.start, piece.at + from - piece.elements.start);
        let n = to - from;
        let f32_at = |i: u64| {
            let b = 4 * i as usize;
            f32::from_le_bytes([bytes[b], bytes[b + 1], bytes[b + 2], bytes[b + 3]])
        };
        match part {
            "" => {
                self.dense.resize(shard_len as usize, 0.0);
                for i in 0..n {
                    self.dense[(dst + i) as usize] = f32_at(src + i);
                }
            }
            "codes" => {
                self.codes.resize(codes.bytes(shard_len) as usize, 0);
                let (src, dst, len) =
                    (codes.bytes(src) as usize, codes.bytes(dst) as usize, codes.bytes(n) as usize);
                self.codes[dst..dst + len].copy_from_slice(&bytes[src..src + len]);
            }
            _ => {
                self.scales.resize(codes.blocks(shard_len) as usize, 0.0);
                let (src, dst) = (codes.blocks(src), codes.blocks(dst));
                for i in 0..codes.blocks(n) {
                    self.scales[(dst + i) as usize] = f32_at(src + i);
                }
            }
        }
    }

    /// The state of a piece of `len` elements at `at`, in the form its storage keeps
    /// (`low_bit`: its whole tensor's state is low-bit).
    fn piece(&self, codes: Codes, at: u64, len: u64, low_bit: bool) -> PieceState {
        let dense = || self.dense.get(at as usize..(at + len) as usize).unwrap_or_default().to_vec();
        let code_range = codes.bytes(at) as usize..(codes.bytes(at) + codes.bytes(len)) as usize;
        let scale_range = codes.blocks(at) as usize..(codes.blocks(at) + codes.blocks(len)) as usize;
        let bytes = || self.codes.get(code_range.clone()).unwrap_or_default().to_vec();
        let scales = || self.scales.get(scale_range.clone()).unwrap_or_default().to_vec();
        match (codes, low_bit) {
            (Codes::Q8, true) => PieceState::Q8(StoredState::Q8 { codes: bytes(), absmax: scales() }),
            (Codes::Q8, false) => PieceState::Q8(StoredState::F32(dense())),
            (Codes::Q4 { .. }, true) => PieceState::Q4(Q4State::Q4 { codes: bytes(), scale: scales() }),
            (Codes::Q4 { .. }, false) => PieceState::Q4(Q4State::F32(dense())),
            (Codes::None, _) => PieceState::Dense(dense()),
        }
    }

    /// Whether it holds the form a piece needs.
    fn has(&self, codes: Codes, low_bit: bool) -> bool {
        match (codes, low_bit) {
            (Codes::None, _) | (_, false) => !self.dense.is_empty(),
            (_, true) => !self.codes.is_empty(),
        }
    }
}

/// This rank's file over `plan`'s shard: `state(j, kind)` reads its piece `j`'s state of
/// `kind`, `None` where the piece keeps none; Adafactor's pieces' state is `adafactor`'s (a
/// vector's `variance` over the shard, a matrix's whole factors by tensor).
pub(crate) fn collect(
    plan: &ShardPlan,
    step: u64,
    schedule_free: Vec<Option<ScheduleFreeScalars>>,
    adafactor: Option<&ShardedAdafactor>,
    mut state: impl FnMut(usize, StateKind) -> Result<Option<PieceState>>,
) -> Result<ShardFile> {
    let codes = Codes::of(plan.storage);
    let mut kinds: Vec<(StateKind, KindData)> = Vec::new();
    for (j, piece) in plan.mine().iter().enumerate() {
        for &kind in StateKind::ALL {
            let piece_state = match adafactor.filter(|a| a.is_vector(piece.tensor)) {
                Some(adafactor) => adafactor.state(piece.tensor, kind).map(|v| PieceState::Dense(v.to_vec())),
                None => state(j, kind)?,
            };
            let Some(piece_state) = piece_state else { continue };
            let slot = match kinds.iter().position(|(k, _)| *k == kind) {
                Some(slot) => slot,
                None => {
                    kinds.push((kind, KindData::default()));
                    kinds.len() - 1
                }
            };
            kinds[slot].1.place(codes, plan.shard_len, piece.at, piece_state);
        }
    }
    Ok(ShardFile {
        ranks: plan.size,
        pieces: plan.mine().to_vec(),
        shard_len: plan.shard_len,
        step,
        structure: plan.structure(),
        schedule_free,
        kinds,
        masters: Vec::new(),
        factored: adafactor.map(ShardedAdafactor::factored).unwrap_or_default(),
    })
}

/// Checks that `loaded` has every state kind this rank's pieces keep (`keeps(j, kind)`, and
/// for Adafactor's pieces what `adafactor` keeps) in the form each keeps it, then hands each
/// piece its state: `write(j, kind, state)`, Adafactor's to `adafactor`. Nothing is written
/// when one is missing.
pub(crate) fn apply(
    plan: &ShardPlan,
    loaded: &Loaded,
    dir: &Path,
    adafactor: Option<&mut ShardedAdafactor>,
    keeps: impl Fn(usize, StateKind) -> bool,
    mut write: impl FnMut(usize, StateKind, PieceState) -> Result<()>,
) -> Result<()> {
    let codes = Codes::of(plan.storage);
    let factored = match adafactor.as_deref() {
        Some(adafactor) => adafactor.factored_from(&loaded.factored).map_err(|problem| bad(dir, problem))?,
        None => Vec::new(),
    };
    let mut writes = Vec::new();
    let mut vectors = Vec::new();
    for (j, piece) in plan.mine().iter().enumerate() {
        let low_bit = plan.low_bit(piece.tensor);
        let vector = adafactor.as_deref().is_some_and(|a| a.is_vector(piece.tensor));
        let keeps = |kind| match vector {
            true => kind == StateKind::Variance,
            false => keeps(j, kind),
        };
        for &kind in StateKind::ALL.iter().filter(|&&k| keeps(k)) {
            let data = loaded.kinds.iter().find(|(k, _)| *k == kind).map(|(_, data)| data);
            let Some(data) = data.filter(|d| d.has(codes, low_bit)) else {
                return Err(bad(
                    dir,
                    format!("the checkpoint holds no `{}` state of these pieces", kind.torch_name()),
                ));
            };
            let state = data.piece(codes, piece.at, piece.elements.end - piece.elements.start, low_bit);
            match (vector, state) {
                (true, PieceState::Dense(values)) => vectors.push((piece.tensor, values)),
                (_, state) => writes.push((j, kind, state)),
            }
        }
    }
    if let Some(adafactor) = adafactor {
        for (tensor, values) in vectors {
            adafactor.set_state(tensor, StateKind::Variance, &values);
        }
        for (tensor, kind, values) in factored {
            adafactor.set_state(tensor, kind, values);
        }
    }
    for (j, kind, state) in writes {
        write(j, kind, state)?;
    }
    Ok(())
}

impl ShardFile {
    /// Places the masters of this rank's piece `piece` (master-weight mode).
    pub(crate) fn place_masters(&mut self, piece: &Piece, values: &[f32]) {
        self.masters.resize(self.shard_len as usize, 0.0);
        self.masters[piece.at as usize..piece.at as usize + values.len()].copy_from_slice(values);
    }
}

impl Loaded {
    /// The loaded masters of a piece, or why they are missing.
    pub(crate) fn masters_of(&self, dir: &Path, piece: &Piece) -> Result<Vec<f32>> {
        let range = piece.at as usize..(piece.at + piece.elements.end - piece.elements.start) as usize;
        match self.masters.dense.get(range) {
            Some(values) => Ok(values.to_vec()),
            None => Err(bad(dir, "the checkpoint holds no f32 masters, which master-weight mode keeps")),
        }
    }
}
