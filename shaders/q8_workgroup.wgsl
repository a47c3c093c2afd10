// The entry point of an 8-bit step where a workgroup owns a block at a time: invocation
// `lid` owns word `lid` of the block (four codes per state), so no two invocations write
// one word, and the block's new absmax is a reduction that never leaves the workgroup.
//
// Needs the prelude, shaders/q8.wgsl, shaders/q8_nearest.wgsl and shaders/q8_codes.wgsl
// (see there); provides `main`.

// Each invocation's largest magnitudes (per state, as bits), then the fold's partials.
var<workgroup> lanes: array<vec4<u32>, WORKGROUP>;
// The first row of the workgroup's entry, found once.
var<workgroup> entry: u32;

@compute @workgroup_size(WORKGROUP)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let w = lid;
    load_scalars();
    // One search per workgroup, and a value the barriers below may depend on.
    if lid == 0u {
        entry = entry_row(wid.x);
    }
    let e = workgroupUniformLoad(&entry);
    // Read from the uniform, not from the private copy, so that the loop's bounds are
    // uniform values (its barriers need them to be).
    let segment = segment_at(e);
    seg = segment;
    for (var b = wid.x - segment.first_group; b < segment.blocks; b += segment.groups) {
        set_first(b * BLOCK_SIZE + lid * CODES_PER_WORD);
        load_states(b, w);
        update(0u);
        lanes[lid] = largest_of_states();
        // Two levels of FAN_IN (each barrier costs a CPU adapter a switch through every
        // invocation).
        workgroupBarrier();
        if lid < FAN_IN {
            var m = lanes[FAN_IN * lid];
            for (var j = 1u; j < FAN_IN; j++) {
                m = max(m, lanes[FAN_IN * lid + j]);
            }
            lanes[FAN_IN * lid] = m;
        }
        workgroupBarrier();
        var block_max = lanes[0];
        for (var j = 1u; j < FAN_IN; j++) {
            block_max = max(block_max, lanes[FAN_IN * j]);
        }
        let absmax = absmax_of(block_max);
        store_states(b, w, absmax);
        if lid == 0u {
            store_absmax(b, absmax);
        }
        // The next block reuses `lanes`.
        workgroupBarrier();
    }
}
