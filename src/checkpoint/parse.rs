//! Reading a checkpoint file's header, metadata and tensor table.

use safetensors::SafeTensors;

use super::{bad, CHECKPOINT_FORMAT};
use crate::{Algorithm, Result, Rounding};

/// A parsed checkpoint file of either backend, checked for internal consistency but not
/// yet against an optimizer. Parsing reads the header and tensor table defensively and copies no tensor
/// data, so arbitrary bytes cost at most the file's size.
pub struct Checkpoint<'a> {
    /// Steps taken when it was saved.
    pub step: u64,
    /// Each parameter group's algorithm and parameter indices.
    pub groups: Vec<(Algorithm, Vec<usize>)>,
    /// The rounding of 16-bit stores, with stochastic rounding's seed; checkpoints written
    /// before rounding modes existed read as [`Rounding::NearestEven`].
    pub rounding: Rounding,
    pub(super) file: SafeTensors<'a>,
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
        if field("format")? != CHECKPOINT_FORMAT {
            return Err(bad(format!("format is `{}`, expected `{CHECKPOINT_FORMAT}`", field("format")?)));
        }
        let step: u64 =
            field("step")?.parse().map_err(|e| bad(format!("`step` is not a whole number: {e}")))?;
        let saved: Vec<serde_json::Value> = serde_json::from_str(field("param_groups")?)
            .map_err(|e| bad(format!("`param_groups` is not JSON: {e}")))?;
        let mut groups = Vec::with_capacity(saved.len().min(1024));
        for (g, saved) in saved.iter().enumerate() {
            let map = saved.as_object().ok_or_else(|| bad(format!("param_groups[{g}] is not an object")))?;
            let algorithm = Algorithm::from_json(map).map_err(|e| bad(format!("param_groups[{g}]: {e}")))?;
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
        Ok(Checkpoint { step, groups, rounding, file })
    }
}
