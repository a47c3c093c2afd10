//! LAMB's shader pieces: the group-0 declarations of its two table passes, their entry
//! point (`src/family/lamb/lamb_entry.wgsl`), and the combine pass (`src/family/lamb/lamb_combine.wgsl`),
//! with the layout of the index buffer they share ([`IndexLayout`]).
//!
//! The passes run in the multi-tensor machinery of every update (`gpu::table`,
//! `gpu::dispatch`), as the gradient norm does: the moments pass writes one partial pair
//! (the sums of `p^2` and `s^2`) per workgroup, at the workgroup's slot
//! (`table.head.first_workgroup` plus its index); the combine pass sums each tensor's slots,
//! listed in ascending order, in that order (no float atomics: the same inputs give the same
//! bits); the apply pass finds its workgroup's tensor from its slot.

use std::fmt::Write;

use crate::gpu::kernel::{binding_wgsl, WORKGROUP_SIZE};
use crate::gpu::pipeline::buffer_entry;
use crate::step::{LambUniform, UNIFORM_SLOT_BYTES};

/// Group 0 of LAMB's passes: the moments pass's partial sums, one `vec2<f32>` per
/// workgroup (written by the moments pass, read by the combine pass).
pub(crate) const PARTIALS: u32 = 4;
/// Group 0 of LAMB's passes: the index buffer ([`IndexLayout`]), read by the table passes,
/// its norms written by the combine pass.
pub(crate) const INDEX: u32 = 5;

/// NORM_FOLD of `shaders/grad_norm.wgsl`: the workgroup's values folded in groups of this
/// many, then the groups' sums (short loops after each barrier on a CPU adapter).
const FOLD: u32 = 16;
const _: () = assert!(WORKGROUP_SIZE.is_multiple_of(FOLD));

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

/// `const BINDING_LAMB_*` for the shader files.
fn binding_constants() -> String {
    format!("const BINDING_LAMB_PARTIALS: u32 = {PARTIALS}u;\nconst BINDING_LAMB_INDEX: u32 = {INDEX}u;\n")
}

/// Group 0's declarations of the two table passes (after the prelude's binding constants):
/// the uniform (`hyper_binding`, as the host-scalar updates declare it), the private `hp`,
/// the partials (written) and the index (read).
pub(crate) fn scalars_wgsl(hyper_binding: &str) -> String {
    binding_constants()
        + &format!(
            "@group(GROUP_SCALARS) @binding(BINDING_HYPER) var<uniform> {hyper_binding};\n\
             var<private> hp: Hyper;\n\
             @group(GROUP_SCALARS) @binding(BINDING_LAMB_PARTIALS) var<storage, read_write> lamb_partials: array<vec2<f32>>;\n\
             @group(GROUP_SCALARS) @binding(BINDING_LAMB_INDEX) var<storage, read> lamb_index: array<u32>;\n"
        )
}

/// The entry point of the two table passes: `sum_squares` for `vector` (vec4) or scalar
/// accesses, `PAIRS` (packed outputs one aligned pair at a time, as `entry_pair.wgsl`),
/// `LAMB_FOLD`, and `src/family/lamb/lamb_entry.wgsl`.
pub(crate) fn entry_wgsl(vector: bool, pairs: bool) -> String {
    let mut s = String::new();
    let sum = if vector { "dot(x, x)" } else { "x * x" };
    let _ = writeln!(s, "fn sum_squares(x: R) -> f32 {{ return f32({sum}); }}");
    let _ = writeln!(s, "const PAIRS: bool = {pairs};");
    let _ = writeln!(s, "const LAMB_FOLD: u32 = {FOLD}u;");
    s + crate::family::lamb::ENTRY_WGSL
}

/// The combine pass's WGSL: its prelude (`WG`, the binding constants, `struct Hyper` in f32)
/// and `src/family/lamb/lamb_combine.wgsl`.
pub(crate) fn combine_wgsl() -> String {
    let mut s = format!("const WG: u32 = {WORKGROUP_SIZE}u;\nalias S = f32;\n");
    s += &binding_wgsl();
    s += &binding_constants();
    s += &LambUniform::wgsl("Hyper");
    s + crate::family::lamb::COMBINE_WGSL
}

/// Group 0's layout entries: the uniform, the partials and the index; `combine` flips
/// which of the two buffers is written.
pub(crate) fn layout_entries(combine: bool) -> [wgpu::BindGroupLayoutEntry; 3] {
    use crate::gpu::kernel::binding;
    use wgpu::BufferBindingType::{Storage, Uniform};
    [
        buffer_entry(binding::HYPER, Uniform, false, UNIFORM_SLOT_BYTES),
        buffer_entry(PARTIALS, Storage { read_only: combine }, false, 8),
        buffer_entry(INDEX, Storage { read_only: !combine }, false, 16),
    ]
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
    use crate::step::{LambSwitches, LambUniform, Switches};
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
                            VariantKey::new(Scalars::Lamb, program, DType::F32, layout).with_width(width);
                        let source = compose(&key);
                        assert!(source.contains("lamb_partials[slot] = sum;"), "{key:?}");
                        let module = naga::front::wgsl::parse_str(&source)
                            .unwrap_or_else(|e| panic!("{key:?}: {}\n{source}", e.emit_to_string(&source)));
                        validator.validate(&module).unwrap_or_else(|e| panic!("{key:?}: {e:?}\n{source}"));
                        let group0: Vec<_> = resource_bindings(&module)
                            .into_iter()
                            .filter(|(_, (group, _))| *group == binding::GROUP_SCALARS)
                            .collect();
                        let mut expected = vec![
                            ("hp_base".to_string(), (binding::GROUP_SCALARS, binding::HYPER)),
                            ("lamb_index".to_string(), (binding::GROUP_SCALARS, super::INDEX)),
                            ("lamb_partials".to_string(), (binding::GROUP_SCALARS, super::PARTIALS)),
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
