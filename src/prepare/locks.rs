//! Per-GPU locks: an in-process mutex so prepares on one GPU run one at a time, and a lock file so
//! two plugin processes (old and new pod during a rolling upgrade) never mutate one GPU at once.
//! Different GPUs never share a lock, so they are prepared in parallel. Per-claim locks keep a
//! prepare and an unprepare of one claim from interleaving.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
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

/// The claims being prepared or unprepared in this process.
///
/// The kubelet may call prepare while an unprepare of the same claim still runs (its call timed
/// out, and a call whose client hangs up is finished anyway). Interleaved, the prepare could adopt
/// a compute instance the unprepare then destroys, and record the claim as prepared without it
/// (found by the storm in tests/reliability). One claim's calls therefore run one at a time;
/// different claims still run in parallel.
#[derive(Debug, Default)]
pub struct ClaimLocks {
    busy: Mutex<HashSet<String>>,
    freed: Condvar,
}

/// Held while one claim is being changed; released on drop.
#[derive(Debug)]
pub struct ClaimGuard<'a> {
    locks: &'a ClaimLocks,
    uid: String,
}

impl ClaimLocks {
    /// Wait until no other call works on `uid`, then hold it.
    pub fn lock(&self, uid: &str) -> ClaimGuard<'_> {
        let mut busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        while busy.contains(uid) {
            busy = self.freed.wait(busy).unwrap_or_else(PoisonError::into_inner);
        }
        busy.insert(uid.to_string());
        ClaimGuard { locks: self, uid: uid.to_string() }
    }
}

impl Drop for ClaimGuard<'_> {
    fn drop(&mut self) {
        self.locks.busy.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.uid);
        self.locks.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A second call on the same claim waits for the first; another claim does not.
    #[test]
    fn one_call_at_a_time_per_claim() {
        let locks = Arc::new(ClaimLocks::default());
        let first = locks.lock("a");
        let _other = locks.lock("b");
        let entered = Arc::new(AtomicBool::new(false));
        let waiter = std::thread::spawn({
            let (locks, entered) = (locks.clone(), entered.clone());
            move || {
                let _g = locks.lock("a");
                entered.store(true, Ordering::SeqCst);
            }
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!entered.load(Ordering::SeqCst), "entered while the first call held the claim");
        drop(first);
        waiter.join().unwrap();
        assert!(entered.load(Ordering::SeqCst));
        assert!(locks.busy.lock().unwrap().len() == 1, "only b is still held");
    }
}
