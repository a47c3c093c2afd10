// The entry point of an 8-bit step where one invocation owns a block, for CPU adapters
// (which run a workgroup barrier as a switch through every invocation): the block's update
// with its new states kept in private memory, then, their largest magnitude known, the
// states requantized (by arithmetic, DEFERRED: then the words with a value near a switch
// between codes are requantized again from the table).
//
// Needs the prelude, shaders/q8.wgsl, shaders/q8_nearest.wgsl and shaders/q8_codes.wgsl
// (see there); provides `main`.

// Each word's new states, per state, until the block's absmax is known.
var<private> kept0: array<R, BLOCK_WORDS>;
var<private> kept1: array<R, BLOCK_WORDS>;
var<private> kept2: array<R, BLOCK_WORDS>;
var<private> kept3: array<R, BLOCK_WORDS>;

// Word `w` of block `b`'s new states, back from the kept copies.
fn restore(b: u32, w: u32) {
    set_first(b * BLOCK_SIZE + w * CODES_PER_WORD);
    if STATES > 0u { new_states[0] = kept0[w]; }
    if STATES > 1u { new_states[1] = kept1[w]; }
    if STATES > 2u { new_states[2] = kept2[w]; }
    if STATES > 3u { new_states[3] = kept3[w]; }
}

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
            if STATES > 3u { kept3[w] = new_states[3]; }
            words = w + 1u;
        }
        let absmax = absmax_of(block_max);
        // With DEFERRED, bit w (of 64: BLOCK_WORDS) set where word w has a value near a
        // switch between codes.
        var near_words = vec2(0u);
        for (var w = 0u; w < words; w++) {
            restore(b, w);
            redo = false;
            store_states(b, w, absmax);
            let bit = 1u << (w & 31u);
            near_words |= select(vec2(0u), select(vec2(bit, 0u), vec2(0u, bit), w >= 32u), redo);
        }
        // Those words' codes found again from the table, one word a turn: a CPU adapter
        // runs an `if` masked for every invocation, but leaves a loop once no invocation
        // is in it, so this costs a word or two per block where a branch per word would
        // cost the table's loads for every word.
        if DEFERRED {
            loop {
                if all(near_words == vec2(0u)) {
                    break;
                }
                let low = near_words.x != 0u;
                let w = select(32u + firstTrailingBit(near_words.y), firstTrailingBit(near_words.x), low);
                restore(b, w);
                store_states_exact(b, w, absmax);
                near_words = select(vec2(near_words.x, near_words.y & (near_words.y - 1u)), vec2(near_words.x & (near_words.x - 1u), near_words.y), low);
            }
        }
        // Every word of the block reads the old absmax, so the new one is written last.
        store_absmax(b, absmax);
    }
}
