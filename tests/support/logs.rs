//! A child's log in a failure message: the last lines, so a panic stays readable.

use std::path::Path;

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The last `n` lines of the file at `path`, under a line naming it; empty if it cannot be read.
pub fn file_tail(what: &str, path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    format!("--- {what} ({}), last lines:\n{}", path.display(), tail(&text, n))
}
