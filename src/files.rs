//! Durable writes and owned directories, shared by everything that keeps node state on disk: the
//! checkpoint, CDI specs and the simulator's state file.
//!
//! A reader (a runtime watching the CDI directory, a restarted daemon) must see a file whole or
//! not at all, and a crash must leave the old or the new version, never a torn one. So a write
//! goes to a hidden temp file beside the target (a name no runtime loads) and is renamed over the
//! target. How far it goes before the rename depends on what a power loss may cost
//! ([`Durability`]): a [`Durability::Durable`] write fsyncs the temp file before the rename and the
//! directory after it, so the new version survives a power loss; an [`Durability::Atomic`] one
//! skips both fsyncs, for files that a durable record can write again.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Distinguishes temp files of concurrent writes in one process.
static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// How far a write goes before it returns.
///
/// A process that crashes leaves the page cache behind, so after the rename every reader on the
/// machine sees the new file whole, synced or not; only a power loss or a kernel crash can lose an
/// unsynced write, and then the machine reboots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// fsync the file before the rename and the directory after it: the new version survives a
    /// power loss. For records nothing else can rebuild: the checkpoint, the simulator's state.
    Durable,
    /// The rename alone: old or new while the machine runs; after a power loss the old version,
    /// the new one or an empty file. For files written again from a durable record (CDI specs),
    /// where the two fsyncs would only add to every call's latency.
    Atomic,
}

/// The steps of an atomic write, so an error says which one failed and tests can fail each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Create,
    Write,
    Sync,
    Rename,
    SyncDir,
}

impl Step {
    /// The operation, as an error message words it (`cannot <op> <path>`).
    pub fn op(self) -> &'static str {
        match self {
            Self::Create => "create temp file",
            Self::Write => "write",
            Self::Sync => "fsync",
            Self::Rename => "rename temp file over",
            Self::SyncDir => "fsync directory",
        }
    }
}

/// A failed atomic write: the step, the path it acted on (the temp file, the target or the
/// directory) and the OS error. The temp file is already removed.
#[derive(Debug, thiserror::Error)]
#[error("cannot {} {}: {source}", step.op(), path.display())]
pub struct WriteError {
    pub step: Step,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

/// Replace `path` with `bytes` atomically; the file gets exactly `mode` whatever the umask.
///
/// # Errors
/// The step that failed; nothing half-written is left behind.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32, durability: Durability) -> Result<(), WriteError> {
    write_atomic_with(path, bytes, mode, durability, |_| Ok(()))
}

/// [`write_atomic`] with `before` called ahead of each step; an error from it fails that step,
/// which is how tests prove every step's failure leaves the old file intact.
///
/// # Errors
/// As for [`write_atomic`].
pub fn write_atomic_with(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    durability: Durability,
    before: impl Fn(Step) -> io::Result<()>,
) -> Result<(), WriteError> {
    let durable = durability == Durability::Durable;
    let dir = parent_dir(path);
    let prefix = temp_prefix(path);
    let pid = std::process::id();
    let (mut file, tmp) = loop {
        let tmp = dir.join(format!("{prefix}{pid}-{}", TEMP_SEQ.fetch_add(1, Ordering::Relaxed)));
        let opened =
            before(Step::Create).and_then(|()| OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp));
        match opened {
            Ok(file) => break (file, tmp),
            // A leftover of an earlier process with our PID (PID 1 in every container).
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(fail(Step::Create, &tmp)(e)),
        }
    };
    let written = (|| {
        before(Step::Write)
            .and_then(|()| file.write_all(bytes))
            // The umask may have narrowed the mode given at creation.
            .and_then(|()| file.set_permissions(fs::Permissions::from_mode(mode)))
            .map_err(fail(Step::Write, &tmp))?;
        if durable {
            before(Step::Sync).and_then(|()| file.sync_all()).map_err(fail(Step::Sync, &tmp))?;
        }
        drop(file);
        before(Step::Rename).and_then(|()| fs::rename(&tmp, path)).map_err(fail(Step::Rename, path))
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written?;
    if !durable {
        return Ok(());
    }
    before(Step::SyncDir).and_then(|()| sync_dir(&dir)).map_err(fail(Step::SyncDir, &dir))
}

/// Remove the temp files crashed writes of `path` left behind (best effort). Call it only when no
/// other process can be writing `path`, i.e. under the caller's lock.
pub fn remove_temp_files(path: &Path) {
    let prefix = temp_prefix(path);
    let Ok(entries) = fs::read_dir(parent_dir(path)) else { return };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// fsync a directory, so a rename or removal in it is durable.
///
/// # Errors
/// The directory cannot be opened or synced.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Create `dir` and its parents with exactly `mode`, whatever the umask; an existing directory is
/// left as it is (an operator may have chosen its mode).
///
/// # Errors
/// The directory cannot be created or its mode set.
pub fn create_dir(dir: &Path, mode: u32) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    DirBuilder::new().recursive(true).mode(mode).create(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(mode))
}

fn fail(step: Step, path: &Path) -> impl FnOnce(io::Error) -> WriteError + '_ {
    move |source| WriteError { step, path: path.to_path_buf(), source }
}

