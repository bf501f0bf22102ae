//! The checkpoint on disk: locked read-modify-write and atomic replacement.
//!
//! Every access takes an exclusive `flock` on `<state_dir>/checkpoint.lock`, so two plugin
//! processes on one node (the old and new pod of a rolling upgrade) never lose each other's
//! updates. The lock file is separate from the data file because the data file is replaced by
//! rename, and a lock on a replaced inode would guard nothing. Writes go to a unique temp file in
//! the same directory (mode 0600), are fsynced, renamed over `checkpoint.json`, and the directory
//! is fsynced, so a crash leaves either the old or the new file, never a torn one.
//!
//! A bad file must never stop the daemon (NVIDIA's driver crash-loops on one): [`CheckpointStore::load`]
//! moves it aside and starts empty; only real I/O errors are errors.

use super::format::{decode, encode};
use super::record::Checkpoint;
use super::{Result, StateError};
use crate::files::{self, Durability, Step};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The checkpoint's file name in the state directory.
pub const FILE_NAME: &str = "checkpoint.json";
/// The lock file's name in the state directory.
pub const LOCK_NAME: &str = "checkpoint.lock";
/// What [`CheckpointStore::load`] found at startup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loaded {
    /// No file: a first start (the checkpoint is empty).
    Fresh(Checkpoint),
    /// The file, read and verified.
    Ok(Checkpoint),
    /// The file was unreadable; it was moved to `moved_to` and the checkpoint is empty.
    Corrupt { checkpoint: Checkpoint, moved_to: PathBuf, reason: String },
}

impl Loaded {
    /// The checkpoint, whatever was found.
    pub fn checkpoint(&self) -> &Checkpoint {
        match self {
            Self::Fresh(c) | Self::Ok(c) | Self::Corrupt { checkpoint: c, .. } => c,
        }
    }

    /// The checkpoint, whatever was found.
    pub fn into_checkpoint(self) -> Checkpoint {
        match self {
            Self::Fresh(c) | Self::Ok(c) | Self::Corrupt { checkpoint: c, .. } => c,
        }
    }
}

/// `<state_dir>/checkpoint.json`, guarded by `<state_dir>/checkpoint.lock`.
#[derive(Debug)]
pub struct CheckpointStore {
    dir: PathBuf,
    path: PathBuf,
    lock_path: PathBuf,
    writes: AtomicU64,
    #[cfg(test)]
    fault: std::sync::Mutex<Option<Step>>,
}

impl CheckpointStore {
    /// The store in `state_dir`. Touches nothing until used.
    pub fn new(state_dir: &Path) -> Self {
        CheckpointStore {
            dir: state_dir.to_path_buf(),
            path: state_dir.join(FILE_NAME),
            lock_path: state_dir.join(LOCK_NAME),
            writes: AtomicU64::new(0),
            #[cfg(test)]
            fault: std::sync::Mutex::new(None),
        }
    }

    /// The checkpoint file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The lock file.
    pub fn lock_path(&self) -> &Path {
        &self.lock_path
    }

    /// Completed atomic writes since this store was made.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// At startup: read the file, creating the state directory (0750) if needed, and remove temp
    /// files left by a crashed write.
    ///
    /// A missing file is [`Loaded::Fresh`]. A file that cannot be understood (not JSON, truncated,
    /// wrong checksum, a newer format version, wrong types) is renamed to
    /// `checkpoint.json.corrupt-<unix seconds>` and [`Loaded::Corrupt`] returned with an empty
    /// checkpoint: the caller logs it and recovers from the hardware.
    ///
    /// # Errors
    /// I/O errors only (permissions, EIO, a state directory that cannot be created).
    pub fn load(&self) -> Result<Loaded> {
        let _guard = self.lock()?;
        files::remove_temp_files(&self.path);
        match self.read_unlocked()? {
            None => Ok(Loaded::Fresh(Checkpoint::default())),
            Some(Ok(cp)) => Ok(Loaded::Ok(cp)),
            Some(Err(reason)) => {
                let moved_to = self.corrupt_path();
                fs::rename(&self.path, &moved_to).map_err(|e| self.io(&self.path, "move aside corrupt", e))?;
                files::sync_dir(&self.dir).map_err(|e| self.io(&self.dir, "fsync", e))?;
                Ok(Loaded::Corrupt { checkpoint: Checkpoint::default(), moved_to, reason })
            }
        }
    }

