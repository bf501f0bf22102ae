//! The harness's own promise: a test's child process sees none of the settings migdra reads
//! from the environment, whatever the shell that runs the tests exports.

use crate::support::command::{INHERITED, SCRUBBED, SCRUBBED_PREFIXES, migdra};
use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::path::Path;

/// The quoted names after each `pattern` in `text`.
fn names_after(text: &str, pattern: &str) -> Vec<String> {
    text.match_indices(pattern)
        .filter_map(|(at, _)| {
            let rest = &text[at + pattern.len()..];
            let name = &rest[..rest.find('"')?];
            name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_').then(|| name.to_string())
        })
        .filter(|n| !n.is_empty())
        .collect()
}

/// Every environment variable src/ names: clap `env` attributes, `std::env::var`/`var_os`
/// calls, and `*_ENV` constants read that way.
fn read_by_src() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut todo = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension() == Some(OsStr::new("rs")) {
                let text = std::fs::read_to_string(&path).unwrap();
                for pattern in ["env = \"", "env::var(\"", "env::var_os(\"", "_ENV: &str = \""] {
                    names.extend(names_after(&text, pattern));
                }
            }
        }
    }
    names
}

/// Each variable src/ reads is in the scrub list, or named as one a child keeps; and the list
/// is really removed from `migdra`'s environment.
#[test]
fn every_variable_migdra_reads_is_scrubbed() {
    let read = read_by_src();
    assert!(read.contains("NODE_NAME") && read.contains("MIGDRA_SIM_FAULTS"), "the scan found {read:?}");
    let missing: Vec<&String> =
        read.iter().filter(|n| !SCRUBBED.contains(&n.as_str()) && !INHERITED.contains(&n.as_str())).collect();
    assert!(missing.is_empty(), "src/ reads {missing:?}: add them to SCRUBBED in tests/support/command.rs");
    for name in read.iter().filter(|n| n.starts_with("MIGDRA_")) {
        assert!(SCRUBBED_PREFIXES.iter().any(|p| name.starts_with(p)), "{name}");
    }

    let cmd = migdra();
    let removed: BTreeSet<&OsStr> = cmd.get_envs().filter(|(_, v)| v.is_none()).map(|(k, _)| k).collect();
    for name in SCRUBBED {
        assert!(removed.contains(OsStr::new(name)), "migdra() keeps {name}");
    }
}
