// Adafactor (torch.optim.Adafactor), one tensor per dispatch, in passes recorded in order
// into one compute pass (src/family/adafactor/gpu_passes.rs), f32 math whatever the storage:
//   rows        each row's mean of g^2 over the last dim: row_var = lerp(row_var, mean, w)
//   cols        each column's mean of g^2 over the second-last dim: col_var likewise
//   psum        partial sums of p^2 (before the decay), one per workgroup
//   vector_pass 1-D: variance = lerp(variance, g^2, w); partial sums of U^2
//   denoms      each matrix's max(mean(row_var), eps1)
//   usum        2-D: partial sums of U^2, U = g / sqrt(max((row_var / denom) col_var, eps1^2))
//   finalize    one invocation: the partials added in order; scale = alpha / max(1, rms(U)/d)
// Non-finite values follow torch: its clamps (the max of denoms and of V) keep a NaN, the
// host's Python max (alpha's, the scale's) drops one; `is_nan` tests the bits.
//   apply       p = p decay - scale U (16-bit parameters: a whole word per invocation)
//   apply_rows  the same for f32 matrices, a row at a time
// Every sum runs in a fixed order over a fixed partition (a serial loop per row or column,
// `info.parts` workgroups reduced as a tree, the partials added in order): no atomics, the
// same bits on every run. The host prepends `S`, `struct Hyper` (src/family/adafactor/contract.rs),
// `struct Info`, `WG` and the `BINDING_*` constants (src/family/adafactor/gpu_passes.rs),
// shaders/convert.wgsl and shaders/nan_bits.wgsl.

// `struct Info` (where one tensor lives, and its shape) is generated from src/family/adafactor/gpu_passes.rs.

@group(0) @binding(BINDING_HYPER) var<uniform> hp: Hyper;
@group(0) @binding(BINDING_INFO) var<uniform> info: Info;
@group(0) @binding(BINDING_PARAMS) var<storage, read_write> param_words: array<u32>;
@group(0) @binding(BINDING_GRADS) var<storage, read> grad_words: array<u32>;
@group(0) @binding(BINDING_STATE) var<storage, read_write> state: array<f32>;
@group(0) @binding(BINDING_SCRATCH) var<storage, read_write> scratch: array<f32>;

var<workgroup> lanes: array<f32, WG>;

fn eps1() -> f32 {
    return select(hp.eps1, info.machine_eps, hp.eps1_from_dtype != 0.0);
}

// torch's lerp: two forms, below and above a weight of one half.
fn lerp_t(start: f32, end: f32, weight: f32) -> f32 {
    let diff = end - start;
    if abs(weight) < 0.5 {
        return start + weight * diff;
    }
    return end - diff * (1.0 - weight);
}

fn decode(word: u32, half: u32, dtype: u32) -> f32 {
    if dtype == 0u {
        return bitcast<f32>(word);
    }
    let h = (word >> (half * 16u)) & 0xffffu;
    if dtype == 1u {
        return f16_value(h);
    }
    return bf16_value(h);
}

fn word_of(j: u32, dtype: u32) -> u32 {
    return select(j >> 1u, j, dtype == 0u);
}

fn load_param(i: u32) -> f32 {
    let j = i + info.p_shift;
    return decode(param_words[word_of(j, info.p_dtype)], j & 1u, info.p_dtype);
}

// torch.clamp(x, min=lo): a NaN stays NaN (WGSL leaves max's result for a NaN open).
fn clamp_min(x: f32, lo: f32) -> f32 {
    return select(max(x, lo), x, is_nan(x));
}

// Python's max(a, x), which torch takes on the host for alpha and the clipping denominator:
// a NaN x gives a.
fn py_max(a: f32, x: f32) -> f32 {
    return select(max(a, x), a, is_nan(x));
}

// The gradient, its sign flipped with maximize.
fn load_grad(i: u32) -> f32 {
    let j = i + info.g_shift;
    let k = word_of(j, info.g_dtype);
    var word: u32;
    if info.grad_in_param != 0u {
        word = param_words[k];
    } else {
        word = grad_words[k];
    }
    return decode(word, j & 1u, info.g_dtype) * hp.sign;
}

// Element i's update U.
fn update_of(i: u32) -> f32 {
    let e = eps1();
    let g = load_grad(i);
    if info.factored == 0u {
        return g / sqrt(clamp_min(state[info.state_a + i], e * e));
    }
    let rc = info.rows * info.cols;
    let b = i / rc;
    let within = i - b * rc;
    let r = within / info.cols;
    let c = within - r * info.cols;
    let row = state[info.state_a + b * info.rows + r];
    let col = state[info.state_b + b * info.cols + c];
    let v = row / scratch[info.scratch_base + b] * col;
    return g / sqrt(clamp_min(v, e * e));
}

// The invocation's index in a grid of workgroups (x up to the device's limit, then y).
fn grid_index(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wid.y * nwg.x + wid.x) * WG + lid;
}

// The workgroup's values added as a tree (always the same pairs), written to `slot`.
fn reduce_store(lid: u32, acc: f32, slot: u32) {
    lanes[lid] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if lid < s {
            lanes[lid] += lanes[lid + s];
        }
        workgroupBarrier();
    }
    if lid == 0u {
        scratch[slot] = lanes[0];
    }
}

