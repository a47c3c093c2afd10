//! Comparing checkpoint files by content rather than by bytes.

use safetensors::SafeTensors;

/// A checkpoint's content in a canonical order (the metadata map has none): each metadata
/// entry, then each tensor named with its dtype and shape, with its bytes. Two checkpoints
/// hold the same state exactly when these are equal. An unreadable file gives one entry
/// naming the error, which equals no readable file's.
pub fn canonical(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    let (file, metadata) = match (SafeTensors::deserialize(bytes), SafeTensors::read_metadata(bytes)) {
        (Ok(file), Ok((_, metadata))) => (file, metadata),
        (Err(e), _) | (_, Err(e)) => return vec![(format!("unreadable: {e}"), Vec::new())],
    };
    let mut entries: Vec<(String, Vec<u8>)> = metadata
        .metadata()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (format!("metadata {k}"), v.into_bytes()))
        .collect();
    for (name, view) in file.tensors() {
        entries.push((format!("{name} {:?} {:?}", view.dtype(), view.shape()), view.data().to_vec()));
    }
    entries.sort();
    entries
}
