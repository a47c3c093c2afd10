//! The nearest code of a value by arithmetic on the value, with no table indexed per element:
//! what lets the CPU backend requantize a register of lanes at once (`cpu/q8/lanes.rs`)
//! instead of gathering from [`CodeTable`](super::lut::CodeTable).
//!
//! bitsandbytes' dynamic maps are, per sign, a zero code, seven decades `10^(k-6)` of codes
//! evenly spaced over `[0.1, 1]` of the decade (the midpoints of a `linspace`), and the code
//! of 1. Within decade `k` a value's magnitude `m` has an affine *position*
//! `m * scale[k] + offset[k]` that puts the switch between the decade's codes `j - 1` and `j`
//! at position `j` (j >= 1) and the switch from the decade below (or from 0) at position
//! [`FIRST_SWITCH`]. The *index position* `min(p, p * FIRST_SCALE + FIRST_OFFSET)` of a
//! position `p` stretches `[FIRST_SWITCH, 1]` onto `[0, 1]` and leaves the positions above 1
//! alone (the second line lies below the first exactly where `p < 1`), so that every switch
//! lies at an integer: the code is the decade's first magnitude index plus its floor (-1,
//! the code below the decade, under the first switch), and one distance to the nearest
//! integer tells a value near a switch, the first switch included. The positions of the real switches, which
//! `nearest_code`'s f32 midpoints decide, lie within 2.5e-5 of those (f32 rounding of the
//! codes and of their midpoints); a value whose position lies within [`NEAR`] of a switch is
//! reported as near ([`Quantizer::estimate`] gives `None`) and its caller asks the exact rule.
//! Every other value's code is the nearest code bit for bit, even from a product `v * (1 /
//! absmax)` instead of the rule's quotient `v / absmax` (a few ulps apart, far less than
//! `NEAR`): the division, the slowest instruction of the loop, is left to the near values.
//!
//! The decade of `m` is the decade of its span's start, plus one where the span holds a
//! decade's start (a span is two binades, a factor 4, so it holds at most one): two 16-entry
//! tables indexed by the exponent's upper bits, which a register permute reads. The decades' starts are put a
//! little below the powers of ten (`DECADE_START`): near a decade's start both decades give
//! the same code (the last one of the decade below) and the position stays below the
//! decade's count of codes.
//!
//! The AVX-512 loop looks no decade up: each decade's position and its first code's stretch,
//! plus the code of the decade's first code, are lines in the magnitude, and as the code
//! rises by ever smaller steps from one line to the next, the least of the lines is the one
//! whose range holds the magnitude; a span meets at most three ([`LINES`]), so three
//! 16-entry tables of slopes and offsets, read by register permutes, and two minimums give
//! the *code position*, whose floor is the code and whose distance to the nearest integer
//! is the index position's (`Quantizer::code_position`, which the tests run).

use super::nearest_code;

/// The position of the switch from the code below a decade to the decade's first code.
/// (The decade's first switch between its own codes lies at 1; with bitsandbytes' spacing
/// the switch from the decade below lies 0.8 of a step below it.)
pub const FIRST_SWITCH: f32 = 0.2;

/// The index position's slope below position 1: `[FIRST_SWITCH, 1]` onto `[0, 1]` (exact in
/// f32, as is [`FIRST_OFFSET`]).
pub const FIRST_SCALE: f32 = 1.25;

/// The index position's offset below position 1.
pub const FIRST_OFFSET: f32 = -0.25;

/// A code position nearer than this to an integer is left to the exact rule: about three
/// times the most by which a code position can miss (the switches lie within 2.5e-5 of their
/// positions, the product by the reciprocal and the fused multiply-add add under 2.5e-5,
/// the stretch below position 1 a quarter more, and the lines' f32 slopes and offsets, of
/// codes up to 255, under 2.5e-5), and rare enough in
/// practice (a value lies that near a switch with odds of about 1 in 1000) to cost little.
pub const NEAR: f32 = 1.0 / 4096.0;

/// Magnitudes are clamped to this before their position is taken, so that the top decade's
/// position stays below its count of codes (the switch to the code of 1, which lies below,
/// is tested on the values themselves instead: [`Quantizer::top_value`]).
pub const CLAMP: f32 = 0.999;

