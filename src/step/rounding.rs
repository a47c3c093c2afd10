//! How a 16-bit store rounds: to nearest even (the default), stochastically from a
//! counter-based hash, or with a Kahan compensation buffer. The hash and the stochastic
//! conversions here are the CPU backend's; `shaders/stochastic.wgsl` is the same integer
//! arithmetic line for line, so both backends store the same bits for the same seed.
//!
//! # In an optimizer
//!
//! Rounding (`OptimizerBuilder::rounding`, honoured by the CPU backend too): with f16 or
//! bf16 parameters and no f32 masters, an update smaller than half a unit in the last place
//! is rounded away and training stalls. `Rounding::Stochastic { seed, state }` rounds each
//! parameter store (and with `state` each 16-bit state store) up with probability equal to
//! the discarded fraction, from a counter-based integer hash of (seed, step, parameter index,
//! element index): unbiased, reproducible for a seed, independent of how the work is
//! dispatched, and bit-identical on the GPU (native or packed f16, bf16, `vec4`, pair and
//! scalar paths, capturable or not) and the CPU backend. `Rounding::Kahan` keeps a
//! compensation tensor per parameter in its dtype (2 bytes per element, against master
//! weights' 4; `state.{i}.kahan_comp` in checkpoints): `target = p_new + c; p = round(target);
//! c = round(target - p)`. Both refuse f32 parameters, master weights and model copies with
//! typed errors; NaN and infinity store as with nearest rounding; checkpoints keep the seed
//! and the compensations, and a resumed run is bit-identical. The repository's `PERF.md` ("Pure bf16 training")
//! shows what each does to a training run.

use std::mem::offset_of;

use super::fields::shader_struct;
use super::UNIFORM_SLOT_BYTES;
use crate::StateKind;

/// How the optimizer rounds the f32 results of an update when it stores them as f16 or
/// bf16 ([`OptimizerBuilder::rounding`](crate::OptimizerBuilder::rounding)).
///
/// With 16-bit parameters and no f32 master copy, an update smaller than half a unit in the
/// last place of a parameter is rounded away by nearest rounding, and training stalls once
/// the updates get small. The two other modes keep those updates:
///
/// - [`Rounding::Stochastic`] rounds up with probability equal to the discarded fraction,
///   so each store is right on average (unbiased) and small updates accumulate in
///   expectation. The random bits are a hash of (seed, step, parameter index, element
///   index), so a run is reproducible for a seed, the same on the GPU and the CPU backend,
///   and independent of how the work is dispatched.
/// - [`Rounding::Kahan`] keeps one more 16-bit tensor per parameter (2 bytes per element,
///   against master weights' 4) holding the rounding error of the last parameter store,
///   which the next step adds back: `target = p_new + c; p = round(target);
///   c = round(target - p)` (both to nearest even).
///
/// Both need every parameter to be F16 or BF16 (f32 stores do not round) and exclude master
/// weights and model copies. NaN and infinity are stored as with nearest rounding.
///
/// `#[non_exhaustive]`: another rounding mode would be a new variant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Rounding {
    /// Round to nearest, ties to even: every store, as IEEE 754's default.
    #[default]
    NearestEven,
    /// Stochastic rounding of the parameter stores (and, with `state`, of the 16-bit state
    /// stores): a value between two neighbouring 16-bit numbers is rounded to the one further
    /// from zero with probability equal to its distance from the one nearer zero, in units
    /// of their spacing.
    Stochastic {
        /// The seed of the counter-based hash; a run is reproducible for a seed.
        seed: u64,
        /// Round the state stores (moments, momentum buffers, sums) stochastically too,
        /// where the state is F16 or BF16; f32 state is stored exactly either way.
        state: bool,
    },
    /// Kahan-compensated parameter updates: one compensation tensor per parameter, of the
    /// parameter's dtype ([`StateKind::KahanCompensation`]), owned by the optimizer and saved
    /// with its state. All stores round to nearest even.
    Kahan,
}

