// The entry point of a 4-bit step where a workgroup owns BLOCKS_PER_GROUP blocks at a
// time: invocation `lid` owns word `lid % BLOCK_WORDS` (eight codes per state) of block
// `lid / BLOCK_WORDS` of the group, so no two invocations write one word, and each block's
// new scale is a tree reduction over its words that never leaves the workgroup (the same
// order every run: deterministic).
//
// Needs the prelude, shaders/q8.wgsl and shaders/q4_codes.wgsl; provides `main`.

// Each invocation's largest magnitudes (per state, as bits), then the reduction's partials.
var<workgroup> lanes: array<vec4<u32>, WORKGROUP>;
// The first row of the workgroup's entry, found once.
var<workgroup> entry: u32;

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    load_scalars();
    load_maps();
    if lid == 0u {
        entry = entry_row(wid.x);
    }
    let e = workgroupUniformLoad(&entry);
    // Read from the uniform, so that the loop's bounds are uniform (its barriers need it).
    let segment = segment_at(e);
    seg = segment;
    let w = lid % BLOCK_WORDS;
    let rounds = (segment.blocks + BLOCKS_PER_GROUP - 1u) / BLOCKS_PER_GROUP;
    for (var r = wid.x - segment.first_group; r < rounds; r += segment.groups) {
        let b = r * BLOCKS_PER_GROUP + lid / BLOCK_WORDS;
        let at = b * BLOCK_SIZE + w * CODES_PER_WORD;
        // A block past the segment's end has no live lane: it loads zeros, stores nothing.
        set_first(at);
        load_half(b, w, 0u);
        update(0u);
        let low = new_states;
        var own = largest_of_states();
        set_first(at + 4u);
        load_half(b, w, 1u);
        update(0u);
        own = max(own, largest_of_states());
        lanes[lid] = own;
        workgroupBarrier();
        for (var stride = BLOCK_WORDS / 2u; stride > 0u; stride = stride / 2u) {
            if w < stride {
                lanes[lid] = max(lanes[lid], lanes[lid + stride]);
            }
            workgroupBarrier();
        }
        let scale = scale_of(lanes[lid - w]);
        if live.x {
            if STATES > 0u { store_word(0u, b, w, low[0], new_states[0], scale.x); }
            if STATES > 1u { store_word(1u, b, w, low[1], new_states[1], scale.y); }
            // Every word of the block read the old scale before the barriers above.
            if w == 0u {
                store_scales(b, scale);
            }
        }
        // The next round reuses `lanes`.
        workgroupBarrier();
    }
}
