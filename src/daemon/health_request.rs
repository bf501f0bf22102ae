//! The request file through which `migdra health clear` asks the running daemon to forget GPUs'
//! errors: written by the command, taken by the daemon. A file in the plugin directory, because
//! both run on the node with that directory and the daemon serves nothing else an operator reaches.

use std::path::{Path, PathBuf};

/// The request file's name: one GPU UUID per line.
pub const REQUEST_FILE: &str = "health-clear";

/// Where the request file is in a plugin directory.
pub fn request_path(plugin_dir: &Path) -> PathBuf {
    plugin_dir.join(REQUEST_FILE)
}

/// Add GPUs to the request. Requests not yet taken stay: two operators' requests add up.
pub fn add(plugin_dir: &Path, uuids: &[String]) -> Result<(), crate::files::WriteError> {
    let path = request_path(plugin_dir);
    let mut lines: Vec<String> =
        std::fs::read_to_string(&path).unwrap_or_default().lines().map(str::to_owned).collect();
    lines.extend(uuids.iter().cloned());
    lines.sort();
    lines.dedup();
    crate::files::write_atomic(&path, (lines.join("\n") + "\n").as_bytes(), 0o600, crate::files::Durability::Atomic)
}

/// Take the request, if there is one: the GPU UUIDs it names. Taken by a rename, so a request
/// written meanwhile waits for the next look instead of being lost.
pub fn take(plugin_dir: &Path) -> std::io::Result<Option<Vec<String>>> {
    let path = request_path(plugin_dir);
    let taken = plugin_dir.join(format!(".{REQUEST_FILE}-taken"));
    match std::fs::rename(&path, &taken) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    }
    let text = std::fs::read_to_string(&taken);
    let _ = std::fs::remove_file(&taken);
    Ok(Some(text?.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_owned).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_add_up_until_taken_once() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(take(dir.path()).unwrap(), None);
        add(dir.path(), &["GPU-b".into(), "GPU-a".into()]).unwrap();
        add(dir.path(), &["GPU-a".into(), "GPU-c".into()]).unwrap();
        assert_eq!(take(dir.path()).unwrap(), Some(vec!["GPU-a".into(), "GPU-b".into(), "GPU-c".into()]));
        assert_eq!(take(dir.path()).unwrap(), None, "a request is taken once");
    }
}
