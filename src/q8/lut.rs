//! The nearest code of a value in one table load and one comparison, instead of a binary
//! search over the 256 codes: what lets a step requantize without a search per element, on
//! the CPU and on the GPU, whose kernels read the same table.
//!
//! A value's magnitude is clamped into [`SMALLEST`, 1] (below `SMALLEST` every map's
//! nearest code is the code of 0; above 1 it is the end code, as
//! [`nearest_code`](super::nearest_code) clamps), and its f32 bits, shifted right by
//! [`BUCKET_SHIFT`], name its bucket (exponent and top seven mantissa bits), per sign.
//! `nearest_code` is monotone in the value, and no bucket spans more than one switch between
//! neighbouring codes (the closest codes of either map, near 1, lie further apart than a
//! bucket is wide), so a bucket is described by the code at its start, the code at its end
//! and the low bits where the first gives way to the second. Every entry is derived from
//! `nearest_code` itself, so the table gives its answer bit for bit. The table is 23 KiB: it
//! stays in a CPU core's L1 cache.

use std::sync::OnceLock;

/// The bits below a value's bucket.
pub const BUCKET_SHIFT: u32 = 16;
/// The bits of the smallest magnitude with a bucket of its own, 2^-23: below it, every
/// value's nearest code is the code of 0 (both maps' smallest non-zero codes are above
/// 3e-7, twice 2^-23).
pub const SMALLEST: u32 = 0x3400_0000;
/// The bits of 1.0, the largest magnitude a bucket starts at.
pub const ONE: u32 = 0x3f80_0000;
/// The bits of infinity: magnitudes from it up are infinite or NaN.
pub const INFINITY: u32 = 0x7f80_0000;
/// Buckets of one sign: magnitudes from [`SMALLEST`] to 1.
pub const BUCKETS_PER_SIGN: usize = ((ONE - SMALLEST) >> BUCKET_SHIFT) as usize + 1;
/// Buckets of a table: positive values, then negative ones.
pub const BUCKETS: usize = 2 * BUCKETS_PER_SIGN;

/// One map's table: per bucket `start | end << 8 | switch << 16`, where a value whose bits
/// below the bucket are at least `switch` takes `end`, and `start` otherwise.
pub struct CodeTable {
    map: [f32; 256],
    /// The code of 0, which NaN and the infinities take.
    zero: u8,
    entries: Box<[u32]>,
    /// The same codes by arithmetic, for the CPU backend's vector loops.
    quantizer: super::arith::Quantizer,
}

/// The bucket of `x` (not NaN) and the bits of its clamped magnitude.
#[cfg_attr(not(feature = "cpu"), allow(dead_code))]
#[inline(always)]
fn bucket(bits: u32) -> (usize, u32) {
    let magnitude = (bits & 0x7fff_ffff).clamp(SMALLEST, ONE);
    let sign = (bits >> 31) as usize;
    (sign * BUCKETS_PER_SIGN + ((magnitude - SMALLEST) >> BUCKET_SHIFT) as usize, magnitude)
}

impl CodeTable {
    fn build(map: &[f32; 256]) -> Self {
        let low_mask = (1u32 << BUCKET_SHIFT) - 1;
        let mut entries = vec![0u32; BUCKETS].into_boxed_slice();
        for (b, entry) in entries.iter_mut().enumerate() {
            let sign = if b >= BUCKETS_PER_SIGN { 0x8000_0000 } else { 0 };
            let first = SMALLEST + (((b % BUCKETS_PER_SIGN) as u32) << BUCKET_SHIFT);
            let code = |low: u32| super::nearest_code(map, f32::from_bits(sign | first | low));
            // The bucket of 1.0 holds only 1.0 itself (larger values are clamped to it).
            let last = if first == ONE { 0 } else { low_mask };
            let (start, end) = (code(0), code(last));
            // The first low bits that take `end` (at most one switch per bucket).
            let (mut lo, mut hi) = (0u32, if start == end { 0 } else { last });
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if code(mid) == start {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            // Where nothing switches, every value takes `end`, which is `start`.
            let switch = if start == end { 0 } else { hi };
            *entry = u32::from(start) | u32::from(end) << 8 | switch << BUCKET_SHIFT;
        }
        CodeTable {
            map: *map,
            zero: super::zero_code(map),
            entries,
            quantizer: super::arith::Quantizer::new(map),
        }
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

    /// The table of the map a state of `kind` is quantized with (the CPU backend's lookup;
    /// the GPU kernels name the maps' tables by their place in the code tables' binding).
    #[cfg(feature = "cpu")]
    pub fn for_kind(kind: crate::StateKind) -> &'static CodeTable {
        if super::is_signed(kind) {
            Self::signed()
        } else {
            Self::unsigned()
        }
    }

    /// The code NaN and the infinities take: the code of 0.
    pub fn zero(&self) -> u8 {
        self.zero
    }

    /// The map this table finds codes of.
    pub fn map(&self) -> &[f32; 256] {
        &self.map
    }

    /// The nearest code of `x`: [`super::nearest_code`] of the table's map, bit for bit.
    #[cfg_attr(not(feature = "cpu"), allow(dead_code))]
    #[inline(always)]
    pub fn code(&self, x: f32) -> u8 {
        let bits = x.to_bits();
        let (b, magnitude) = bucket(bits);
        let entry = self.entries.get(b).copied().unwrap_or(0);
        let switched = (magnitude & ((1 << BUCKET_SHIFT) - 1)) >= entry >> BUCKET_SHIFT;
        let code = (if switched { entry >> 8 } else { entry }) as u8;
        // NaN and the infinities take the code of 0, as `nearest_code` gives them (an integer
        // compare, so that the loops calling this stay vectorizable).
        if bits & 0x7fff_ffff >= INFINITY {
            self.zero
        } else {
            code
        }
    }

    /// The constants that find the same codes by arithmetic on the value.
    #[cfg_attr(not(feature = "cpu"), allow(dead_code))]
    pub(crate) fn quantizer(&self) -> &super::arith::Quantizer {
        &self.quantizer
    }

    /// The entries, as the GPU kernels bind them.
    pub fn entries(&self) -> &[u32] {
        &self.entries
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
                let sign = if bucket >= BUCKETS_PER_SIGN { 0x8000_0000 } else { 0 };
                let first = sign | (SMALLEST + (((bucket % BUCKETS_PER_SIGN) as u32) << BUCKET_SHIFT));
                let switch = entry >> BUCKET_SHIFT;
                // Codes are monotone in the value, so neighbouring start and end codes mean
                // one switch at most (infinities and NaN share the top buckets).
                let (start, end) = ((entry & 0xff) as i32, (entry >> 8 & 0xff) as i32);
                assert!((start - end).abs() <= 1, "bucket {bucket:#x}: codes {start} to {end}");
                for low in [0, 1, switch.saturating_sub(1), switch, switch + 1, 0x7fff, 0xfffe, 0xffff] {
                    check(first | low.min(0xffff));
                }
                // Beyond 1 and below the smallest bucket, where magnitudes are clamped.
                for bits in [0, 1, SMALLEST - 1, ONE + 1, 0x7f80_0000, 0x7fc0_0000, 0x4b80_0002] {
                    check(sign | bits);
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
