//! A block's largest finite magnitude as a plain integer max, which vectorizes (a max of a
//! select, leaving NaN and the infinities out, does not): the 8-bit absmax and the 4-bit
//! scale are both taken this way.
//!
//! Bits of magnitudes order as the magnitudes do, infinity and NaN (from `INFINITY` up)
//! above every finite one. Shifted up by `KEY_SHIFT`, the finite ones stay below 2^31 and
//! the others wrap to negative i32s, which a signed max leaves out.

const INFINITY: u32 = 0x7f80_0000;

const KEY_SHIFT: u32 = (1 << 31) - INFINITY;

/// The key of a run with no finite non-zero value yet.
pub(super) const NO_KEY: i32 = KEY_SHIFT as i32;

/// `value`'s key: the largest key of a run is its largest finite magnitude's.
#[inline(always)]
pub(super) fn key(value: f32) -> i32 {
    (value.to_bits() & 0x7fff_ffff).wrapping_add(KEY_SHIFT) as i32
}

/// The largest finite magnitude of a run whose largest key is `key`: 0 where no value was
/// finite and non-zero.
#[inline(always)]
pub(super) fn largest_finite(key: i32) -> f32 {
    f32::from_bits((key as u32).wrapping_sub(KEY_SHIFT))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_key_is_the_largest_finite_magnitude() {
        let largest = |values: &[f32]| largest_finite(values.iter().fold(NO_KEY, |m, v| m.max(key(*v))));
        assert_eq!(largest(&[]), 0.0);
        assert_eq!(largest(&[0.0, -0.0]), 0.0);
        assert_eq!(largest(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY]), 0.0);
        assert_eq!(largest(&[0.5, -3.0, f32::NAN, 2.0, f32::NEG_INFINITY]), 3.0);
        assert_eq!(largest(&[1e-45, -1e-40]), 1e-40);
        assert_eq!(largest(&[f32::MAX, -f32::MAX, f32::INFINITY]), f32::MAX);
        assert_eq!(largest(&[-f32::NAN, 7.0]), 7.0);
    }
}
