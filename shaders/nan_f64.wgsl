// `is_nan(x)` for f64 math: WGSL has no 64-bit integers (nor a size-changing bitcast)
// without extensions, and an ordered comparison is false exactly for NaN.
//
// The generated prelude supplies `R` (f64).

fn is_nan(x: R) -> bool {
    return !(x == x);
}
