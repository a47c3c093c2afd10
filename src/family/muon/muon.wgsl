// Muon (torch.optim.Muon): its two elementwise passes, one element at a time. The matrix
// work between them (Newton-Schulz) is shaders/matmul.wgsl and src/family/muon/muon_normalize.wgsl,
// recorded by src/optimizer/muon.rs.
//
// MOMENTUM_PASS (the parameter slot is bound to an f32 scratch tensor, never read):
//   b' = lerp(b, g, 1 - momentum)                            torch: buf.lerp_(grad, 1 - momentum)
//   u  = lerp(g, b', momentum) if NESTEROV else b'            written to the parameter slot
// The apply pass (the gradient slot is bound to O, the orthogonalized u scaled by the
// shape's learning-rate ratio and transposed back to the parameter's layout):
//   p' = p * decay - lr * o                                  decay = 1 - lr * weight_decay
// torch's lerp(start, end, w) is start + w (end - start) for w < 0.5, else
// end - (end - start) (1 - w); both forms are kept so the CPU and the oracle round alike.
// The prelude declares `struct Hyper` from the step contract (src/family/muon/contract.rs).

fn torch_lerp(start: R, end: R, w: S) -> R {
    if (w < S(0.5)) {
        return start + w * (end - start);
    }
    return end - (end - start) * (S(1) - w);
}

fn update(i: u32) {
    if (MOMENTUM_PASS) {
        let g = load_grad(i);
        let b = torch_lerp(load_momentum_buffer(i), g, hp.one_minus_momentum);
        store_momentum_buffer(i, b);
        var u = b;
        if (NESTEROV) {
            u = torch_lerp(g, b, hp.momentum);
        }
        store_param(i, u);
    } else {
        let p = load_param(i);
        let o = load_grad(i);
        // torch: param.mul_(1 - lr * weight_decay); param.add_(update, alpha=-adjusted_lr).
        let p_new = p * hp.decay - hp.lr * o;
        store_param(i, p_new);
        store_param_copy(i, p_new);
    }
}
