// The entry point of a 4-bit step where one invocation owns a block, for CPU adapters
// (which run a workgroup barrier as a switch through every invocation): the block's update
// with its new states kept in private memory, then, their largest magnitude known, the
// states requantized.
//
// Needs the prelude, shaders/q8.wgsl and shaders/q4_codes.wgsl; provides `main`.

// Each half word's new states, per state, until the block's scale is known.
var<private> kept0: array<R, KEPT>;
var<private> kept1: array<R, KEPT>;

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    load_scalars();
    load_maps();
    seg = segment_at(entry_row(wid.x));
    for (var b = (wid.x - seg.first_group) * WORKGROUP + lid; b < seg.blocks; b += seg.groups * WORKGROUP) {
        var block_max = vec4(0u);
        for (var q = 0u; q < KEPT; q++) {
            set_first(b * BLOCK_SIZE + q * 4u);
            load_half(b, q / 2u, q % 2u);
            update(0u);
            block_max = max(block_max, largest_of_states());
            if STATES > 0u { kept0[q] = new_states[0]; }
            if STATES > 1u { kept1[q] = new_states[1]; }
        }
        let scale = scale_of(block_max);
        for (var w = 0u; w < BLOCK_WORDS; w++) {
            if STATES > 0u { store_word(0u, b, w, kept0[2u * w], kept0[2u * w + 1u], scale.x); }
            if STATES > 1u { store_word(1u, b, w, kept1[2u * w], kept1[2u * w + 1u], scale.y); }
        }
        // Every word of the block read the old scale, so the new one is written last.
        store_scales(b, scale);
    }
}
