// Adagrad, one element at a time (ONNX Adagrad and PyTorch Adagrad).
//   g' = (MAXIMIZE ? -g : g) + weight_decay * p
//   h' = h + g' * g'
//   p' = p - lr * g' / (sqrt(h') + eps)
// The host folds the learning-rate decay into `lr`:
//   ONNX:  R / (1 + T * decay_factor)        torch: lr / (1 + (step - 1) * lr_decay)

override MAXIMIZE: bool = false;
// 0: no weight decay. 1: L2, `g += weight_decay * p`.
override WEIGHT_DECAY: u32 = 0u;

struct AdagradHyper {
    lr: R,
    weight_decay: R,
    eps: R,
}

@group(0) @binding(0) var<uniform> hp: AdagradHyper;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let stride = groups.x * WG;
    for (var i = gid.x; i < seg.n; i += stride) {
        let p = load_param(i);
        var g = load_grad(i);
        let h_prev = load_sum(i);

        if MAXIMIZE {
            g = -g;
        }
        if WEIGHT_DECAY == 1u {
            g = g + hp.weight_decay * p;
        }
        let h = h_prev + g * g;
        store_sum(i, h);
        store_param(i, p - hp.lr * g / (sqrt(h) + hp.eps));
    }
}
