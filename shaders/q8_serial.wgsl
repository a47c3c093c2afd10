// The entry point of an 8-bit step where one invocation owns a block, for CPU adapters
// (which run a workgroup barrier as a switch through every invocation): the block's update
// with its new states kept in private memory, then, their largest magnitude known, the
// states requantized.
//
// Needs the prelude, shaders/q8.wgsl and shaders/q8_codes.wgsl (see there); provides
// `main`.

// Each word's new states, per state, until the block's absmax is known.
var<private> kept: array<array<R, BLOCK_WORDS>, MAX_STATES>;

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    var absmax: array<f32, MAX_STATES>;
    load_scalars();
    seg = segments.entries[entry_row(wid.x) / ENTRY_ROWS];
    for (var b = (wid.x - seg.first_group) * WORKGROUP + lid; b < seg.blocks; b += seg.groups * WORKGROUP) {
        var block_max = vec2(0u);
        var words = 0u;
        for (var w = 0u; w < BLOCK_WORDS; w++) {
            set_first(b * BLOCK_SIZE + w * CODES_PER_WORD);
            if !live.x {
                break;
            }
            for (var k = 0u; k < STATES; k++) {
                load_state(k, b, w);
            }
            update(0u);
            var own = vec2(0u);
            for (var k = 0u; k < STATES; k++) {
                own[k] = largest(new_states[k]);
                kept[k][w] = new_states[k];
            }
            block_max = max(block_max, own);
            words = w + 1u;
        }
        for (var k = 0u; k < STATES; k++) {
            absmax[k] = absmax_of(block_max[k]);
        }
        for (var w = 0u; w < words; w++) {
            set_first(b * BLOCK_SIZE + w * CODES_PER_WORD);
            for (var k = 0u; k < STATES; k++) {
                new_states[k] = kept[k][w];
                store_state(k, b, w, absmax[k]);
            }
        }
        // Every word of the block reads the old absmax, so the new one is written last.
        for (var k = 0u; k < STATES; k++) {
            state[seg.absmax[k] + b] = bitcast<u32>(absmax[k]);
        }
    }
}
