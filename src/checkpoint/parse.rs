//! Reading a checkpoint file's header, metadata and tensor table.

use std::collections::{BTreeMap, HashMap};

use safetensors::SafeTensors;

use super::layout::{Q4_BLOCK_SIZE, Q4_MIN_SIZE};
use super::layout::{Q8_BLOCK_SIZE, Q8_MIN_8BIT_SIZE};
use super::{bad, checksum, JsonMap, READABLE_FORMATS};
use crate::q8::{Q8States, BLOCK_SIZE};
use crate::{Algorithm, Result, Rounding, ScheduleFreeMode};

/// A parsed checkpoint file of either backend, checked for internal consistency but not
/// yet against an optimizer. Parsing reads the header and tensor table defensively and
/// copies no tensor data, so arbitrary bytes cost at most the file's size. A trainer reads
/// one to rebuild the optimizer it came from (its groups, step and options) before loading:
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let bytes = std::fs::read("optimizer.safetensors")?;
/// let checkpoint = wgpu_optim::Checkpoint::parse(&bytes)?;
/// println!("step {}, {} groups", checkpoint.step, checkpoint.groups.len());
/// for (algorithm, params) in &checkpoint.groups {
///     println!("{algorithm:?} over parameters {params:?}");
/// }
/// # Ok(()) }
/// ```
///
/// # Saving and loading
///
/// - **Checkpoints** (`save`, `load`): safetensors under PyTorch's `state_dict` names
///   (`state.{i}.exp_avg`, `.exp_avg_sq`, `.max_exp_avg_sq`, `.momentum_buffer`, `.sum`,
///   `.step`), each tensor in its dtype, `param_groups` (every group's hyperparameters) in the
///   metadata, and in master-weight mode the f32 masters (`master.{i}`); not the model's
///   parameters, which the trainer saves. `load` replaces the state, the step count and every
///   group's hyperparameters (learning rate included). Written atomically (temporary file,
///   then rename); a mismatched, truncated or corrupt file, or a target buffer that cannot be
///   written, is refused with a typed error and leaves the optimizer as it was. Every tensor's
///   CRC-32 is in the metadata (`crc32`, format `wgpu-optim-checkpoint/2`) and checked on
///   load, so a flipped bit in the data is refused naming the tensor; files without checksums
///   (format 1, and files converted from PyTorch) still load. Save, load, continue is
///   bit-identical to an uninterrupted run. `Optimizer::save_to_bytes` documents the contents.
///   The CPU backend's `CpuOptimizer::save`/`load` write and read the same format: a checkpoint
///   saved on the GPU loads on the CPU and the other way round, and the bytes are a function
///   of the state (sorted metadata), so the same state saves to the same bytes on either
///   backend, every time.
/// - **Shapes** (`OptimizerBuilder::param_shapes`, for both backends): give each parameter's
///   shape (numbered across groups) and every state, master and Kahan compensation is saved in
///   it, as PyTorch's `state_dict` holds it; without it they are saved flat, `[len]`. `load`
///   takes a tensor flat or in the parameter's shape (any shape of its length when no shapes
///   were given); another shape is `Error::BadFile` naming the tensor, and a shape whose
///   elements do not multiply to its parameter's length is refused when the optimizer is built
///   (`Error::LengthMismatch` naming `param_shapes[i]`).
///
///   ```rust,no_run
///   use wgpu_optim::{Adam, GpuContext, Optimizer};
///
///   fn save_linear(ctx: &GpuContext) -> wgpu_optim::Result<()> {
///       // torch.nn.Linear(5, 8): weight [8, 5], bias [8]
///       let params = [ctx.upload_f32("fc1.weight", &[0.1; 40]), ctx.upload_f32("fc1.bias", &[0.0; 8])];
///       let options = Optimizer::builder().param_shapes(vec![vec![8, 5], vec![8]]);
///       let optimizer = options.build(ctx, Adam::adamw(), &params)?;
///       optimizer.save("optimizer.safetensors") // state.0.exp_avg is [8, 5]
///   }
///   ```
/// - **PyTorch resumes ours, and we resume PyTorch's** (`tools/torch_checkpoint.py`, needs
///   only `torch` and `safetensors`; `--help` says more):
///
///   ```sh
///   # ours -> a torch.optim state_dict that optimizer.load_state_dict accepts
///   python3 tools/torch_checkpoint.py to-torch optimizer.safetensors optimizer.pt
///   # torch.save(optimizer.state_dict(), "state.pt") -> a checkpoint Optimizer::load and
///   # CpuOptimizer::load read (SGD keeps no step count in PyTorch: add --step N)
///   python3 tools/torch_checkpoint.py from-torch state.pt optimizer.safetensors
///   ```
///
///   Adam, AdamW, AMSGrad, SGD (with momentum, Nesterov or neither), Adagrad, RMSprop and
///   Adafactor (its factored `row_var`/`col_var` or a vector's `variance`, in torch's shapes);
///   other classes, master weights and stochastic or Kahan rounding are refused by name. The
///   parameters go to PyTorch in the checkpoint's order, and PyTorch needs the states in the
///   parameters' shapes: build the optimizer with `param_shapes` (`train_mlp --save` does, so
///   an f32 run's checkpoint converts as is). `tests/integration/torch_checkpoint.rs` loads PyTorch's
///   state after 5 steps (fixtures in `tests/fixtures/torch/`, made by
///   `tools/make_torch_fixture.py`) and continues 5 steps on the GPU and the CPU backend
///   within the trajectory tolerance of the conformance vectors (`rtol` 1e-5, `atol` 1e-6)
///   of PyTorch's own continuation (Adafactor too, with `eps1` set, `d` 2 and `maximize` in
///   one of its two cases). The other way, measured once for the six optimizers of
///   the fixtures (random parameters and gradients; our 5 steps on lavapipe, saved,
///   converted, 5 more in PyTorch 2.15 against 5 more of ours): at most 2.4e-7 apart on either backend (Adam 6.0e-8), one or two f32
///   ulps of parameters near 1.
pub struct Checkpoint<'a> {
    /// Steps taken when it was saved.
    pub step: u64,
    /// Each parameter group's algorithm and parameter indices.
    pub groups: Vec<(Algorithm, Vec<usize>)>,
    /// The rounding of 16-bit stores, with stochastic rounding's seed; checkpoints written
    /// before rounding modes existed read as [`Rounding::NearestEven`].
    pub rounding: Rounding,
    /// With blockwise 8-bit state ([`StateStorage::Q8`]): its settings, from the
    /// `q8_min_8bit_size` metadata (with `q8_block_size`, which must be 256); `None` for a
    /// checkpoint of full-precision state.
    ///
    /// [`StateStorage::Q8`]: crate::StateStorage::Q8
    pub q8_states: Option<Q8States>,
    /// With blockwise 4-bit state ([`StateStorage::Q4`]): its settings, from the
    /// `q4_block_size` and `q4_min_size` metadata; `None` for a checkpoint without.
    ///
    /// [`StateStorage::Q4`]: crate::StateStorage::Q4
    pub q4_states: Option<crate::q4::Q4States>,
    /// The mode the parameters were in, where a group's family has modes (read by the
    /// family from its groups' entries, which must agree); train otherwise.
    pub mode: ScheduleFreeMode,
    /// Each group's `param_groups` entry, with what its family's passes added to it (their
    /// per-group values, which the families read: `FamilyCheckpoint::check_saved_group`).
    pub(crate) entries: Vec<JsonMap>,
    pub(super) file: SafeTensors<'a>,
    /// Each tensor's CRC-32 from the `crc32` metadata; `None` in files without (format 1,
    /// and files converted from PyTorch).
    checksums: Option<BTreeMap<String, u32>>,
}

