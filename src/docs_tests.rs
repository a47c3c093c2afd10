//! The front pages agree with the family registry: every family's configuration type is
//! named in README.md's algorithm table and in the crate-level rustdoc, so a new family
//! cannot be registered without them.

use crate::family::LISTED as FAMILIES;

fn read(file: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The rows of README.md's "## Algorithms" table.
fn readme_algorithm_rows(readme: &str) -> Vec<&str> {
    let start = readme.find("\n## Algorithms\n").expect("README.md has an \"## Algorithms\" section");
    let section = &readme[start + 1..];
    let end = section[3..].find("\n## ").map_or(section.len(), |i| i + 3);
    section[..end].lines().filter(|l| l.starts_with("| ") && !l.starts_with("|---")).skip(1).collect()
}

#[test]
fn every_family_has_a_row_in_readme_s_algorithm_table() {
    let readme = read("README.md");
    let rows = readme_algorithm_rows(&readme);
    assert_eq!(rows.len(), FAMILIES.len(), "one row per family: {rows:#?}");
    for crate::family::Listed { config, folder, .. } in FAMILIES {
        let name = format!("`{config}`");
        let link = format!("(src/family/{folder}/)");
        assert!(
            rows.iter().any(|row| row.contains(&name) && row.contains(&link)),
            "README.md's algorithm table has no row naming {name} with a link to {link}"
        );
    }
}

#[test]
fn every_family_is_on_the_crate_s_front_page() {
    let lib = read("src/lib.rs");
    let front: String = lib.lines().take_while(|l| l.starts_with("//!")).collect::<Vec<_>>().join("\n");
    for crate::family::Listed { config, .. } in FAMILIES {
        let link = format!("[`{config}`]");
        assert!(front.contains(&link), "src/lib.rs's crate docs do not link {link}");
    }
}

/// README.md tells a user one way to run the tests, and CI runs exactly that: `.ci/run`
/// calls `tools/test.sh`, and README names no other test command (the other forms are
/// CONTRIBUTING.md's).
#[test]
fn readme_s_one_test_command_is_the_one_ci_runs() {
    let readme = read("README.md");
    let ci = read(".ci/run");
    assert!(
        readme.contains("```sh\ntools/test.sh\n```"),
        "README.md shows `tools/test.sh` as its test command"
    );
    assert!(
        ci.lines().any(|l| !l.trim_start().starts_with('#') && l.contains("tools/test.sh")),
        ".ci/run runs tools/test.sh"
    );
    for other in ["cargo test", "cargo nextest"] {
        assert!(!readme.contains(other), "README.md names `{other}`, which CI does not run as given");
    }
}
