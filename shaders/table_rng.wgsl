// Stochastic rounding's per-entry key (src/step/rounding.rs documents the hash).
//
// The generated prelude supplies, before this file: `rng_row(r)` (row r as an `RngRow`:
// ordinal, first_lo, first_hi), `ENTRY_RNG` (the row of an entry that holds it), and
// `rng_mix` (shaders/stochastic.wgsl).
//
// This file provides the private key and first element of the current entry, and
// `rng_begin(e, seed_lo, seed_hi, step)`, which sets them for entry e.

var<private> rng_key: u32;
var<private> rng_first_lo: u32;
var<private> rng_first_hi: u32;

fn rng_begin(e: u32, seed_lo: u32, seed_hi: u32, step: u32) {
    let r = rng_row(e + ENTRY_RNG);
    rng_first_lo = r.first_lo;
    rng_first_hi = r.first_hi;
    rng_key = rng_mix(rng_mix(rng_mix(rng_mix(seed_lo) ^ seed_hi) ^ step) ^ r.ordinal);
}
