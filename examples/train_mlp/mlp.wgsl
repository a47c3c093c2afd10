// Forward and backward kernels of a fully connected ReLU network with softmax cross-entropy.
//
// The host prepends `alias Param = f32;` (or f16, or u32 holding pairs of bf16) and
// `fn param(i) -> f32`, which reads parameter element i: parameters are stored in the model's dtype, everything else (activations, deltas, gradients) is f32, and
// all arithmetic is f32.
//
// Each invocation computes one column of a block of four output rows, looping over the
// reduction dimension (a fixed summation order: no atomics, deterministic results). That
// is all the tiling there is: plenty for a 2-64-64-3 network, and simple to check. The
// block of four exists for lavapipe, whose loads cost about the same for one lane as for
// all: the rows' operands are the same for a whole workgroup, the column's operand is
// loaded once per step and used four times, which makes a step about twice as fast as
// with one output per invocation. Each entry point uses a subset of the bindings below,
// so the auto-derived bind group layout of each pipeline holds only what it touches.
//
// Layouts: weights are [out, in] row-major at element `dims.w` of `params` (PyTorch's
// `Linear.weight`), biases [out] at `dims.b`; activations and deltas are [n, features].

struct Dims {
    // Samples in the batch.
    n: u32,
    // Input and output features of the layer.
    in_dim: u32,
    out_dim: u32,
    // Element offsets of the weight matrix and bias vector in `params` and `grads`.
    w: u32,
    b: u32,
    // 1: apply ReLU to the output (hidden layers); 0: linear output (logits).
    relu: u32,
}

@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read> params: array<Param>;
// The layer's input activations [n, in_dim] (softmax: the logits [n, out_dim]).
@group(0) @binding(2) var<storage, read> src: array<f32>;
// dLoss/d(layer output before its ReLU) [n, out_dim].
@group(0) @binding(3) var<storage, read> delta: array<f32>;
// Where a kernel writes activations or deltas.
@group(0) @binding(4) var<storage, read_write> dst: array<f32>;
@group(0) @binding(5) var<storage, read_write> grads: array<f32>;
@group(0) @binding(6) var<storage, read> labels: array<u32>;
@group(0) @binding(7) var<storage, read_write> loss: array<f32>;
@group(0) @binding(8) var<storage, read_write> correct: array<u32>;

const WG: u32 = 64u;

fn weight(out_index: u32, in_index: u32) -> f32 {
    return param(dims.w + out_index * dims.in_dim + in_index);
}

// src[start + min(r, room) * step] for r = 0..3: a block of rows (or columns) that repeats
// the last valid one past the end, so no read leaves the array; such results are not stored.
fn src4(start: u32, step: u32, room: u32) -> vec4<f32> {
    return vec4(src[start], src[start + min(1u, room) * step], src[start + min(2u, room) * step],
                src[start + min(3u, room) * step]);
}

// The same for delta.
fn delta4(start: u32, step: u32, room: u32) -> vec4<f32> {
    return vec4(delta[start], delta[start + min(1u, room) * step], delta[start + min(2u, room) * step],
                delta[start + min(3u, room) * step]);
}

// dst[s, o] = act(b[o] + sum_k W[o, k] src[s, k]) for o = this invocation's column and the
// four samples s of this workgroup's block.
@compute @workgroup_size(WG)
fn forward(@builtin(global_invocation_id) id: vec3<u32>, @builtin(workgroup_id) group: vec3<u32>) {
    let o = id.x;
    let first = group.y * 4u;
    if o >= dims.out_dim || first >= dims.n {
        return;
    }
    let room = min(dims.n - 1u - first, 3u);
    var sum = vec4(param(dims.b + o));
    for (var k = 0u; k < dims.in_dim; k++) {
        sum += weight(o, k) * src4(first * dims.in_dim + k, dims.in_dim, room);
    }
    if dims.relu != 0u {
        sum = max(sum, vec4(0.0));
    }
    for (var r = 0u; r <= room; r++) {
        dst[(first + r) * dims.out_dim + o] = sum[r];
    }
}

// Per sample s: softmax of the logits src[s, :], the loss -log p[label], whether the
// arg max is the label, and dst[s, c] = (p[c] - [c == label]) / n, the gradient of the
// batch-mean loss with respect to the logits.
@compute @workgroup_size(WG)
fn softmax_xent(@builtin(global_invocation_id) id: vec3<u32>) {
    let s = id.x;
    if s >= dims.n {
        return;
    }
    let row = s * dims.out_dim;
    let label = labels[s];
    // Subtracting the maximum keeps exp() finite for any logits.
    var top = src[row];
    var best = 0u;
    for (var c = 1u; c < dims.out_dim; c++) {
        if src[row + c] > top {
            top = src[row + c];
            best = c;
        }
    }
    var total = 0.0;
    for (var c = 0u; c < dims.out_dim; c++) {
        total += exp(src[row + c] - top);
    }
    let scale = 1.0 / f32(dims.n);
    for (var c = 0u; c < dims.out_dim; c++) {
        let p = exp(src[row + c] - top) / total;
        dst[row + c] = (p - select(0.0, 1.0, c == label)) * scale;
    }
    loss[s] = log(total) - (src[row + label] - top);
    correct[s] = select(0u, 1u, best == label);
}

// The layer's parameter gradients, for the four outputs o of this workgroup's block and
// the column k of this invocation: dW[o, k] = sum_s delta[s, o] src[s, k] for k < in_dim,
// and column in_dim is the bias, db[o] = sum_s delta[s, o].
@compute @workgroup_size(WG)
fn weight_grad(@builtin(global_invocation_id) id: vec3<u32>, @builtin(workgroup_id) group: vec3<u32>) {
    let k = id.x;
    let first = group.y * 4u;
    if k > dims.in_dim || first >= dims.out_dim {
        return;
    }
    let room = min(dims.out_dim - 1u - first, 3u);
    let is_weight = k < dims.in_dim;
    let column = min(k, dims.in_dim - 1u);
    var sum = vec4(0.0);
    for (var s = 0u; s < dims.n; s++) {
        let x = select(1.0, src[s * dims.in_dim + column], is_weight);
        sum += x * delta4(s * dims.out_dim + first, 1u, room);
    }
    for (var r = 0u; r <= room; r++) {
        let o = first + r;
        if is_weight {
            grads[dims.w + o * dims.in_dim + k] = sum[r];
        } else {
            grads[dims.b + o] = sum[r];
        }
    }
}

// The previous layer's delta for the column k of this invocation and the four samples s
// of this workgroup's block: dst[s, k] = (sum_o delta[s, o] W[o, k]) * [src[s, k] > 0],
// where src is this layer's input, the previous layer's ReLU output (positive exactly
// where its input was).
@compute @workgroup_size(WG)
fn input_grad(@builtin(global_invocation_id) id: vec3<u32>, @builtin(workgroup_id) group: vec3<u32>) {
    let k = id.x;
    let first = group.y * 4u;
    if k >= dims.in_dim || first >= dims.n {
        return;
    }
    let room = min(dims.n - 1u - first, 3u);
    var sum = vec4(0.0);
    for (var o = 0u; o < dims.out_dim; o++) {
        sum += weight(o, k) * delta4(first * dims.out_dim + o, dims.out_dim, room);
    }
    for (var r = 0u; r <= room; r++) {
        let index = (first + r) * dims.in_dim + k;
        dst[index] = select(0.0, sum[r], src[index] > 0.0);
    }
}
