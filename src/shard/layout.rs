//! The flat layout of ZeRO-1 (DeepSpeed's `stage_1_and_2.py`, Megatron's distributed
//! optimizer): a group's parameters one after another in one flat range, split into equal
//! contiguous shards, one per rank, so that a shard may cut a tensor in the middle.

use std::ops::Range;

use crate::{Error, Result};

/// Where each tensor of a group lies in the flat range, and which part of which tensors
/// each rank's shard holds.
///
/// Every tensor starts at a multiple of `align` elements and every shard is a whole number
/// of `align`s, so that with `align` a low-bit block size a shard's boundary is a block
/// boundary of the tensor it cuts: a sharded block is the block the unsharded state has.
/// The flat range is padded at the end to `ranks * align`; padding belongs to no tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlatLayout {
    lens: Vec<u64>,
    starts: Vec<u64>,
    shard_len: u64,
    ranks: usize,
}

/// One tensor's part in a shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    /// The tensor's index in the group.
    pub tensor: usize,
    /// The elements of the tensor in this shard.
    pub elements: Range<u64>,
    /// Where they start in the shard.
    pub at: u64,
}

impl FlatLayout {
    /// The layout of tensors of `lens` elements over `ranks` shards, each tensor starting at
    /// a multiple of `align` elements (1: packed; a block size for low-bit state).
    pub fn new(lens: &[u64], ranks: usize, align: u64) -> Result<Self> {
        if ranks == 0 || align == 0 {
            return Err(Error::BadValue {
                argument: if ranks == 0 { "ranks" } else { "align" }.into(),
                problem: "is 0, but a flat layout needs at least one rank and an alignment of at least 1"
                    .into(),
            });
        }
        let mut starts = Vec::with_capacity(lens.len());
        let mut end = 0u64;
        for &len in lens {
            let start = end.div_ceil(align) * align;
            starts.push(start);
            end = start + len;
        }
        let unit = ranks as u64 * align;
        let padded = end.div_ceil(unit) * unit;
        Ok(FlatLayout { lens: lens.to_vec(), starts, shard_len: padded / ranks as u64, ranks })
    }

    /// Elements per shard (every shard has as many, padding included).
    pub fn shard_len(&self) -> u64 {
        self.shard_len
    }

    /// The flat range's length, padding included: `ranks * shard_len`.
    pub fn padded_len(&self) -> u64 {
        self.shard_len * self.ranks as u64
    }

    /// Where tensor `i` starts in the flat range.
    pub fn start(&self, tensor: usize) -> u64 {
        self.starts[tensor]
    }

    /// Rank `rank`'s shard, as a range of the flat range.
    pub fn shard(&self, rank: usize) -> Range<u64> {
        rank as u64 * self.shard_len..(rank as u64 + 1) * self.shard_len
    }

    /// The parts of tensors in rank `rank`'s shard, in flat order (tensors of no elements in
    /// it are left out).
    pub fn pieces(&self, rank: usize) -> Vec<Piece> {
        let shard = self.shard(rank);
        self.lens
            .iter()
            .zip(&self.starts)
            .enumerate()
            .filter_map(|(tensor, (&len, &start))| {
                let from = start.max(shard.start);
                let to = (start + len).min(shard.end);
                (from < to).then(|| Piece {
                    tensor,
                    elements: from - start..to - start,
                    at: from - shard.start,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element of every tensor is in exactly one shard, at the flat offset its tensor's
    /// start gives it, and shards are equal and contiguous.
    fn check_covers(lens: &[u64], ranks: usize, align: u64) -> FlatLayout {
        let layout = FlatLayout::new(lens, ranks, align).unwrap();
        let mut seen: Vec<Vec<u32>> = lens.iter().map(|&l| vec![0; l as usize]).collect();
        for rank in 0..ranks {
            assert_eq!(layout.shard(rank).end - layout.shard(rank).start, layout.shard_len());
            assert_eq!(layout.shard_len() % align, 0, "a shard is whole alignment units");
            for piece in layout.pieces(rank) {
                let flat = layout.shard(rank).start + piece.at;
                assert_eq!(flat, layout.start(piece.tensor) + piece.elements.start);
                for e in piece.elements.clone() {
                    seen[piece.tensor][e as usize] += 1;
                }
            }
        }
        assert!(seen.iter().flatten().all(|&n| n == 1), "{lens:?} over {ranks} ranks: {seen:?}");
        assert!(layout.padded_len() >= lens.iter().sum());
        assert_eq!(layout.padded_len() % (ranks as u64 * align), 0);
        layout
    }

    #[test]
    fn shards_are_equal_cover_every_element_once_and_cut_tensors_where_they_fall() {
        for ranks in 1..=4 {
            for align in [1, 4, 256] {
                check_covers(&[10, 0, 7, 1001, 3], ranks, align);
                check_covers(&[], ranks, align);
            }
        }
        // 10 + 7 elements over 2 ranks, packed: 9 per shard, the first tensor cut after 9.
        let layout = check_covers(&[10, 7], 2, 1);
        assert_eq!(layout.shard_len(), 9);
        assert_eq!(layout.pieces(0), [Piece { tensor: 0, elements: 0..9, at: 0 }]);
        assert_eq!(
            layout.pieces(1),
            [Piece { tensor: 0, elements: 9..10, at: 0 }, Piece { tensor: 1, elements: 0..7, at: 1 }]
        );
    }

    #[test]
    fn with_a_block_size_shard_boundaries_are_block_boundaries_of_the_tensor_they_cut() {
        let block = 256;
        let layout = check_covers(&[1000, 300, 5000], 3, block);
        for rank in 0..3 {
            for piece in layout.pieces(rank) {
                assert_eq!(layout.start(piece.tensor) % block, 0);
                assert_eq!(piece.elements.start % block, 0, "rank {rank}: {piece:?}");
            }
        }
    }

    #[test]
    fn no_ranks_or_no_alignment_is_refused() {
        assert!(matches!(FlatLayout::new(&[4], 0, 1), Err(Error::BadValue { .. })));
        assert!(matches!(FlatLayout::new(&[4], 2, 0), Err(Error::BadValue { .. })));
    }
}
