//! The checkpoint's own byte layout and its integrity check: safetensors bytes that are a
//! function of their contents (sorted metadata, a fixed tensor order), and a CRC-32 of
//! every tensor's data in the metadata, checked on load.

use std::collections::BTreeMap;

use safetensors::tensor::{TensorInfo, TensorView};
use safetensors::SafeTensors;

use super::bad;
use crate::Result;

/// The metadata key of the tensors' checksums: a JSON object from each tensor's name to the
/// CRC-32 (IEEE, as zlib's `crc32`) of its data bytes, as 8 lowercase hex digits.
pub(crate) const CHECKSUMS: &str = "crc32";

/// The CRC-32 of `data` as the metadata writes it.
fn crc32_hex(data: &[u8]) -> String {
    format!("{:08x}", crc32fast::hash(data))
}

/// The safetensors bytes of `tensors` and `metadata`, with [`CHECKSUMS`] added. The same
/// state gives the same bytes: `safetensors::serialize` writes its metadata from a
/// `HashMap` in a different order on every call, so the header is written here, with the
/// metadata sorted by key and the tensors in safetensors' own order (by descending dtype
/// alignment, then by name).
pub(crate) fn serialize(
    mut tensors: Vec<(String, TensorView<'_>)>,
    mut metadata: BTreeMap<String, String>,
) -> Result<Vec<u8>> {
    tensors.sort_by(|(a, x), (b, y)| y.dtype().cmp(&x.dtype()).then_with(|| a.cmp(b)));
    let checksums: BTreeMap<&str, String> =
        tensors.iter().map(|(name, view)| (name.as_str(), crc32_hex(view.data()))).collect();
    let checksums = serde_json::to_string(&checksums).map_err(|e| bad(e.to_string()))?;
    metadata.insert(CHECKSUMS.to_string(), checksums);
    // serde_json's map keeps either sorted or insertion order (its `preserve_order`
    // feature); both are fixed here, as every key is inserted in a fixed order.
    let mut header = serde_json::Map::new();
    let metadata: serde_json::Map<String, serde_json::Value> =
        metadata.into_iter().map(|(k, v)| (k, serde_json::Value::String(v))).collect();
    header.insert("__metadata__".into(), metadata.into());
    let mut offset = 0;
    for (name, view) in &tensors {
        let end = offset + view.data().len();
        let info =
            TensorInfo { dtype: view.dtype(), shape: view.shape().to_vec(), data_offsets: (offset, end) };
        header.insert(name.clone(), serde_json::to_value(info).map_err(|e| bad(e.to_string()))?);
        offset = end;
    }
    let mut header = serde_json::Value::Object(header).to_string().into_bytes();
    // As safetensors pads it: the data starts 8-byte aligned.
    header.resize(header.len().next_multiple_of(8), b' ');
    let mut bytes = Vec::with_capacity(8 + header.len() + offset);
    bytes.extend((header.len() as u64).to_le_bytes());
    bytes.extend(header);
    for (_, view) in &tensors {
        bytes.extend_from_slice(view.data());
    }
    Ok(bytes)
}

/// The checksums of a file's metadata: `None` without any (files of format 1, and files
/// converted from PyTorch), or [`Error::BadFile`](crate::Error::BadFile) when the entry is
/// not an object of 8-hex-digit strings.
pub(crate) fn parse(metadata: Option<&String>) -> Result<Option<BTreeMap<String, u32>>> {
    let Some(json) = metadata else { return Ok(None) };
    let map: BTreeMap<String, String> = serde_json::from_str(json)
        .map_err(|e| bad(format!("`{CHECKSUMS}` is not an object of tensor names to hex strings: {e}")))?;
    map.into_iter()
        .map(|(name, hex)| match (hex.len(), u32::from_str_radix(&hex, 16)) {
            (8, Ok(crc)) => Ok((name, crc)),
            _ => Err(bad(format!("`{CHECKSUMS}` of `{name}` is `{hex}`, not 8 hex digits of a CRC-32"))),
        })
        .collect::<Result<_>>()
        .map(Some)
}

/// Refuses a file whose tensors and checksums differ: a tensor without a checksum, a
/// checksum without a tensor, or data whose CRC-32 is not its checksum (a flipped bit).
pub(crate) fn verify(checksums: &BTreeMap<String, u32>, file: &SafeTensors<'_>) -> Result<()> {
    for (name, view) in file.iter() {
        let expected =
            checksums.get(name).ok_or_else(|| bad(format!("`{CHECKSUMS}` has no checksum of `{name}`")))?;
        let got = crc32fast::hash(view.data());
        if got != *expected {
            return Err(bad(format!(
                "the data of `{name}` is corrupt: its CRC-32 is {got:08x}, the file's checksum says {expected:08x}"
            )));
        }
    }
    if let Some(name) = checksums.keys().find(|name| file.tensor(name).is_err()) {
        return Err(bad(format!("`{CHECKSUMS}` has a checksum of `{name}`, which the file does not hold")));
    }
    Ok(())
}
