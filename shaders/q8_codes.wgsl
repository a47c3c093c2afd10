// Blockwise 8-bit codes in an 8-bit step: dequantizing a word of four codes, finding the
// code of a scaled value, and a block's largest finite magnitude.
//
// The generated prelude declares, besides what shaders/q8.wgsl lists:
//   tables                  the code tables' binding: the signed map, the unsigned map
//                           (256 f32 bits each), then the signed and the unsigned
//                           crate::q8::lut::CodeTable entries.
//   SMALLEST, ONE, INFINITY, BUCKET_SHIFT, BUCKETS_PER_SIGN
//                           crate::q8::lut's constants.
//   CODINGS                 array<Coding, STATES>: state k's map and table, and its code
//                           of 0 (the signed map's for first moments and momentum, the
//                           unsigned one's for Adam's second moment).
// This file provides struct Coding, dequantize, code, largest, and the per-state steps
// the entry points call (load_states, largest_of_states, store_states, store_absmax).

// Where a state's codes are decoded (`map`: the first word of its map in `tables`) and
// found (`table`: the first word of its CodeTable), and its code of 0.
struct Coding {
    map: u32,
    table: u32,
    zero: u32,
}

// The four codes of `word` (the first in its low byte), as values of `map` times `scale`.
fn dequantize(map: u32, word: u32, scale: f32) -> R {
    return vec4(bitcast<f32>(tables[map + (word & 0xffu)]), bitcast<f32>(tables[map + ((word >> 8u) & 0xffu)]), bitcast<f32>(tables[map + ((word >> 16u) & 0xffu)]), bitcast<f32>(tables[map + (word >> 24u)])) * scale;
}

// `CodeTable::code` (src/q8/lut.rs): the bucket of the clamped magnitude, per sign; NaN
// and the infinities take `zero`, the code of 0. An entry is
// `start | end << 8 | switch << 16`.
fn code(table: u32, zero: u32, x: f32) -> u32 {
    let bits = bitcast<u32>(x);
    let magnitude = clamp(bits & 0x7fffffffu, SMALLEST, ONE);
    let entry = tables[table + (bits >> 31u) * BUCKETS_PER_SIGN + ((magnitude - SMALLEST) >> BUCKET_SHIFT)];
    let c = select(entry & 0xffu, (entry >> 8u) & 0xffu, (magnitude & ((1u << BUCKET_SHIFT) - 1u)) >= (entry >> 16u));
    return select(c, zero, (bits & 0x7fffffffu) >= INFINITY);
}

// The four codes of `scaled` (the live lanes; bytes past the tensor's end stay 0) in one
// word.
fn encode(coding: Coding, scaled: R) -> u32 {
    return code(coding.table, coding.zero, scaled.x) | select(0u, code(coding.table, coding.zero, scaled.y) << 8u, live.y) | select(0u, code(coding.table, coding.zero, scaled.z) << 16u, live.z) | select(0u, code(coding.table, coding.zero, scaled.w) << 24u, live.w);
}

// The largest finite magnitude of the live lanes, as the bits of |x|: a NaN or infinity
// would spoil its whole block's scale, so it counts as 0.
fn largest(v: R) -> u32 {
    let magnitude = bitcast<vec4<u32>>(v) & vec4(0x7fffffffu);
    let bits = select(vec4(0u), magnitude, live & (magnitude < vec4(INFINITY)));
    return max(max(bits.x, bits.y), max(bits.z, bits.w));
}

// Each state's new absmax of a block from its largest magnitude's bits (lane k: state k):
// 1 for an all-zero block.
fn absmax_of(largest_bits: vec4<u32>) -> vec4<f32> {
    return select(bitcast<vec4<f32>>(largest_bits), vec4(1.0), largest_bits == vec4(0u));
}

// Loads state k's word `w` of block `b` into old_states[k].
fn load_state(k: u32, b: u32, w: u32) {
    let scale = bitcast<f32>(state[seg.scale[k] + b]);
    let word = select(0u, state[seg.values[k] + b * BLOCK_WORDS + w], live.x);
    old_states[k] = dequantize(CODINGS[k].map, word, scale);
}

// Stores new_states[k], scaled by the block's new `absmax`, as state k's word `w` of
// block `b`.
fn store_state(k: u32, b: u32, w: u32, absmax: f32) {
    let codes = encode(CODINGS[k], new_states[k] / absmax);
    if live.x {
        state[seg.values[k] + b * BLOCK_WORDS + w] = codes;
    }
}

// Each state's part of a step. A variant has STATES of the MAX_STATES (3) states; the
// conditions are constants, so each call below has a constant `k` once inlined, and the
// states a variant lacks compile to nothing.
fn load_states(b: u32, w: u32) {
    if STATES > 0u { load_state(0u, b, w); }
    if STATES > 1u { load_state(1u, b, w); }
    if STATES > 2u { load_state(2u, b, w); }
}

// Per state, the largest finite magnitude of its new values (as bits; 0 where absent).
fn largest_of_states() -> vec4<u32> {
    var own = vec4(0u);
    if STATES > 0u { own.x = largest(new_states[0]); }
    if STATES > 1u { own.y = largest(new_states[1]); }
    if STATES > 2u { own.z = largest(new_states[2]); }
    return own;
}

fn store_states(b: u32, w: u32, absmax: vec4<f32>) {
    if STATES > 0u { store_state(0u, b, w, absmax.x); }
    if STATES > 1u { store_state(1u, b, w, absmax.y); }
    if STATES > 2u { store_state(2u, b, w, absmax.z); }
}

// Each state's new absmax of block `b`.
fn store_absmax(b: u32, absmax: vec4<f32>) {
    if STATES > 0u { state[seg.scale[0] + b] = bitcast<u32>(absmax.x); }
    if STATES > 1u { state[seg.scale[1] + b] = bitcast<u32>(absmax.y); }
    if STATES > 2u { state[seg.scale[2] + b] = bitcast<u32>(absmax.z); }
}
