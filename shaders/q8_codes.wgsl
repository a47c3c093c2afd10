// Blockwise 8-bit codes in an 8-bit step: dequantizing a word of four codes, finding the
// codes of scaled values, and a block's largest finite magnitude.
//
// Needs shaders/q8_nearest.wgsl (struct Coding, code, estimate, codes_arith) and what
// its prelude declares; besides what shaders/q8.wgsl lists, the generated prelude declares:
//   CODINGS                 array<Coding, STATES>: state k's map and table, its code of 0
//                           (the signed map's for first moments and momentum, the unsigned
//                           one's for Adam's second moment) and its map's constants.
//   ARITHMETIC              whether codes are found by arithmetic (codes_arith) or by a
//                           table load per value (code): the same codes, at another cost.
//   DEFERRED                with ARITHMETIC, whether `encode` leaves a word with a value
//                           near a switch to the entry point (the serial one), which finds
//                           its codes again with store_states_exact.
// This file provides dequantize, encode, largest, and the per-state steps the entry points
// call (load_states, largest_of_states, store_states, store_states_exact, store_absmax),
// and `redo`.

// The four codes of `word` (the first in its low byte), as values of `map` times `scale`.
fn dequantize(map: u32, word: u32, scale: f32) -> R {
    return vec4(bitcast<f32>(tables[map + (word & 0xffu)]), bitcast<f32>(tables[map + ((word >> 8u) & 0xffu)]), bitcast<f32>(tables[map + ((word >> 16u) & 0xffu)]), bitcast<f32>(tables[map + (word >> 24u)])) * scale;
}

// With DEFERRED: set by `encode` where a live value lies near a switch between codes (its
// word's code there is then an estimate, to be found again by store_states_exact).
var<private> redo: bool;

// Four codes (the live lanes; bytes past the tensor's end stay 0) in one word.
fn pack(c: vec4<u32>) -> u32 {
    return c.x | select(0u, c.y << 8u, live.y) | select(0u, c.z << 16u, live.z) | select(0u, c.w << 24u, live.w);
}

// The four codes of `scaled` in one word, found the variant's way.
fn encode(coding: Coding, scaled: R) -> u32 {
    if ARITHMETIC {
        if DEFERRED {
            let e = estimate(coding, scaled);
            redo = redo || any(e.near & live);
            return pack(e.codes);
        }
        return pack(codes_arith(coding, scaled));
    }
    return encode_exact(coding, scaled);
}

// The four codes of `scaled` in one word, from the table.
fn encode_exact(coding: Coding, scaled: R) -> u32 {
    return code(coding.table, coding.zero, scaled.x) | select(0u, code(coding.table, coding.zero, scaled.y) << 8u, live.y) | select(0u, code(coding.table, coding.zero, scaled.z) << 16u, live.z) | select(0u, code(coding.table, coding.zero, scaled.w) << 24u, live.w);
}

// The largest finite magnitude of the live lanes, as the bits of |x|: a NaN or infinity
// would spoil its whole block's scale, so it counts as 0.
fn largest(v: R) -> u32 {
    let magnitude = bitcast<vec4<u32>>(v) & vec4(0x7fffffffu);
    let bits = select(vec4(0u), magnitude, live & (magnitude < vec4(INFINITY)));
    return max(max(bits.x, bits.y), max(bits.z, bits.w));
}

// Per state (lane k: state k), whether the block `absmax_of` last scaled holds no finite
// value but 0: its codes are all the code of 0, -0.0's too (crate::q8::quantize), where the
// sign rule would give -0.0 the code below.
var<private> zero_block: vec4<bool>;

// Each state's new absmax of a block from its largest magnitude's bits (lane k: state k):
// 1 for an all-zero block.
fn absmax_of(largest_bits: vec4<u32>) -> vec4<f32> {
    zero_block = largest_bits == vec4(0u);
    return select(bitcast<vec4<f32>>(largest_bits), vec4(1.0), zero_block);
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
    var codes = encode(CODINGS[k], new_states[k] / absmax);
    if zero_block[k] {
        codes = pack(vec4(CODINGS[k].zero));
    }
    if live.x {
        state[seg.values[k] + b * BLOCK_WORDS + w] = codes;
    }
}

// store_state with the codes from the table.
fn store_state_exact(k: u32, b: u32, w: u32, absmax: f32) {
    var codes = encode_exact(CODINGS[k], new_states[k] / absmax);
    if zero_block[k] {
        codes = pack(vec4(CODINGS[k].zero));
    }
    if live.x {
        state[seg.values[k] + b * BLOCK_WORDS + w] = codes;
    }
}

// Each state's part of a step. A variant has STATES of the MAX_STATES (4) states; the
// conditions are constants, so each call below has a constant `k` once inlined, and the
// states a variant lacks compile to nothing.
fn load_states(b: u32, w: u32) {
    if STATES > 0u { load_state(0u, b, w); }
    if STATES > 1u { load_state(1u, b, w); }
    if STATES > 2u { load_state(2u, b, w); }
    if STATES > 3u { load_state(3u, b, w); }
}

// Per state, the largest finite magnitude of its new values (as bits; 0 where absent).
fn largest_of_states() -> vec4<u32> {
    var own = vec4(0u);
    if STATES > 0u { own.x = largest(new_states[0]); }
    if STATES > 1u { own.y = largest(new_states[1]); }
    if STATES > 2u { own.z = largest(new_states[2]); }
    if STATES > 3u { own.w = largest(new_states[3]); }
    return own;
}

fn store_states(b: u32, w: u32, absmax: vec4<f32>) {
    if STATES > 0u { store_state(0u, b, w, absmax.x); }
    if STATES > 1u { store_state(1u, b, w, absmax.y); }
    if STATES > 2u { store_state(2u, b, w, absmax.z); }
    if STATES > 3u { store_state(3u, b, w, absmax.w); }
}

fn store_states_exact(b: u32, w: u32, absmax: vec4<f32>) {
    if STATES > 0u { store_state_exact(0u, b, w, absmax.x); }
    if STATES > 1u { store_state_exact(1u, b, w, absmax.y); }
    if STATES > 2u { store_state_exact(2u, b, w, absmax.z); }
    if STATES > 3u { store_state_exact(3u, b, w, absmax.w); }
}

// Each state's new absmax of block `b`.
fn store_absmax(b: u32, absmax: vec4<f32>) {
    if STATES > 0u { state[seg.scale[0] + b] = bitcast<u32>(absmax.x); }
    if STATES > 1u { state[seg.scale[1] + b] = bitcast<u32>(absmax.y); }
    if STATES > 2u { state[seg.scale[2] + b] = bitcast<u32>(absmax.z); }
    if STATES > 3u { state[seg.scale[3] + b] = bitcast<u32>(absmax.w); }
}
