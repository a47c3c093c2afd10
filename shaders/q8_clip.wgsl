// Global clipping in an 8-bit step: each gradient scaled by the clip buffer's coefficient
// as it is loaded.
//
// The generated prelude declares `struct ClipHeader` (src/step/clip.rs) and its binding,
// `clip_state`. This file provides clip(g) and load_clip(), which shaders/q8.wgsl calls.

// A private copy, read once by load_scalars (as `hp`).
var<private> clip_coefficient: f32;

fn load_clip() {
    clip_coefficient = clip_state.coefficient;
}

fn clip(g: R) -> R {
    return g * clip_coefficient;
}
