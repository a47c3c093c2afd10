//! What every trajectory reads from its case before it runs: the parameters, each step's
//! gradients and the storage type, and the same inputs as the CPU backend's host tensors or
//! the GPU's buffers (a buffer per tensor in place, tensors packed at odd offsets out of
//! place).

#[cfg(feature = "cpu")]
use wgpu_optim::cpu::{CpuOptimizer, HostSlice, HostSliceMut, HostTensor};
use wgpu_optim::{DType, GpuContext, Result, Tensor};

use super::case::{Case, CaseTensor, ValueType};
use super::run::packed;

/// A trajectory's parameters and gradients, checked against each other.
pub(super) struct Inputs<'a> {
    /// `param.{i}`, the initial values.
    pub params: Vec<&'a CaseTensor>,
    /// `grad.{i}`: `steps` gradients of `param.{i}`, one after another.
    grads: Vec<&'a CaseTensor>,
    /// The parameters' storage type (`param.0`'s).
    pub dtype: DType,
}

impl<'a> Inputs<'a> {
    /// Reads `param.{i}` and `grad.{i}` for the case's `count` tensors; a gradient tensor
    /// that does not hold `steps` gradients of its parameter is refused.
    pub fn read(case: &'a Case) -> Result<Self> {
        let (n, steps) = (case.count, case.steps);
        let params: Vec<&CaseTensor> =
            (0..n).map(|i| case.tensor(&format!("param.{i}"))).collect::<Result<_>>()?;
        let grads: Vec<&CaseTensor> =
            (0..n).map(|i| case.tensor(&format!("grad.{i}"))).collect::<Result<_>>()?;
        let dtype = match case.tensor("param.0")?.dtype {
            ValueType::Float(d) => d,
            other => return Err(case.bad(format!("tensor `param.0` is {other:?}, expected a float tensor"))),
        };
        for (i, (p, g)) in params.iter().zip(&grads).enumerate() {
            if g.values.len() != steps * p.values.len() {
                return Err(case.bad(format!(
                    "grad.{i} has {} values, expected steps x param.{i} = {}",
                    g.values.len(),
                    steps * p.values.len()
                )));
            }
        }
        Ok(Inputs { params, grads, dtype })
    }

    /// Each parameter's shape.
    pub fn shapes(&self) -> Vec<Vec<usize>> {
        self.params.iter().map(|p| p.shape.clone()).collect()
    }

    /// Each parameter's initial values.
    pub fn initial(&self) -> Vec<Vec<f64>> {
        self.params.iter().map(|p| p.values.clone()).collect()
    }

    /// Parameter `i`'s gradient at step `k` (from 0).
    pub fn grad(&self, i: usize, k: usize) -> &'a [f64] {
        let len = self.params[i].values.len();
        &self.grads[i].values[k * len..(k + 1) * len]
    }

    /// The gradients of step `k` (from 0), one per parameter.
    pub fn grads_at(&self, k: usize) -> Vec<Vec<f64>> {
        (0..self.params.len()).map(|i| self.grad(i, k).to_vec()).collect()
    }

    /// The initial parameters as the CPU backend's host tensors.
    #[cfg(feature = "cpu")]
    pub fn host_params(&self) -> Result<Vec<HostTensor>> {
        self.params.iter().map(|p| HostTensor::from_f64(self.dtype, &p.values)).collect()
    }

    /// One step of `optimizer` over `params` with step `k`'s gradients.
    #[cfg(feature = "cpu")]
    pub fn cpu_step(&self, optimizer: &mut CpuOptimizer, params: &mut [HostTensor], k: usize) -> Result<()> {
        let grads: Vec<HostTensor> =
            self.grads_at(k).iter().map(|g| HostTensor::from_f64(self.dtype, g)).collect::<Result<_>>()?;
        let grad_views: Vec<HostSlice<'_>> = grads.iter().map(HostTensor::as_slice).collect();
        let mut param_views: Vec<HostSliceMut<'_>> =
            params.iter_mut().map(HostTensor::as_mut_slice).collect();
        optimizer.step(&mut param_views, &grad_views)
    }

    /// The initial parameters on the GPU and zeroed tensors for their gradients: a buffer
    /// each `in_place`, otherwise packed at odd offsets into one buffer each for the
    /// parameters and the gradients (the stateful optimizer's out-of-place check for
    /// algorithms without a stateless operator).
    pub async fn gpu_tensors(&self, ctx: &GpuContext, in_place: bool) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
        if in_place {
            let params: Vec<Tensor> = self
                .params
                .iter()
                .enumerate()
                .map(|(i, p)| ctx.upload(&format!("param.{i}"), &p.values, self.dtype))
                .collect();
            let grads = params.iter().map(|t| ctx.zeros("grad", t.len, self.dtype)).collect();
            return Ok((params, grads));
        }
        let lengths: Vec<u64> = self.params.iter().map(|p| p.values.len() as u64).collect();
        let params = packed(ctx, "params", &lengths, self.dtype);
        for (t, values) in params.iter().zip(&self.params) {
            ctx.write_async(t, &values.values).await?;
        }
        Ok((params, packed(ctx, "grads", &lengths, self.dtype)))
    }

    /// Writes step `k`'s gradients into `grads`.
    pub async fn write_grads(&self, ctx: &GpuContext, grads: &[Tensor], k: usize) -> Result<()> {
        for (t, g) in grads.iter().zip(self.grads_at(k)) {
            ctx.write_async(t, &g).await?;
        }
        Ok(())
    }
}
