//! Global gradient-norm clipping, PyTorch's `clip_grad_norm_`: the norm of all of an
//! optimizer's gradients taken as one vector, and the coefficient every gradient is
//! multiplied by as the update loads it. The GPU keeps the norm and the coefficient in a
//! small device buffer whose head is [`ClipHeader`]; the CPU backend computes the same
//! coefficient with [`clip_coefficient`].

use std::mem::offset_of;

use super::fields::shader_struct;
use crate::{Algorithm, Error, Result};

/// Which norm of the gradients is clipped.
///
/// `#[non_exhaustive]`: PyTorch clips any p-norm; only these two are fused so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NormType {
    /// The Euclidean norm, `sqrt(sum g^2)` (`norm_type=2`, PyTorch's default).
    #[default]
    L2,
    /// The largest magnitude, `max |g|` (`norm_type=inf`).
    Inf,
}

impl NormType {
    /// PyTorch's `norm_type` for this norm: 2 or infinity, for a configuration written for
    /// PyTorch's `clip_grad_norm_`.
    pub fn torch_value(self) -> f64 {
        match self {
            NormType::L2 => 2.0,
            NormType::Inf => f64::INFINITY,
        }
    }

    /// The norm for PyTorch's `norm_type` (reading a PyTorch configuration); `None` for any
    /// p other than 2 and infinity.
    pub fn from_torch_value(p: f64) -> Option<Self> {
        if p == 2.0 {
            Some(NormType::L2)
        } else if p == f64::INFINITY {
            Some(NormType::Inf)
        } else {
            None
        }
    }
}

/// Clip the global norm of every gradient of the optimizer (all groups) to `max_norm`
/// before each step: `total_norm` over all gradients as one vector, each gradient
/// multiplied by `min(1, max_norm / (total_norm + 1e-6))` in f32, as
/// `torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)` does before `step()`.
///
/// A non-finite norm is not an error (PyTorch's default, `error_if_nonfinite=False`): the
/// coefficient is NaN and the update propagates it. With AMP in capturable mode a
/// non-finite gradient skips the step as it does without clipping.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GradClip {
    /// The largest norm the gradients keep; positive and finite.
    pub max_norm: f64,
    /// The norm measured.
    pub norm_type: NormType,
}

impl GradClip {
    /// Clipping the L2 norm to `max_norm`.
    pub fn l2(max_norm: f64) -> Self {
        GradClip { max_norm, norm_type: NormType::L2 }
    }

    /// [`Error::BadHyperparameter`] unless `max_norm` is positive and finite. Building an
    /// optimizer checks it anyway; a trainer checks a configuration earlier with it.
    pub fn validate(&self) -> Result<()> {
        if !(self.max_norm > 0.0 && self.max_norm.is_finite()) {
            return Err(Error::BadHyperparameter {
                name: "max_norm",
                value: self.max_norm,
                expected: "a positive, finite norm to clip to",
            });
        }
        Ok(())
    }
}

/// What PyTorch's `clip_grad_norm_` adds to the norm before dividing by it, and so what
/// [`GradClip`] adds.
pub(crate) const TORCH_CLIP_EPS: f64 = 1e-6;

/// The clipping an optimizer runs: the bound and norm of a [`GradClip`] and the `eps` added
/// to the norm, [`TORCH_CLIP_EPS`] for `grad_clip` or a family's own (Adan's `eps`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct FusedClip {
    /// The bound and the norm measured.
    pub(crate) clip: GradClip,
    /// Added to the norm before `max_norm` is divided by it.
    pub(crate) eps: f64,
}

impl FusedClip {
    /// The coefficient for a measured `total_norm` ([`clip_coefficient`] with this clip's
    /// bound and eps, in f32).
    #[cfg_attr(all(not(feature = "cpu"), target_arch = "wasm32"), allow(dead_code))]
    pub(crate) fn coefficient(&self, total_norm: f32) -> f32 {
        clip_coefficient(total_norm, self.clip.max_norm as f32, self.eps as f32)
    }
}