    /// The current checkpoint, read under the lock; empty when there is no file or no state
    /// directory (nothing is created then). Where the lock file cannot be opened for lack of
    /// permission (a read-only view), it reads without the lock, which is safe because writes
    /// replace the file atomically.
    ///
    /// # Errors
    /// [`StateError::Corrupt`] for a bad file (left where it is), or an I/O error.
    pub fn read(&self) -> Result<Checkpoint> {
        if !self.dir.exists() {
            return Ok(Checkpoint::default());
        }
        let _guard = match self.lock() {
            Ok(g) => Some(g),
            Err(StateError::Io { source, .. })
                if matches!(source.kind(), io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem) =>
            {
                None
            }
            Err(e) => return Err(e),
        };
        self.read_existing()
    }

    /// Read-modify-write under the lock: re-read the file (missing = empty), run `f` on it, stamp
    /// `boot_id`, write it atomically, unlock. Returns `f`'s value.
    ///
    /// If `f` fails, nothing is written and its error comes back as `Ok(Err(e))`. If the result
    /// equals what the file already held, the write is skipped.
    ///
    /// # Errors
    /// [`StateError::Corrupt`] when the file on disk is bad (call [`Self::load`] first), or an
    /// I/O error. A failure before the rename leaves the previous file untouched; a failure to
    /// fsync the directory after it leaves the new file in place, but maybe not durable.
    pub fn update<T, E>(&self, boot_id: &str, f: impl FnOnce(&mut Checkpoint) -> Result<T, E>) -> Result<Result<T, E>> {
        let _guard = self.lock()?;
        let before = self.read_unlocked()?.transpose().map_err(|reason| self.corrupt(reason))?;
        let mut work = before.clone().unwrap_or_default();
        let out = match f(&mut work) {
            Ok(out) => out,
            Err(e) => return Ok(Err(e)),
        };
        work.boot_id = boot_id.to_string();
        if before.as_ref() != Some(&work) {
            self.write_unlocked(&work)?;
        }
        Ok(Ok(out))
    }

    /// Replace the whole checkpoint (after recovery), under the lock.
    ///
    /// # Errors
    /// As for [`Self::update`].
    pub fn replace(&self, checkpoint: &Checkpoint) -> Result<()> {
        let _guard = self.lock()?;
        self.write_unlocked(checkpoint)
    }

