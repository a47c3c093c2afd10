//! Storage types around the f32 loops. f32 operands are updated where they lie; f16 and
//! bf16 operands pass through f32 scratch a block at a time, so the loops stay the same
//! and each element is still read once from memory and written once.

use std::cell::RefCell;

use half::slice::HalfFloatSliceExt;

use super::host::{HostSlice, HostSliceMut};
use super::kernels::{Kernel, Operands, MAX_STATE};

/// Elements per conversion block: the scratch of all five operands (20 KiB) stays in L1.
const BLOCK: usize = 1024;

/// A run of one tensor's elements with the same run of its gradient and state.
pub(super) struct Job<'a> {
    pub(super) param: HostSliceMut<'a>,
    pub(super) grad: HostSlice<'a>,
    /// In the kernels' slot order; slots the algorithm does not keep are empty.
    pub(super) state: [HostSliceMut<'a>; MAX_STATE],
}

impl<'a> Job<'a> {
    pub(super) fn is_empty(&self) -> bool {
        self.param.is_empty()
    }

    /// The first `mid` elements of every operand, and the rest.
    pub(super) fn split_at(self, mid: usize) -> (Self, Self) {
        let (param, param_rest) = self.param.split_at(mid);
        let (grad, grad_rest) = self.grad.split_at(mid);
        let [(s0, r0), (s1, r1), (s2, r2)] = self.state.map(|s| s.split_at(mid));
        (
            Job { param, grad, state: [s0, s1, s2] },
            Job { param: param_rest, grad: grad_rest, state: [r0, r1, r2] },
        )
    }

    /// The operands themselves when every one is stored as f32, otherwise the job back.
    fn into_f32(self) -> Result<Operands<'a>, Self> {
        use HostSliceMut::F32 as M;
        match (self.param, self.grad, self.state) {
            (M(param), HostSlice::F32(grad), [M(a), M(b), M(c)]) => {
                Ok(Operands { param, grad, state: [a, b, c] })
            }
            (param, grad, state) => Err(Job { param, grad, state }),
        }
    }
}

/// Updates every element of `job`.
pub(super) fn run(kernel: &Kernel, job: Job<'_>) {
    match job.into_f32() {
        Ok(operands) => kernel.run(operands),
        Err(job) => SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
            Ok(mut scratch) => scratch.run(kernel, job),
            // Unreachable (a job never starts another on its thread), but a fresh scratch
            // is a safe answer.
            Err(_) => Scratch::new().run(kernel, job),
        }),
    }
}

thread_local! {
    // One per worker, kept: zeroing a fresh 20 KiB per job costs about as much as
    // updating a hundred 16-bit elements, and models have many tensors of a few hundred
    // (biases, norms).
    static SCRATCH: RefCell<Box<Scratch>> = RefCell::new(Scratch::new());
}

/// f32 copies of one block of each operand.
struct Scratch {
    param: [f32; BLOCK],
    grad: [f32; BLOCK],
    state: [[f32; BLOCK]; MAX_STATE],
}

impl Scratch {
    fn new() -> Box<Self> {
        Box::new(Scratch { param: [0.0; BLOCK], grad: [0.0; BLOCK], state: [[0.0; BLOCK]; MAX_STATE] })
    }

    fn run(&mut self, kernel: &Kernel, job: Job<'_>) {
        let mut rest = job;
        while !rest.is_empty() {
            let (mut block, tail) = rest.split_at(BLOCK);
            let [s0, s1, s2] = &mut self.state;
            let [b0, b1, b2] = &mut block.state;
            kernel.run(Operands {
                param: load(&mut block.param, &mut self.param),
                grad: load_grad(block.grad, &mut self.grad),
                state: [load(b0, s0), load(b1, s1), load(b2, s2)],
            });
            store(&mut block.param, &self.param);
            for (slot, scratch) in block.state.iter_mut().zip(&self.state) {
                store(slot, scratch);
            }
            rest = tail;
        }
    }
}

/// The block as f32: itself, or widened into `scratch`.
fn load<'s>(values: &'s mut HostSliceMut<'_>, scratch: &'s mut [f32; BLOCK]) -> &'s mut [f32] {
    let n = values.len().min(BLOCK);
    match values {
        HostSliceMut::F32(v) => v,
        HostSliceMut::F16(v) => {
            v[..n].convert_to_f32_slice(&mut scratch[..n]);
            &mut scratch[..n]
        }
        HostSliceMut::BF16(v) => {
            bf16_to_f32(&v[..n], &mut scratch[..n]);
            &mut scratch[..n]
        }
    }
}

fn load_grad<'s>(values: HostSlice<'s>, scratch: &'s mut [f32; BLOCK]) -> &'s [f32] {
    let n = values.len().min(BLOCK);
    match values {
        HostSlice::F32(v) => v,
        HostSlice::F16(v) => {
            v[..n].convert_to_f32_slice(&mut scratch[..n]);
            &scratch[..n]
        }
        HostSlice::BF16(v) => {
            bf16_to_f32(&v[..n], &mut scratch[..n]);
            &scratch[..n]
        }
    }
}

/// Rounds the updated f32 block back into 16-bit storage (nearest even); an f32 operand
/// was updated in place.
fn store(values: &mut HostSliceMut<'_>, scratch: &[f32; BLOCK]) {
    let n = values.len().min(BLOCK);
    match values {
        HostSliceMut::F32(_) => {}
        HostSliceMut::F16(v) => v[..n].convert_from_f32_slice(&scratch[..n]),
        HostSliceMut::BF16(v) => f32_to_bf16(&scratch[..n], &mut v[..n]),
    }
}

/// bf16 is the top half of an f32, so widening is a shift. half's slice conversion for bf16
/// is a scalar loop; these are plain integer loops the compiler vectorizes.
fn bf16_to_f32(values: &[half::bf16], out: &mut [f32]) {
    for (o, v) in out.iter_mut().zip(values) {
        *o = f32::from_bits(u32::from(v.to_bits()) << 16);
    }
}

/// Rounds to nearest even as `shaders/convert.wgsl`'s `bf16_bits` does; NaN stays a quiet NaN.
fn f32_to_bf16(values: &[f32], out: &mut [half::bf16]) {
    for (o, v) in out.iter_mut().zip(values) {
        let b = v.to_bits();
        let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16;
        let nan = (b & 0x7fff_ffff) > 0x7f80_0000;
        *o = half::bf16::from_bits(if nan { ((b >> 16) | 0x40) as u16 } else { rounded as u16 });
    }
}
