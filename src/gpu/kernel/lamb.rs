//! The prelude pieces of LAMB's two table passes (`gpu::lamb`): their group-0 declarations
//! and their entry point (`src/family/lamb/lamb_entry.wgsl`).

use std::fmt::Write;

use super::WORKGROUP_SIZE;

/// Group 0 of LAMB's passes: the moments pass's partial sums, one `vec2<f32>` per
/// workgroup (written by the moments pass, read by the combine pass).
pub(crate) const PARTIALS: u32 = 4;
/// Group 0 of LAMB's passes: the index buffer (`gpu::lamb::IndexLayout`), read by the table
/// passes, its norms written by the combine pass.
pub(crate) const INDEX: u32 = 5;

/// NORM_FOLD of `shaders/grad_norm.wgsl`: the workgroup's values folded in groups of this
/// many, then the groups' sums (short loops after each barrier on a CPU adapter).
const FOLD: u32 = 16;
const _: () = assert!(WORKGROUP_SIZE.is_multiple_of(FOLD));

/// `const BINDING_LAMB_*` for the shader files.
pub(crate) fn binding_constants() -> String {
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