    /// Hold the exclusive lock until the returned file is dropped. Creates the state directory.
    fn lock(&self) -> Result<File> {
        files::create_dir(&self.dir, 0o750).map_err(|e| self.io(&self.dir, "create directory", e))?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&self.lock_path)
            .map_err(|e| self.io(&self.lock_path, "open lock file", e))?;
        file.lock().map_err(|e| self.io(&self.lock_path, "lock", e))?;
        Ok(file)
    }

    /// The file's checkpoint, or why it is bad; `None` when there is no file.
    fn read_unlocked(&self) -> Result<Option<Result<Checkpoint, String>>> {
        match fs::read(&self.path) {
            Ok(bytes) => Ok(Some(decode(&bytes))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.io(&self.path, "read", e)),
        }
    }

    /// Like [`Self::read_unlocked`], with a missing file as empty and a bad one as an error.
    fn read_existing(&self) -> Result<Checkpoint> {
        match self.read_unlocked()? {
            None => Ok(Checkpoint::default()),
            Some(r) => r.map_err(|reason| self.corrupt(reason)),
        }
    }

    /// Write atomically; call with the lock held. Leaves no temp file behind on failure.
    fn write_unlocked(&self, checkpoint: &Checkpoint) -> Result<()> {
        let text = encode(checkpoint).map_err(StateError::Encode)?;
        files::write_atomic_with(&self.path, text.as_bytes(), 0o600, Durability::Durable, |step| self.inject(step))
            .map_err(|e| StateError::Io { path: e.path, op: e.step.op(), source: e.source })?;
        self.writes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// `checkpoint.json.corrupt-<unix seconds>`, with `-<n>` added if that exists already.
    fn corrupt_path(&self) -> PathBuf {
        let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let base = format!("{FILE_NAME}.corrupt-{secs}");
        let mut candidate = self.dir.join(&base);
        let mut n = 1;
        while candidate.symlink_metadata().is_ok() {
            n += 1;
            candidate = self.dir.join(format!("{base}-{n}"));
        }
        candidate
    }

    fn io(&self, path: &Path, op: &'static str, source: io::Error) -> StateError {
        StateError::Io { path: path.to_path_buf(), op, source }
    }

    fn corrupt(&self, reason: String) -> StateError {
        StateError::Corrupt { path: self.path.clone(), reason }
    }

    #[cfg(test)]
    fn inject(&self, step: Step) -> io::Result<()> {
        match *self.fault.lock().unwrap_or_else(std::sync::PoisonError::into_inner) {
            Some(s) if s == step => Err(io::Error::other(format!("injected failure at {step:?}"))),
            _ => Ok(()),
        }
    }

    #[cfg(not(test))]
    fn inject(&self, _step: Step) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::record::tests::sample_claim;
    use crate::state::record::{ClaimRecord, ClaimState};
    use std::os::unix::fs::PermissionsExt;

    fn store() -> (tempfile::TempDir, CheckpointStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(&dir.path().join("state"));
        (dir, store)
    }

    fn put(store: &CheckpointStore, uid: &str) {
        store
            .update("boot-1", |cp| {
                cp.claims.insert(uid.to_string(), sample_claim(uid));
                Ok::<_, ()>(())
            })
            .unwrap()
            .unwrap();
    }

    fn clear(cp: &mut Checkpoint) -> Result<(), ()> {
        cp.claims.clear();
        Ok(())
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn round_trip_through_the_file() {
        let (_tmp, store) = store();
        assert_eq!(store.load().unwrap(), Loaded::Fresh(Checkpoint::default()));
        put(&store, "u1");
        put(&store, "u2");
        let cp = store.read().unwrap();
        assert_eq!(cp.claims.len(), 2);
        assert_eq!(cp.claims["u1"], sample_claim("u1"));
        assert_eq!(store.load().unwrap(), Loaded::Ok(cp.clone()));
        assert_eq!(CheckpointStore::new(store.path().parent().unwrap()).read().unwrap(), cp);
        assert_eq!(store.writes(), 2);

        let dir = store.path().parent().unwrap();
        assert_eq!(entries(dir), [FILE_NAME, LOCK_NAME]);
        assert_eq!(mode(dir), 0o750);
        assert_eq!(mode(store.path()), 0o600);
        assert_eq!(mode(store.lock_path()), 0o600);
    }

    #[test]
    fn read_of_a_missing_directory_is_empty_and_creates_nothing() {
        let (tmp, store) = store();
        assert_eq!(store.read().unwrap(), Checkpoint::default());
        assert!(entries(tmp.path()).is_empty());
    }

    #[test]
    fn update_stamps_the_boot_id_and_returns_the_closure_value() {
        let (_tmp, store) = store();
        let n = store.update("boot-A", |cp| Ok::<_, ()>(cp.claims.len())).unwrap().unwrap();
        assert_eq!(n, 0);
        assert_eq!(store.read().unwrap().boot_id, "boot-A");
        put(&store, "u1");
        assert_eq!(store.read().unwrap().boot_id, "boot-1");
        let writes = store.writes();
        // Nothing changed: no write.
        store.update("boot-1", |_| Ok::<_, ()>(())).unwrap().unwrap();
        assert_eq!(store.writes(), writes);
        store.update("boot-B", |_| Ok::<_, ()>(())).unwrap().unwrap();
        assert_eq!(store.read().unwrap().boot_id, "boot-B");
        assert_eq!(store.writes(), writes + 1);
    }

    #[test]
    fn a_failing_update_writes_nothing() {
        let (_tmp, store) = store();
        put(&store, "u1");
        let before = fs::read(store.path()).unwrap();
        let writes = store.writes();
        let out = store
            .update("boot-other", |cp| {
                cp.claims.clear();
                Err::<(), _>("no GPU")
            })
            .unwrap();
        assert_eq!(out, Err("no GPU"));
        assert_eq!(fs::read(store.path()).unwrap(), before);
        assert_eq!(store.writes(), writes);
    }

    #[test]
    fn replace_writes_the_whole_checkpoint_as_given() {
        let (_tmp, store) = store();
        put(&store, "u1");
        let mut cp = Checkpoint::new("boot-R");
        cp.claims.insert("u9".to_string(), sample_claim("u9"));
        store.replace(&cp).unwrap();
        assert_eq!(store.read().unwrap(), cp);
    }

    /// Flip one byte inside the payload, keeping the JSON valid.
    fn flip_payload_byte(path: &Path) {
        let mut bytes = fs::read(path).unwrap();
        let at = bytes.windows(7).position(|w| w == b"GPU-aaa").unwrap() + 4;
        bytes[at] = b'b';
        fs::write(path, bytes).unwrap();
    }

    fn assert_moved_aside(store: &CheckpointStore, bad: &[u8], want_reason: &str) {
        let dir = store.path().parent().unwrap();
        match store.load().unwrap() {
            Loaded::Corrupt { checkpoint, moved_to, reason } => {
                assert_eq!(checkpoint, Checkpoint::default());
                assert!(reason.contains(want_reason), "{reason}");
                let name = moved_to.file_name().unwrap().to_string_lossy().into_owned();
                let secs = name.strip_prefix("checkpoint.json.corrupt-").unwrap();
                let secs = secs.split('-').next().unwrap();
                assert!(secs.parse::<u64>().unwrap() > 1_700_000_000, "{name}");
                assert_eq!(moved_to.parent(), Some(dir));
                assert_eq!(fs::read(&moved_to).unwrap(), bad);
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
        assert!(!store.path().exists());
        // Starting over works.
        put(store, "fresh");
        assert_eq!(store.read().unwrap().claims.len(), 1);
    }

    #[test]
    fn a_checksum_mismatch_is_corrupt() {
        let (_tmp, store) = store();
        put(&store, "u1");
        flip_payload_byte(store.path());
        let bad = fs::read(store.path()).unwrap();
        let err = store.read().unwrap_err();
        assert!(matches!(&err, StateError::Corrupt { reason, .. } if reason.starts_with("checksum mismatch")), "{err}");
        assert!(err.to_string().contains("checkpoint.json"), "{err}");
        let err = store.update("boot-1", |_| Ok::<_, ()>(())).unwrap_err();
        assert!(matches!(err, StateError::Corrupt { .. }), "{err}");
        assert_eq!(fs::read(store.path()).unwrap(), bad, "read and update leave a bad file where it is");
        assert_moved_aside(&store, &bad, "checksum mismatch");
    }

    #[test]
    fn garbage_truncated_empty_and_future_files_are_corrupt() {
        let good = {
            let (_tmp, store) = store();
            put(&store, "u1");
            fs::read(store.path()).unwrap()
        };
        let future = String::from_utf8(good.clone()).unwrap().replacen("\"version\": 1", "\"version\": 7", 1);
        let cases: [(&[u8], &str); 4] = [
            (b"\x00\x01garbage", "envelope"),
            (&good[..good.len() - 20], "envelope"),
            (b"", "empty"),
            (future.as_bytes(), "newer"),
        ];
        for (bad, want) in cases {
            let (_tmp, store) = store();
            fs::create_dir_all(store.path().parent().unwrap()).unwrap();
            fs::write(store.path(), bad).unwrap();
            assert!(matches!(store.read(), Err(StateError::Corrupt { .. })), "{want}");
            assert_moved_aside(&store, bad, want);
        }
    }

    #[test]
    fn two_corruptions_in_one_second_keep_both_files() {
        let (_tmp, store) = store();
        let dir = store.path().parent().unwrap().to_path_buf();
        fs::create_dir_all(&dir).unwrap();
        let mut moved = Vec::new();
        for bad in ["one", "two"] {
            fs::write(store.path(), bad).unwrap();
            let Loaded::Corrupt { moved_to, .. } = store.load().unwrap() else { panic!("not corrupt") };
            moved.push(moved_to);
        }
        // The second in the same second gets a suffix; in the next second a new name anyway.
        assert_ne!(moved[0], moved[1]);
        assert_eq!(fs::read_to_string(&moved[0]).unwrap(), "one");
        assert_eq!(fs::read_to_string(&moved[1]).unwrap(), "two");
    }

    #[test]
    fn unknown_fields_anywhere_load() {
        let payload = r#"{
            "bootId": "b1", "futureTop": {"x": 1},
            "claims": {"u1": {
                "uid": "u1", "namespace": "ns", "name": "c", "state": "PrepareStarted", "priority": 3,
                "devices": [{
                    "requests": ["r"], "pool": "p", "device": "gpu-0-mig-1g10gb-19-0", "gpuUuid": "GPU-1",
                    "pciBusId": "0000:01:00.0", "gpuMinor": 0, "gpuIndex": 0, "cdiIds": [], "shareId": "s",
                    "mig": {"owner": "dynamic", "profileId": 19, "profile": "1g.10gb", "start": 0, "size": 1,
                            "giId": 9, "memoryMode": "fast"}
                }]
            }}
        }"#;
        let text = format!(
            r#"{{"version": 1, "writer": "migdra 3.0", "checksum": "{}", "checkpoint": {payload}}}"#,
            super::super::format::checksum(payload.as_bytes())
        );
        let (_tmp, store) = store();
        fs::create_dir_all(store.path().parent().unwrap()).unwrap();
        fs::write(store.path(), text).unwrap();
        let Loaded::Ok(cp) = store.load().unwrap() else { panic!("did not load") };
        let claim = &cp.claims["u1"];
        assert_eq!(claim.state, ClaimState::PrepareStarted);
        let mig = claim.devices[0].mig.as_ref().unwrap();
        assert_eq!((mig.profile_id, mig.gi_id, mig.ci_id), (19, Some(9), None));
    }

    #[test]
    fn a_v1_file_without_defaulted_fields_loads() {
        // Only the fields every version-1 writer writes: no needsRecreate, lastError, mig, or
        // the MIG record's optional IDs.
        let payload = r#"{"bootId":"b1","claims":{"u1":{"uid":"u1","namespace":"ns","name":"c",
            "state":"UnprepareStarted","devices":[
            {"requests":["r"],"pool":"p","device":"gpu-3","gpuUuid":"GPU-3","pciBusId":"0000:03:00.0",
             "gpuMinor":3,"gpuIndex":2,"cdiIds":["k/claim=u1"]},
            {"requests":["r"],"pool":"p","device":"gpu-0-mig-1g10gb-19-0","gpuUuid":"GPU-0",
             "pciBusId":"0000:01:00.0","gpuMinor":0,"gpuIndex":0,"cdiIds":[],
             "mig":{"owner":"static","profileId":19,"profile":"1g.10gb","start":0,"size":1}}]}}}"#;
        let text = format!(
            r#"{{"version":1,"checksum":"{}","checkpoint":{payload}}}"#,
            super::super::format::checksum(payload.as_bytes())
        );
        let (_tmp, store) = store();
        fs::create_dir_all(store.path().parent().unwrap()).unwrap();
        fs::write(store.path(), text).unwrap();
        let cp = store.read().unwrap();
        let claim: &ClaimRecord = &cp.claims["u1"];
        assert!(!claim.needs_recreate);
        assert_eq!(claim.last_error, None);
        assert_eq!(claim.devices[0].mig, None);
        let mig = claim.devices[1].mig.as_ref().unwrap();
        assert_eq!(
            (mig.gi_id, mig.ci_id, mig.uuid.as_deref(), mig.gi_cap_minor, mig.ci_cap_minor),
            (None, None, None, None, None)
        );
    }

    #[test]
    fn concurrent_updates_through_two_stores_lose_nothing() {
        let (_tmp, a) = store();
        let b = CheckpointStore::new(a.path().parent().unwrap());
        std::thread::scope(|s| {
            for (store, prefix) in [(&a, "a"), (&b, "b")] {
                s.spawn(move || {
                    for i in 0..200 {
                        put(store, &format!("{prefix}-{i}"));
                    }
                });
            }
        });
        let cp = a.read().unwrap();
        assert_eq!(cp.claims.len(), 400);
        assert!(
            (0..200).all(|i| cp.claims.contains_key(&format!("a-{i}")) && cp.claims.contains_key(&format!("b-{i}")))
        );
        assert_eq!(a.writes() + b.writes(), 400);
    }

    #[test]
    fn a_failed_write_keeps_the_old_file_and_no_temp_files() {
        let (_tmp, store) = store();
        put(&store, "u1");
        let dir = store.path().parent().unwrap().to_path_buf();
        let before = fs::read(store.path()).unwrap();
        for step in [Step::Create, Step::Write, Step::Sync, Step::Rename] {
            *store.fault.lock().unwrap() = Some(step);
            let err = store.update("boot-1", clear).unwrap_err();
            assert!(err.to_string().contains("injected failure"), "{err}");
            assert_eq!(fs::read(store.path()).unwrap(), before, "{step:?}");
            assert_eq!(entries(&dir), [FILE_NAME, LOCK_NAME], "{step:?}");
            assert!(store.replace(&Checkpoint::default()).is_err());
            assert_eq!(fs::read(store.path()).unwrap(), before, "{step:?}");
        }
        // Failing to fsync the directory: the new file is in place but reported as not durable.
        *store.fault.lock().unwrap() = Some(Step::SyncDir);
        assert!(store.update("boot-1", clear).is_err());
        assert_eq!(entries(&dir), [FILE_NAME, LOCK_NAME]);
        *store.fault.lock().unwrap() = None;
        assert_eq!(store.writes(), 1);
    }

    #[test]
    fn a_real_rename_failure_leaves_no_temp_file() {
        // checkpoint.json is a non-empty directory: creating and writing the temp file work,
        // the rename fails for real.
        let (_tmp, store) = store();
        fs::create_dir_all(store.path().join("keep")).unwrap();
        let err = store.replace(&Checkpoint::new("b")).unwrap_err();
        assert!(matches!(&err, StateError::Io { op: "rename temp file over", .. }), "{err}");
        assert!(err.to_string().starts_with("failed to rename temp file over "), "{err}");
        assert_eq!(entries(store.path().parent().unwrap()), [FILE_NAME, LOCK_NAME]);
        assert!(matches!(store.load(), Err(StateError::Io { op: "read", .. })));
    }

    #[test]
    fn a_state_dir_under_a_regular_file_is_an_io_error() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("file"), "x").unwrap();
        let store = CheckpointStore::new(&tmp.path().join("file").join("state"));
        let err = store.load().unwrap_err();
        assert!(matches!(&err, StateError::Io { op: "create directory", .. }), "{err}");
        assert!(store.update("b", |_| Ok::<_, ()>(())).is_err());
        assert!(store.replace(&Checkpoint::default()).is_err());
    }

    #[test]
    fn a_read_only_state_dir_keeps_the_old_file_when_not_root() {
        let (_tmp, store) = store();
        put(&store, "u1");
        let dir = store.path().parent().unwrap().to_path_buf();
        if fs::metadata(store.path()).map(|m| std::os::unix::fs::MetadataExt::uid(&m)).unwrap() == 0 {
            return; // root ignores directory permissions; the injected failures cover this case
        }
        let before = fs::read(store.path()).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o500)).unwrap();
        let result = store.update("boot-1", clear);
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o750)).unwrap();
        assert!(matches!(result, Err(StateError::Io { op: "create temp file", .. })), "{result:?}");
        assert_eq!(fs::read(store.path()).unwrap(), before);
        assert_eq!(entries(&dir), [FILE_NAME, LOCK_NAME]);
    }

    #[test]
    fn load_removes_temp_files_of_crashed_writes() {
        let (_tmp, store) = store();
        put(&store, "u1");
        let dir = store.path().parent().unwrap();
        fs::write(dir.join(".checkpoint.json.tmp-1-0"), "half").unwrap();
        fs::write(dir.join("other"), "kept").unwrap();
        assert!(matches!(store.load().unwrap(), Loaded::Ok(_)));
        assert_eq!(entries(dir), [FILE_NAME, LOCK_NAME, "other"]);
    }
}
