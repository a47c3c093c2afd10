//! Moving a parameter's state into the optimizer that steps it: from another optimizer
//! or from a loaded record.

use std::collections::BTreeMap;

use burn::module::ParamId;
use burn::tensor::TensorData;

use super::{lost, Home, ModuleStep};
use crate::record;
use wgpu_optim::{Algorithm, Error, Optimizer, Result, StateKind, StateView};

impl ModuleStep {
    /// Brings each of `ids`' state into `target` (whose parameter `i` is `ids[i]`; `key`
    /// where it is one of `self.bounds`) from where it is: another optimizer (copied in
    /// `encoder`) or a loaded record (written through the queue). A parameter never stepped
    /// keeps the fresh state `target` was built with.
    pub(super) fn bring_in(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        target: &Optimizer,
        key: Option<u64>,
        ids: &[ParamId],
    ) -> Result<()> {
        for (i, id) in ids.iter().enumerate() {
            match self.params.get(id).map(|e| &e.home) {
                None => {}
                Some(Home::Bound(home)) if Some(*home) == key => {}
                Some(Home::Bound(home)) => {
                    let source = self.bound(*home)?;
                    let j = source.ids.iter().position(|p| p == id).ok_or_else(|| lost(*id))?;
                    let q8 = self.options.state_storage.q8().is_some();
                    copy_state(&source.optimizer, j, target, i, encoder, q8)?;
                    if self.options.state_storage.q4().is_some() {
                        crate::q4::copy(&self.algorithm, &source.optimizer, j, target, i)?;
                    }
                }
                Some(Home::Loaded(state)) => self.write_loaded(target, i, *id, &state.tensors)?,
            }
        }
        Ok(())
    }

    /// A loaded record's state tensors into `target`'s parameter `i`, each converted to the
    /// state's dtype (bit for bit where they are the same).
    fn write_loaded(
        &self,
        target: &Optimizer,
        i: usize,
        id: ParamId,
        tensors: &BTreeMap<String, TensorData>,
    ) -> Result<()> {
        if self.options.state_storage.q4().is_some() {
            return crate::q4::write_loaded(&self.algorithm, target, i, id.val(), tensors);
        }
        let ctx = self.shared.context();
        for (name, data) in tensors {
            let kind = record::state_kind(name).ok_or_else(|| lost(id))?;
            let tensor = target.tensor_state(i, kind).ok_or_else(|| lost(id))?;
            if data.num_elements() as u64 != tensor.len {
                return Err(Error::LengthMismatch {
                    argument: format!("the loaded {name} of parameter {id}"),
                    got: data.num_elements() as u64,
                    expected: tensor.len,
                    reference: format!("parameter {id}"),
                });
            }
            let dtype = record::dtype_of(data)?;
            if dtype == tensor.dtype {
                ctx.write_bytes(tensor, data.as_bytes())?;
            } else {
                ctx.write(tensor, &data.iter::<f64>().collect::<Vec<f64>>())?;
            }
        }
        Ok(())
    }
}

/// Copies parameter `j`'s state in `from` into parameter `i`'s in `to` (the same parameter,
/// another optimizer or buffer).
fn copy_state(
    from: &Optimizer,
    j: usize,
    to: &Optimizer,
    i: usize,
    encoder: &mut wgpu::CommandEncoder,
    q8: bool,
) -> Result<()> {
    // 8-bit state is its algorithm's (never Adafactor's nor the Kahan compensation).
    let q8_kinds = if q8 { param_algorithm(from, j).map_or(&[][..], |a| a.state_kinds()) } else { &[] };
    for &kind in StateKind::ALL {
        match (from.tensor_state(j, kind), to.tensor_state(i, kind)) {
            (Some(src), Some(dst)) => encoder.copy_buffer_to_buffer(
                &src.buffer,
                src.offset,
                &dst.buffer,
                dst.offset,
                src.byte_len(),
            ),
            // 8-bit state has no tensor: it moves through the host.
            _ if q8_kinds.contains(&kind) => {
                if let Some(state) = from.state(j, kind)?.and_then(StateView::quantized) {
                    to.set_state(i, kind, &state)?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// The algorithm of `optimizer`'s parameter `j`: its group's.
fn param_algorithm(optimizer: &Optimizer, j: usize) -> Option<&Algorithm> {
    let mut first = 0;
    for g in 0..optimizer.group_count() {
        let len = optimizer.group_params(g)?.len();
        if j < first + len {
            return optimizer.group_algorithm(g);
        }
        first += len;
    }
    None
}
