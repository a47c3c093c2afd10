// Gradient clipping's second pass, one workgroup: combines the partials of grad_norm.wgsl
// in a fixed order into the global norm and writes it with PyTorch's coefficient,
// min(1, max_norm / (total_norm + CLIP_EPS)) (NaN stays NaN), into the clip buffer, where the
// update kernels read it. CLIP_EPS is PyTorch's 1e-6 for grad_clip, or the official Adan's
// eps for its own clipping. The prelude (src/gpu/kernel/passes.rs's clip_finalize_wgsl) declares WG
// (the workgroup size, a power of two), the BINDING_* constants, `struct ClipHeader`,
// NORM_INF, norm_combine.wgsl's `combine`, and `publish`, which in capturable mode also
// writes the coefficient into the device state, where capturable update kernels read it.

@group(GROUP_SCALARS) @binding(BINDING_FINALIZE_PARTIALS) var<storage, read> partials: array<f32>;
@group(GROUP_SCALARS) @binding(BINDING_FINALIZE_CLIP) var<storage, read_write> clip: ClipHeader;

override CLIP_EPS: f32;

var<workgroup> lanes: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32) {
    var acc = 0.0;
    for (var k = lid; k < arrayLength(&partials); k += WG) {
        acc = combine(acc, partials[k]);
    }
    lanes[lid] = acc;
    for (var half = WG / 2u; half > 0u; half = half / 2u) {
        workgroupBarrier();
        if lid < half {
            lanes[lid] = combine(lanes[lid], lanes[lid + half]);
        }
    }
    if lid == 0u {
        var norm = lanes[0];
        if !NORM_INF {
            norm = sqrt(norm);
        }
        clip.total_norm = norm;
        let coefficient = clip.max_norm / (norm + CLIP_EPS);
        clip.coefficient = select(min(coefficient, 1.0), coefficient, nan_f32(coefficient));
        publish(clip.coefficient);
    }
}
