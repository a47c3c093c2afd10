//! The memory a step writes (parameters, model copies, state), kept sorted so that each new
//! set of gradients is checked against it in O(n log n): a gradient is read in the same pass
//! as every other tensor is updated, so one that lies in another tensor's written range
//! would read values the step already updated (DirectML's aliasing rule).

use super::Optimizer;
use crate::gpu::plan::Arg;
use crate::{Error, Result, Tensor};

/// One tensor a step writes.
struct Written {
    arg: Arg,
    /// `Some(i)` for `params[i]`, which `grads[i]` may be exactly (each element is read
    /// before it is written); its partial overlaps are refused where the step is planned.
    param: Option<usize>,
}

/// Every range a step writes, sorted by buffer and offset. They are pairwise disjoint (the
/// parameters and model copies are checked when the optimizer is built, the state is the
/// optimizer's own), so their ends are sorted too.
#[derive(Default)]
pub(super) struct WrittenRanges(Vec<Written>);

impl WrittenRanges {
    /// The ranges `optimizer`'s steps write: its parameters (in master-weight mode the
    /// masters), model copies, and state tensors (Kahan compensations, Adafactor's states and
    /// the f32 states of small tensors with 8-bit state included; 8-bit states live in
    /// buffers no tensor names).
    pub(super) fn new(optimizer: &Optimizer) -> Self {
        let mut written = Vec::new();
        let mut push = |name: String, tensor: &Tensor, param: Option<usize>| {
            if tensor.len > 0 {
                written.push(Written { arg: Arg::new(name, tensor), param });
            }
        };
        for (i, p) in optimizer.params.iter().enumerate() {
            push(format!("params[{i}]"), p, Some(i));
        }
        for (i, c) in optimizer.model_copies.iter().enumerate() {
            push(format!("model_copies[{i}]"), c, None);
        }
        for group in &optimizer.groups {
            let kinds = optimizer.state_kinds(&group.algorithm);
            for i in group.first..group.first + group.len {
                for (kind, t) in kinds.iter().zip(&optimizer.state[i]) {
                    push(format!("{}[{i}]", kind.torch_name()), t, None);
                }
            }
        }
        // States the families' passes keep (Adafactor's) are not in `state`.
        for (i, kind, t) in optimizer.passes.iter().flat_map(|p| p.states()) {
            push(format!("{}[{i}]", kind.torch_name()), t, None);
        }
        written.sort_by(|a, b| {
            let (a, b) = (&a.arg.tensor, &b.arg.tensor);
            a.buffer.cmp(&b.buffer).then(a.offset.cmp(&b.offset))
        });
        WrittenRanges(written)
    }

    /// Refuses a gradient that shares a byte with a range the step writes, other than its
    /// own parameter ([`Error::OverlapsWritten`] naming both). `grads` holds one gradient
    /// per parameter.
    pub(super) fn check(&self, grads: &[Tensor]) -> Result<()> {
        for (i, grad) in grads.iter().enumerate().filter(|(_, g)| g.len > 0) {
            let start = grad.byte_range().start;
            // The first written range of the gradient's buffer that ends after it starts.
            let first = self.0.partition_point(|w| {
                let t = &w.arg.tensor;
                t.buffer < grad.buffer || (t.buffer == grad.buffer && t.byte_range().end <= start)
            });
            let hit = self.0[first..]
                .iter()
                .take_while(|w| w.arg.tensor.buffer == grad.buffer)
                .take_while(|w| w.arg.tensor.offset < grad.byte_range().end)
                .find(|w| w.param != Some(i));
            if let Some(w) = hit {
                return Err(Error::OverlapsWritten {
                    tensor: format!("grads[{i}]"),
                    written: w.arg.name.clone(),
                });
            }
        }
        Ok(())
    }
}
