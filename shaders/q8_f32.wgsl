// The entry point of an 8-bit step's f32 states (a tensor below min_8bit_size): each
// invocation's four values of state k are four words from `seg.values[k]` in the arena.
//
// Needs the prelude and shaders/q8.wgsl (see there); provides `main`.

// State k's four values, lanes past the segment's end reading its last value.
fn load_f32_state(k: u32) {
    let at = seg.values[k];
    let last = seg.n - 1u;
    old_states[k] = bitcast<vec4<f32>>(vec4(state[at + min(first, last)], state[at + min(first + 1u, last)], state[at + min(first + 2u, last)], state[at + min(first + 3u, last)]));
}

fn store_f32_state(k: u32) {
    let at = seg.values[k] + first;
    let bits = bitcast<vec4<u32>>(new_states[k]);
    if live.x { state[at] = bits.x; }
    if live.y { state[at + 1u] = bits.y; }
    if live.z { state[at + 2u] = bits.z; }
    if live.w { state[at + 3u] = bits.w; }
}

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    load_scalars();
    seg = segment_at(entry_row(wid.x));
    for (var b = wid.x - seg.first_group; b < seg.blocks; b += seg.groups) {
        set_first(b * BLOCK_SIZE + lid * CODES_PER_WORD);
        // A variant has STATES of the MAX_STATES (4) states; the conditions are constants.
        if STATES > 0u { load_f32_state(0u); }
        if STATES > 1u { load_f32_state(1u); }
        if STATES > 2u { load_f32_state(2u); }
        if STATES > 3u { load_f32_state(3u); }
        update(0u);
        if STATES > 0u { store_f32_state(0u); }
        if STATES > 1u { store_f32_state(1u); }
        if STATES > 2u { store_f32_state(2u); }
        if STATES > 3u { store_f32_state(3u); }
    }
}
