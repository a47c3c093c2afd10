//! The shape the family registry promises, checked over the source tree: no file outside a
//! family's folder matches on that family, no file under `src/` is over 700 lines, and none
//! includes another by `#[path]`. A change that breaks one of these fails here with the file
//! and line, rather than being found by reading.

use std::path::{Path, PathBuf};

use super::LISTED;

/// The most lines a file under `src/` may have.
const MAX_LINES: usize = 700;

/// Files allowed to name a family in a match, and why.
const ALLOWED: &[(&str, &str)] = &[];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every `.rs` file under `src/`, as `(path relative to the crate, text)`.
fn sources() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let relative =
                path.strip_prefix(root).expect("under the crate").to_string_lossy().replace('\\', "/");
            (relative, text)
        })
        .collect()
}

/// A line's code, without its comment (a `//` outside a string literal is near enough here:
/// no line this checks holds `//` in a string).
fn code(line: &str) -> &str {
    line.split("//").next().unwrap_or_default()
}

/// Whether `code` takes a family apart: a match arm, an `if let`, a `let .. else` or a
/// `matches!` on one of the generated enums' variants for `family`/`variant`.
fn matches_on(code: &str, family: &str, variant: &str) -> bool {
    let names = [
        format!("Algorithm::{variant}"),
        format!("Family::{family}"),
        format!("Switches::{family}"),
        format!("KernelStep::{family}"),
        format!("CpuUpdate::{family}"),
    ];
    let named = names.iter().any(|name| {
        code.match_indices(name.as_str()).any(|(at, _)| {
            // The whole variant (`Family::Adam`, not `Family::Adamax`).
            !code[at + name.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '_')
        })
    });
    let takes_apart = code.contains("=>")
        || code.contains("if let ")
        || code.contains("matches!(")
        || (code.contains("let ") && code.contains(" else"));
    named && takes_apart
}

#[test]
fn no_file_outside_a_familys_folder_matches_on_that_family() {
    let mut found = Vec::new();
    // This file's own examples of what the check catches are not matches.
    for (path, text) in sources().into_iter().filter(|(path, _)| path != "src/family/layout_tests.rs") {
        for listed in LISTED {
            let (family, folder, variant) = (listed.family, listed.folder, listed.variant);
            if path.starts_with(&format!("src/family/{folder}/"))
                || ALLOWED.contains(&(path.as_str(), variant))
            {
                continue;
            }
            for (n, line) in text.lines().enumerate() {
                if matches_on(code(line), family, variant) {
                    found.push(format!("{path}:{}: {}", n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "matches on a family outside its folder (move them into the family's folder behind a \
         trait or hook):\n{}",
        found.join("\n")
    );
}

#[test]
fn no_file_under_src_is_over_700_lines_or_includes_another_by_path() {
    let sources = sources();
    assert!(sources.len() > 100, "found only {} files under src/", sources.len());
    let long: Vec<String> = sources
        .iter()
        .filter(|(_, text)| text.lines().count() > MAX_LINES)
        .map(|(path, text)| format!("{path}: {} lines", text.lines().count()))
        .collect();
    assert!(long.is_empty(), "files over {MAX_LINES} lines:\n{}", long.join("\n"));
    let included: Vec<&str> = sources
        .iter()
        .filter(|(_, text)| text.lines().any(|line| code(line).trim_start().starts_with("#[path")))
        .map(|(path, _)| path.as_str())
        .collect();
    assert!(included.is_empty(), "`#[path]` includes in {included:?}");
}

#[test]
fn the_check_finds_what_it_looks_for() {
    // The forms it must catch, and the uses it must leave alone.
    assert!(matches_on("        Algorithm::Adam(c) => c.lr,", "Adam", "Adam"));
    assert!(matches_on("if let Algorithm::Lamb(_) = algorithm {", "Lamb", "Lamb"));
    assert!(matches_on("matches!(family, Family::Muon)", "Muon", "Muon"));
    assert!(matches_on("let KernelStep::Adopt(s, u) = step else {", "Adopt", "Adopt"));
    assert!(!matches_on("let algorithm = Algorithm::Sgd(Sgd::default());", "Momentum", "Sgd"));
    assert!(!matches_on("Family::Adamax(x) => 1,", "Adam", "Adam"));
    assert_eq!(code("let x = 1; // Algorithm::Adam(c) => c"), "let x = 1; ");
    assert!(LISTED
        .iter()
        .any(|l| (l.family, l.folder, l.variant, l.config) == ("Momentum", "momentum", "Sgd", "Sgd")));
}
