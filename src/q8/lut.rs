//! The nearest code of a value in one table load and one comparison, instead of a binary
//! search over the 256 codes: what lets a step requantize at memory speed on the CPU and
//! on the GPU, whose kernels read the same table.
//!
//! A value's f32 bits, shifted right by [`BUCKET_SHIFT`], name its bucket (sign, exponent and
//! the top seven mantissa bits). [`nearest_code`](super::nearest_code) is monotone in the
//! value, and no bucket spans more than one switch between neighbouring codes (the closest
//! codes of either map, near 1, lie further apart than a bucket is wide), so a bucket is
//! described by the code at its start, the code at its end and the low bits where the first
//! gives way to the second. Every entry is derived from `nearest_code` itself, so the table
//! gives its answer bit for bit, NaN and infinities included.

use std::sync::OnceLock;

/// The bits below a value's bucket.
pub const BUCKET_SHIFT: u32 = 16;
/// Buckets of a table: every sign, exponent and top seven mantissa bits.
pub const BUCKETS: usize = 1 << (32 - BUCKET_SHIFT);

/// One map's table: per bucket `start | end << 8 | switch << 16`, where a value whose bits
/// below the bucket are at least `switch` takes `end`, and `start` otherwise.
pub struct CodeTable {
    map: [f32; 256],
    entries: Box<[u32; BUCKETS]>,
}

impl CodeTable {
    fn build(map: &[f32; 256]) -> Self {
        let code = |bits: u32| super::nearest_code(map, f32::from_bits(bits));
        let low_mask = (1u32 << BUCKET_SHIFT) - 1;
        let mut entries = Box::new([0u32; BUCKETS]);
        for (bucket, entry) in entries.iter_mut().enumerate() {
            let first = (bucket as u32) << BUCKET_SHIFT;
            let (start, end) = (code(first), code(first | low_mask));
            // The first low bits that take `end` (at most one switch per bucket).
            let (mut lo, mut hi) = (0u32, low_mask);
            if start == end {
                hi = 0;
            }
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if code(first | mid) == start {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            *entry = u32::from(start) | u32::from(end) << 8 | hi << BUCKET_SHIFT;
        }
        CodeTable { map: *map, entries }
    }

    /// The table of the map a state of `kind` is quantized with.
    pub fn for_kind(kind: crate::StateKind) -> &'static CodeTable {
        if super::is_signed(kind) {
            Self::signed()
        } else {
            Self::unsigned()
        }
    }

    /// The map this table finds codes of.
    pub fn map(&self) -> &[f32; 256] {
        &self.map
    }

    /// The table of [`super::signed_map`], built once.
    pub fn signed() -> &'static CodeTable {
        static TABLE: OnceLock<CodeTable> = OnceLock::new();
        TABLE.get_or_init(|| CodeTable::build(&super::signed_map()))
    }

    /// The table of [`super::unsigned_map`], built once.
    pub fn unsigned() -> &'static CodeTable {
        static TABLE: OnceLock<CodeTable> = OnceLock::new();
        TABLE.get_or_init(|| CodeTable::build(&super::unsigned_map()))
    }

    /// The nearest code of `x`: [`super::nearest_code`] of the table's map, bit for bit.
    #[inline(always)]
    pub fn code(&self, x: f32) -> u8 {
        let bits = x.to_bits();
        let entry = self.entries[(bits >> BUCKET_SHIFT) as usize];
        let switched = (bits & ((1 << BUCKET_SHIFT) - 1)) >= entry >> BUCKET_SHIFT;
        (if switched { entry >> 8 } else { entry }) as u8
    }

    /// The entries, as the GPU kernels bind them.
    pub fn entries(&self) -> &[u32] {
        &self.entries[..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::q8::{nearest_code, signed_map, unsigned_map};

    /// Every bucket's edges and switch point, and a spread of values between, against the
    /// binary search; and the claim the table rests on: a bucket holds at most one switch.
    #[test]
    fn the_table_gives_the_nearest_code_of_every_value_it_is_asked() {
        for (map, table) in [(signed_map(), CodeTable::signed()), (unsigned_map(), CodeTable::unsigned())] {
            let check = |bits: u32| {
                let x = f32::from_bits(bits);
                assert_eq!(table.code(x), nearest_code(&map, x), "{x:e} ({bits:#010x})");
            };
            for (bucket, entry) in table.entries().iter().enumerate() {
                let first = (bucket as u32) << BUCKET_SHIFT;
                let switch = entry >> BUCKET_SHIFT;
                // Codes are monotone in the value, so neighbouring start and end codes mean
                // one switch at most (infinities and NaN share the top buckets).
                let (start, end) = ((entry & 0xff) as i32, (entry >> 8 & 0xff) as i32);
                let finite = (first >> 23) & 0xff != 0xff;
                assert!(!finite || (start - end).abs() <= 1, "bucket {bucket:#x}: codes {start} to {end}");
                for low in [0, 1, switch.saturating_sub(1), switch, switch + 1, 0x7fff, 0xfffe, 0xffff] {
                    check(first | low.min(0xffff));
                }
            }
            // Pseudo-random bits (a 32-bit LCG) and the codes themselves with their neighbours.
            let mut state = 0x2545_f491u32;
            for _ in 0..200_000 {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                check(state);
            }
            for c in map {
                for delta in [-1i32, 0, 1] {
                    check(c.to_bits().wrapping_add_signed(delta));
                }
            }
        }
    }
}
