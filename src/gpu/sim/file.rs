//! The state file: one simulated node shared by every process that opens it, each operation under
//! an exclusive `flock` on `<file>.lock`, each change an atomic rewrite.

use super::SimState;
use crate::gpu::{GpuError, Result};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

pub(super) struct StateFile {
    pub(super) path: PathBuf,
    pub(super) lock: PathBuf,
}

impl StateFile {
    pub(super) fn new(path: &Path) -> Self {
        let mut lock = path.as_os_str().to_owned();
        lock.push(".lock");
        StateFile { path: path.to_path_buf(), lock: PathBuf::from(lock) }
    }

    pub(super) fn error(&self, reason: String) -> GpuError {
        GpuError::SimState { path: self.path.display().to_string(), reason }
    }

    pub(super) fn io_error(&self, what: &str, e: io::Error) -> GpuError {
        self.error(format!("{what}: {e}"))
    }

    /// Hold an exclusive flock on `<path>.lock` until the returned file is dropped.
    pub(super) fn lock_file(&self) -> Result<File> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&self.lock)
            .map_err(|e| self.io_error(&format!("cannot open lock file {}", self.lock.display()), e))?;
        f.lock().map_err(|e| self.io_error(&format!("cannot lock {}", self.lock.display()), e))?;
        Ok(f)
    }

    /// The state, or `None` when there is no file. Call with the lock held.
    pub(super) fn read_opt(&self) -> Result<Option<SimState>> {
        let bytes = match fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.io_error("cannot read it", e)),
        };
        let fix = "delete it, or recreate it with --sim MODEL:COUNT[:mig-off][,...]";
        let st: SimState = serde_json::from_slice(&bytes)
            .map_err(|e| self.error(format!("not a valid simulator state ({e}); {fix}")))?;
        st.validate().map_err(|e| self.error(format!("not a valid simulator state: {e}; {fix}")))?;
        Ok(Some(st))
    }

    /// Replace the file atomically, so a reader in another process never sees half a state.
    pub(super) fn write(&self, st: &SimState) -> Result<()> {
        let mut json =
            serde_json::to_vec_pretty(st).map_err(|e| self.error(format!("cannot encode the state: {e}")))?;
        json.push(b'\n');
        crate::files::write_atomic(&self.path, &json, 0o644, crate::files::Durability::Durable)
            .map_err(|e| self.error(e.to_string()))
    }
}