impl Rounding {
    /// The name used in errors and checkpoints: `nearest_even`, `stochastic`, `kahan`.
    pub fn name(&self) -> &'static str {
        match self {
            Rounding::NearestEven => "nearest_even",
            Rounding::Stochastic { .. } => "stochastic",
            Rounding::Kahan => "kahan",
        }
    }

    /// The seed of stochastic rounding.
    pub(crate) fn seed(&self) -> Option<u64> {
        match self {
            Rounding::Stochastic { seed, .. } => Some(*seed),
            _ => None,
        }
    }

    /// Which stores round stochastically.
    pub(crate) fn stochastic(&self) -> Stochastic {
        match *self {
            Rounding::Stochastic { state, .. } => Stochastic { params: true, state },
            _ => Stochastic::default(),
        }
    }
}

/// Which stores of a kernel round stochastically (the others round to nearest even).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Stochastic {
    /// The parameter stores.
    pub(crate) params: bool,
    /// The state stores.
    pub(crate) state: bool,
}

impl Stochastic {
    /// Whether any store rounds stochastically.
    pub(crate) fn any(self) -> bool {
        self.params || self.state
    }
}

shader_struct! {
    /// The seed and the step, as stochastic kernels read them: the last 16 bytes of each
    /// group's uniform slot (after the family's uniform, which is far shorter), so the host
    /// writes them with the hyperparameters, at no extra cost. Capturable kernels take the
    /// step from the device's counter instead. `struct RoundingHeader` in WGSL.
    #[derive(Default)]
    RoundingHeader {
        /// The seed's low 32 bits.
        seed_lo: u32,
        /// The seed's high 32 bits.
        seed_hi: u32,
        /// The step being taken, modulo 2^32.
        step: u32,
        /// Keeps the header a whole 16 bytes.
        reserved: u32,
    }
}

impl RoundingHeader {
    /// Bytes of the header.
    pub(crate) const BYTES: u64 = std::mem::size_of::<RoundingHeader>() as u64;
    /// Its byte offset in a uniform slot.
    pub(crate) const OFFSET: u64 = UNIFORM_SLOT_BYTES - Self::BYTES;

    /// The header of step `t` for `seed`.
    pub(crate) fn new(seed: u64, t: u64) -> Self {
        RoundingHeader { seed_lo: seed as u32, seed_hi: (seed >> 32) as u32, step: t as u32, reserved: 0 }
    }

    /// Writes the header into its place in one uniform slot.
    pub(crate) fn write(&self, slot: &mut [u8]) {
        let at = Self::OFFSET as usize;
        slot[at..at + Self::BYTES as usize].copy_from_slice(bytemuck::bytes_of(self));
    }

    /// `struct RoundingHeader` and `struct HyperSlot` (the family's `Hyper` of `hyper_bytes`,
    /// padding, then the header at [`Self::OFFSET`]) in WGSL. The padding is an explicit
    /// array rather than `@size`, which naga's GLSL output does not honour (on the GL backend
    /// the header was read from the wrong place).
    pub(crate) fn slot_wgsl(hyper_bytes: u64) -> String {
        let mut s = Self::wgsl();
        // A struct member of the uniform address space takes a multiple of 16 bytes.
        let pad = (Self::OFFSET - hyper_bytes.next_multiple_of(16)) / 16;
        let padding =
            if pad > 0 { format!("    padding: array<vec4<u32>, {pad}>,\n") } else { String::new() };
        s.push_str(&format!(
            "struct HyperSlot {{\n    hyper: Hyper,\n{padding}    rounding: RoundingHeader,\n}}\n"
        ));
        s
    }
}

const _: () = assert!(offset_of!(RoundingHeader, step) == 8);

/// The hash's round: Chris Wellons' `lowbias32`, a bijection of `u32` with good avalanche.
#[cfg_attr(not(feature = "cpu"), allow(dead_code))]
#[inline(always)]
pub(crate) fn mix(x: u32) -> u32 {
    let mut x = x;
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x
}

/// The hash state after (seed, step, tensor ordinal): `h = mix(h ^ word)` over those words
/// from `h = 0`. Constant over a tensor's step, so computed once per chunk.
#[cfg_attr(not(feature = "cpu"), allow(dead_code))]
pub(crate) fn key(seed: u64, step: u64, ordinal: u32) -> u32 {
    let h = mix(seed as u32);
    let h = mix(h ^ (seed >> 32) as u32);
    let h = mix(h ^ step as u32);
    mix(h ^ ordinal)
}

/// The 32 random bits of one store: the hash continued over (stream, element index low
/// word, element index high word).
#[cfg_attr(not(feature = "cpu"), allow(dead_code))]
#[inline(always)]
pub(crate) fn bits(key: u32, stream: u32, element: u64) -> u32 {
    mix(mix(mix(key ^ stream) ^ element as u32) ^ (element >> 32) as u32)
}

