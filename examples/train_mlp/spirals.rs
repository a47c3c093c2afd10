//! The three interleaved spirals of Stanford's CS231n ("Putting it together: minimal neural
//! network case study"), generated from a seed so a run needs no download and is repeatable.
//!
//! Class `k` has points at radius `r` evenly spaced in `[0, 1]` and angle
//! `t = linspace(4k, 4(k + 1)) + 0.2 N(0, 1)`, placed at `(r sin t, r cos t)`. A linear
//! classifier gets about half of them right; a small MLP can get nearly all.

/// Classes, each one spiral arm.
pub const CLASSES: usize = 3;

/// Points per class (CS231n uses 100; 200 makes the arms denser and the task a bit harder).
pub const POINTS_PER_CLASS: usize = 200;

/// Features per point: its x and y.
pub const FEATURES: usize = 2;

/// A labelled data set, stored as the GPU wants it: features row-major, labels as `u32`.
#[derive(Clone, Debug, PartialEq)]
pub struct Spirals {
    /// `len() * FEATURES` values: point `i` is `features[2 i..2 i + 2]`.
    pub features: Vec<f32>,
    /// The class of each point, in `0..CLASSES`.
    pub labels: Vec<u32>,
}

impl Spirals {
    /// The data set for `seed`: the same seed always gives the same points.
    pub fn generate(seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let n = CLASSES * POINTS_PER_CLASS;
        let mut features = Vec::with_capacity(n * FEATURES);
        let mut labels = Vec::with_capacity(n);
        for class in 0..CLASSES {
            let first_angle = 4.0 * class as f64;
            for i in 0..POINTS_PER_CLASS {
                let along = i as f64 / (POINTS_PER_CLASS - 1) as f64;
                let radius = along;
                let angle = first_angle + 4.0 * along + 0.2 * rng.normal();
                features.push((radius * angle.sin()) as f32);
                features.push((radius * angle.cos()) as f32);
                labels.push(class as u32);
            }
        }
        Spirals { features, labels }
    }

    /// Number of points.
    pub fn len(&self) -> usize {
        self.labels.len()
    }
}

/// SplitMix64: tiny, fast, and good enough for data and initial weights; a dependency
/// would add nothing but a version to keep in step.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator whose sequence depends only on `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `(0, 1]`: never 0, so its logarithm is finite.
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal, by Box-Muller (one of the pair is discarded: simpler, and speed
    /// does not matter for a few thousand draws).
    pub fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit(), self.unit());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}
