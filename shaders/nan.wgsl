// `max_propagating_nan(a, b)`: NaN if either is NaN (as `torch.maximum`), else max(a, b).
//
// Before this file: `R` and `is_nan(x)` (shaders/nan_bits.wgsl or nan_f64.wgsl).

fn max_propagating_nan(a: R, b: R) -> R {
    return select(max(a, b), a + b, is_nan(a) | is_nan(b));
}