/// A decade starts at this fraction of its power of ten (see the module docs).
pub const DECADE_START: f64 = 0.998;

/// The bits of the smallest magnitude given a position, 2^-24: smaller ones (far below the
/// smallest codes, whose code is the code of 0 as its is) are raised to it, so that every
/// magnitude's span (its bits shifted right by [`SPAN_SHIFT`], modulo 16) has an entry.
pub const FLOOR: u32 = 103 << 23;

/// A magnitude's bits shifted right by this, modulo 16, name its span: two binades.
pub const SPAN_SHIFT: u32 = 24;

/// Decades of a dynamic map.
pub const DECADES: usize = 7;

/// Lines per span (see [`Quantizer::code_position`]).
pub const LINES: usize = 3;

/// One map's constants, derived from the map itself (see the module docs).
// The fields and method marked `allow(dead_code)` off x86-64 serve only the CPU backend's
// AVX-512 loops (`cpu/q8/lanes.rs`); wasm32 and aarch64 builds compile the rest.
#[derive(Clone, Debug)]
pub struct Quantizer {
    /// Whether the map has negative codes (the code of 0 in its middle).
    #[cfg_attr(not(all(feature = "cpu", target_arch = "x86_64")), allow(dead_code))]
    pub signed: bool,
    /// The code of 0, which NaN and the infinities take.
    #[cfg_attr(not(all(feature = "cpu", target_arch = "x86_64")), allow(dead_code))]
    pub zero: u8,
    /// Per span (see [`SPAN_SHIFT`]): the decade of its smallest magnitude. This and the
    /// next three locate each switch in its decade for the tests; the code positions'
    /// lines are derived from the same positions.
    #[cfg_attr(not(test), allow(dead_code))]
    pub span_decade: [i32; 16],
    /// Per span: the start of the decade that begins inside it, or 2 (above any magnitude).
    #[cfg_attr(not(test), allow(dead_code))]
    pub span_split: [f32; 16],
    /// The starts of decades 1 to 6: a magnitude's decade is the count of them it reaches
    /// (what the span tables give; the GPU kernels compare with each instead).
    pub starts: [f32; DECADES - 1],
    /// Per decade: the position's slope (the GPU kernels' decade constants, which pick a
    /// decade by comparing with [`starts`](Self::starts), and the tests).
    pub scale: [f32; 16],
    /// Per decade: the position's offset.
    pub offset: [f32; 16],
    /// Per decade: its first code's magnitude index (index 0 is the code of 0).
    pub base: [i32; 16],
    /// The bits of the smallest positive value whose nearest code is the code of 1.
    pub top_bits: u32,
    /// The magnitude index of the code of 1.
    pub top_index: i32,
    /// The code of magnitude index 0 (the code of 0): 127 in the signed map, 0 in the
    /// unsigned one; a positive value's code is its magnitude index plus this.
    #[cfg_attr(not(all(feature = "cpu", target_arch = "x86_64")), allow(dead_code))]
    pub middle: i32,
    /// Per span: the slopes of the (at most) three lines whose least, floored, is the code
    /// of a positive magnitude in the span ([`Quantizer::code_position`]).
    #[cfg_attr(not(all(feature = "cpu", target_arch = "x86_64")), allow(dead_code))]
    pub line_scale: [[f32; 16]; LINES],
    /// Per span: the lines' offsets.
    #[cfg_attr(not(all(feature = "cpu", target_arch = "x86_64")), allow(dead_code))]
    pub line_offset: [[f32; 16]; LINES],
    /// The map's f32 bits, byte `p` of every code in `planes[p]`: four 256-entry byte tables,
    /// which byte permutes read 64 codes at a time.
    #[cfg_attr(not(all(feature = "cpu", target_arch = "x86_64")), allow(dead_code))]
    pub planes: [[u8; 256]; 4],
}