/// Temp files of `path` are `.<file name>.tmp-<pid>-<n>`: hidden, and not `*.json`/`*.yaml`, so
/// no CDI runtime loads one.
fn temp_prefix(path: &Path) -> String {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    format!(".{name}.tmp-")
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> =
            fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    #[test]
    fn writes_whole_files_with_the_exact_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.json");
        write_atomic(&path, b"one", 0o600, Durability::Durable).unwrap();
        write_atomic(&path, b"two", 0o644, Durability::Durable).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o644);
        write_atomic(&path, b"three", 0o600, Durability::Atomic).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"three");
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert_eq!(names(dir.path()), ["a.json"]);
    }

    #[test]
    fn a_failure_at_any_step_keeps_the_old_file_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.json");
        write_atomic(&path, b"old", 0o600, Durability::Durable).unwrap();
        for failing in [Step::Create, Step::Write, Step::Sync, Step::Rename] {
            let err = write_atomic_with(&path, b"new", 0o600, Durability::Durable, |s| {
                if s == failing { Err(io::Error::other("injected")) } else { Ok(()) }
            })
            .unwrap_err();
            assert_eq!(err.step, failing);
            assert!(err.to_string().starts_with(&format!("cannot {}", failing.op())), "{err}");
            assert_eq!(fs::read(&path).unwrap(), b"old", "{failing:?}");
            assert_eq!(names(dir.path()), ["a.json"], "{failing:?}");
        }
        // The rename happened; only its durability is in doubt.
        let err = write_atomic_with(&path, b"new", 0o600, Durability::Durable, |s| {
            if s == Step::SyncDir { Err(io::Error::other("injected")) } else { Ok(()) }
        })
        .unwrap_err();
        assert_eq!((err.step, err.path.as_path()), (Step::SyncDir, dir.path()));
        assert_eq!(fs::read(&path).unwrap(), b"new");
    }

    #[test]
    fn only_a_durable_write_syncs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.json");
        let steps = |durability| {
            let seen = std::cell::RefCell::new(Vec::new());
            write_atomic_with(&path, b"x", 0o600, durability, |s| {
                seen.borrow_mut().push(s);
                Ok(())
            })
            .unwrap();
            seen.into_inner()
        };
        assert_eq!(steps(Durability::Durable), [Step::Create, Step::Write, Step::Sync, Step::Rename, Step::SyncDir]);
        assert_eq!(steps(Durability::Atomic), [Step::Create, Step::Write, Step::Rename]);
    }

    #[test]
    fn leftover_temp_files_are_removed_and_others_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint.json");
        fs::write(dir.path().join(".checkpoint.json.tmp-1-0"), "half").unwrap();
        fs::write(dir.path().join(".other.json.tmp-1-0"), "not ours").unwrap();
        remove_temp_files(&path);
        assert_eq!(names(dir.path()), [".other.json.tmp-1-0"]);
    }

    #[test]
    fn created_directories_get_the_mode_and_existing_ones_are_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let new = dir.path().join("a/b");
        create_dir(&new, 0o750).unwrap();
        assert_eq!(fs::metadata(&new).unwrap().mode() & 0o777, 0o750);
        fs::set_permissions(&new, fs::Permissions::from_mode(0o700)).unwrap();
        create_dir(&new, 0o750).unwrap();
        assert_eq!(fs::metadata(&new).unwrap().mode() & 0o777, 0o700);
    }
}
