//! Blockwise 8-bit state on the GPU ([`crate::q8`]), kept and dispatched by the engine
//! 4-bit state shares ([`crate::gpu::blockwise`]): per state, its codes, four to a word,
//! then one absmax per block, or f32 values below `min_8bit_size`.
//!
//! What is 8-bit's own: blocks of [`BLOCK_SIZE`] (the last may be partial), bitsandbytes'
//! dynamic maps found through code tables that every quantized variant binds, the kernel
//! [`shader::compose`] writes for every family 8-bit state runs, and [`StoredState`].

mod shader;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use wgpu::util::DeviceExt;

pub(crate) use crate::gpu::blockwise::Variant;
use crate::gpu::blockwise::{Engine, Format, Stored};
use crate::gpu::compile::CachedPipeline;
use crate::gpu::pipeline::PipelineKey;
use crate::gpu::GpuContext;
use crate::q8::{blocks, check_replacement, Q8States, StoredState, BLOCK_SIZE};
use crate::step::{KernelStep, Switches};
use crate::{Algorithm, Result, Tensor};
pub(crate) use shader::Requantize;

/// 8-bit state: four codes to a word, blocks of [`BLOCK_SIZE`], and the code tables.
#[derive(Debug)]
pub(crate) struct Q8 {
    config: Q8States,
    tables: wgpu::Buffer,
    /// How codes are found: by the adapter's kind, or as `WGPU_OPTIM_Q8_REQUANTIZE` says.
    requantize: Requantize,
}

impl Format for Q8 {
    const NAME: &'static str = "8-bit";
    const OPTION: &'static str = "8-bit state_storage";
    const CODES_PER_WORD: u64 = 4;
    const F32_TOO_LARGE: &'static str = "the f32 state of a tensor below min_8bit_size is kept in \
                                         one binding: lower min_8bit_size so that it keeps 8-bit state";

    fn block_size(&self) -> u64 {
        BLOCK_SIZE as u64
    }

    fn quantizes(&self, len: u64) -> bool {
        self.config.quantizes(len)
    }

    fn piece_unit(&self) -> u64 {
        BLOCK_SIZE as u64
    }

    /// Blocks of [`BLOCK_SIZE`] (the last may be partial) with either state; a workgroup
    /// owns one, or an invocation one where serial.
    fn blocks(&self, variant: &Variant, n: u64) -> (u64, u64) {
        let blocks = blocks(n as usize) as u64;
        let owners = if variant.serial { blocks.div_ceil(u64::from(shader::WORKGROUP)) } else { blocks };
        (blocks, owners)
    }

    fn pipeline(ctx: &GpuContext, variant: &Variant) -> Result<Arc<CachedPipeline>> {
        ctx.inner.pipelines.get_or_compile(PipelineKey::Q8(variant.clone()), || compile(ctx, variant))
    }

    type State = StoredState;
    const STATE_ARGUMENT: &'static str = "q8 state";

    fn to_state(stored: Stored<Vec<u8>, Vec<f32>>) -> StoredState {
        match stored {
            Stored::Codes { codes, scale } => StoredState::Q8 { codes, absmax: scale },
            Stored::F32(values) => StoredState::F32(values),
        }
    }

    fn check_replacement<'a>(
        &self,
        state: &'a StoredState,
        len: usize,
        argument: &str,
    ) -> Result<Stored<&'a [u8], &'a [f32]>> {
        check_replacement(state, self.config, len, argument)?;
        Ok(match state {
            StoredState::Q8 { codes, absmax } => Stored::Codes { codes, scale: absmax },
            StoredState::F32(values) => Stored::F32(values),
        })
    }

    fn code_tables(&self) -> Option<&wgpu::Buffer> {
        Some(&self.tables)
    }

    fn requantize(&self) -> Requantize {
        self.requantize
    }

    /// bitsandbytes' 8-bit kernels' form of the step.
    fn kernel_step(algorithm: &Algorithm, t: u64) -> KernelStep {
        crate::q8::kernel_step(algorithm, t)
    }

    /// Below `min_8bit_size`, bitsandbytes' 32-bit kernels' form.
    fn tensor_switches(switches: Switches, quantized: bool) -> Switches {
        if quantized {
            switches
        } else {
            crate::q8::f32_state_switches(switches)
        }
    }

    /// bitsandbytes' 2-state kernel (Adam, AdEMAMix).
    fn restarts_non_finite(switches: &Switches) -> bool {
        crate::q8::restarts_non_finite(switches)
    }
}

/// The 8-bit state of an optimizer and the dispatches that update it.
pub(crate) type Q8Engine = Engine<Q8>;

impl Engine<Q8> {
    /// Zeroed state for `params`, parameter i in group `groups[i]`, each group run by
    /// `algorithms[g]` (checked by [`crate::q8::check_options`]); with `clip`, kernels that
    /// scale the gradients by the clip coefficient.
    pub(crate) fn new(
        ctx: &GpuContext,
        config: Q8States,
        params: &[Tensor],
        groups: &[usize],
        algorithms: &[Algorithm],
        clip: bool,
    ) -> Result<Self> {
        let tables_words = shader::tables_words();
        let tables = ctx.catch("creating the 8-bit state", || {
            ctx.device().create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("wgpu-optim 8-bit code tables"),
                contents: bytemuck::cast_slice(&tables_words),
                usage: wgpu::BufferUsages::STORAGE,
            })
        })?;
        let requantize = Requantize::chosen(ctx.report().device_type);
        Engine::with_format(ctx, Q8 { config, tables, requantize }, params, groups, algorithms, clip)
    }

    /// Chooses how codes are found, whatever the adapter, so that tests cover both.
    #[cfg(test)]
    pub(crate) fn set_requantize(&mut self, requantize: Requantize) {
        self.format_mut().requantize = requantize;
    }

    /// The 8-bit settings (only checkpoints read them).
    #[cfg_attr(not(feature = "checkpoint"), allow(dead_code))]
    pub(crate) fn config(&self) -> Q8States {
        self.format.config
    }
}

/// The pipeline of `variant`; the context's registry (`gpu::pipeline`) calls this once per
/// variant.
pub(crate) fn compile(ctx: &GpuContext, variant: &Variant) -> Result<CachedPipeline> {
    crate::gpu::blockwise::compile(ctx, "8-bit", variant, &shader::compose(variant), variant.quantized)
}