impl<'a> Checkpoint<'a> {
    /// Parses checkpoint bytes; every malformed field is an [`Error::BadFile`](crate::Error::BadFile)
    /// naming it.
    pub fn parse(bytes: &'a [u8]) -> Result<Self> {
        let (_, metadata) =
            SafeTensors::read_metadata(bytes).map_err(|e| bad(format!("not a safetensors file: {e}")))?;
        let file = SafeTensors::deserialize(bytes).map_err(|e| bad(format!("corrupt tensor table: {e}")))?;
        let meta = metadata.metadata().clone().unwrap_or_default();
        let field = |key: &str| meta.get(key).ok_or_else(|| bad(format!("metadata has no `{key}`")));
        let format = field("format")?;
        if !READABLE_FORMATS.contains(&format.as_str()) {
            return Err(bad(format!("format is `{format}`, expected one of {READABLE_FORMATS:?}")));
        }
        let step: u64 =
            field("step")?.parse().map_err(|e| bad(format!("`step` is not a whole number: {e}")))?;
        let saved: Vec<serde_json::Value> = serde_json::from_str(field("param_groups")?)
            .map_err(|e| bad(format!("`param_groups` is not JSON: {e}")))?;
        let mut groups = Vec::with_capacity(saved.len().min(1024));
        let mut entries = Vec::with_capacity(saved.len().min(1024));
        for (g, saved) in saved.into_iter().enumerate() {
            let serde_json::Value::Object(map) = saved else {
                return Err(bad(format!("param_groups[{g}] is not an object")));
            };
            let algorithm = Algorithm::from_json(&map).map_err(|e| bad(format!("param_groups[{g}]: {e}")))?;
            algorithm.validate().map_err(|e| bad(format!("param_groups[{g}]: {e}")))?;
            let params = map
                .get("params")
                .and_then(|p| p.as_array())
                .and_then(|p| {
                    p.iter()
                        .map(|i| i.as_u64().and_then(|i| usize::try_from(i).ok()))
                        .collect::<Option<Vec<_>>>()
                })
                .ok_or_else(|| bad(format!("param_groups[{g}].params is not a list of indices")))?;
            groups.push((algorithm, params));
            entries.push(map);
        }
        let rounding = match meta.get("rounding").map(String::as_str) {
            None | Some("nearest_even") => Rounding::NearestEven,
            Some("kahan") => Rounding::Kahan,
            Some("stochastic") => Rounding::Stochastic {
                seed: field("rounding_seed")?
                    .parse()
                    .map_err(|e| bad(format!("`rounding_seed` is not a whole number: {e}")))?,
                state: field("rounding_state")?
                    .parse()
                    .map_err(|e| bad(format!("`rounding_state` is not true or false: {e}")))?,
            },
            Some(other) => return Err(bad(format!("unknown rounding `{other}`"))),
        };
        let q8_states = q8_states(&meta)?;
        let q4_states = q4_states(&meta)?;
        // Each family checks what its passes added to its groups' entries.
        let mut mode = None;
        for (g, (entry, (algorithm, _))) in entries.iter().zip(&groups).enumerate() {
            mode = algorithm.check_saved_group(g, entry, mode)?.or(mode);
        }
        let mode = mode.unwrap_or_default();
        let checksums = checksum::parse(meta.get(checksum::CHECKSUMS))?;
        Ok(Checkpoint { step, groups, rounding, q8_states, q4_states, mode, entries, file, checksums })
    }