/// The kinds whose stores have been rounded stochastically since streams were numbered:
/// kind `ROUNDED_STREAMS[i]` draws stream `1 + i`. Stored bits depend on these numbers, so
/// the list only grows at its end (a kind not listed draws [`stream`]'s own number).
const ROUNDED_STREAMS: [StateKind; 12] = [
    StateKind::ExpAvg,
    StateKind::ExpAvgSq,
    StateKind::MaxExpAvgSq,
    StateKind::MomentumBuffer,
    StateKind::Sum,
    StateKind::KahanCompensation,
    StateKind::Z,
    StateKind::SquareAvg,
    StateKind::GradAvg,
    StateKind::ExpAvgSlow,
    StateKind::ExpAvgDiff,
    StateKind::NegPreGrad,
];

/// Adafactor's states, kept in f32 (never rounded): numbered apart all the same, from
/// [`F32_STREAM_BASE`].
const F32_STREAMS: [StateKind; 3] = [StateKind::RowVar, StateKind::ColVar, StateKind::Variance];
const F32_STREAM_BASE: u32 = 20;

/// The first stream of the kinds neither list names, numbered by their declaration: past
/// every listed stream, so a new kind draws bits of its own without an edit here.
const NEW_STREAM_BASE: u32 = 64;
const _: () = assert!(
    ROUNDED_STREAMS.len() < F32_STREAM_BASE as usize
        && F32_STREAM_BASE as usize + F32_STREAMS.len() <= NEW_STREAM_BASE as usize
);

/// The stream of a store: 0 for the parameter, a number of its kind's for a state tensor,
/// so that no two tensors of a parameter draw the same bits.
pub(crate) fn stream(kind: Option<StateKind>) -> u32 {
    let Some(kind) = kind else { return 0 };
    let at = |list: &[StateKind]| list.iter().position(|k| *k == kind).map(|i| i as u32);
    at(&ROUNDED_STREAMS)
        .map(|i| 1 + i)
        .or_else(|| at(&F32_STREAMS).map(|i| F32_STREAM_BASE + i))
        .unwrap_or(NEW_STREAM_BASE + kind as u32)
}

/// bfloat16 bits of `x` rounded stochastically with the random bits `r`: the top 16 bits
/// of `r` are added below the kept bits, which carries into them with probability equal to
/// the discarded fraction. NaN stays a quiet NaN; infinity stays infinity.
#[cfg_attr(not(feature = "cpu"), allow(dead_code))]
#[inline(always)]
pub(crate) fn bf16_bits(x: f32, r: u32) -> u16 {
    let b = x.to_bits();
    if b & 0x7fff_ffff > 0x7f80_0000 {
        return ((b >> 16) | 0x40) as u16;
    }
    (b.wrapping_add(r >> 16) >> 16) as u16
}

