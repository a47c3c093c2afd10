//! Blockwise 4-bit state on the GPU ([`crate::q4`]), kept and dispatched by the engine
//! 8-bit state shares ([`crate::gpu::blockwise`]): per state, its codes, eight to a word,
//! then one scale per block, or f32 values for a tensor that keeps f32 state.
//!
//! What is 4-bit's own: the block is the configuration's (128 by default, not 256), a word
//! holds eight codes (not four), a block's scale is at least 1e-12 (not 1 for a zero block),
//! codes are found by torchao's search over 16 entries (no code tables), f32 state runs
//! 8-bit's f32 entry point over blocks of [`shader::F32_BLOCK`], and only Adam runs.

mod shader;
#[cfg(test)]
mod tests;

use std::sync::Arc;

pub(crate) use crate::gpu::blockwise::Variant;
use crate::gpu::blockwise::{Engine, Format, Stored};
use crate::gpu::compile::CachedPipeline;
use crate::gpu::pipeline::PipelineKey;
use crate::gpu::GpuContext;
use crate::q4::{check_replacement, Q4State, Q4States};
use crate::step::KernelStep;
use crate::{Algorithm, Result, Tensor};

/// 4-bit state: eight codes to a word, blocks of the configuration's size.
#[derive(Debug)]
pub(crate) struct Q4 {
    config: Q4States,
}

impl Format for Q4 {
    const NAME: &'static str = "4-bit";
    const OPTION: &'static str = "4-bit state_storage";
    const CODES_PER_WORD: u64 = shader::CODES_PER_WORD as u64;
    const F32_TOO_LARGE: &'static str = "f32 state is kept in one binding: lower min_size, or make it a \
                                         whole number of blocks, so that it keeps 4-bit state";

    fn block_size(&self) -> u64 {
        self.config.block_size as u64
    }

    /// torchao's form of the step (Adam's L2 term at a coefficient of 0 too).
    fn kernel_step(algorithm: &Algorithm, t: u64) -> KernelStep {
        crate::q4::kernel_step(algorithm, t)
    }

    /// Whole blocks only (`len` then fills whole words), from `min_size` on.
    fn quantizes(&self, len: u64) -> bool {
        self.config.quantizes(len)
    }

    /// Whole blocks of both kinds: 4-bit's, and f32's of [`shader::F32_BLOCK`].
    fn piece_unit(&self) -> u64 {
        self.block_size().max(u64::from(shader::F32_BLOCK))
    }

    /// f32 states: blocks of [`shader::F32_BLOCK`], a workgroup each. 4-bit states (whole
    /// blocks): an invocation owns a block where serial, a workgroup
    /// [`shader::blocks_per_group`] blocks otherwise.
    fn blocks(&self, variant: &Variant, n: u64) -> (u64, u64) {
        if !variant.quantized {
            let blocks = n.div_ceil(u64::from(shader::F32_BLOCK));
            return (blocks, blocks);
        }
        let block = self.block_size();
        let per_owner =
            if variant.serial { shader::WORKGROUP } else { shader::blocks_per_group(block as u32) };
        (n / block, (n / block).div_ceil(u64::from(per_owner)))
    }

    fn pipeline(ctx: &GpuContext, variant: &Variant) -> Result<Arc<CachedPipeline>> {
        ctx.inner.pipelines.get_or_compile(PipelineKey::Q4(variant.clone()), || compile(ctx, variant))
    }

    type State = Q4State;
    const STATE_ARGUMENT: &'static str = "q4 state";

    /// The codes' bytes are torchao's packed codes as they lie in the words.
    fn to_state(stored: Stored<Vec<u8>, Vec<f32>>) -> Q4State {
        match stored {
            Stored::Codes { codes, scale } => Q4State::Q4 { codes, scale },
            Stored::F32(values) => Q4State::F32(values),
        }
    }

    fn check_replacement<'a>(
        &self,
        state: &'a Q4State,
        len: usize,
        argument: &str,
    ) -> Result<Stored<&'a [u8], &'a [f32]>> {
        check_replacement(state, self.config, len, argument)?;
        Ok(match state {
            Q4State::Q4 { codes, scale } => Stored::Codes { codes, scale },
            Q4State::F32(values) => Stored::F32(values),
        })
    }
}

/// The 4-bit state of an optimizer and the dispatches that update it.
pub(crate) type Q4Engine = Engine<Q4>;

impl Engine<Q4> {
    /// Zeroed state (torchao's: codes 0 under scale 0) for `params`, parameter i in group
    /// `groups[i]` run by `algorithms[g]` (checked by [`crate::q4::check_options`]).
    pub(crate) fn new(
        ctx: &GpuContext,
        config: Q4States,
        params: &[Tensor],
        groups: &[usize],
        algorithms: &[Algorithm],
        clip: bool,
    ) -> Result<Self> {
        Engine::with_format(ctx, Q4 { config }, params, groups, algorithms, clip)
    }

    /// The 4-bit settings.
    #[cfg_attr(not(feature = "checkpoint"), allow(dead_code))]
    pub(crate) fn config(&self) -> Q4States {
        self.format.config
    }
}

/// The pipeline of `variant`; the context's registry (`gpu::pipeline`) calls this once per
/// variant.
pub(crate) fn compile(ctx: &GpuContext, variant: &Variant) -> Result<CachedPipeline> {
    crate::gpu::blockwise::compile(ctx, "4-bit", variant, &shader::compose(variant), false)
}
