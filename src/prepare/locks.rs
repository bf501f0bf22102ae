//! Per-GPU locks: an in-process mutex so prepares on one GPU run one at a time, and a lock file so
//! two plugin processes (old and new pod during a rolling upgrade) never mutate one GPU at once.
//! Different GPUs never share a lock, so they are prepared in parallel.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The lock of one GPU.
#[derive(Debug)]
pub struct GpuLock {
    path: PathBuf,
    local: Mutex<()>,
}

/// Held while a GPU is being changed; both locks are released on drop.
#[derive(Debug)]
pub struct GpuGuard<'a> {
    _file: File,
    _local: MutexGuard<'a, ()>,
}

impl GpuLock {
    pub fn new(dir: &Path, gpu_uuid: &str) -> Self {
        Self { path: dir.join(format!("gpu-{gpu_uuid}.lock")), local: Mutex::new(()) }
    }

    /// Take both locks, waiting at most `timeout` for the other process.
    ///
    /// # Errors
    /// The lock file cannot be opened, or another process holds it past `timeout`.
    pub fn lock(&self, timeout: Duration) -> std::io::Result<GpuGuard<'_>> {
        let local = self.local.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let file = OpenOptions::new().create(true).truncate(false).write(true).mode(0o600).open(&self.path)?;
        let deadline = Instant::now() + timeout;
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(GpuGuard { _file: file, _local: local }),
                Err(std::fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("another process holds {} for more than {timeout:?}", self.path.display()),
                    ));
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(e),
            }
        }
    }
}
