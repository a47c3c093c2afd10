//! Adafactor's pieces on a GPU rank, stepped on the host ([`ShardedAdafactor`]): read back
//! in one copy, widened to f32, stepped with their gradients from the reduced shard (which
//! is on the host already), and written back rounded to their dtype. The host buffers are
//! kept from step to step, and the bytes written back serve the step's all-gather, which
//! then reads back only the other pieces.

use super::{view, widen_bytes};
use crate::family::adafactor::shard::{PieceStep, ShardedAdafactor};
use crate::shard::plan::ShardPlan;
use crate::shard::{Communicator, ReduceOp};
use crate::{DType, GpuContext, Result, Tensor};

/// Adafactor's sharded step over this rank's pieces of its tensors, with their host buffers.
#[derive(Debug)]
pub(super) struct AdafactorPieces {
    pub step: ShardedAdafactor,
    /// Each Adafactor tensor's piece here (in `ShardedAdafactor::indices` order): its index
    /// in `ShardPlan::mine` and its view.
    views: Vec<Option<(usize, Tensor)>>,
    /// Each piece's values in f32.
    wide: Vec<Vec<f32>>,
    /// Each piece's bytes as the last step wrote them back.
    bytes: Vec<Vec<u8>>,
}

impl AdafactorPieces {
    /// `step`'s pieces of `params` on this rank of `plan`.
    pub(super) fn new(step: ShardedAdafactor, plan: &ShardPlan, params: &[Tensor]) -> Self {
        let mine = plan.mine();
        let views: Vec<Option<(usize, Tensor)>> = step
            .indices()
            .map(|i| {
                let j = mine.iter().position(|p| p.tensor == i)?;
                Some((j, view(&params[i], &mine[j])))
            })
            .collect();
        let count = views.len();
        AdafactorPieces { step, views, wide: vec![Vec::new(); count], bytes: vec![Vec::new(); count] }
    }

    /// Step `t` of the pieces, with the gradients of this rank's reduced `shard`. Every rank
    /// calls it (the step's all-reduces).
    pub(super) fn run<C: Communicator>(
        &mut self,
        ctx: &GpuContext,
        plan: &ShardPlan,
        comm: &C,
        t: u64,
        shard: &[f32],
    ) -> Result<()> {
        let here: Vec<Tensor> = self.views.iter().flatten().map(|(_, v)| v.clone()).collect();
        let mut read = match here.is_empty() {
            true => Vec::new(),
            false => ctx.read_bytes_many(&here)?,
        }
        .into_iter();
        for (wide, v) in self.wide.iter_mut().zip(&self.views) {
            if let (Some((_, view)), Some(bytes)) = (v, v.as_ref().and_then(|_| read.next())) {
                wide.resize(view.len as usize, 0.0);
                widen_bytes(view.dtype, &bytes, 0..view.len as usize, wide);
            }
        }
        let mine = plan.mine();
        let mut steps: Vec<PieceStep<'_>> = self
            .wide
            .iter_mut()
            .zip(&self.views)
            .map(|(values, v)| {
                let (j, _) = v.as_ref()?;
                let (at, len) = (mine[*j].at as usize, values.len());
                Some((&mut values[..], &shard[at..at + len]))
            })
            .collect();
        let mut all_reduce = |values: &mut [f64]| comm.all_reduce_f64(values, ReduceOp::Sum);
        self.step.step(t, &mut steps, &mut all_reduce)?;
        drop(steps);
        for ((values, bytes), v) in self.wide.iter().zip(&mut self.bytes).zip(&self.views) {
            if let Some((_, view)) = v {
                narrow_into(view.dtype, values, bytes);
                ctx.write_bytes(view, bytes)?;
            }
        }
        Ok(())
    }

    /// The bytes the last step wrote into this rank's piece `j` (of `ShardPlan::mine`),
    /// where it is Adafactor's.
    pub(super) fn written(&self, j: usize) -> Option<&[u8]> {
        let k = self.views.iter().position(|v| v.as_ref().is_some_and(|(at, _)| *at == j))?;
        Some(&self.bytes[k])
    }
}

/// f32 `values` rounded to `dtype`, as its bytes, into `out`.
fn narrow_into(dtype: DType, values: &[f32], out: &mut Vec<u8>) {
    out.clear();
    match dtype {
        DType::F16 => out.extend(values.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes())),
        DType::BF16 => out.extend(values.iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())),
        _ => out.extend_from_slice(bytemuck::cast_slice(values)),
    }
}
