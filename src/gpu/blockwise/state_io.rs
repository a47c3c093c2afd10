//! Reading back and replacing a parameter's low-bit state, chunk by chunk.

use super::{state_words, Engine, Format, Stored, TensorState};
use crate::gpu::GpuContext;
use crate::{DType, Error, Result, StateKind, Tensor};

/// One chunk of one state to read back: its codes (or values) and scales as one tensor, the
/// byte where the scales start in it, and the chunk's elements.
struct Readback {
    both: Tensor,
    split: usize,
    len: usize,
}

impl<F: Format> Engine<F> {
    /// State `kind` of parameter `i` as a tensor, where it is f32.
    pub(crate) fn f32_state(&self, i: usize, kind: StateKind) -> Option<Tensor> {
        let tensor = self.tensors.get(i)?;
        let k = tensor.kinds.iter().position(|s| *s == kind)?;
        // f32 state is one chunk.
        let chunk = tensor.chunks.first().filter(|_| !tensor.quantized)?;
        Some(Tensor::new(&chunk.buffer, 4 * chunk.placements[k].values, tensor.len, DType::F32))
    }

    /// The words of state `k` of parameter `i`, chunk by chunk: its codes (or values), and
    /// its scales.
    fn views(&self, i: usize, k: usize) -> impl Iterator<Item = (Tensor, Tensor)> + '_ {
        let tensor = &self.tensors[i];
        tensor.chunks.iter().map(move |chunk| {
            let placement = chunk.placements[k];
            let (value_words, scale_words) = state_words(&self.format, chunk.len, tensor.quantized);
            let values = Tensor::new(&chunk.buffer, 4 * placement.values, value_words, DType::F32);
            (values, Tensor::new(&chunk.buffer, 4 * placement.scale, scale_words, DType::F32))
        })
    }

    /// Parameter `i`'s state of `kind`, read back (waits for the queue); `None` where there
    /// is no such state.
    pub(crate) fn read(&self, ctx: &GpuContext, i: usize, kind: StateKind) -> Result<Option<F::State>> {
        let Some(views) = self.readback_views(i, kind) else { return Ok(None) };
        let mut parts = Vec::with_capacity(views.len());
        for view in &views {
            parts.push(ctx.read_bytes(&view.both)?);
        }
        Ok(Some(F::to_state(self.decode(i, &views, &parts))))
    }

    /// [`Self::read`] without blocking (a browser's main thread).
    pub(crate) async fn read_async(
        &self,
        ctx: &GpuContext,
        i: usize,
        kind: StateKind,
    ) -> Result<Option<F::State>> {
        let Some(views) = self.readback_views(i, kind) else { return Ok(None) };
        let mut parts = Vec::with_capacity(views.len());
        for view in &views {
            parts.push(ctx.read_bytes_async(&view.both).await?);
        }
        Ok(Some(F::to_state(self.decode(i, &views, &parts))))
    }

    /// Parameter `i`'s state of `kind`, one readback per chunk; `None` where there is no
    /// such state.
    fn readback_views(&self, i: usize, kind: StateKind) -> Option<Vec<Readback>> {
        let tensor = self.tensors.get(i)?;
        let k = tensor.kinds.iter().position(|s| *s == kind)?;
        let views = self.views(i, k).zip(&tensor.chunks).map(|((values, scale), chunk)| {
            // A state's scale words follow its codes: one readback takes both.
            debug_assert_eq!(scale.offset, values.offset + 4 * values.len);
            let both = Tensor::new(&values.buffer, values.offset, values.len + scale.len, DType::F32);
            Readback { both, split: 4 * values.len as usize, len: chunk.len as usize }
        });
        Some(views.collect())
    }

    /// Parameter `i`'s state from the bytes of its [`Self::readback_views`], chunk by chunk:
    /// the codes' bytes are the packed codes as they lie in the words.
    fn decode(&self, i: usize, views: &[Readback], parts: &[Vec<u8>]) -> Stored<Vec<u8>, Vec<f32>> {
        let tensor = &self.tensors[i];
        let code_bytes = |len: usize| len * 4 / F::CODES_PER_WORD as usize;
        let mut codes = Vec::with_capacity(code_bytes(tensor.len as usize));
        let mut scale: Vec<f32> = Vec::with_capacity(tensor.len.div_ceil(self.format.block_size()) as usize);
        for (view, bytes) in views.iter().zip(parts) {
            let (value_bytes, scale_bytes) = bytes.split_at(view.split);
            if !tensor.quantized {
                // f32 state is one chunk.
                return Stored::F32(bytemuck::pod_collect_to_vec(value_bytes));
            }
            codes.extend_from_slice(&value_bytes[..code_bytes(view.len)]);
            scale.extend(bytemuck::pod_collect_to_vec::<u8, f32>(scale_bytes));
        }
        Stored::Codes { codes, scale }
    }

    /// Parameter `i` and the index of its state of `kind`: refused where the optimizer has
    /// no such parameter or state.
    fn position(&self, i: usize, kind: StateKind) -> Result<(&TensorState, usize)> {
        let count = self.tensors.len();
        let tensor = self.tensors.get(i).ok_or_else(|| Error::BadRange {
            argument: format!("index {i}"),
            problem: format!("the optimizer has {count} parameters (indices from 0)"),
        })?;
        let k = tensor.kinds.iter().position(|s| *s == kind).ok_or_else(|| Error::StateMismatch {
            argument: format!("state kind {kind:?}"),
            got: vec![kind],
            expected: tensor.kinds.clone(),
        })?;
        Ok((tensor, k))
    }

    /// Replaces parameter `i`'s state of `kind` (queued: lands before the next submitted
    /// step). Refused, with nothing written, where `state` is not stored as this tensor's is
    /// or has the wrong length.
    pub(crate) fn write(&self, ctx: &GpuContext, i: usize, kind: StateKind, state: &F::State) -> Result<()> {
        let (tensor, k) = self.position(i, kind)?;
        let argument = format!("{} {i} {kind:?}", F::STATE_ARGUMENT);
        let state = self.format.check_replacement(state, tensor.len as usize, &argument)?;
        let block = self.format.block_size() as usize;
        let code_bytes = |element: usize| element * 4 / F::CODES_PER_WORD as usize;
        for ((values, scale_view), chunk) in self.views(i, k).zip(&tensor.chunks) {
            let (start, end) = (chunk.start as usize, (chunk.start + chunk.len) as usize);
            match state {
                Stored::F32(v) => ctx.write_bytes(&values, bytemuck::cast_slice(&v[start..end]))?,
                Stored::Codes { codes, scale } => {
                    let codes = &codes[code_bytes(start)..code_bytes(end)];
                    // A chunk's last word may hold fewer codes than it has room for.
                    if codes.len() == 4 * values.len as usize {
                        ctx.write_bytes(&values, codes)?;
                    } else {
                        let mut words = codes.to_vec();
                        words.resize(4 * values.len as usize, 0);
                        ctx.write_bytes(&values, &words)?;
                    }
                    let first = start / block;
                    let scale = &scale[first..first + scale_view.len as usize];
                    if !scale.is_empty() {
                        ctx.write_bytes(&scale_view, bytemuck::cast_slice(scale))?;
                    }
                }
            }
        }
        Ok(())
    }
}