/// The clipping an optimizer of `algorithms` (one per group) runs with the option
/// `grad_clip`: that option with PyTorch's eps, or the groups' own clipping
/// ([`Algorithm::own_grad_clip`], the official Adan's `max_grad_norm`), which clips every
/// group together with one setting. [`Error::ConflictingOptions`] for both at once, or for
/// groups whose own clipping settings differ (the official Adan reads one `max_grad_norm` for
/// all groups; a group without clipping, or with another `eps`, would be clipped
/// differently from what it asks).
pub(crate) fn fused_clip(grad_clip: Option<GradClip>, algorithms: &[Algorithm]) -> Result<Option<FusedClip>> {
    if let Some(clip) = &grad_clip {
        clip.validate()?;
    }
    let own = algorithms.first().and_then(Algorithm::own_grad_clip);
    if algorithms.iter().any(|a| a.own_grad_clip() != own) {
        return Err(Error::ConflictingOptions {
            first: "max_grad_norm",
            second: "param groups",
            reason: "the official Adan clips all groups together with one max_grad_norm and eps; give \
                     every group the same max_grad_norm and, when clipping, the same eps",
        });
    }
    match (grad_clip, own) {
        (Some(_), Some(_)) => Err(Error::ConflictingOptions {
            first: "max_grad_norm",
            second: "grad_clip",
            reason: "Adan's own clipping already clips the global gradient norm; use one of them",
        }),
        (Some(clip), None) => Ok(Some(FusedClip { clip, eps: TORCH_CLIP_EPS })),
        (None, Some((max_norm, eps))) => Ok(Some(FusedClip { clip: GradClip::l2(max_norm), eps })),
        (None, None) => Ok(None),
    }
}

/// Refuses changing a group's algorithm to one whose own clipping
/// ([`Algorithm::own_grad_clip`]) differs: the clip was built with the optimizer.
#[cfg_attr(not(feature = "cpu"), allow(dead_code))]
pub(crate) fn check_own_clip_change(old: &Algorithm, new: &Algorithm) -> Result<()> {
    if old.own_grad_clip() != new.own_grad_clip() {
        return Err(Error::ConflictingOptions {
            first: "max_grad_norm",
            second: "set_group_algorithm",
            reason: "Adan's own clipping (max_grad_norm and its eps) is fixed when the optimizer is \
                     built; keep them when changing other hyperparameters",
        });
    }
    Ok(())
}

/// PyTorch's `clip_coef_clamped`: `max_norm / (total_norm + eps)` in f32, at most 1, with
/// `eps` 1e-6 for `clip_grad_norm_` (the official Adan adds its own `eps`). A NaN norm gives
/// NaN (`torch.clamp` keeps NaN).
#[cfg_attr(not(feature = "cpu"), allow(dead_code))]
pub(crate) fn clip_coefficient(total_norm: f32, max_norm: f32, eps: f32) -> f32 {
    let coefficient = max_norm / (total_norm + eps);
    if coefficient.is_nan() {
        coefficient
    } else {
        coefficient.min(1.0)
    }
}

shader_struct! {
    /// The head of the clip buffer: what the finalize pass writes and the update kernels
    /// read (`struct ClipHeader` in WGSL).
    ClipHeader {
        /// The last step's global gradient norm.
        total_norm: f32,
        /// What the last step multiplied every gradient by.
        coefficient: f32,
        /// The clip threshold, in f32 as PyTorch holds it next to an f32 norm.
        max_norm: f32,
        /// Keeps the header a whole 16 bytes.
        reserved: u32,
    }
}

impl ClipHeader {
    /// Bytes of the header (a binding of it is exactly this long).
    pub(crate) const BYTES: u64 = std::mem::size_of::<ClipHeader>() as u64;
    /// Byte offset of `total_norm`.
    pub(crate) const TOTAL_NORM: u64 = offset_of!(ClipHeader, total_norm) as u64;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_coefficient_is_torchs_clamped_ratio() {
        // max_norm / (norm + 1e-6) in f32, written out by hand.
        let eps = TORCH_CLIP_EPS as f32;
        assert_eq!(clip_coefficient(36.0, 1.0, eps), 1.0f32 / (36.0f32 + 1e-6f32));
        assert_eq!(clip_coefficient(0.25, 1.0, eps), 1.0);
        assert_eq!(clip_coefficient(0.0, 1.0, eps), 1.0);
        assert!(clip_coefficient(f32::NAN, 1.0, eps).is_nan());
        assert_eq!(clip_coefficient(f32::INFINITY, 1.0, eps), 0.0);
    }

    #[test]
    fn the_header_lays_out_as_its_wgsl() {
        let names: Vec<String> = ClipHeader::wgsl()
            .lines()
            .filter_map(|l| l.trim().split_once(':').map(|(n, _)| n.to_string()))
            .collect();
        assert_eq!(names, ["total_norm", "coefficient", "max_norm", "reserved"]);
        assert_eq!((ClipHeader::TOTAL_NORM, ClipHeader::BYTES), (0, 16));
        assert_eq!(offset_of!(ClipHeader, coefficient), 4);
    }

    #[test]
    fn max_norm_must_be_positive_and_finite() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                GradClip::l2(bad).validate(),
                Err(Error::BadHyperparameter { name: "max_norm", .. })
            ));
        }
        assert!(GradClip::l2(1e-3).validate().is_ok());
        assert_eq!(NormType::from_torch_value(f64::INFINITY), Some(NormType::Inf));
        assert_eq!(NormType::from_torch_value(1.0), None);
    }
}