/// binary16 bits of `x` rounded stochastically with the random bits `r`, in integer
/// arithmetic: normal results add the top 13 bits of `r` below the kept bits; subnormal
/// results round up where `r >= 2^32 - f`, `f` the discarded fraction in units of 2^-32. NaN stays a quiet NaN,
/// 65536 and above are infinity (between 65504 and 65536 the result is 65504 or infinity).
#[cfg_attr(not(feature = "cpu"), allow(dead_code))]
#[inline(always)]
pub(crate) fn f16_bits(x: f32, r: u32) -> u16 {
    let b = x.to_bits();
    let sign = (b >> 16) & 0x8000;
    let a = b & 0x7fff_ffff;
    if a > 0x7f80_0000 {
        return (sign | 0x7e00 | ((a >> 13) & 0x3ff)) as u16;
    }
    if a >= 0x4780_0000 {
        return (sign | 0x7c00) as u16;
    }
    if a < 0x3880_0000 {
        // |x| = m 2^(e - 150); in units of 2^-24 (the subnormal spacing), m 2^-s.
        let e = (a >> 23).max(1);
        let m = if a >= 0x0080_0000 { (a & 0x7f_ffff) | 0x80_0000 } else { a & 0x7f_ffff };
        let s = 126 - e;
        let (q, fraction) = if s < 32 {
            (m >> s, m << (32 - s))
        } else if s < 64 {
            (0, m >> (s - 32))
        } else {
            (0, 0)
        };
        // Up when r >= 2^32 - fraction, so that large r rounds up as on the normal path.
        return (sign | (q + u32::from(!r < fraction))) as u16;
    }
    (sign | ((a - 0x3800_0000 + (r >> 19)) >> 13)) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The streams of the kinds already stored keep their numbers (stored bits and the
    /// oracle's draws depend on them), and no two kinds share one.
    #[test]
    fn each_kind_keeps_its_stream_and_draws_its_own() {
        use StateKind::*;
        let numbered = [
            (ExpAvg, 1),
            (ExpAvgSq, 2),
            (MaxExpAvgSq, 3),
            (MomentumBuffer, 4),
            (Sum, 5),
            (KahanCompensation, 6),
            (Z, 7),
            (SquareAvg, 8),
            (GradAvg, 9),
            (ExpAvgSlow, 10),
            (ExpAvgDiff, 11),
            (NegPreGrad, 12),
            (RowVar, 20),
            (ColVar, 21),
            (Variance, 22),
        ];
        assert_eq!(stream(None), 0);
        let mut seen = std::collections::HashSet::from([0]);
        for (kind, want) in numbered {
            assert_eq!(stream(Some(kind)), want, "{kind:?}");
            assert!(seen.insert(stream(Some(kind))), "{kind:?} shares a stream");
        }
    }

    #[test]
    fn the_wgsl_header_sits_at_the_end_of_the_uniform_slot() {
        // Eleven f32 fields: 48 bytes, then 12 vec4s of padding up to byte 240.
        let wgsl = RoundingHeader::slot_wgsl(44);
        assert!(wgsl.contains("padding: array<vec4<u32>, 12>"), "{wgsl}");
        assert!(!RoundingHeader::slot_wgsl(240).contains("padding"));
        assert_eq!(RoundingHeader::OFFSET + RoundingHeader::BYTES, UNIFORM_SLOT_BYTES);
        let mut slot = vec![0u8; UNIFORM_SLOT_BYTES as usize];
        RoundingHeader::new(0x0123_4567_89ab_cdef, 7).write(&mut slot);
        assert_eq!(&slot[240..252], &[0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01, 7, 0, 0, 0]);
    }

    /// Values exactly representable in the 16-bit type are stored unchanged whatever the
    /// random bits; others go to one of their two neighbours.
    #[test]
    fn stochastic_stores_land_on_a_neighbour_and_keep_representable_values() {
        let rs = [0u32, 1, 0x7fff_ffff, 0x8000_0000, 0xffff_fffe, u32::MAX, 0x1234_5678];
        for bits in (0..=u16::MAX).step_by(7) {
            let h = half::bf16::from_bits(bits);
            if h.is_nan() {
                continue;
            }
            for r in rs {
                assert_eq!(bf16_bits(h.to_f32(), r), bits, "bf16 {bits:#x} r {r:#x}");
            }
            let h = half::f16::from_bits(bits);
            if h.is_nan() {
                continue;
            }
            for r in rs {
                assert_eq!(f16_bits(h.to_f32(), r), bits, "f16 {bits:#x} r {r:#x}");
            }
        }
        for x in [1.0f32 + 1e-5, -3.3e-6, 7.0e-8, 65510.0, 1e-9, -3e-10] {
            let near = half::f16::from_f32(x);
            let down = f16_bits(x, 0);
            let up = f16_bits(x, u32::MAX);
            let lower = |v: u16| half::f16::from_bits(v).to_f64().abs();
            assert!(lower(down) <= f64::from(x.abs()) && f64::from(x.abs()) <= lower(up), "{x}");
            assert!(down == near.to_bits() || up == near.to_bits(), "{x}");
            assert!(up - down <= 1, "{x}: {down:#x} {up:#x}");
        }
    }

    #[test]
    fn nan_and_infinity_store_as_with_nearest_rounding() {
        for x in [f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::from_bits(0x7f80_0001)] {
            for r in [0, u32::MAX] {
                let b = x.to_bits();
                let nearest =
                    if x.is_nan() { (b >> 16) | 0x40 } else { (b + 0x7fff + ((b >> 16) & 1)) >> 16 };
                assert_eq!(u32::from(bf16_bits(x, r)), nearest, "{x}");
                assert_eq!(f16_bits(x, r), half::f16::from_f32(x).to_bits(), "{x}");
            }
        }
    }
}