@compute @workgroup_size(WG)
fn rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = grid_index(wid, nwg, lid);
    if r >= info.batches * info.rows {
        return;
    }
    let base = r * info.cols;
    var sum = 0.0;
    for (var c = 0u; c < info.cols; c++) {
        let g = load_grad(base + c);
        sum += g * g;
    }
    let at = info.state_a + r;
    state[at] = lerp_t(state[at], sum / f32(info.cols), hp.weight);
}

@compute @workgroup_size(WG)
fn cols(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let k = grid_index(wid, nwg, lid);
    if k >= info.batches * info.cols {
        return;
    }
    let b = k / info.cols;
    let c = k - b * info.cols;
    let base = b * info.rows * info.cols + c;
    var sum = 0.0;
    for (var r = 0u; r < info.rows; r++) {
        let g = load_grad(base + r * info.cols);
        sum += g * g;
    }
    let at = info.state_b + k;
    state[at] = lerp_t(state[at], sum / f32(info.rows), hp.weight);
}

@compute @workgroup_size(WG)
fn denoms(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let b = grid_index(wid, nwg, lid);
    if b >= info.batches {
        return;
    }
    var sum = 0.0;
    for (var r = 0u; r < info.rows; r++) {
        sum += state[info.state_a + b * info.rows + r];
    }
    scratch[info.scratch_base + b] = clamp_min(sum / f32(info.rows), eps1());
}

@compute @workgroup_size(WG)
fn psum(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    var acc = 0.0;
    for (var i = wid.x * WG + lid; i < info.n; i += info.parts * WG) {
        let p = load_param(i);
        acc += p * p;
    }
    reduce_store(lid, acc, info.scratch_base + info.batches + wid.x);
}

@compute @workgroup_size(WG)
fn vector_pass(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let e = eps1();
    var acc = 0.0;
    for (var i = wid.x * WG + lid; i < info.n; i += info.parts * WG) {
        let g = load_grad(i);
        let v = lerp_t(state[info.state_a + i], g * g, hp.weight);
        state[info.state_a + i] = v;
        let u = g / sqrt(clamp_min(v, e * e));
        acc += u * u;
    }
    reduce_store(lid, acc, info.scratch_base + info.batches + info.parts + wid.x);
}

// Whole rows per workgroup (rows w, w + parts, ...), its invocations striding over the
// columns: the batch is split off once per row, never per element.
@compute @workgroup_size(WG)
fn usum(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let e = eps1();
    var acc = 0.0;
    for (var row = wid.x; row < info.batches * info.rows; row += info.parts) {
        let b = row / info.rows;
        let factor = state[info.state_a + row] / scratch[info.scratch_base + b];
        for (var c = lid; c < info.cols; c += WG) {
            let g = load_grad(row * info.cols + c);
            let v = factor * state[info.state_b + b * info.cols + c];
            let u = g / sqrt(clamp_min(v, e * e));
            acc += u * u;
        }
    }
    reduce_store(lid, acc, info.scratch_base + info.batches + info.parts + wid.x);
}

// f32 parameters of 2 or more dimensions: x over the columns, y (and a loop) over the rows.
@compute @workgroup_size(WG)
fn apply_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let c = wid.x * WG + lid;
    let scale = scratch[info.scratch_base + info.batches + 2u * info.parts];
    let e = eps1();
    if c >= info.cols {
        return;
    }
    for (var row = wid.y; row < info.batches * info.rows; row += nwg.y) {
        let b = row / info.rows;
        let factor = state[info.state_a + row] / scratch[info.scratch_base + b];
        let v = factor * state[info.state_b + b * info.cols + c];
        let i = row * info.cols + c;
        let u = load_grad(i) / sqrt(clamp_min(v, e * e));
        let p = bitcast<f32>(param_words[i + info.p_shift]);
        param_words[i + info.p_shift] = bitcast<u32>(p * hp.decay - scale * u);
    }
}

@compute @workgroup_size(1)
fn finalize() {
    let base = info.scratch_base + info.batches;
    var p2 = 0.0;
    var u2 = 0.0;
    for (var k = 0u; k < info.parts; k++) {
        p2 += scratch[base + k];
        u2 += scratch[base + info.parts + k];
    }
    let root_n = sqrt(f32(info.n));
    let alpha = py_max(hp.eps2, sqrt(p2) / root_n) * hp.rho;
    scratch[base + 2u * info.parts] = alpha / py_max(1.0, sqrt(u2) / (root_n * hp.d));
}

fn store_bits(x: f32) -> u32 {
    if info.p_dtype == 1u {
        return f16_bits(x);
    }
    return bf16_bits(x);
}

@compute @workgroup_size(WG)
fn apply(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let k = grid_index(wid, nwg, lid);
    let scale = scratch[info.scratch_base + info.batches + 2u * info.parts];
    if info.p_dtype == 0u {
        if k >= info.n {
            return;
        }
        let p = bitcast<f32>(param_words[k + info.p_shift]);
        param_words[k + info.p_shift] = bitcast<u32>(p * hp.decay - scale * update_of(k));
        return;
    }
    // 16-bit: this invocation owns one word, both of whose halves it writes back.
    let first = info.p_shift >> 1u;
    let words = ((info.p_shift + info.n + 1u) >> 1u) - first;
    if k >= words {
        return;
    }
    let w = first + k;
    var word = param_words[w];
    for (var h = 0u; h < 2u; h++) {
        let j = 2u * w + h;
        if j >= info.p_shift && j < info.p_shift + info.n {
            let i = j - info.p_shift;
            let p = decode(word, h, info.p_dtype);
            word = with_half(word, h, store_bits(p * hp.decay - scale * update_of(i)));
        }
    }
    param_words[w] = word;
}
