// The 8-bit code of a value, two ways that give the same code bit for bit
// (crate::q8::nearest_code's, bitsandbytes' CUDA kernels' rule with its sign rule): a load
// from the value's bucket of a CodeTable
// (src/q8/lut.rs), or arithmetic on the value (src/q8/arith.rs), which asks the table only
// for the few values near a switch between codes.
//
// The generated prelude (src/gpu/q8/shader.rs) declares, before this file:
//   R                       vec4<f32>.
//   tables                  the code tables' binding: the signed map, the unsigned map
//                           (256 f32 bits each), then the signed and the unsigned
//                           crate::q8::lut::CodeTable entries.
//   SMALLEST, ONE, INFINITY, BUCKET_SHIFT, BUCKETS_PER_SIGN
//                           crate::q8::lut's constants.
//   FIRST_SWITCH, NEAR, FLOOR, CLAMP
//                           crate::q8::arith's constants (FLOOR and CLAMP as f32 bits).
//   struct Decade, decade_signed(m), decade_unsigned(m)
//                           per lane, the position's slope and offset and the first
//                           magnitude index of the decade of magnitude m (at least FLOOR,
//                           at most CLAMP) in the signed or the unsigned map: the
//                           crate::q8::arith::Quantizer of the map, the decade found by
//                           comparing m with each decade's start (no table is indexed).
// This file provides struct Coding, code, struct Estimate, estimate and codes_arith.

// Where a state's codes are decoded (`map`: the first word of its map in `tables`) and
// found (`table`: the first word of its CodeTable), its code of 0, and the arithmetic's
// constants of its map: which map, the smallest positive value that takes the code of 1
// (Quantizer::top_bits) and that code's magnitude index.
struct Coding {
    map: u32,
    table: u32,
    zero: u32,
    signed: bool,
    top: f32,
    top_index: i32,
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

// The codes of four values by arithmetic, and which lanes' positions lie near a switch.
struct Estimate {
    codes: vec4<u32>,
    near: vec4<bool>,
}

// The nearest codes of four values as `Quantizer::estimate` finds them (src/q8/arith.rs,
// whose module docs give the reasoning): the decade of the clamped magnitude, an affine
// position in it whose floor counts the decade's codes below, the switch to the code of 1
// tested on the value itself. A finite lane whose position lies within NEAR of a switch
// (about one value in 2000) is marked near: only `code` can tell its code.
fn estimate(coding: Coding, x: R) -> Estimate {
    let bits = bitcast<vec4<u32>>(x);
    let magnitude = bits & vec4(0x7fffffffu);
    let m = bitcast<R>(clamp(magnitude, vec4(FLOOR), vec4(CLAMP)));
    var d: Decade;
    if coding.signed {
        d = decade_signed(m);
    } else {
        d = decade_unsigned(m);
    }
    // The errors of an unfused multiply-add (a WGSL implementation may round the product)
    // are a few 1e-6 at most, far inside NEAR.
    let position = fma(m, d.scale, d.offset);
    let j = select(vec4<i32>(floor(position)), vec4(-1), position < R(FIRST_SWITCH));
    let index = select(d.base + j, vec4(coding.top_index), x >= R(coding.top));
    let negative = bits >= vec4(0x80000000u);
    var c: vec4<i32>;
    if coding.signed {
        // A negative value (-0.0 too) never takes the code of 0, index 0: the sign rule of
        // crate::q8::nearest_code keeps it one code below.
        c = select(127 + index, 127 - max(index, vec4(1)), negative);
    } else {
        c = select(index, vec4(0), negative);
    }
    let finite = magnitude < vec4(INFINITY);
    let codes = select(vec4(coding.zero), vec4<u32>(c), finite);
    // WGSL's round() rounds half to even, as round_ties_even on the host.
    let near = (abs(position - round(position)) < R(NEAR)) | (abs(position - R(FIRST_SWITCH)) < R(NEAR));
    return Estimate(codes, near & finite);
}

// The nearest codes of four values: `estimate`'s, near lanes taking `code`'s. (A CPU
// adapter runs the branch, masked, for every value: the serial entry point defers near
// words to a loop of their own instead, see shaders/q8_serial.wgsl.)
fn codes_arith(coding: Coding, x: R) -> vec4<u32> {
    let e = estimate(coding, x);
    if any(e.near) {
        let exact = vec4(code(coding.table, coding.zero, x.x), code(coding.table, coding.zero, x.y), code(coding.table, coding.zero, x.z), code(coding.table, coding.zero, x.w));
        return select(e.codes, exact, e.near);
    }
    return e.codes;
}
