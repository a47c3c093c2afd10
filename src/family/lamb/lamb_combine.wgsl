// LAMB's combine pass, one invocation per tensor of the group: sums the tensor's partials
// of the moments pass (src/family/lamb/lamb_entry.wgsl) in the order of its slot list, and writes
// its norms and trust ratio as torch-optimizer's Lamb computes them:
//   weight_norm = min(sqrt(sum p^2), clamp_value)       (torch: clamp(0, clamp_value))
//   adam_norm   = sqrt(sum s^2)
//   trust_ratio = weight_norm / adam_norm, or 1 where either is 0
//   applied     = 1 with `adam`, else trust_ratio        (what the apply pass multiplies)
// The index buffer's layout: src/family/lamb/shader.rs, `IndexLayout`. The prelude declares WG, the
// binding constants and `struct Hyper` (src/family/lamb/contract.rs).

@group(GROUP_SCALARS) @binding(BINDING_HYPER) var<uniform> hp: Hyper;
@group(GROUP_SCALARS) @binding(BINDING_PASS_PARTIALS) var<storage, read> pass_partials: array<vec2<f32>>;
@group(GROUP_SCALARS) @binding(BINDING_PASS_INDEX) var<storage, read_write> pass_index: array<u32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let tensors = pass_index[0];
    let t = gid.x;
    if t >= tensors {
        return;
    }
    let offsets = pass_index[1];
    let slots = offsets + tensors + 1u;
    var sums = vec2(0.0);
    for (var k = pass_index[offsets + t]; k < pass_index[offsets + t + 1u]; k++) {
        sums += pass_partials[pass_index[slots + k]];
    }
    let weight_norm = min(sqrt(sums.x), hp.clamp_value);
    let adam_norm = sqrt(sums.y);
    let trust_ratio = select(weight_norm / adam_norm, 1.0, weight_norm == 0.0 || adam_norm == 0.0);
    let at = pass_index[2] + 4u * t;
    pass_index[at] = bitcast<u32>(weight_norm);
    pass_index[at + 1u] = bitcast<u32>(adam_norm);
    pass_index[at + 2u] = bitcast<u32>(trust_ratio);
    pass_index[at + 3u] = bitcast<u32>(select(trust_ratio, 1.0, hp.adam != 0u));
}
