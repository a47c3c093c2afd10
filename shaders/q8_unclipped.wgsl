// An 8-bit step without clipping: the gradient as stored. Provides clip(g) and load_clip()
// for shaders/q8.wgsl (shaders/q8_clip.wgsl is the clipped form).

fn load_clip() {}

fn clip(g: R) -> R {
    return g;
}
