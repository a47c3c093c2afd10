//! What the areas share: the testkit's deterministic data, swept variants and comparator
//! (as the library's integration tests have them), the shared device, and a module of 1-D
//! parameters with Burn's tensors to and from f64.

use burn::module::{Module, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor, TensorData};
use wgpu_optim_burn::SharedDevice;
pub use wgpu_optim_testkit::cases::{
    adagrad_variants, adam_switch_combinations, rmsprop_variants, sgd_variants, Rng,
};
pub use wgpu_optim_testkit::compare::{assert_close, Tolerance};

pub fn shared() -> SharedDevice {
    SharedDevice::headless_blocking().unwrap_or_else(|e| panic!("Burn tests need an adapter: {e}"))
}

pub fn tensor(values: &[f64], device: &Device) -> Tensor<1> {
    let data: Vec<f32> = values.iter().map(|v| *v as f32).collect();
    Tensor::from_data(TensorData::new(data, [values.len()]), device)
}

pub fn values<const D: usize>(t: Tensor<D>) -> Vec<f64> {
    t.into_data()
        .try_to_vec::<f32>()
        .unwrap_or_else(|e| panic!("reading a Burn tensor: {e:?}"))
        .into_iter()
        .map(f64::from)
        .collect()
}

/// A module of 1-D parameters, so that tests choose every value.
#[derive(Module, Debug)]
pub struct Params {
    pub params: Vec<Param<Tensor<1>>>,
}

impl Params {
    pub fn new(values: &[Vec<f64>], device: &Device) -> Self {
        Params { params: values.iter().map(|v| Param::from_tensor(tensor(v, device))).collect() }
    }

    pub fn grads(&self, grads: &[Vec<f64>], device: &Device) -> GradientsParams {
        let mut out = GradientsParams::new();
        for (p, g) in self.params.iter().zip(grads) {
            out.register(p.id, tensor(g, device));
        }
        out
    }

    pub fn values(&self) -> Vec<Vec<f64>> {
        self.params.iter().map(|p| values(p.val())).collect()
    }
}
