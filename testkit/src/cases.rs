//! Deterministic test data and the algorithm variants the tests sweep: shared by the
//! library's integration tests and the Burn crate's, so both check the same cases.

/// SplitMix64: deterministic, dependency-free test data. A clone draws the same values.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
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

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }

    /// `len` values in [-scale, scale), exactly representable in f32.
    pub fn vec(&mut self, len: usize, scale: f64) -> Vec<f64> {
        (0..len).map(|_| f64::from((self.uniform() * scale) as f32)).collect()
    }

    /// `len` values in [0, scale), exactly representable in f32 (second moments).
    pub fn positive(&mut self, len: usize, scale: f64) -> Vec<f64> {
        (0..len).map(|_| f64::from((self.uniform().abs() * scale) as f32)).collect()
    }
}

/// Every combination of amsgrad, maximize and weight-decay mode (none, L2, decoupled,
/// decoupled with a zero coefficient), and two with beta1 below 0.5 (ATen's other lerp).
///
/// Weight decays in these lists are powers of two: then `g + wd * p` is exact in f32 before
/// its one rounding, so where it cancels (|g + wd p| ~ 1e-8 happens among millions of random
/// elements) f32 and the f64 oracle still agree. With wd = 0.05 the product's own rounding
/// would dominate such a cancelled sum and the two would differ by design, not by a bug.
pub fn adam_switch_combinations() -> Vec<wgpu_optim::Algorithm> {
    use wgpu_optim::Adam;
    let mut configs = Vec::new();
    for amsgrad in [false, true] {
        for maximize in [false, true] {
            for (weight_decay, decoupled_weight_decay) in
                [(0.0, false), (0.0625, false), (0.0, true), (0.0625, true)]
            {
                let adam = Adam {
                    lr: 1e-2,
                    amsgrad,
                    maximize,
                    weight_decay,
                    decoupled_weight_decay,
                    ..Adam::default()
                };
                configs.push(adam.into());
            }
        }
    }
    // beta1 below 0.5: ATen's lerp from the gradient (`FirstMoment::LerpFromGrad`).
    configs.push(Adam { lr: 1e-2, beta1: 0.3, ..Adam::default() }.into());
    configs.push(Adam { lr: 1e-2, beta1: 0.3, amsgrad: true, weight_decay: 0.0625, ..Adam::adamw() }.into());
    configs
}

/// SGD: plain, momentum, dampening, Nesterov, and maximize with weight decay.
pub fn sgd_variants() -> Vec<wgpu_optim::Algorithm> {
    use wgpu_optim::Sgd;
    let base = Sgd { lr: 0.01, ..Sgd::default() };
    vec![
        base.into(),
        Sgd { momentum: 0.9, ..base }.into(),
        Sgd { momentum: 0.9, dampening: 0.5, ..base }.into(),
        Sgd { momentum: 0.9, nesterov: true, ..base }.into(),
        Sgd { momentum: 0.8, nesterov: true, weight_decay: 0.015625, maximize: true, ..base }.into(),
        Sgd { momentum: 0.9, weight_decay: 0.125, maximize: true, ..base }.into(),
        Sgd { weight_decay: 0.125, maximize: true, ..base }.into(),
    ]
}

/// Adagrad: defaults, lr_decay with weight decay, and an initial accumulator with maximize.
pub fn adagrad_variants() -> Vec<wgpu_optim::Algorithm> {
    use wgpu_optim::Adagrad;
    vec![
        Adagrad::default().into(),
        Adagrad { lr_decay: 0.1, weight_decay: 0.015625, ..Adagrad::default() }.into(),
        Adagrad { initial_accumulator_value: 0.1, eps: 1e-6, maximize: true, ..Adagrad::default() }.into(),
    ]
}

/// RMSprop: PyTorch's defaults, centered with momentum, and maximize with weight decay.
pub fn rmsprop_variants() -> Vec<wgpu_optim::Algorithm> {
    use wgpu_optim::RmsProp;
    vec![
        RmsProp::default().into(),
        RmsProp { centered: true, momentum: 0.9, ..RmsProp::default() }.into(),
        RmsProp { alpha: 0.9, weight_decay: 0.015625, maximize: true, ..RmsProp::default() }.into(),
    ]
}
