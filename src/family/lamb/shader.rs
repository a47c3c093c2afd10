//! LAMB's passes on the GPU: its two table passes ([`PASSES`]: their partials and entry
//! point, which the kernel prelude declares and appends), the combine pass
//! (`src/family/lamb/lamb_combine.wgsl`) and the layout of the index buffer the passes share
//! ([`IndexLayout`]).
//!
//! The passes run in the multi-tensor machinery of every update (`gpu::table`,
//! `gpu::dispatch`), as the gradient norm does: the moments pass writes one partial pair
//! (the sums of `p^2` and `s^2`) per workgroup, at the workgroup's slot
//! (`table.head.first_workgroup` plus its index); the combine pass sums each tensor's slots,
//! listed in ascending order, in that order (no float atomics: the same inputs give the same
//! bits); the apply pass finds its workgroup's tensor from its slot.

use std::fmt::Write;

use crate::gpu::kernel::{binding_wgsl, TablePasses, WORKGROUP_SIZE};
use super::contract::LambUniform;

// The passes' recording (`gpu_passes`) finds every GPU piece of LAMB's here.
pub(crate) use crate::gpu::kernel::binding::{PASS_INDEX as INDEX, PASS_PARTIALS as PARTIALS};
pub(crate) use crate::gpu::pipeline::pass_layout_entries as layout_entries;

/// LAMB's two table passes (the moments pass, then the apply pass): each workgroup's
/// partial is its sums of `p^2` and `s^2`, and the entry point is `lamb_entry.wgsl`.
pub(crate) static PASSES: TablePasses = TablePasses { name: super::NAME, partial: "vec2<f32>", entry_wgsl };

/// `LAMB_FOLD` of `lamb_entry.wgsl`: the workgroup's values folded in groups of this many,
/// then the groups' sums (short loops after each barrier on a CPU adapter).
const FOLD: u32 = 16;
const _: () = assert!(WORKGROUP_SIZE.is_multiple_of(FOLD));

/// The entry point of the two table passes: `sum_squares` for `vector` (vec4) or scalar
/// accesses, `PAIRS` (packed outputs one aligned pair at a time, as `entry_pair.wgsl`),
/// `LAMB_FOLD`, and `src/family/lamb/lamb_entry.wgsl`.
fn entry_wgsl(vector: bool, pairs: bool) -> String {
    let mut s = String::new();
    let sum = if vector { "dot(x, x)" } else { "x * x" };
    let _ = writeln!(s, "fn sum_squares(x: R) -> f32 {{ return f32({sum}); }}");
    let _ = writeln!(s, "const PAIRS: bool = {pairs};");
    let _ = writeln!(s, "const LAMB_FOLD: u32 = {FOLD}u;");
    s + super::ENTRY_WGSL
}

/// Words (`u32`) of the index buffer of a group of `tensors` tensors whose moments pass has
/// `moment_slots` workgroups and whose apply pass has `apply_slots`:
///
/// - `[0]` tensors, `[1]` where the slot lists start (`csr`), `[2]` where the norms start,
///   `[3]` the moments slots;
/// - from 4: the tensor (0-based in the group) of each apply-pass workgroup;
/// - from `csr`: `tensors + 1` offsets, then the moments pass's slots of each tensor in
///   ascending order (tensor t's are entries `offsets[t] .. offsets[t + 1]`);
/// - from `norms`: per tensor `weight_norm`, `adam_norm`, `trust_ratio` and the ratio the
///   step applies (1 with `adam`), as f32 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IndexLayout {
    pub(crate) tensors: u32,
    pub(crate) csr: u32,
    pub(crate) norms: u32,
    pub(crate) words: u32,
}

impl IndexLayout {
    /// The words of the index buffer, from each moments slot's tensor and each apply slot's
    /// tensor; the norms start at 0.
    pub(crate) fn build(tensors: u32, moment_owners: &[u32], apply_owners: &[u32]) -> (Self, Vec<u32>) {
        let csr = 4 + apply_owners.len() as u32;
        let norms = csr + tensors + 1 + moment_owners.len() as u32;
        let words = norms + 4 * tensors;
        let mut index = vec![tensors, csr, norms, moment_owners.len() as u32];
        index.extend_from_slice(apply_owners);
        let mut offsets = vec![0u32; tensors as usize + 1];
        for &t in moment_owners {
            offsets[t as usize + 1] += 1;
        }
        for t in 0..tensors as usize {
            offsets[t + 1] += offsets[t];
        }
        let mut slots = vec![0u32; moment_owners.len()];
        let mut next = offsets.clone();
        for (slot, &t) in moment_owners.iter().enumerate() {
            slots[next[t as usize] as usize] = slot as u32;
            next[t as usize] += 1;
        }
        index.extend(offsets);
        index.extend(slots);
        index.resize(words as usize, 0);
        (IndexLayout { tensors, csr, norms, words }, index)
    }
}

