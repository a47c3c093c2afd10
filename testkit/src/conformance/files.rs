//! The vector files of a directory, as the native runners (the `conformance` example and
//! the tests) read them: a directory that holds none is an error, never a run that checks
//! nothing and passes.

use std::fmt;
use std::path::{Path, PathBuf};

/// Why a directory gave no vector files to run.
#[derive(Debug)]
pub enum VectorDirError {
    /// The directory could not be listed.
    Unreadable {
        /// The directory asked for.
        dir: PathBuf,
        /// What listing it returned.
        source: std::io::Error,
    },
    /// The directory holds no `*.safetensors` file (subdirectories are not searched).
    Empty {
        /// The directory asked for.
        dir: PathBuf,
    },
}

impl fmt::Display for VectorDirError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VectorDirError::Unreadable { dir, source } => {
                write!(f, "cannot read {}: {source}", dir.display())
            }
            VectorDirError::Empty { dir } => write!(
                f,
                "{} holds no *.safetensors vector file (subdirectories are not searched): \
                 a run would check nothing",
                dir.display()
            ),
        }
    }
}

impl std::error::Error for VectorDirError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            VectorDirError::Unreadable { source, .. } => Some(source),
            VectorDirError::Empty { .. } => None,
        }
    }
}

/// The `*.safetensors` files directly in `dir`, sorted by path; an error where there are
/// none or `dir` cannot be listed.
pub fn vector_files(dir: &Path) -> Result<Vec<PathBuf>, VectorDirError> {
    let unreadable = |source| VectorDirError::Unreadable { dir: dir.to_path_buf(), source };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(unreadable)? {
        let path = entry.map_err(unreadable)?.path();
        if path.is_file() && path.extension().is_some_and(|e| e == "safetensors") {
            files.push(path);
        }
    }
    if files.is_empty() {
        return Err(VectorDirError::Empty { dir: dir.to_path_buf() });
    }
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory of this process's own under the system's temporary one.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("wgpu-optim-testkit-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_directory_without_vector_files_is_an_error_that_names_it() {
        let dir = scratch("no-vectors");
        std::fs::write(dir.join("README.md"), b"not a vector").unwrap();
        // A vector file one level down is not read: only the directory's own files count.
        std::fs::create_dir(dir.join("nested")).unwrap();
        std::fs::write(dir.join("nested/adam_1.safetensors"), b"").unwrap();
        let err = vector_files(&dir).unwrap_err();
        assert!(matches!(&err, VectorDirError::Empty { dir: d } if *d == dir), "{err:?}");
        let message = err.to_string();
        assert!(message.contains(&dir.display().to_string()), "{message}");
        assert!(message.contains("no *.safetensors vector file"), "{message}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_directory_is_unreadable() {
        let dir = scratch("missing").join("not-there");
        let err = vector_files(&dir).unwrap_err();
        assert!(
            matches!(&err, VectorDirError::Unreadable { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
        );
        assert!(err.to_string().starts_with(&format!("cannot read {}: ", dir.display())), "{err}");
        std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
    }

    #[test]
    fn the_vector_files_come_sorted_and_nothing_else_with_them() {
        let dir = scratch("sorted");
        for name in ["sgd_2.safetensors", "adam_1.safetensors", "FORMAT.md", "adam_1.safetensors.json"] {
            std::fs::write(dir.join(name), b"").unwrap();
        }
        std::fs::create_dir(dir.join("lion.safetensors")).unwrap();
        let files = vector_files(&dir).unwrap();
        assert_eq!(files, [dir.join("adam_1.safetensors"), dir.join("sgd_2.safetensors")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
