//! PyTorch's `torch.optim.RMSprop` (`_single_tensor_rmsprop`), in f64.

/// `torch.optim.RMSprop`'s hyperparameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RmsProp {
    /// `lr`.
    pub lr: f64,
    /// `alpha`: the old `square_avg`'s weight.
    pub alpha: f64,
    /// `eps`: added to the root.
    pub eps: f64,
    /// `weight_decay`: L2, added to the gradient.
    pub weight_decay: f64,
    /// `momentum` (0: no `momentum_buffer`).
    pub momentum: f64,
    /// `centered`: subtract the squared `grad_avg` under the root.
    pub centered: bool,
    /// `maximize`: ascend the gradient.
    pub maximize: bool,
}

/// PyTorch's RMSprop state for one parameter. PyTorch creates every tensor as zeros on the
/// first step; `momentum_buffer` only when `momentum > 0`, `grad_avg` only when `centered`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TorchRmsPropState {
    /// `square_avg`.
    pub square_avg: Vec<f64>,
    /// `momentum_buffer` (empty without momentum).
    pub momentum_buffer: Vec<f64>,
    /// `grad_avg` (empty unless centered).
    pub grad_avg: Vec<f64>,
}

impl TorchRmsPropState {
    /// Zero state for `len` elements, as PyTorch creates it.
    pub fn zeros(config: &RmsProp, len: usize) -> Self {
        TorchRmsPropState {
            square_avg: vec![0.0; len],
            momentum_buffer: if config.momentum > 0.0 { vec![0.0; len] } else { Vec::new() },
            grad_avg: if config.centered { vec![0.0; len] } else { Vec::new() },
        }
    }

    /// The tensors PyTorch keeps, in its `state_dict` order: `square_avg`,
    /// `momentum_buffer`, `grad_avg`.
    pub fn tensors(&self, config: &RmsProp) -> Vec<Vec<f64>> {
        let mut t = vec![self.square_avg.clone()];
        if config.momentum > 0.0 {
            t.push(self.momentum_buffer.clone());
        }
        if config.centered {
            t.push(self.grad_avg.clone());
        }
        t
    }

    /// State holding `tensors` in the order of [`Self::tensors`].
    pub fn from_tensors(config: &RmsProp, tensors: &[Vec<f64>]) -> Self {
        let len = tensors.first().map_or(0, Vec::len);
        let mut state = TorchRmsPropState::zeros(config, len);
        let mut values = tensors.iter().cloned();
        state.square_avg = values.next().unwrap_or_default();
        if config.momentum > 0.0 {
            state.momentum_buffer = values.next().unwrap_or_default();
        }
        if config.centered {
            state.grad_avg = values.next().unwrap_or_default();
        }
        state
    }

    /// Every tensor kept, for rounding to a storage dtype.
    pub fn tensors_mut(&mut self) -> [&mut Vec<f64>; 3] {
        [&mut self.square_avg, &mut self.momentum_buffer, &mut self.grad_avg]
    }
}

/// One step of `torch.optim.RMSprop`'s single-tensor path.
pub fn torch_rmsprop_step(config: &RmsProp, param: &mut [f64], grad: &[f64], state: &mut TorchRmsPropState) {
    let alpha = config.alpha;
    for i in 0..param.len() {
        // grad = grad if not maximize else -grad
        let mut grad = if config.maximize { -grad[i] } else { grad[i] };
        if config.weight_decay != 0.0 {
            // grad = grad.add(param, alpha=weight_decay)
            grad += config.weight_decay * param[i];
        }
        // square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
        state.square_avg[i] = state.square_avg[i] * alpha + (1.0 - alpha) * grad * grad;
        let mut avg = if config.centered {
            // grad_avg.lerp_(grad, 1 - alpha), in the form ATen's lerp takes for the weight.
            let (a, weight) = (state.grad_avg[i], 1.0 - alpha);
            state.grad_avg[i] =
                if weight.abs() < 0.5 { a + weight * (grad - a) } else { grad - (grad - a) * (1.0 - weight) };
            // square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_()
            (state.square_avg[i] - state.grad_avg[i] * state.grad_avg[i]).sqrt()
        } else {
            // square_avg.sqrt()
            state.square_avg[i].sqrt()
        };
        // avg = avg.add_(eps)
        avg += config.eps;
        if config.momentum > 0.0 {
            // buf.mul_(momentum).addcdiv_(grad, avg); param.add_(buf, alpha=-lr)
            let buf = &mut state.momentum_buffer[i];
            *buf = *buf * config.momentum + grad / avg;
            param[i] += -config.lr * *buf;
        } else {
            // param.addcdiv_(grad, avg, value=-lr)
            param[i] += -config.lr * (grad / avg);
        }
    }
}
