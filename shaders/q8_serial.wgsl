// The entry point of an 8-bit step where one invocation owns a block, for CPU adapters
// (which run a workgroup barrier as a switch through every invocation): the block's update
// with its new states kept in private memory, then, their largest magnitude known, the
// states requantized.
//
// Needs the prelude, shaders/q8.wgsl and shaders/q8_codes.wgsl (see there); provides
// `main`.

// Each word's new states, per state, until the block's absmax is known.
var<private> kept0: array<R, BLOCK_WORDS>;
var<private> kept1: array<R, BLOCK_WORDS>;
var<private> kept2: array<R, BLOCK_WORDS>;

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    load_scalars();
    seg = segment_at(entry_row(wid.x));
    for (var b = (wid.x - seg.first_group) * WORKGROUP + lid; b < seg.blocks; b += seg.groups * WORKGROUP) {
        var block_max = vec4(0u);
        var words = 0u;
        for (var w = 0u; w < BLOCK_WORDS; w++) {
            set_first(b * BLOCK_SIZE + w * CODES_PER_WORD);
            if !live.x {
                break;
            }
            load_states(b, w);
            update(0u);
            block_max = max(block_max, largest_of_states());
            if STATES > 0u { kept0[w] = new_states[0]; }
            if STATES > 1u { kept1[w] = new_states[1]; }
            if STATES > 2u { kept2[w] = new_states[2]; }
            words = w + 1u;
        }
        let absmax = absmax_of(block_max);
        for (var w = 0u; w < words; w++) {
            set_first(b * BLOCK_SIZE + w * CODES_PER_WORD);
            if STATES > 0u { new_states[0] = kept0[w]; }
            if STATES > 1u { new_states[1] = kept1[w]; }
            if STATES > 2u { new_states[2] = kept2[w]; }
            store_states(b, w, absmax);
        }
        // Every word of the block reads the old absmax, so the new one is written last.
        store_absmax(b, absmax);
    }
}
