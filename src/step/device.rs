//! The head of capturable mode's device state buffer, which the step-advancing, unscaling
//! and capturable update kernels all read: one Pod struct here, its WGSL generated from it.

use std::mem::offset_of;

use super::fields::shader_struct;

shader_struct! {
    /// The device state's first bytes, which every kernel sees through the generated
    /// declaration (`struct DeviceHeader` in WGSL).
    DeviceHeader {
        /// Steps taken on the device (AMP-skipped steps excluded).
        step: u32,
        /// Non-zero when AMP's unscale found a NaN or an infinity: the step is skipped.
        found_inf: u32,
        /// AMP's `1 / scale`, copied from the trainer's tensor by each unscale.
        inv_scale: f32,
        /// Gradient clipping's coefficient in capturable mode, written by the clip pass and
        /// read by the update kernels beside the step counter, so that clipping costs no
        /// storage binding of its own there (1 when not clipping).
        clip_coefficient: f32,
    }
}

impl Default for DeviceHeader {
    fn default() -> Self {
        DeviceHeader { step: 0, found_inf: 0, inv_scale: 1.0, clip_coefficient: 1.0 }
    }
}

impl DeviceHeader {
    /// Bytes of the header (a binding of it is exactly this long).
    pub(crate) const BYTES: u64 = std::mem::size_of::<DeviceHeader>() as u64;
    /// Byte offset of `step`.
    pub(crate) const STEP: u64 = offset_of!(DeviceHeader, step) as u64;
    /// Byte offset of `found_inf`.
    pub(crate) const FOUND_INF: u64 = offset_of!(DeviceHeader, found_inf) as u64;
    /// Byte offset of `inv_scale`.
    pub(crate) const INV_SCALE: u64 = offset_of!(DeviceHeader, inv_scale) as u64;
    /// Byte offset of `clip_coefficient`.
    #[cfg(test)]
    pub(crate) const CLIP_COEFFICIENT: u64 = offset_of!(DeviceHeader, clip_coefficient) as u64;

    /// `struct DeviceHeader { ... }` in WGSL. The unscale kernel sets `found_inf` from many
    /// invocations, so there it is atomic; everywhere else a plain `u32`.
    pub(crate) fn wgsl_for(atomic_found_inf: bool) -> String {
        if atomic_found_inf {
            Self::wgsl_with("found_inf", "atomic<u32>")
        } else {
            Self::wgsl()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::DeviceHeader;

    #[test]
    fn the_wgsl_declaration_lists_the_fields_in_their_rust_order() {
        let wgsl = DeviceHeader::wgsl_for(false);
        let names: Vec<&str> =
            wgsl.lines().filter_map(|l| l.trim().split_once(':')).map(|(name, _)| name).collect();
        assert_eq!(names, ["step", "found_inf", "inv_scale", "clip_coefficient"]);
        // Every field is 4 bytes, so WGSL's offsets are 4 k, as repr(C)'s.
        assert_eq!(
            (
                DeviceHeader::STEP,
                DeviceHeader::FOUND_INF,
                DeviceHeader::INV_SCALE,
                DeviceHeader::CLIP_COEFFICIENT
            ),
            (0, 4, 8, 12)
        );
        assert_eq!(DeviceHeader::BYTES, 16);
    }
}
