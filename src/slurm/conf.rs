//! The line format slurm.conf and gres.conf share: `Key=Value` pairs separated by blanks, `#`
//! comments, `\` line continuations, `"quoted values"`, and `Include FILE` lines (relative paths
//! from the including file's directory). Keys are case-insensitive.

use std::fmt;
use std::path::{Path, PathBuf};

/// Deepest `Include` nesting; deeper is almost certainly a loop.
const MAX_INCLUDE_DEPTH: usize = 8;

/// Where a line came from, for error messages: `/etc/slurm/gres.conf:12`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub file: PathBuf,
    pub line: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file.display(), self.line)
    }
}

/// A problem in a config file, with its place.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{at}: {message}")]
pub struct ConfError {
    pub at: Location,
    pub message: String,
}

/// One logical line: its `Key=Value` pairs in order, keys as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub at: Location,
    pub pairs: Vec<(String, String)>,
}

impl Line {
    /// The value of `key` (case-insensitive), the last one when repeated, like Slurm.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs.iter().rev().find(|(k, _)| k.eq_ignore_ascii_case(key)).map(|(_, v)| v.as_str())
    }

    pub fn error(&self, message: impl Into<String>) -> ConfError {
        ConfError { at: self.at.clone(), message: message.into() }
    }
}

/// Read `path` and every file it includes, in order.
///
/// # Errors
/// A file cannot be read, an `Include` loops or nests too deep, or a line has a word that is not
/// `Key=Value`, or an unterminated quote.
pub fn read(path: &Path) -> Result<Vec<Line>, ConfError> {
    let mut out = Vec::new();
    read_into(path, None, 0, &mut out)?;
    Ok(out)
}

fn read_into(path: &Path, from: Option<&Location>, depth: usize, out: &mut Vec<Line>) -> Result<(), ConfError> {
    let here = |line| Location { file: path.to_path_buf(), line };
    let text = std::fs::read_to_string(path).map_err(|e| ConfError {
        at: from.cloned().unwrap_or_else(|| here(0)),
        message: format!("cannot read {}: {e}", path.display()),
    })?;
    for (at, logical) in logical_lines(&text) {
        let at = here(at);
        let words = words(&logical).map_err(|message| ConfError { at: at.clone(), message })?;
        let Some(first) = words.first() else { continue };
        if first.eq_ignore_ascii_case("include") {
            let [_, target] = words.as_slice() else {
                return Err(ConfError { at, message: "Include takes exactly one file name".into() });
            };
            if depth >= MAX_INCLUDE_DEPTH {
                return Err(ConfError {
                    at,
                    message: format!("Include nested deeper than {MAX_INCLUDE_DEPTH}: a loop?"),
                });
            }
            let target = path.parent().unwrap_or(Path::new(".")).join(target);
            read_into(&target, Some(&at), depth + 1, out)?;
            continue;
        }
        let mut pairs = Vec::new();
        for w in words {
            let Some((k, v)) = w.split_once('=') else {
                return Err(ConfError { at, message: format!("{w:?} is not Key=Value") });
            };
            if k.is_empty() {
                return Err(ConfError { at, message: format!("{w:?} has no key before '='") });
            }
            pairs.push((k.to_string(), v.to_string()));
        }
        out.push(Line { at, pairs });
    }
    Ok(())
}

/// Join `\` continuations and drop comments; each item carries its first line number.
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let line = strip_comment(raw);
        let (body, continues) = match line.trim_end().strip_suffix('\\') {
            Some(b) => (b.to_string(), true),
            None => (line.to_string(), false),
        };
        let entry = pending.get_or_insert_with(|| (i + 1, String::new()));
        entry.1.push(' ');
        entry.1.push_str(&body);
        if !continues {
            out.extend(pending.take());
        }
    }
    out.extend(pending);
    out
}

/// Everything before an unescaped `#` outside quotes.
fn strip_comment(line: &str) -> String {
    let (mut out, mut quoted, mut chars) = (String::new(), false, line.chars().peekable());
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'#') => out.push(chars.next().unwrap_or('#')),
            '"' => {
                quoted = !quoted;
                out.push(c);
            }
            '#' if !quoted => break,
            _ => out.push(c),
        }
    }
    out
}

/// Blank-separated words; double quotes group blanks and are removed.
fn words(line: &str) -> Result<Vec<String>, String> {
    let (mut out, mut cur, mut quoted, mut any) = (Vec::new(), String::new(), false, false);
    for c in line.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    if quoted {
        return Err("unterminated '\"'".into());
    }
    if any {
        out.push(cur);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn pairs_comments_quotes_continuations_and_includes() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "more.conf", "Name=gpu File=/dev/nvidia2 # two\n");
        let main = write(
            d.path(),
            "gres.conf",
            "# header\nAutoDetect=off\n\nName=gpu Type=\"a b\" \\\n  File=/dev/nvidia[0-1]\n\
             include more.conf\nName=gpu File=/x\\#y\n",
        );
        let lines = read(&main).unwrap();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0].get("autodetect"), Some("off"));
        assert_eq!(lines[1].get("TYPE"), Some("a b"));
        assert_eq!(lines[1].get("File"), Some("/dev/nvidia[0-1]"));
        assert_eq!(lines[1].at.line, 4);
        assert_eq!(lines[2].at.to_string(), format!("{}:1", d.path().join("more.conf").display()));
        assert_eq!(lines[3].get("File"), Some("/x#y"));
    }

    #[test]
    fn errors_name_file_and_line() {
        let d = tempfile::tempdir().unwrap();
        let p = write(d.path(), "gres.conf", "AutoDetect=off\nName=gpu File\n");
        let e = read(&p).unwrap_err();
        assert_eq!(e.to_string(), format!("{}:2: \"File\" is not Key=Value", p.display()));
        let p = write(d.path(), "q.conf", "Name=\"gpu\nx=1\n");
        assert!(read(&p).unwrap_err().to_string().ends_with("q.conf:1: unterminated '\"'"));
        let p = write(d.path(), "loop.conf", "Include loop.conf\n");
        assert!(read(&p).unwrap_err().to_string().contains("a loop?"));
        let p = write(d.path(), "missing.conf", "Include nothere.conf\n");
        let e = read(&p).unwrap_err().to_string();
        assert!(e.contains("missing.conf:1: cannot read") && e.contains("nothere.conf"), "{e}");
    }
}
