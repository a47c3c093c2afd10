//! Packing segments into dispatches, for every kernel that updates many segments in one
//! dispatch through a table: greedily, in order, each segment joining the dispatch still open
//! for what it must share with it (its variant and buffers) while the dispatch's rules
//! (binding sizes, the table's room, no byte written by one segment and touched by another)
//! accept it. The rules themselves are the caller's; `gpu::table` has the table's room
//! ([`crate::gpu::table::table_fits`]) and the workgroup shares.

use std::collections::HashMap;
use std::hash::Hash;

/// Packs `items` in order: each joins the dispatch still open for its key where `try_add`
/// accepts it, and otherwise starts a new one (`start`), which becomes the open one for its
/// key. An item without a key starts a dispatch of its own, which no item joins and which
/// leaves the open dispatches open (a phase of a pair-mode update). The dispatches, in the
/// order they were started.
pub(crate) fn pack_greedy<K: Eq + Hash, T, D>(
    items: impl IntoIterator<Item = (Option<K>, T)>,
    mut start: impl FnMut(T) -> D,
    mut try_add: impl FnMut(&mut D, &T) -> bool,
) -> Vec<D> {
    let mut dispatches: Vec<D> = Vec::new();
    let mut open: HashMap<K, usize> = HashMap::new();
    for (key, item) in items {
        let Some(key) = key else {
            dispatches.push(start(item));
            continue;
        };
        if let Some(&d) = open.get(&key) {
            if try_add(&mut dispatches[d], &item) {
                continue;
            }
        }
        open.insert(key, dispatches.len());
        dispatches.push(start(item));
    }
    dispatches
}

/// Whether the byte ranges `[a, b)` and `[c, d)` share a byte.
pub(crate) fn overlap((a, b): (u64, u64), (c, d): (u64, u64)) -> bool {
    a < d && c < b
}

/// The smallest binding, starting at a multiple of `align`, that covers the binding
/// `(lo, hi)` and the range `(start, end)`. `(u64::MAX, 0)` is the empty binding.
pub(crate) fn cover((lo, hi): (u64, u64), (start, end): (u64, u64), align: u64) -> (u64, u64) {
    (lo.min(start / align * align), hi.max(end))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Packs into dispatches of at most two items.
    fn in_twos(items: impl IntoIterator<Item = (Option<char>, i32)>) -> Vec<Vec<i32>> {
        pack_greedy(
            items,
            |x| vec![x],
            |d: &mut Vec<i32>, &x| {
                d.len() < 2 && {
                    d.push(x);
                    true
                }
            },
        )
    }

    #[test]
    fn items_join_the_open_dispatch_of_their_key_until_it_refuses_them() {
        // Keys 'a' and 'b' interleave.
        let items = [('a', 1), ('b', 2), ('a', 3), ('a', 4), ('b', 5), ('a', 6)].map(|(k, x)| (Some(k), x));
        let packed = in_twos(items);
        assert_eq!(packed, [vec![1, 3], vec![2, 5], vec![4, 6]]);
    }

    #[test]
    fn an_item_without_a_key_starts_a_dispatch_of_its_own_and_leaves_the_open_one_open() {
        let items = [(Some('a'), 1), (None, 2), (None, 3), (Some('a'), 4), (Some('a'), 5)];
        let packed = in_twos(items);
        assert_eq!(packed, [vec![1, 4], vec![2], vec![3], vec![5]]);
    }

    #[test]
    fn a_cover_starts_aligned_and_overlap_is_of_half_open_ranges() {
        assert_eq!(cover((u64::MAX, 0), (260, 300), 256), (256, 300));
        assert_eq!(cover((256, 300), (100, 120), 256), (0, 300));
        assert!(overlap((0, 8), (4, 12)));
        assert!(!overlap((0, 8), (8, 12)));
    }
}