/// The combine pass's WGSL: its prelude (`WG`, the binding constants, `struct Hyper` in f32)
/// and `src/family/lamb/lamb_combine.wgsl`.
pub(crate) fn combine_wgsl() -> String {
    let mut s = format!("const WG: u32 = {WORKGROUP_SIZE}u;\nalias S = f32;\n");
    s += &binding_wgsl();
    s += &LambUniform::wgsl("Hyper");
    s + crate::family::lamb::COMBINE_WGSL
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tensors_slots_are_listed_in_ascending_order_after_the_offsets() {
        // Moments slots 0..5 of tensors 1, 0, 1, 1, 0; apply slots of tensors 0, 1.
        let (layout, words) = IndexLayout::build(2, &[1, 0, 1, 1, 0], &[0, 1]);
        assert_eq!(layout, IndexLayout { tensors: 2, csr: 6, norms: 14, words: 22 });
        assert_eq!(&words[..4], &[2, 6, 14, 5]);
        assert_eq!(&words[4..6], &[0, 1]);
        assert_eq!(&words[6..9], &[0, 2, 5]);
        assert_eq!(&words[9..14], &[1, 4, 0, 2, 3]);
        assert!(words[14..].iter().all(|&w| w == 0));
    }

    #[test]
    fn the_combine_pass_validates() {
        let source = combine_wgsl();
        let module = naga::front::wgsl::parse_str(&source)
            .unwrap_or_else(|e| panic!("{}\n{source}", e.emit_to_string(&source)));
        let mut validator = naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::all(),
        );
        validator.validate(&module).unwrap_or_else(|e| panic!("{e:?}\n{source}"));
    }
}

#[cfg(test)]
mod naga_tests {
    use crate::gpu::kernel::tests::{members, resource_bindings};
    use crate::gpu::kernel::{
        binding, compose, BindingDesc, BindingLayout, Program, Scalars, Storage, VariantKey,
    };
    use crate::family::lamb::contract::{LambSwitches, LambUniform};
    use crate::step::Switches;
    use crate::DType;

    /// Every LAMB table-pass variant (both passes, each storage, scalar and vec4 accesses,
    /// Kahan or not) validates, binds group 0 by the named numbers, and lays out `Hyper` as
    /// the Rust uniform.
    #[test]
    fn every_lamb_pass_variant_validates() {
        let mut validator = naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::all(),
        );
        let storages = [
            Storage::Native(DType::F32),
            Storage::Native(DType::F16),
            Storage::Packed(DType::F16),
            Storage::Packed(DType::BF16),
        ];
        for apply in [false, true] {
            let program = Program::Update(Switches::Lamb(LambSwitches { apply }));
            for storage in storages {
                for width in [1, 4] {
                    for kahan in [false, true] {
                        // Param, grad, exp_avg, exp_avg_sq (and the compensation) bound in place.
                        let inputs = vec![Some(0), Some(1), Some(2), Some(3), kahan.then_some(4)];
                        let outputs = vec![Some(0), Some(2), Some(3), None, kahan.then_some(4)];
                        let n = if kahan { 5 } else { 4 };
                        let bindings = vec![BindingDesc { storage, read_write: true }; n];
                        let layout = BindingLayout { inputs, outputs, bindings };
                        let key =
                            VariantKey::new(Scalars::Passes(&super::PASSES), program, DType::F32, layout)
                                .with_width(width);
                        let source = compose(&key);
                        assert!(source.contains("pass_partials[slot] = sum;"), "{key:?}");
                        let module = naga::front::wgsl::parse_str(&source)
                            .unwrap_or_else(|e| panic!("{key:?}: {}\n{source}", e.emit_to_string(&source)));
                        validator.validate(&module).unwrap_or_else(|e| panic!("{key:?}: {e:?}\n{source}"));
                        let group0: Vec<_> = resource_bindings(&module)
                            .into_iter()
                            .filter(|(_, (group, _))| *group == binding::GROUP_SCALARS)
                            .collect();
                        let mut expected = vec![
                            ("hp_base".to_string(), (binding::GROUP_SCALARS, binding::HYPER)),
                            ("pass_index".to_string(), (binding::GROUP_SCALARS, super::INDEX)),
                            ("pass_partials".to_string(), (binding::GROUP_SCALARS, super::PARTIALS)),
                        ];
                        expected.sort();
                        assert_eq!(group0, expected, "{key:?}");
                        let hyper: Vec<(String, u32)> = LambUniform::FIELDS
                            .iter()
                            .zip(LambUniform::OFFSETS)
                            .map(|(f, o)| (f.to_string(), *o as u32))
                            .collect();
                        assert_eq!(members(&module, "Hyper"), hyper, "{key:?}");
                    }
                }
            }
        }
    }
}