impl Quantizer {
    /// The constants of `map`, one of bitsandbytes' dynamic maps (signed or unsigned).
    ///
    /// # Panics
    ///
    /// If `map` is not laid out as a dynamic map (checked so that a changed map fails loudly
    /// in the tests rather than quantizing wrongly).
    pub fn new(map: &[f32; 256]) -> Self {
        let signed = map[0] < 0.0;
        // The positive codes below 1, by magnitude index (1, 2, ...).
        let first_positive = if signed { 128 } else { 1 };
        let positive = &map[first_positive..255];
        assert!(map[first_positive - 1] == 0.0 && map[255] == 1.0, "not a dynamic map");
        let power = |k: usize| 10f64.powi(k as i32 - 6);
        let decade_start = |k: usize| DECADE_START * power(k) / 10.0;

        let (mut scale, mut offset, mut bases) = ([0f32; 16], [0f32; 16], [0i32; 16]);
        let middle = if signed { 127 } else { 0 };
        // The code position's lines (slope, offset), two a decade: its first code's stretch
        // below position 1, then the decade's position, both plus the decade's first code.
        let mut lines: Vec<(f64, f64)> = Vec::new();
        let mut first = 0usize;
        for k in 0..DECADES {
            let codes: Vec<f64> = positive
                .iter()
                .map(|&c| f64::from(c))
                .filter(|&c| c >= power(k) / 10.0 && c < power(k))
                .collect();
            let n = codes.len();
            assert!(
                n >= 1 && positive[first] as f64 == codes[0],
                "decade {k} of the map is not where expected"
            );
            let below = if first == 0 { 0.0 } else { f64::from(positive[first - 1]) };
            let first_switch = (below + codes[0]) / 2.0;
            // Two points fix the affine position: the first switch at FIRST_SWITCH, and the
            // last switch at n - 1 (or, for a decade of one code, its end short of 1).
            let (far, at) = if n >= 2 {
                ((codes[n - 2] + codes[n - 1]) / 2.0, (n - 1) as f64)
            } else {
                (decade_start(k + 1), 0.9)
            };
            let slope = (at - f64::from(FIRST_SWITCH)) / (far - first_switch);
            let intercept = f64::from(FIRST_SWITCH) - slope * first_switch;
            scale[k] = slope as f32;
            offset[k] = intercept as f32;
            // The decade's first code's magnitude index (index 0 is the code of 0).
            let base = (first + 1) as i32;
            bases[k] = base;
            let code = f64::from(base + middle);
            let (stretch, shift) = (f64::from(FIRST_SCALE), f64::from(FIRST_OFFSET));
            lines.push((stretch * slope, stretch * intercept + shift + code));
            lines.push((slope, intercept + code));
            first += n;
        }
        assert_eq!(first, positive.len(), "codes outside the decades");

        // Magnitudes from FLOOR to CLAMP lie in spans 51 to 63 (exponent fields 102 to 126),
        // entries 3 to 15; entries 0 to 2 are never read.
        assert!(FLOOR >> SPAN_SHIFT == 51 && CLAMP.to_bits() >> SPAN_SHIFT == 63);
        let starts: [f32; DECADES - 1] = std::array::from_fn(|i| decade_start(i + 1) as f32);
        let (mut span_decade, mut span_split) = ([0i32; 16], [2f32; 16]);
        for (entry, (decade, split)) in span_decade.iter_mut().zip(span_split.iter_mut()).enumerate() {
            let low = f32::from_bits((48 + entry as u32) << SPAN_SHIFT);
            *decade = starts.iter().filter(|&&s| s <= low).count() as i32;
            if let Some(&s) = starts.iter().find(|&&s| s > low && s < 4.0 * low) {
                *split = s;
            }
        }

        let (line_scale, line_offset) = span_lines(&lines);

        // The switch to the code of 1: the first bits, above the code below it, that take it.
        let (mut lo, mut hi) = (map[254].to_bits(), 1f32.to_bits());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if nearest_code(map, f32::from_bits(mid)) == 255 {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        assert!(f32::from_bits(hi) < CLAMP, "the code of 1 switches above the clamp");
        Quantizer {
            signed,
            zero: super::zero_code(map),
            span_decade,
            span_split,
            starts,
            scale,
            offset,
            base: bases,
            top_bits: hi,
            top_index: if signed { 128 } else { 255 },
            middle,
            line_scale,
            line_offset,
            planes: std::array::from_fn(|p| std::array::from_fn(|c| (map[c].to_bits() >> (8 * p)) as u8)),
        }
    }

    /// The code position of a magnitude `m` clamped to [[`FLOOR`], [`CLAMP`]]: its span's
    /// lines' least value, whose floor is the code of `m` (of a positive value; below the
    /// switch to the code of 1), and whose distance to the nearest integer is that of its
    /// index position (see the module docs): the lines are the decades' positions and the
    /// stretches of their first codes, each plus the code of its decade's first code, and
    /// as the code rises by ever smaller steps of the magnitude from one line to the next,
    /// the least of them is the line whose range holds `m`. No decade is looked up.
    #[cfg(test)]
    pub fn code_position(&self, m: f32) -> f32 {
        let span = (m.to_bits() >> SPAN_SHIFT) as usize % 16;
        let line = |l: usize| m.mul_add(self.line_scale[l][span], self.line_offset[l][span]);
        line(0).min(line(1).min(line(2)))
    }

    /// The smallest value `v` whose quotient `v / absmax` takes the code of 1 (for a normal
    /// absmax): the switch to the code of 1 tested on the values themselves, exactly, where
    /// the position is taken from a product by the reciprocal.
    #[cfg_attr(not(all(feature = "cpu", target_arch = "x86_64")), allow(dead_code))]
    pub fn top_value(&self, absmax: f32) -> f32 {
        // fl(v / absmax) >= top exactly where v / absmax reaches the midpoint of top and the
        // float below it (inclusive where rounding to even picks top there): v >= absmax *
        // midpoint, a product exact in f64 (24 + 25 significant bits).
        let top = f32::from_bits(self.top_bits);
        let midpoint = (f64::from(top) + f64::from(top.next_down())) / 2.0;
        let bound = f64::from(absmax) * midpoint;
        let inclusive = self.top_bits & 1 == 0;
        // The nearest f32 to the bound, or the one above it where it falls short: the float
        // below the nearest lies more than the bound's distance below.
        let v = bound as f32;
        let reaches = if inclusive { f64::from(v) >= bound } else { f64::from(v) > bound };
        if reaches {
            v
        } else {
            v.next_up()
        }
    }

    /// The nearest code of `quotient` from `x`, a value a few ulps from it (see the module
    /// docs), or `None` where `x` lies near a switch between codes and only the exact rule can
    /// tell. Lane for lane what the CPU backend's AVX-512 loop computes (which tests the switch
    /// to the code of 1 with [`Quantizer::top_value`]), written out for the tests.
    #[cfg(test)]
    pub fn estimate(&self, x: f32, quotient: f32) -> Option<u8> {
        let bits = x.to_bits();
        let magnitude = bits & 0x7fff_ffff;
        if magnitude >= super::lut::INFINITY {
            return Some(self.zero);
        }
        let negative = bits >> 31 == 1;
        let clamped = magnitude.clamp(FLOOR, CLAMP.to_bits());
        let m = f32::from_bits(clamped);
        let position = self.code_position(m);
        let top = quotient >= f32::from_bits(self.top_bits);
        let code = if top { self.top_index + self.middle } else { position.floor() as i32 };
        if (position - position.round_ties_even()).abs() < NEAR {
            return None;
        }
        // A negative value's code mirrors its magnitude's in the signed map (127 less its
        // magnitude index), and never reaches the code of 0: the sign rule keeps the code
        // below it (`nearest_code`). The unsigned map has only the code of 0 for it.
        let code = match (self.signed, negative) {
            (true, true) => 254 - code.max(self.middle + 1),
            (false, true) => 0,
            (_, false) => code,
        };
        Some(code as u8)
    }
}

/// Per span, the lines of `lines` (slope, offset; by falling slope) that are the least of
/// them somewhere in the span, as f32 (the last repeated where fewer than [`LINES`]).
///
/// # Panics
///
/// If a span needs more than [`LINES`].
fn span_lines(lines: &[(f64, f64)]) -> ([[f32; 16]; LINES], [[f32; 16]; LINES]) {
    // The lower envelope over m >= 0 (slopes fall, so each line, once least, stays least
    // until the next one takes over): the lines kept and where each stops being least.
    let cross = |a: (f64, f64), b: (f64, f64)| (b.1 - a.1) / (a.0 - b.0);
    let mut hull: Vec<(f64, f64)> = Vec::new();
    for &line in lines {
        assert!(hull.last().is_none_or(|last| last.0 > line.0), "the lines' slopes do not fall");
        while let [.., a, b] = hull[..] {
            if cross(a, line) <= cross(a, b) {
                hull.pop();
            } else {
                break;
            }
        }
        while let [a] = hull[..] {
            // A first line above the next one at 0 is never least.
            if cross(a, line) <= 0.0 {
                hull.pop();
            } else {
                break;
            }
        }
        hull.push(line);
    }
    let ends: Vec<f64> = hull.windows(2).map(|w| cross(w[0], w[1])).chain([f64::INFINITY]).collect();
    let (mut scales, mut offsets) = ([[0f32; 16]; LINES], [[0f32; 16]; LINES]);
    for entry in 0..16 {
        // Spans below FLOOR's (entries 0 to 2) are never read: they take FLOOR's lines.
        let low = f64::from(f32::from_bits((48 + entry.max(3) as u32) << SPAN_SHIFT));
        let high = 4.0 * low;
        let mut start = 0.0;
        let mut kept = Vec::new();
        for (line, end) in hull.iter().zip(&ends) {
            if start <= high && *end >= low {
                kept.push(*line);
            }
            start = *end;
        }
        assert!(!kept.is_empty() && kept.len() <= LINES, "span {entry} needs {} lines", kept.len());
        for l in 0..LINES {
            let (scale, offset) = kept[l.min(kept.len() - 1)];
            scales[l][entry] = scale as f32;
            offsets[l][entry] = offset as f32;
        }
    }
    (scales, offsets)
}

/// The index position of a position (see the module docs), as the AVX-512 loop takes it.
#[cfg(test)]
fn index_position(position: f32) -> f32 {
    position.min(position.mul_add(FIRST_SCALE, FIRST_OFFSET))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::q8::lut::CodeTable;
    use crate::q8::{signed_map, unsigned_map};

    /// Every value the estimate answers gets the nearest code, and it answers all but few:
    /// each switch of either map (from the code table) and 2000 ulps either side, every
    /// code with its neighbours, the special values, and pseudo-random values and quotients.
    #[test]
    fn the_estimate_is_the_nearest_code_wherever_it_answers() {
        for (map, table) in [(signed_map(), CodeTable::signed()), (unsigned_map(), CodeTable::unsigned())] {
            let q = Quantizer::new(&map);
            let (mut asked, mut answered) = (0u64, 0u64);
            let mut check = |x: f32, exact: f32| {
                asked += 1;
                if let Some(code) = q.estimate(x, exact) {
                    answered += 1;
                    assert_eq!(
                        code,
                        nearest_code(&map, exact),
                        "{x:e} for {exact:e} ({:#010x})",
                        exact.to_bits()
                    );
                }
            };
            // The switches: the first bits of each bucket that take its end code.
            for (bucket, entry) in table.entries().iter().enumerate() {
                let sign = if bucket >= crate::q8::lut::BUCKETS_PER_SIGN { 0x8000_0000u32 } else { 0 };
                let first = crate::q8::lut::SMALLEST
                    + (((bucket % crate::q8::lut::BUCKETS_PER_SIGN) as u32) << crate::q8::lut::BUCKET_SHIFT);
                if entry & 0xff != (entry >> 8) & 0xff {
                    let at = sign | (first + (entry >> crate::q8::lut::BUCKET_SHIFT));
                    for delta in -2000i32..=2000 {
                        let x = f32::from_bits(at.wrapping_add_signed(delta));
                        check(x, x);
                    }
                }
            }
            for c in map {
                for delta in -3i32..=3 {
                    let x = f32::from_bits(c.to_bits().wrapping_add_signed(delta));
                    check(x, x);
                    check(-x, -x);
                }
            }
            let specials = [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 1e-30, -1e-30, f32::MIN_POSITIVE, 1e-45, -1e-45];
            for x in
                specials.into_iter().chain([f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, f32::MIN])
            {
                check(x, x);
            }
            for power in -8..=0 {
                let p = 10f32.powi(power);
                for delta in -50i32..=50 {
                    let x = f32::from_bits(p.to_bits().wrapping_add_signed(delta));
                    check(x, x);
                    check(-x, -x);
                }
            }
            // Products by the reciprocal against the rule's quotients.
            let mut state = 0x2545_f491u32;
            let mut next = || {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                state
            };
            for _ in 0..300_000 {
                let x = f32::from_bits(next());
                check(x, x);
                // A value and a block's absmax at least its magnitude, of any scale.
                let absmax = f32::from_bits(0x0080_0000 + next() % 0x7e00_0000);
                let v = absmax * (f32::from_bits(next() & 0x807f_ffff | 0x3f00_0000) - 0.5) * 2.0;
                check(v * (1.0 / absmax), v / absmax);
                // The switch to the code of 1, in the values' domain.
                let top = q.top_value(absmax);
                assert!(top / absmax >= f32::from_bits(q.top_bits), "{absmax:e}");
                assert!(top.next_down() / absmax < f32::from_bits(q.top_bits), "{absmax:e}");
            }
            for absmax in [1.0, f32::MIN_POSITIVE, 1.5 * f32::MIN_POSITIVE, 1e-30, 0.3, 7.0, f32::MAX / 2.0] {
                let top = q.top_value(absmax);
                assert!(top / absmax >= f32::from_bits(q.top_bits), "{absmax:e}");
                assert!(top.next_down() / absmax < f32::from_bits(q.top_bits), "{absmax:e}");
            }
            assert!(answered as f64 > 0.6 * asked as f64, "{answered} of {asked} answered");
        }
    }

    /// The margin [`NEAR`] rests on: every switch between codes below the code of 1 (the
    /// first value of each bucket's end code, from the code table) lies within 2.5e-5 of its
    /// position (an integer, or [`FIRST_SWITCH`]), and its index position within 2.5e-5 of
    /// an integer.
    #[test]
    fn every_switch_lies_near_its_position() {
        use crate::q8::lut::{BUCKETS_PER_SIGN, BUCKET_SHIFT, SMALLEST};
        for (map, table) in [(signed_map(), CodeTable::signed()), (unsigned_map(), CodeTable::unsigned())] {
            let q = Quantizer::new(&map);
            for (bucket, entry) in table.entries().iter().enumerate() {
                let first = SMALLEST + (((bucket % BUCKETS_PER_SIGN) as u32) << BUCKET_SHIFT);
                let at = first + (entry >> BUCKET_SHIFT);
                if entry & 0xff == (entry >> 8) & 0xff || at >= q.top_bits {
                    continue;
                }
                let m = f32::from_bits(at);
                let span = (at.max(FLOOR) >> SPAN_SHIFT) as usize % 16;
                let k = (q.span_decade[span] + i32::from(m >= q.span_split[span])) as usize;
                let position = m.mul_add(q.scale[k], q.offset[k]);
                let miss = (position - position.round_ties_even()).abs().min((position - FIRST_SWITCH).abs());
                assert!(miss <= 2.5e-5, "bucket {bucket}: the switch at {m:e} lies at position {position}");
                let stretched = index_position(position);
                let miss = (stretched - stretched.round_ties_even()).abs();
                assert!(
                    miss <= 2.5e-5,
                    "bucket {bucket}: the switch at {m:e} lies at index position {stretched}"
                );
                let coded = q.code_position(m);
                let miss = (coded - coded.round_ties_even()).abs();
                assert!(miss <= 6e-5, "bucket {bucket}: the switch at {m:e} lies at code position {coded}");
            }
        }
    }

    /// f32 magnitudes across all of [2^-26, 1] of both signs, against the code table: every
    /// 31st bit pattern (a prime stride, so the walk meets every low-bit residue and every
    /// bucket), beside the test above that takes every value within 2000 ulps of each switch,
    /// where an estimate could go wrong. (Every pattern takes minutes in a debug build; the
    /// stride keeps the walk to a few seconds.)
    #[test]
    fn the_estimate_is_the_nearest_code_of_values_across_the_whole_range() {
        for (map, table) in [(signed_map(), CodeTable::signed()), (unsigned_map(), CodeTable::unsigned())] {
            let q = Quantizer::new(&map);
            for bits in (0x3280_0000u32..=0x3f80_0000).step_by(31) {
                for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
                    if let Some(code) = q.estimate(x, x) {
                        assert_eq!(code, table.code(x), "{x:e}");
                    }
                }
            }
        }
    }
}