    /// Refuses a file whose tensor data does not match its checksums (a flipped bit, a
    /// truncated copy patched back to length); a file without checksums passes.
    pub(crate) fn verify_checksums(&self) -> Result<()> {
        match &self.checksums {
            Some(checksums) => checksum::verify(checksums, &self.file),
            None => Ok(()),
        }
    }
}

/// The 8-bit settings in the metadata: none, or `min_8bit_size` with a block size of
/// [`BLOCK_SIZE`] (absmax of other blocks would scale other runs of codes).
fn q8_states(meta: &HashMap<String, String>) -> Result<Option<Q8States>> {
    let (min, block) = (meta.get(Q8_MIN_8BIT_SIZE), meta.get(Q8_BLOCK_SIZE));
    let (min, block) = match (min, block) {
        (None, None) => return Ok(None),
        (Some(min), Some(block)) => (min, block),
        (Some(_), None) => {
            return Err(bad(format!("metadata has `{Q8_MIN_8BIT_SIZE}` but no `{Q8_BLOCK_SIZE}`")))
        }
        (None, Some(_)) => {
            return Err(bad(format!("metadata has `{Q8_BLOCK_SIZE}` but no `{Q8_MIN_8BIT_SIZE}`")))
        }
    };
    if block.parse::<usize>() != Ok(BLOCK_SIZE) {
        return Err(bad(format!(
            "`{Q8_BLOCK_SIZE}` is `{block}`, expected {BLOCK_SIZE}: this crate keeps one absmax per \
             block of {BLOCK_SIZE} elements (bitsandbytes' blockwise optimizers' block size)"
        )));
    }
    let min_8bit_size =
        min.parse().map_err(|e| bad(format!("`{Q8_MIN_8BIT_SIZE}` is `{min}`, not a whole number: {e}")))?;
    Ok(Some(Q8States { min_8bit_size }))
}

/// The 4-bit settings in the metadata: none, or both `q4_block_size` (a block size the
/// crate takes) and `q4_min_size`.
fn q4_states(meta: &HashMap<String, String>) -> Result<Option<crate::q4::Q4States>> {
    let number = |name: &str, value: &String| {
        value.parse::<u64>().map_err(|e| bad(format!("`{name}` is `{value}`, not a whole number: {e}")))
    };
    match (meta.get(Q4_BLOCK_SIZE), meta.get(Q4_MIN_SIZE)) {
        (None, None) => Ok(None),
        (Some(block), Some(min)) => {
            let config = crate::q4::Q4States {
                block_size: number(Q4_BLOCK_SIZE, block)? as usize,
                min_size: number(Q4_MIN_SIZE, min)?,
            };
            config.validate().map_err(|e| bad(e.to_string()))?;
            Ok(Some(config))
        }
        _ => Err(bad(format!("metadata has one of `{Q4_BLOCK_SIZE}` and `{Q4_MIN_SIZE}` but not the other"))),
    }
}
