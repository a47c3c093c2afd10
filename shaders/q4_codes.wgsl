// Blockwise 4-bit codes in a 4-bit step (torchao's AdamW4bit format): dequantizing half a
// word of codes, torchao's code search, packing, and each state's part of a step.
//
// The generated prelude (src/gpu/q4/shader.rs) declares, besides what shaders/q8.wgsl
// lists:
//   MAP0, MAP1        state k's 16-entry map: torchao's signed qmap1 for exp_avg, its
//                     unsigned qmap2 (k/16, no 0) for exp_avg_sq.
//   ZERO0, ZERO1      the code a NaN or infinite value takes (that of 0; qmap2's smallest).
//   count0, count1    the number of state k's thresholds not above x (src/q4/mod.rs's
//                     `thresholds`): torchao's code of a finite x, without a table lookup.
//   MIN_SCALE         the smallest scale, torchao's clip(1e-12).
//   INFINITY          the bits of +inf.
// This file provides map_entry, code_of, the per-state loads and stores, largest_of_states
// and scale_of, which the entry points call.
//
// A u32 word holds the codes of eight consecutive elements: byte j (bits 8j..8j+7) holds
// element 2j in its high nibble and element 2j+1 in its low one, so the state's bytes are
// torchao's packed codes. Half h of a word is its elements 4h..4h+3.

// Both maps, copied from the constants once per invocation (`load_maps`): indexing a
// constant array with a variable would copy it at every access.
var<private> maps: array<f32, 32>;

fn load_maps() {
    for (var c = 0u; c < 16u; c++) {
        maps[c] = MAP0[c];
        maps[16u + c] = MAP1[c];
    }
}

fn map_entry(k: u32, c: u32) -> f32 {
    return maps[16u * k + c];
}

fn zero_code(k: u32) -> u32 {
    return select(ZERO1, ZERO0, k == 0u);
}

// torchao's quantize_4bit_with_qmap (the last entry not above x, then up one where x is at
// least halfway to the next entry, a tie going up), as a count of thresholds. NaN and the
// infinities take the code of 0 (see src/q4/mod.rs).
fn code_of(k: u32, x: f32) -> u32 {
    var c: u32;
    if k == 0u {
        c = count0(x);
    } else {
        c = count1(x);
    }
    return select(zero_code(k), c, (bitcast<u32>(x) & 0x7fffffffu) < INFINITY);
}

// Where the four codes of half h lie in a word: elements 4h, 4h+1 in byte 2h (high nibble
// first), elements 4h+2, 4h+3 in byte 2h+1.
fn half_shifts(h: u32) -> vec4<u32> {
    return vec4(4u, 0u, 12u, 8u) + vec4(16u * h);
}

fn dequantize_half(k: u32, word: u32, h: u32, scale: f32) -> R {
    let c = (vec4(word) >> half_shifts(h)) & vec4(15u);
    return vec4(map_entry(k, c.x), map_entry(k, c.y), map_entry(k, c.z), map_entry(k, c.w)) * scale;
}

fn encode_half(k: u32, scaled: R, h: u32) -> u32 {
    let s = half_shifts(h);
    return (code_of(k, scaled.x) << s.x) | (code_of(k, scaled.y) << s.y) | (code_of(k, scaled.z) << s.z) | (code_of(k, scaled.w) << s.w);
}

// State k's word w of block b: its codes, and its block's scale.
fn word_at(k: u32, b: u32, w: u32) -> u32 {
    return state[seg.values[k] + b * BLOCK_WORDS + w];
}

fn scale_at(k: u32, b: u32) -> f32 {
    return bitcast<f32>(state[seg.scale[k] + b]);
}

// Loads half h of word w of block b of every state into old_states (zeros for an inactive
// invocation, whose block lies past the segment's end).
fn load_half(b: u32, w: u32, h: u32) {
    if STATES > 0u { old_states[0] = select(R(0.0), dequantize_half(0u, word_at(0u, b, w), h, scale_at(0u, b)), live.x); }
    if STATES > 1u { old_states[1] = select(R(0.0), dequantize_half(1u, word_at(1u, b, w), h, scale_at(1u, b)), live.x); }
}

// The largest finite magnitude of the live lanes, as the bits of |x|: a NaN or infinity
// would spoil its whole block's scale, so it counts as 0.
fn largest(v: R) -> u32 {
    let magnitude = bitcast<vec4<u32>>(v) & vec4(0x7fffffffu);
    let bits = select(vec4(0u), magnitude, live & (magnitude < vec4(INFINITY)));
    return max(max(bits.x, bits.y), max(bits.z, bits.w));
}

// Per state (lane k), the largest finite magnitude of new_states[k], as bits.
fn largest_of_states() -> vec4<u32> {
    var own = vec4(0u);
    if STATES > 0u { own.x = largest(new_states[0]); }
    if STATES > 1u { own.y = largest(new_states[1]); }
    return own;
}

// Each state's new scale from its largest magnitude's bits: torchao's amax().clip(1e-12).
fn scale_of(largest_bits: vec4<u32>) -> vec4<f32> {
    return max(bitcast<vec4<f32>>(largest_bits), vec4(MIN_SCALE));
}

// Stores state k's word w of block b from its two halves' new values.
fn store_word(k: u32, b: u32, w: u32, low: R, high: R, scale: f32) {
    state[seg.values[k] + b * BLOCK_WORDS + w] = encode_half(k, low / scale, 0u) | encode_half(k, high / scale, 1u);
}

fn store_scales(b: u32, scale: vec4<f32>) {
    if STATES > 0u { state[seg.scale[0] + b] = bitcast<u32>(scale.x); }
    if STATES > 1u { state[seg.scale[1] + b] = bitcast<u32>(scale.y); }
}
