// What every 8-bit-state step shares: the family's load_/store_ functions over four
// elements per invocation, and the private copies the entry points fill first.
//
// The generated prelude (src/gpu/q8/shader.rs) declares, before this file:
//   R, S                  vec4<f32> and f32: an invocation updates four elements at once.
//   BLOCK_SIZE            elements per block of 8-bit state (crate::q8::BLOCK_SIZE).
//   CODES_PER_WORD        codes per u32 word of state, and elements per invocation.
//   BLOCK_WORDS           words of codes per block: BLOCK_SIZE / CODES_PER_WORD.
//   WORKGROUP             invocations per workgroup (BLOCK_WORDS: one word each).
//   FAN_IN                the workgroup reduction's fan-in, FAN_IN * FAN_IN = WORKGROUP.
//   STATES, MAX_STATES    the variant's state count (0 to 4) and the most any has.
//   table                 the dispatch's table (src/gpu/kernel/table_layout.rs's table_head_wgsl, as
//                         for the multi-tensor kernels): a TableHead, then vec4<u32> rows.
//   entry_row(w)          the first row of the entry of workgroup w (a multiple of
//                         ENTRY_ROWS, the rows of one entry).
//   struct Segment,       a table entry (src/gpu/blockwise/layout.rs), and the one whose first
//   segment_at(r)         row is r, read from table.rows.
//   params, state         the parameters' and the state arena's bindings.
//   grad_at(j)            gradient j, from the gradients' binding or the parameters'.
//   clip(g), load_clip()  the gradient as the step sees it, and the clip coefficient's
//                         private copy (shaders/q8_clip.wgsl or q8_unclipped.wgsl).
//   RESTART_NON_FINITE    whether a non-finite gradient leaves its parameter as loaded and
//                         restarts its states from 0 (store_<state> stores 0 where
//                         `restart`, which this file sets).
//   is_nan, max_propagating_nan
//   load_<state>, store_<state>
//                         state k of the variant as old_states[k] and new_states[k];
//                         every other slot of the family reads 0 and stores nothing.
//   struct Hyper, hp_base the family's uniform and its binding; the override constants.
// The family's body (src/family/adam/adam.wgsl, momentum.wgsl) provides `update`.
//
// This file provides: the private `seg`, `first`, `live`, `old_states`, `new_states`,
// `hp`, `param_loaded`, `restart`; load_param, load_grad, store_param, store_param_copy;
// load_scalars.

// With RESTART_NON_FINITE (bitsandbytes' 2-state kernel): the four parameters as loaded, and
// the lanes whose gradient is NaN or infinite, whose parameter is stored as it was loaded
// and whose states restart from 0 (the prelude's store_<state> select them).
var<private> param_loaded: R;
var<private> restart: vec4<bool>;

// The invocation's segment, its first element within the segment, and which of its four
// elements exist.
var<private> seg: Segment;
var<private> first: u32;
var<private> live: vec4<bool>;

// State k's four values before the update, and after (`load_<state>`/`store_<state>`).
var<private> old_states: array<R, MAX_STATES>;
var<private> new_states: array<R, MAX_STATES>;

// A private copy, loaded first thing by every entry point: a CPU adapter's compiler
// cannot keep uniform values in registers across storage writes that might alias them.
var<private> hp: Hyper;

fn load_scalars() {
    hp = hp_base;
    load_clip();
}

// Lanes past the segment's end read its last element (so every load is in bounds and
// branch-free) and are never written.
fn load_param(i: u32) -> R {
    let at = seg.param + first;
    let last = seg.param + seg.n - 1u;
    param_loaded = vec4(params[min(at, last)], params[min(at + 1u, last)], params[min(at + 2u, last)], params[min(at + 3u, last)]);
    return param_loaded;
}

// With clipping the gradient as stored is scaled as it is loaded, as PyTorch scales the
// gradients in place before the step (the f32 kernels do the same).
fn load_grad(i: u32) -> R {
    let at = seg.grad + first;
    let last = seg.grad + seg.n - 1u;
    let g = vec4(grad_at(min(at, last)), grad_at(min(at + 1u, last)), grad_at(min(at + 2u, last)), grad_at(min(at + 3u, last)));
    // The gradient as stored is what bitsandbytes tests (before its `gnorm_scale`).
    restart = vec4(RESTART_NON_FINITE) & ((bitcast<vec4<u32>>(g) & vec4(0x7fffffffu)) >= vec4(0x7f800000u));
    return clip(g);
}

fn store_param(i: u32, p: R) {
    let v = select(p, param_loaded, restart);
    let at = seg.param + first;
    if live.x { params[at] = v.x; }
    if live.y { params[at + 1u] = v.y; }
    if live.z { params[at + 2u] = v.z; }
    if live.w { params[at + 3u] = v.w; }
}

// 8-bit state keeps f32 parameters only: there is no model copy.
fn store_param_copy(i: u32, v: R) {}

// The invocation's four elements from `first`.
fn set_first(element: u32) {
    first = element;
    live = (vec4(first) + vec4(0u, 1u, 2u, 3u)) < vec4(seg.n);
}
